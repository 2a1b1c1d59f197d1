"""``posenc bench bias``: bias attention (ALiBi, T5, KERPLE, FIRE, Sandwich) through posenc's paths.

Each case is one sequence length ``s`` (self-attention, so ``t = s``) and dtype; a whole
:class:`~posenc.attention.Attention` layer (projections included, causal) is timed on
``x [b, s, h*d]``. Candidates, all timed in the same run, round-robin:

================  ================================================================================
``materialized``  ``Attention(backend="sdpa")``: the bias is built as a float32 ``[h, s, t]``
                  tensor, masked and passed to SDPA as its float mask
``flex``          ``Attention(backend="flex")``: compiled FlexAttention, the bias added entry by
                  entry in a ``score_mod``, causality a block mask (its first call, the kernel
                  compile, is reported apart)
``causal``        ``Attention(encoding=None, backend="sdpa")``: plain causal SDPA without a bias,
                  the floor (one per case, shared by every bias)
================  ================================================================================

Mode: inference (``torch.no_grad()``) on CPU, where FlexAttention has no backward; forward +
backward (``autograd.grad`` of the output with respect to ``x`` and every parameter) on CUDA.

Every candidate makes one untimed first call (for flex: the kernel compile plus one run, reported
as ``first_s``). Peak memory is measured during the first timed call, as growth above what was
held just before it:

* CPU: the resident set. Freed heap is first handed back to the OS (``malloc_trim``), then the
  kernel's high-water mark is reset to the current RSS (``echo 5 > /proc/self/clear_refs``,
  Linux >= 4.0); peak = ``VmHWM`` after the call - ``VmRSS`` before it, read from
  ``/proc/self/status``. It counts every page the call touched (bias, masks, SDPA buffers,
  output), not tensor sizes; ``getrusage``'s max RSS could not be used in one process because it
  never goes down.
* CUDA: ``torch.cuda.max_memory_allocated()`` after ``reset_peak_memory_stats()`` minus
  ``memory_allocated()`` before.

The materialized path is never tried where it would not fit: its need is estimated as the
larger of the float32 bias itself (``h * s * t * 4`` bytes, a lower bound) and the peak per
score measured at the last shorter length of the same bias and dtype, scaled by ``s * t`` (FIRE
runs its MLP over every ``(i, j)``: ~10x the bias). Above ``memory_limit`` (or what the machine
has available now) the row says ``skipped: memory (would need N GiB)``. A candidate whose
predicted time per call (its median at the last shorter length times ``(s / s_prev)**2``)
exceeds ``max_call_s`` is skipped the same way, with the reason ``time``.

The flex candidates run with their encoding's ``.bias`` replaced by a function that raises, so a
flex row exists only if that path never built an ``[h, s, t]`` bias.
"""

from __future__ import annotations

from .limits import (
    DEFAULT_MEMORY_FRACTION,
    GiB,
    MiB,
    PeakMemory,
    available_memory,
    human_bytes,
    materialized_need,
    memory_limit_for,
    memory_skip_reason,
    time_skip_reason,
    total_memory,
)
from .plan import (
    BIASES,
    CANDIDATES,
    CUDA_FULL_EXTRA,
    PRESET_REPEATS,
    PRESETS,
    Case,
    Sweep,
    parse_biases,
    parse_dtype_names,
    parse_lengths,
    parse_skip,
    plan_cases,
)
from .report import (
    SHORT_HEADER,
    TABLE_HEADER,
    block,
    row_notes,
    rows_doc,
    table_rows,
    target_summary,
)
from .rows import (
    GPU_TARGET_BIASES,
    GPU_TARGET_RATIO,
    TARGET_MIN_S,
    TARGET_SPEEDUP,
    BiasRow,
    Measurement,
)
from .run import run_bias_bench

__all__ = [
    "BIASES",
    "CANDIDATES",
    "CUDA_FULL_EXTRA",
    "DEFAULT_MEMORY_FRACTION",
    "GPU_TARGET_BIASES",
    "GPU_TARGET_RATIO",
    "PRESETS",
    "PRESET_REPEATS",
    "SHORT_HEADER",
    "TABLE_HEADER",
    "TARGET_MIN_S",
    "TARGET_SPEEDUP",
    "BiasRow",
    "Case",
    "GiB",
    "Measurement",
    "MiB",
    "PeakMemory",
    "Sweep",
    "available_memory",
    "block",
    "human_bytes",
    "materialized_need",
    "memory_limit_for",
    "memory_skip_reason",
    "parse_biases",
    "parse_dtype_names",
    "parse_lengths",
    "parse_skip",
    "plan_cases",
    "row_notes",
    "rows_doc",
    "run_bias_bench",
    "table_rows",
    "target_summary",
    "time_skip_reason",
    "total_memory",
]
