"""The decode per-call table of ``posenc bench rope``: every public rotary call at one step.

At a decode step (``q [b, 32, 1, 128]``, 8 KV heads) a rotation moves a few KB, so what a call
costs is its Python and dispatch overhead. Each public call is timed against transformers' own
``apply_rotary_pos_emb`` (``transformers.models.llama.modeling_llama``) on its ready cos/sin:

==================  ==========================================================================
``hf-apply``        transformers' ``apply_rotary_pos_emb(q, k, cos, sin)``, tables in q's dtype
``rope_qk``         :func:`posenc.kernels.rope_qk` on per-token float32 rows ``[b, 1, d/2]``
``rope_qk-table``   the same from a ``[4096, d/2]`` table and ``positions=``
``drop-in``         :func:`posenc.hf.apply_rotary_pos_emb` on transformers' tables as they are
``apply_posenc``    the rotation :func:`posenc.hf.apply_posenc` puts into a Llama attention
                    (the stand-in for its ``apply_rotary_pos_emb``), same tables
``RotaryEmbedding`` ``RotaryEmbedding(d)(q, k, positions)``: positions to rotated q, k
``MRoPE``           ``MRoPE(d, [16, 24, 24])(q, k, positions)``, text positions ``[b, 1]``
``XPos``            ``XPos(d)(q, k, positions)``
==================  ==========================================================================

Timing: thread CPU time (other processes' load does not count), round-robin over the calls,
each sample the mean of :data:`CALLS_PER_SAMPLE` back-to-back calls, medians. Ratios from
the same run: ``x hf`` = hf-apply µs / call µs (> 1: faster than transformers), ``x rope_qk``
= call µs / rope_qk µs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .harness import Shape, dtype_name

CALLS = (
    "hf-apply", "rope_qk", "rope_qk-table", "drop-in", "apply_posenc", "RotaryEmbedding",
    "MRoPE", "XPos",
)  # fmt: skip
#: Per call, CPU thread time: rope_qk's budget, the factor every other public call may take
#: over it, and how much faster than transformers' apply the drop-in and the modules must be.
TARGET_ROPE_QK_US = 15.0
TARGET_OVER_ROPE_QK = 1.3
TARGET_OVER_HF = 2.0
#: The calls held to TARGET_OVER_HF (the functional rope_qk forms are held to their budget).
VS_HF = ("drop-in", "apply_posenc", "RotaryEmbedding", "MRoPE", "XPos")
CALLS_PER_SAMPLE = 50
#: Where the step sits: deep in a cache, inside the modules' tables (4096 rows).
POSITION = 1000


def _calls(shape: Shape, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    """Each public call on seeded inputs of ``shape`` (s = 1) and ``dtype``."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    from ..hf import apply_rotary_pos_emb
    from ..hf.patch import HALF, fused_rotation
    from ..kernels import rope_qk
    from ..rotary import MRoPE, RotaryEmbedding, XPos

    b, d = shape.b, shape.d
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, shape.h, 1, d, generator=gen).to(dtype)  # [b, h, 1, d]
    k = torch.randn(b, shape.hk, 1, d, generator=gen).to(dtype)  # [b, hk, 1, d]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    angles = torch.arange(4096, dtype=torch.float64)[:, None] * inv_freq  # [4096, d/2]
    cos, sin = angles.cos().float(), angles.sin().float()  # the table, float32
    positions = torch.full((b, 1), POSITION)  # [b, 1]
    cos_rows, sin_rows = cos[positions], sin[positions]  # [b, 1, d/2] float32
    # transformers' rotary output: cat(freqs, freqs) in q's dtype, [b, 1, d]
    cos_hf = torch.cat((cos_rows, cos_rows), -1).to(dtype)
    sin_hf = torch.cat((sin_rows, sin_rows), -1).to(dtype)
    patched = fused_rotation(HALF, hf_apply)
    t = d // 8  # Qwen2-VL's [16, 24, 24] at d = 128: the pairs split over (t, h, w)
    section = [t, (d // 2 - t) // 2, d // 2 - t - (d // 2 - t) // 2]
    rope, mrope, xpos = RotaryEmbedding(d), MRoPE(d, section), XPos(d)
    return {
        "hf-apply": lambda: hf_apply(q, k, cos_hf, sin_hf),
        "rope_qk": lambda: rope_qk(q, k, cos_rows, sin_rows),
        "rope_qk-table": lambda: rope_qk(q, k, cos, sin, positions=positions),
        "drop-in": lambda: apply_rotary_pos_emb(q, k, cos_hf, sin_hf),
        "apply_posenc": lambda: patched(q, k, cos_hf, sin_hf),
        "RotaryEmbedding": lambda: rope(q, k, positions),
        "MRoPE": lambda: mrope(q, k, positions),
        "XPos": lambda: xpos(q, k, positions),
    }


def time_calls(
    calls: dict[str, Callable[[], object]], repeats: int, per_sample: int = CALLS_PER_SAMPLE
) -> dict[str, list[float]]:
    """Samples (µs per call, thread CPU time) of each call, round-robin: sample 1 of each,
    then sample 2 of each, ..., after two warm-up calls each."""
    for fn in calls.values():
        fn(), fn()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.thread_time()
            for _ in range(per_sample):
                fn()
            samples[name].append((time.thread_time() - t0) / per_sample * 1e6)
    return samples


def decode_rows(shapes: list[Shape], dtypes: list[torch.dtype], repeats: int) -> list[dict]:
    """One row per (shape, dtype, call): median µs, the ratios, the sample count."""
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for dtype in dtypes:
            medians = {
                name: statistics.median(v)
                for name, v in time_calls(_calls(shape, dtype), repeats).items()
            }
            for name, us in medians.items():
                rows.append({
                    "shape": shape.short, "dtype": dtype_name(dtype), "call": name, "us": us,
                    "x_hf": medians["hf-apply"] / us, "x_rope_qk": us / medians["rope_qk"],
                    "samples": repeats,
                })  # fmt: skip
    return rows


def target_text(row: dict[str, Any]) -> str:
    """``ok``, or what the row MISSED (``us``: its budget; ``x hf``: 2x transformers' apply);
    "" where no target applies (transformers' apply itself)."""
    call = row["call"]
    if call == "hf-apply":
        return ""
    budget = TARGET_ROPE_QK_US * (1.0 if call == "rope_qk" else TARGET_OVER_ROPE_QK)
    missed = ["us"] if row["us"] > budget else []
    if call in VS_HF and row["x_hf"] < TARGET_OVER_HF:
        missed.append("x hf")
    return "MISSED " + ", ".join(missed) if missed else "ok"


HEADER = ["shape", "dtype", "call", "us/call", "x hf", "x rope_qk", "target"]
_SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The printed/Markdown rows of :func:`decode_rows`' rows."""
    return [
        [r["shape"], _SHORT_DTYPES.get(r["dtype"], r["dtype"]), r["call"], f"{r['us']:.1f}", f"{r['x_hf']:.2f}",
         f"{r['x_rope_qk']:.2f}", target_text(r)]
        for r in rows
    ]  # fmt: skip


LEGEND = (
    "us/call: median thread CPU time per call (round-robin, each sample the mean of "
    f"{CALLS_PER_SAMPLE} calls); x hf: transformers' apply_rotary_pos_emb us / call us (> 1 "
    "faster); x rope_qk: call us / rope_qk us. Targets (MISSED us / x hf names the one "
    f"missed): rope_qk <= {TARGET_ROPE_QK_US:g} us, every other call <= "
    f"{TARGET_OVER_ROPE_QK:g}x that ({TARGET_OVER_ROPE_QK * TARGET_ROPE_QK_US:.1f} us), the "
    f"drop-in, apply_posenc's rotation and the modules >= {TARGET_OVER_HF:g}x transformers' "
    "apply."
)
