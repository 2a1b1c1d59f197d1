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

import contextlib
import copy
import ctypes
import ctypes.util
import gc
import math
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..attention import Attention, BlockMaskCache, flex_available
from .harness import DTYPES, Timing, dtype_name

BIASES = ("alibi", "t5", "kerple", "fire", "sandwich")
CANDIDATES = ("materialized", "flex", "causal")
GiB = 1024**3
MiB = 1024**2

# CPU target (issue 5): compiled FlexAttention at least this much faster than the materialized
# bias, at s >= TARGET_MIN_S, inference.
TARGET_SPEEDUP = 1.5
TARGET_MIN_S = 2048
# GPU targets (forward + backward): ALiBi and T5 flex within this factor of plain causal SDPA
# at s = 8k, and flex running at s = 64k where the materialized bias cannot.
GPU_TARGET_RATIO = 1.25
GPU_TARGET_BIASES = ("alibi", "t5")
# What a materialized-bias call may need, as a fraction of the device's memory. On CPU the
# machine is shared: 0.4 of 24 GiB admits s = 8k with h = 8 (about 110 bytes per score measured,
# 7.4 GiB) and keeps s = 16k (about 30 GiB) out.
DEFAULT_MEMORY_FRACTION = {"cpu": 0.4, "cuda": 0.8}


@dataclass(frozen=True)
class Sweep:
    """Every combination of these lengths, dtypes and biases."""

    lengths: tuple[int, ...]
    dtypes: tuple[str, ...]
    biases: tuple[str, ...]


# "full" is the RESULTS.md run, sized to about 10 minutes on 2 CPU cores, where a
# materialized-bias call takes 6-12 s at s = 8k and a flex call 13 s at 32k, and every
# (bias, s, dtype) compiles its own kernel (3-8 s): float32, every bias, 1k to 8k (the CPU target,
# while the materialized bias still fits in memory); bfloat16, every bias at 2k and 4k, then the
# two biases of the GPU targets at 8k and 16k, and ALiBi alone at 32k.
PRESETS: dict[str, tuple[Sweep, ...]] = {
    "quick": (Sweep((1024, 2048), ("float32",), BIASES),),
    "full": (
        Sweep((1024, 2048, 4096, 8192), ("float32",), BIASES),
        Sweep((2048, 4096), ("bfloat16",), BIASES),
        Sweep((8192, 16384), ("bfloat16",), GPU_TARGET_BIASES),
        Sweep((32768,), ("bfloat16",), ("alibi",)),
    ),
}
# Timed calls per candidate at most; one whose samples pass the time budget stops after 3.
PRESET_REPEATS = {"quick": 5, "full": 3}
# On CUDA "full" also runs T5 at 32k and both at s = 64k (the length of the GPU target).
CUDA_FULL_EXTRA = Sweep((32768, 65536), ("bfloat16",), GPU_TARGET_BIASES)


@dataclass(frozen=True)
class Case:
    """One sequence length and dtype: the biases to run there (the causal floor is shared)."""

    s: int
    dtype: torch.dtype
    biases: tuple[str, ...]


def parse_lengths(spec: str) -> list[int]:
    """``"1024,2k,32k"`` -> ``[1024, 2048, 32768]`` (``k`` = 1024)."""
    out = []
    for part in spec.split(","):
        text = part.strip().lower()
        m = re.fullmatch(r"(\d+)(k?)", text)
        value = int(m.group(1)) * (1024 if m.group(2) else 1) if m else 0
        if value < 1:
            raise ValueError(
                f"lengths must be positive integers, comma-separated (e.g. 1024,2k,32k), "
                f"got {part.strip()!r}"
            )
        out.append(value)
    return out


def parse_biases(spec: str) -> list[str]:
    """``"alibi,t5"`` or ``"all"`` -> bias names, checked against :data:`BIASES`."""
    if spec.strip() == "all":
        return list(BIASES)
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BIASES]
    if unknown or not names:
        raise ValueError(f"unknown bias {unknown or spec!r}; known: {', '.join(BIASES)} (or all)")
    return names


def parse_dtype_names(spec: str) -> list[str]:
    """``"float32,bf16"`` -> canonical names (``["float32", "bfloat16"]``)."""
    out = []
    for name in spec.split(","):
        name = name.strip()
        if name not in DTYPES:
            raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
        out.append(dtype_name(DTYPES[name]))
    return out


def parse_skip(spec: str) -> tuple[str, ...]:
    """``"flex,causal"`` -> candidates to leave out, checked against :data:`CANDIDATES`."""
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown candidate(s) {unknown}; known: {', '.join(CANDIDATES)}")
    return names


def plan_cases(
    preset: str = "quick",
    lengths: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
    biases: Sequence[str] | None = None,
    device_type: str = "cpu",
) -> list[Case]:
    """The cases of a preset, with ``lengths``/``dtypes``/``biases`` (when given) replacing the
    preset's in each of its sweeps; ordered by dtype, then length (shorter lengths first, so
    that longer ones can be predicted from them)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    sweeps = list(PRESETS[preset])
    if preset == "full" and device_type == "cuda":
        sweeps.append(CUDA_FULL_EXTRA)
    grouped: dict[tuple[str, int], list[str]] = {}  # (dtype, s) -> biases, in order of first use
    for sw in sweeps:
        for dt in dtypes or sw.dtypes:
            for s in lengths or sw.lengths:
                names = grouped.setdefault((dt, s), [])
                names += [b for b in biases or sw.biases if b not in names]
    dtype_order = list(dict.fromkeys(dt for dt, _ in grouped))
    keys = sorted(grouped, key=lambda k: (dtype_order.index(k[0]), k[1]))
    return [Case(s, DTYPES[dt], tuple(grouped[(dt, s)])) for dt, s in keys]


# ---------------------------------------------------------------------------------------------
# Peak memory


def _proc_status_kib(name: str) -> int:
    m = re.search(rf"^{name}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    if m is None:
        raise OSError(f"/proc/self/status has no {name}")
    return int(m.group(1))


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``, which hands freed heap pages back to the OS (so that they are
    not reused unseen by the next call), or a no-op where there is no such function."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return lambda: None

    def call() -> None:
        trim(0)

    return call


class PeakMemory:
    """Peak memory growth of one call on ``device`` (module docstring): ``start()``, the call,
    ``stop() -> bytes`` (None where it cannot be measured; ``why`` says why)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.why = ""
        self._base = 0
        if device.type == "cuda":
            self.method = (
                "CUDA: torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), "
                "minus memory_allocated() before the call"
            )
            return
        self.method = (
            "CPU: resident-set growth: malloc_trim(0), reset the high-water mark "
            "(echo 5 > /proc/self/clear_refs), peak = VmHWM after the call - VmRSS before it"
        )
        self._trim = _malloc_trim()
        try:
            self._reset_hwm()
            _proc_status_kib("VmHWM")
        except OSError as e:
            self.why = f"peak RSS cannot be reset here ({e}); memory not measured"

    @property
    def supported(self) -> bool:
        return not self.why and self.device.type in ("cpu", "cuda")

    @staticmethod
    def _reset_hwm() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def start(self) -> None:
        if not self.supported:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._trim()
            self._reset_hwm()
            self._base = _proc_status_kib("VmRSS") * 1024

    def stop(self) -> int | None:
        if not self.supported:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device) - self._base)
        return max(0, _proc_status_kib("VmHWM") * 1024 - self._base)


def total_memory(device: torch.device) -> int:
    """Bytes of RAM (CPU) or of the GPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    return int(m.group(1)) * 1024 if m else 0


def memory_limit_for(device: torch.device, fraction: float | None = None) -> int:
    """``fraction`` (default :data:`DEFAULT_MEMORY_FRACTION`) of the device's memory, in bytes."""
    if fraction is None:
        fraction = DEFAULT_MEMORY_FRACTION.get(device.type, 0.4)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
    return int(total_memory(device) * fraction)


def available_memory(device: torch.device) -> int | None:
    """Bytes free now (``MemAvailable`` or the CUDA driver's free memory), None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def human_bytes(n: float) -> str:
    """``34359738368`` -> ``"32.0 GiB"``; MiB below a GiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def materialized_need(heads: int, s: int, t: int, measured: tuple[int, int] | None = None) -> int:
    """Estimated bytes of one materialized-bias call at ``s`` queries over ``t`` keys.

    The float32 ``[h, s, t]`` bias (``h * s * t * 4``) is the lower bound; ``measured = (peak
    bytes, s_prev * t_prev)`` from a shorter run of the same bias scales that peak by the
    number of scores (every large buffer of the path is ``O(s * t)``).
    """
    need = heads * s * t * 4
    if measured is not None and measured[1] > 0:
        need = max(need, math.ceil(measured[0] / measured[1] * s * t))
    return need


def memory_skip_reason(need: int, limit: int, available: int | None = None) -> str | None:
    """Why a call needing ``need`` bytes is not tried, or None when it fits.

    ``limit`` is the configured ceiling; ``available`` (free memory now, on a shared machine) must
    also hold it with a tenth to spare.
    """
    if need > limit:
        return f"memory (would need {human_bytes(need)} > limit {human_bytes(limit)})"
    if available is not None and need > 0.9 * available:
        return f"memory (would need {human_bytes(need)}, only {human_bytes(available)} available)"
    return None


def time_skip_reason(previous: tuple[int, float] | None, s: int, max_call_s: float) -> str | None:
    """Why a candidate is not timed at ``s``: its median ``previous = (s_prev, seconds)`` at a
    shorter length, scaled by ``(s / s_prev)**2`` (attention is quadratic), exceeds
    ``max_call_s``; None when it does not (or nothing is known yet)."""
    if previous is None:
        return None
    s_prev, sec = previous
    predicted = sec * (s / s_prev) ** 2
    if predicted > max_call_s:
        return (
            f"time (~{predicted:.0f} s per call predicted from s={s_prev}, limit {max_call_s:g} s)"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Rows


@dataclass
class Measurement:
    """One candidate in one row: median ms, first call (s), peak memory growth (bytes)."""

    status: str = "not run"  # "ok", "skipped", "error", "not run"
    ms: float = float("nan")
    first_s: float = float("nan")
    peak_bytes: int | None = None
    samples: int = 0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class BiasRow:
    """One bias at one length and dtype: the three candidates and how they compare."""

    bias: str
    s: int
    dtype: str
    device: str
    mode: str  # "inference" or "forward+backward"
    heads: int
    head_dim: int
    batch: int
    materialized: Measurement = field(default_factory=Measurement)
    flex: Measurement = field(default_factory=Measurement)
    causal: Measurement = field(default_factory=Measurement)
    max_abs_diff: float = float("nan")  # |flex - materialized| on the first call's outputs
    notes: list[str] = field(default_factory=list)

    @property
    def speedup_vs_materialized(self) -> float:
        """materialized ms / flex ms (> 1: flex is faster)."""
        return self.materialized.ms / self.flex.ms

    @property
    def flex_over_causal(self) -> float:
        """flex ms / plain causal SDPA ms (1.0: the bias costs nothing)."""
        return self.flex.ms / self.causal.ms

    def targets(self) -> str:
        """The issue's targets that apply to this row, each ``met``/``MISSED``, or ``-``."""
        if self.device == "cpu" and self.mode == "inference" and self.s >= TARGET_MIN_S:
            name = f"flex >={TARGET_SPEEDUP:g}x materialized"
            if not self.flex.ok:
                return f"{name}: flex did not run"
            if not self.materialized.ok:
                return f"{name}: - (materialized {self.materialized.status}; flex ran)"
            ok = self.speedup_vs_materialized >= TARGET_SPEEDUP
            return f"{name} {'met' if ok else 'MISSED'}"
        if self.device == "cuda" and self.bias in GPU_TARGET_BIASES:
            if self.s == 8192:
                name = f"flex <={GPU_TARGET_RATIO:g}x causal at 8k"
                if not (self.flex.ok and self.causal.ok):
                    return f"{name}: not measured"
                ok = self.flex_over_causal <= GPU_TARGET_RATIO
                return f"{name} {'met' if ok else 'MISSED'}"
            if self.s == 65536:
                ok = self.flex.ok and not self.materialized.ok
                return f"flex runs at 64k, materialized cannot {'met' if ok else 'MISSED'}"
        return "-"


# ---------------------------------------------------------------------------------------------
# Running


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forbid_bias(encoding: nn.Module, name: str) -> None:
    """Make ``encoding.bias`` raise: a flex call that would materialize ``[h, s, t]`` fails."""

    def refuse(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError(f"the flex path of {name} built an [h, s, t] bias")

    setattr(encoding, "bias", refuse)  # noqa: B010 (an instance attribute hides the method)


@contextlib.contextmanager
def _recompile_limit(at_least: int) -> Iterator[None]:
    """Raise dynamo's recompile limit for the run (every bias, length and dtype compiles its own
    flex kernel; past the default 8 dynamo would fall back to eager FlexAttention, which
    materializes the scores)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    old = getattr(dynamo_config, name)
    setattr(dynamo_config, name, max(old, at_least))
    try:
        yield
    finally:
        setattr(dynamo_config, name, old)


def _inductor_cache_counts() -> tuple[int, int]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return (0, 0)
    c = counters["inductor"]
    return c["fxgraph_cache_hit"], c["fxgraph_cache_miss"]


@dataclass
class _Candidate:
    key: str  # "causal" or "BIAS/materialized" or "BIAS/flex"
    fn: Callable[[], torch.Tensor]
    result: Measurement
    timing: Timing = field(default_factory=Timing)


def _make_call(
    module: nn.Module, x: torch.Tensor, backward: bool, grad_out: torch.Tensor | None
) -> Callable[[], torch.Tensor]:
    """The timed call: ``module(x)`` under no_grad, or forward + backward (``autograd.grad``
    returns the gradients instead of accumulating them, so every call does the same work)."""
    if not backward:

        def infer() -> torch.Tensor:
            with torch.no_grad():
                return module(x)  # type: ignore[no-any-return]

        return infer
    inputs = [x, *(p for p in module.parameters() if p.requires_grad)]

    def train() -> torch.Tensor:
        out = module(x)  # [b, s, h*d]
        torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
        return out.detach()

    return train


def run_bias_bench(
    cases: Sequence[Case],
    *,
    heads: int = 8,
    head_dim: int = 64,
    batch: int = 1,
    device: torch.device | str = "cpu",
    repeats: int = 5,
    budget_s: float = 5.0,
    memory_limit: int | None = None,
    max_call_s: float = 60.0,
    skip: Sequence[str] = (),
    compile_flex: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[BiasRow]:
    """Time and measure every candidate (module docstring) of every case; one row per bias and case.

    Shapes: ``x [b, s, h*d]`` -> ``[b, s, h*d]``, causal self-attention (``t = s``), ``q, k, v
    [b, h, s, d]`` inside; the materialized bias is ``[h, s, t]`` float32.

    Args:
        cases: from :func:`plan_cases`.
        repeats: timed calls per candidate at most; a candidate stops early once it has 3 samples
            adding up to more than ``budget_s`` seconds.
        memory_limit: bytes a materialized call may need (estimate: :func:`materialized_need`);
            default :func:`memory_limit_for` with :data:`DEFAULT_MEMORY_FRACTION`.
        max_call_s: candidates predicted to take longer per call are skipped (``time``).
        skip: candidates (:data:`CANDIDATES`) to leave out.
        compile_flex: ``False`` runs FlexAttention eagerly (materializes the scores; for tests).
        progress: called with a line of text before each case.
    """
    dev = torch.device(device)
    for name in skip:
        if name not in CANDIDATES:
            raise ValueError(f"unknown candidate {name!r}; known: {', '.join(CANDIDATES)}")
    for case in cases:
        if case.s < 1:
            raise ValueError(f"sequence lengths must be positive, got {case.s}")
        unknown = [b for b in case.biases if b not in BIASES]
        if unknown:
            raise ValueError(f"unknown bias {unknown}; known: {', '.join(BIASES)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but CUDA is not available")
    backward = dev.type == "cuda"  # CPU FlexAttention has no backward: inference there
    mode = "forward+backward" if backward else "inference"
    if memory_limit is None:
        memory_limit = memory_limit_for(dev)
    peak = PeakMemory(dev)
    run_flex = "flex" not in skip
    flex_note = ""
    if run_flex and compile_flex and not flex_available(dev.type):
        run_flex, flex_note = False, f"compiled FlexAttention is not available on {dev.type}"

    rows: list[BiasRow] = []
    state = _History()
    variants = sum(len(c.biases) for c in cases)
    with _recompile_limit(variants + 8):
        for case in cases:
            if progress is not None:
                progress(f"s={case.s} {dtype_name(case.dtype)}: {', '.join(case.biases)}")
            setup = _CaseSetup(
                case, heads, head_dim, batch, dev, backward, mode, compile_flex, skip,
                run_flex, flex_note, memory_limit, max_call_s, state,
            )  # fmt: skip
            if run_flex and compile_flex:
                setup.measure_block_mask(peak)
            _time_case(setup.candidates, dev, repeats, budget_s, peak, setup.rows, compile_flex)
            state.record(setup.candidates, case)
            rows += setup.rows.values()
            del setup
            gc.collect()
    return rows


@dataclass
class _History:
    """What shorter lengths of the same run measured, to predict longer ones."""

    times: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    peaks: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)

    def time(self, key: str, dtype: torch.dtype) -> tuple[int, float] | None:
        """``(s, seconds per call)`` of candidate ``key`` at the last length it ran."""
        return self.times.get((key, dtype_name(dtype)))

    def peak(self, bias: str, dtype: torch.dtype) -> tuple[int, int] | None:
        """``(peak bytes, s * t)`` of ``bias``'s materialized path at the last length it ran."""
        return self.peaks.get((bias, dtype_name(dtype)))

    def record(self, candidates: Sequence[_Candidate], case: Case) -> None:
        dt = dtype_name(case.dtype)
        for c in candidates:
            if c.result.ok:
                self.times[(c.key, dt)] = (case.s, c.result.ms / 1e3)
                bias, _, kind = c.key.partition("/")
                if kind == "materialized" and c.result.peak_bytes:
                    self.peaks[(bias, dt)] = (c.result.peak_bytes, case.s * case.s)


class _CaseSetup:
    """Inputs, modules and candidates of one case, and its rows (one per bias).

    Every module shares the floor's projections, and the two paths of a bias share its
    parameters, so the candidates differ only in how attention is computed.
    """

    def __init__(
        self,
        case: Case,
        heads: int,
        head_dim: int,
        batch: int,
        dev: torch.device,
        backward: bool,
        mode: str,
        compile_flex: bool,
        skip: Sequence[str],
        run_flex: bool,
        flex_note: str,
        memory_limit: int,
        max_call_s: float,
        history: _History,
    ) -> None:
        from .. import registry

        self.case, self.dev = case, dev
        self.heads, self.head_dim, self.dim = heads, head_dim, heads * head_dim
        self.compile_flex = compile_flex
        s = t = case.s
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(batch, s, self.dim, generator=gen).to(dev, case.dtype)  # [b, s, h*d]
        grad_out = torch.randn_like(x) if backward else None
        if backward:
            x.requires_grad_(True)
        # A fresh block-mask cache per case: its one-off build is measured on its own instead of
        # hiding in whichever flex call comes first.
        self.masks = BlockMaskCache()
        torch.manual_seed(0)
        floor = self._attention(None, "sdpa")
        self.candidates: list[_Candidate] = []
        self.rows: dict[str, BiasRow] = {}

        def add(key: str, module: nn.Module, result: Measurement, why: str | None) -> None:
            if why:
                result.status, result.note = "skipped", why
            else:
                self.candidates.append(
                    _Candidate(key, _make_call(module, x, backward, grad_out), result)
                )

        causal = Measurement()
        if "causal" in skip:
            causal.status, causal.note = "skipped", "--skip causal"
        else:
            add(
                "causal",
                floor,
                causal,
                time_skip_reason(history.time("causal", case.dtype), s, max_call_s),
            )
        for bias in case.biases:
            row = BiasRow(bias, s, dtype_name(case.dtype), dev.type, mode, heads, head_dim, batch)
            row.causal = causal
            self.rows[bias] = row
            enc = registry.build(bias, dim=self.dim, num_heads=heads, causal=True)
            mat = self._attention(enc, "sdpa")
            flex = self._attention(copy.deepcopy(enc), "flex")
            for module in (mat, flex):
                for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    setattr(module, proj, getattr(floor, proj))
            assert flex.encoding is not None
            _forbid_bias(flex.encoding, bias)

            key = f"{bias}/materialized"
            if "materialized" in skip:
                why: str | None = "--skip materialized"
            else:
                need = materialized_need(heads, s, t, history.peak(bias, case.dtype))
                why = memory_skip_reason(need, memory_limit, available_memory(dev))
                why = why or time_skip_reason(history.time(key, case.dtype), s, max_call_s)
            add(key, mat, row.materialized, why)
            key = f"{bias}/flex"
            if not run_flex:
                why = flex_note or "--skip flex"
            else:
                why = time_skip_reason(history.time(key, case.dtype), s, max_call_s)
            add(key, flex, row.flex, why)

    def _attention(self, encoding: nn.Module | None, backend: str) -> Attention:
        module = Attention(
            self.dim,
            self.heads,
            head_dim=self.head_dim,
            causal=True,
            encoding=encoding,
            backend=backend,
            compile_flex=self.compile_flex,
            block_mask_cache=self.masks,
        )
        return module.to(self.dev, self.case.dtype).eval()

    def measure_block_mask(self, peak: PeakMemory) -> None:
        """Build the causal block mask (once per ``(s, t)``, shared by every layer) and note its
        time and peak memory in every row."""
        s = self.case.s
        peak.start()
        t0 = time.perf_counter()
        try:
            self.masks.causal(s, s, self.dev)
            _sync(self.dev)
        except Exception as e:  # e.g. out of memory: the flex calls then fail and say so
            note = f"causal block mask build failed: {type(e).__name__}: {e}"[:200]
        else:
            used = peak.stop()
            mem = "" if used is None else f", peak {used / MiB:.0f} MiB"
            note = f"causal block mask build (once per s): {(time.perf_counter() - t0) * 1e3:.0f} ms{mem}"
        for row in self.rows.values():
            row.notes.append(note)


def _time_case(
    candidates: list[_Candidate],
    dev: torch.device,
    repeats: int,
    budget_s: float,
    peak: PeakMemory,
    rows: dict[str, BiasRow],
    compile_flex: bool,
) -> None:
    """First call of each candidate (flex: the compile), then ``repeats`` round-robin passes.

    Like :func:`.harness.time_round_robin` (same interleaving, same early stop), and also: peak
    memory measured in the first timed pass, each flex output compared with the materialized
    one, and a flex call that fell back to eager FlexAttention reported.
    """
    firsts: dict[str, torch.Tensor] = {}
    live: list[_Candidate] = []
    for c in candidates:
        hits0, misses0 = _inductor_cache_counts()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                _sync(dev)
                t0 = time.perf_counter()
                out = c.fn()
                _sync(dev)
                c.result.first_s = time.perf_counter() - t0
        except Exception as e:  # reported in the row; the other candidates still run
            oom = isinstance(e, torch.cuda.OutOfMemoryError)
            c.result.status = "error"
            c.result.note = "out of memory" if oom else f"{type(e).__name__}: {e}"[:200]
            if oom:
                torch.cuda.empty_cache()
            continue
        live.append(c)
        bias, _, kind = c.key.partition("/")
        if kind:
            firsts[c.key] = out.float()
            other = firsts.get(f"{bias}/{'materialized' if kind == 'flex' else 'flex'}")
            if other is not None:
                rows[bias].max_abs_diff = float((firsts[c.key] - other).abs().max())
        del out
        if kind == "flex" and compile_flex:
            hits, misses = _inductor_cache_counts()
            if hits > hits0 and misses == misses0:
                rows[bias].notes.append("flex first call: compiled from inductor's on-disk cache")
            eager = [w for w in caught if "without torch.compile" in str(w.message)]
            if eager:
                rows[bias].notes.append(
                    "flex ran EAGER (materializes the scores): " + str(eager[0].message)[:120]
                )
    firsts.clear()

    for rep in range(repeats):
        for c in live:
            tm = c.timing
            if len(tm.samples) >= 3 and sum(tm.samples) > budget_s:
                continue
            if rep == 0:
                peak.start()
            _sync(dev)
            t0 = time.perf_counter()
            c.fn()
            _sync(dev)
            tm.samples.append(time.perf_counter() - t0)
            if rep == 0:
                c.result.peak_bytes = peak.stop()
    for c in live:
        c.result.status = "ok"
        c.result.ms = c.timing.median * 1e3
        c.result.samples = len(c.timing.samples)


# ---------------------------------------------------------------------------------------------
# Report


TABLE_HEADER = [
    "bias",
    "dtype",
    "s",
    "materialized ms",
    "flex ms",
    "causal ms",
    "flex speedup vs materialized",
    "flex / causal",
    "flex first call s",
    "peak MiB materialized",
    "peak MiB flex",
    "peak MiB causal",
    "max abs diff",
    "target",
]

# The same columns, named short enough for a terminal.
SHORT_HEADER = ["bias", "dtype", "s", "mat ms", "flex ms", "causal ms", "flex vs mat",
                "flex/causal", "flex 1st s", "MiB mat", "MiB flex", "MiB causal", "max diff",
                "target"]  # fmt: skip


def _ms(m: Measurement) -> str:
    if m.ok:
        return f"{m.ms:.1f}"
    if m.status == "skipped":
        return (
            f"skipped: {m.note.split(' (')[0]}"
            if m.note.startswith(("memory", "time"))
            else "skipped"
        )
    return m.status


def _mib(m: Measurement) -> str:
    return "-" if not m.ok or m.peak_bytes is None else f"{m.peak_bytes / MiB:.0f}"


def _ratio(x: float) -> str:
    return "-" if x != x else f"{x:.2f}x"


def table_rows(rows: Sequence[BiasRow]) -> list[list[str]]:
    """One line per row, in :data:`TABLE_HEADER`'s columns."""
    out = []
    for r in rows:
        out.append(
            [
                r.bias,
                r.dtype,
                str(r.s),
                _ms(r.materialized),
                _ms(r.flex),
                _ms(r.causal),
                _ratio(r.speedup_vs_materialized),
                _ratio(r.flex_over_causal),
                "-" if r.flex.first_s != r.flex.first_s else f"{r.flex.first_s:.1f}",
                _mib(r.materialized),
                _mib(r.flex),
                _mib(r.causal),
                "-" if r.max_abs_diff != r.max_abs_diff else f"{r.max_abs_diff:.1e}",
                r.targets(),
            ]
        )
    return out


def row_notes(rows: Sequence[BiasRow]) -> list[str]:
    """Skip reasons, errors and per-row notes, one line each (shared notes once per case)."""
    lines: list[str] = []
    seen: set[str] = set()
    for r in rows:
        where = f"s={r.s} {r.dtype}"
        for name, m in (("causal", r.causal), ("materialized", r.materialized), ("flex", r.flex)):
            if m.status in ("skipped", "error") and m.note:
                line = f"{where} {'' if name == 'causal' else r.bias + ' '}{name}: {m.status}: {m.note}"
                if line not in seen:
                    seen.add(line)
                    lines.append(line)
        for note in r.notes:
            line = (
                f"{where}: {note}"
                if note.startswith("causal block mask")
                else f"{where} {r.bias}: {note}"
            )
            if line not in seen:
                seen.add(line)
                lines.append(line)
    return lines


def target_summary(rows: Sequence[BiasRow]) -> list[str]:
    """One line per target: how many applicable rows met it, and which missed."""
    cpu = [r for r in rows if r.device == "cpu" and r.mode == "inference" and r.s >= TARGET_MIN_S]
    lines = []
    if cpu:
        both = [r for r in cpu if r.flex.ok and r.materialized.ok]
        met = [r for r in both if r.speedup_vs_materialized >= TARGET_SPEEDUP]
        missed = [f"{r.bias} s={r.s} {r.dtype} ({r.speedup_vs_materialized:.2f}x)" for r in both if r not in met]  # fmt: skip
        only_flex = [r for r in cpu if r.flex.ok and not r.materialized.ok]
        lines.append(
            f"CPU inference, compiled flex >= {TARGET_SPEEDUP:g}x faster than the materialized "
            f"bias at s >= {TARGET_MIN_S}: met in {len(met)} of {len(both)} rows where both ran"
            + (f"; missed: {', '.join(missed)}" if missed else "")
            + (
                f"; {len(only_flex)} more rows where only flex could run (materialized skipped)"
                if only_flex
                else ""
            )
        )
    gpu = [r for r in rows if r.device == "cuda" and r.targets() != "-"]
    lines += [f"{r.bias} s={r.s} {r.dtype}: {r.targets()}" for r in gpu]
    return lines


def markdown_section(
    rows: Sequence[BiasRow],
    env: dict[str, str],
    command: str,
    memory_limit: int,
    max_call_s: float,
    device: torch.device,
) -> str:
    """The ``bias-<device>`` block of ``benchmarks/RESULTS.md``."""
    from .harness import markdown_table

    mode = rows[0].mode if rows else ("forward+backward" if device.type == "cuda" else "inference")
    peak = PeakMemory(device)
    shape = (
        f"batch {rows[0].batch}, heads {rows[0].heads}, head_dim {rows[0].head_dim}" if rows else ""
    )
    parts = [
        f"## bias ({mode}, {device.type})",
        "",
        "\n".join(f"- {k}: {v}" for k, v in env.items()),
        f"- command: `{command}`",
        f"- shape: {shape}, causal self-attention (t = s), a whole posenc Attention layer",
        "",
        "Candidates, timed round-robin in one run (median ms; at least 3 samples, up to the "
        "`--repeats` given, after one untimed first call): **materialized** = "
        '`Attention(backend="sdpa")`, the `[h, s, t]` float32 bias masked and passed to SDPA; '
        '**flex** = `Attention(backend="flex")`, compiled FlexAttention with the bias in a '
        "`score_mod` (its first call, the kernel compile plus one run, is the `flex first call` "
        "column: a cold compile unless the notes say it came from inductor's on-disk cache; the "
        "causal block mask, built once per s and shared by every layer, is timed apart in the "
        "notes); **causal** = the same layer without a bias through SDPA's causal kernel, the "
        "floor (posenc's layer still builds an `[s, t]` bool mask before taking it). "
        "`flex speedup vs materialized` = materialized ms / flex ms; `flex / causal` = flex ms "
        "/ causal ms. `max abs diff` = largest |flex - materialized| of the layer's outputs.",
        "",
        f"Peak memory: growth during one timed call above what was held just before it. "
        f"{peak.why or peak.method}. The flex path ran with its encoding's `.bias` replaced by "
        "a function that raises, so each flex row also shows that path never built an "
        "`[h, s, t]` bias.",
        "",
        f"Skips: the materialized bias is not tried when its estimated need (the larger of "
        f"h*s*t*4 bytes and the peak per score measured at a shorter length, times s*t) exceeds "
        f"{human_bytes(memory_limit)} or 90% of the memory available at that moment; any "
        f"candidate predicted (from a shorter length, times (s/s_prev)^2) to take more than "
        f"{max_call_s:g} s per call is skipped for time.",
        "",
        "### Targets",
        "",
        *(f"- {line}" for line in target_summary(rows)),
    ]
    if device.type != "cuda":
        parts.append(
            "- GPU targets (forward+backward: FlexAttention ALiBi/T5 at s = 8k within "
            f"{GPU_TARGET_RATIO:g}x of plain causal SDPA; running at s = 64k where the "
            "materialized bias cannot): not measured, this run had no CUDA device. "
            "`posenc bench bias --preset full` on a GPU measures them (s = 64k is added there)."
        )
    parts += ["", "### Results", "", markdown_table(TABLE_HEADER, table_rows(rows))]
    notes = row_notes(rows)
    if notes:
        parts += ["", "### Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(parts)
