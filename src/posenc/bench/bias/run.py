"""Running the benchmark: build each case's modules and inputs, time every candidate
round-robin, measure peak memory, and compare the flex output with the materialized one."""

from __future__ import annotations

import contextlib
import copy
import gc
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...attention import Attention, BlockMaskCache, flex_available
from ..harness import Timing, dtype_name
from .limits import (
    MiB,
    PeakMemory,
    available_memory,
    materialized_need,
    memory_limit_for,
    memory_skip_reason,
    time_skip_reason,
)
from .plan import BIASES, CANDIDATES, Case
from .rows import BiasRow, Measurement


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


@dataclass(frozen=True)
class _Settings:
    """How every case of one run is built and timed (:func:`run_bias_bench`'s arguments)."""

    heads: int
    head_dim: int
    batch: int
    dev: torch.device
    repeats: int
    budget_s: float
    memory_limit: int
    max_call_s: float
    skip: tuple[str, ...]
    compile_flex: bool
    run_flex: bool  # False: flex is skipped, for flex_note (or --skip flex)
    flex_note: str

    @property
    def backward(self) -> bool:
        return self.dev.type == "cuda"  # CPU FlexAttention has no backward: inference there

    @property
    def mode(self) -> str:
        return "forward+backward" if self.backward else "inference"


def _check(cases: Sequence[Case], skip: Sequence[str], dev: torch.device) -> None:
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
    """Time and measure every candidate (package docstring) of every case; one row per bias and
    case.

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
    _check(cases, skip, dev)
    run_flex, flex_note = "flex" not in skip, ""
    if run_flex and compile_flex and not flex_available(dev.type):
        run_flex, flex_note = False, f"compiled FlexAttention is not available on {dev.type}"
    limit = memory_limit if memory_limit is not None else memory_limit_for(dev)
    cfg = _Settings(heads, head_dim, batch, dev, repeats, budget_s, limit, max_call_s,
                    tuple(skip), compile_flex, run_flex, flex_note)  # fmt: skip
    peak = PeakMemory(dev)
    rows: list[BiasRow] = []
    state = _History()
    with _recompile_limit(sum(len(c.biases) for c in cases) + 8):
        for case in cases:
            if progress is not None:
                progress(f"s={case.s} {dtype_name(case.dtype)}: {', '.join(case.biases)}")
            setup = _CaseSetup(case, cfg, state)
            if cfg.run_flex and cfg.compile_flex:
                setup.measure_block_mask(peak)
            live = _first_calls(setup.candidates, setup.rows, cfg)
            _timed_passes(live, cfg, peak)
            state.record(setup.candidates, case)
            rows += setup.rows.values()
            del setup, live
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

    def __init__(self, case: Case, cfg: _Settings, history: _History) -> None:
        self.case, self.cfg, self.history = case, cfg, history
        self.dim = cfg.heads * cfg.head_dim
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(cfg.batch, case.s, self.dim, generator=gen)  # [b, s, h*d]
        self.x = x.to(cfg.dev, case.dtype)
        self.grad_out = torch.randn_like(self.x) if cfg.backward else None
        if cfg.backward:
            self.x.requires_grad_(True)
        # A fresh block-mask cache per case: its one-off build is measured on its own instead of
        # hiding in whichever flex call comes first.
        self.masks = BlockMaskCache()
        torch.manual_seed(0)
        self.floor = self._attention(None, "sdpa")
        self.candidates: list[_Candidate] = []
        self.rows: dict[str, BiasRow] = {}
        causal = Measurement()
        if "causal" in cfg.skip:
            causal.status, causal.note = "skipped", "--skip causal"
        else:
            self._add("causal", self.floor, causal, self._too_slow("causal"))
        for bias in case.biases:
            self._add_bias(bias, causal)

    def _too_slow(self, key: str) -> str | None:
        previous = self.history.time(key, self.case.dtype)
        return time_skip_reason(previous, self.case.s, self.cfg.max_call_s)

    def _add(self, key: str, module: nn.Module, result: Measurement, why: str | None) -> None:
        """Candidate ``key`` timed into ``result``, or ``result`` marked skipped for ``why``."""
        if why:
            result.status, result.note = "skipped", why
            return
        call = _make_call(module, self.x, self.cfg.backward, self.grad_out)
        self.candidates.append(_Candidate(key, call, result))

    def _add_bias(self, bias: str, causal: Measurement) -> None:
        """The row of ``bias`` and its materialized and flex candidates (or why each is not
        run: skipped by the user, over the memory limit, or predicted too slow)."""
        from ... import registry

        cfg, case = self.cfg, self.case
        row = BiasRow(bias, case.s, dtype_name(case.dtype), cfg.dev.type, cfg.mode, cfg.heads,
                      cfg.head_dim, cfg.batch, causal=causal)  # fmt: skip
        self.rows[bias] = row
        enc = registry.build(bias, dim=self.dim, num_heads=cfg.heads, causal=True)
        mat = self._attention(enc, "sdpa")
        flex = self._attention(copy.deepcopy(enc), "flex")
        for module in (mat, flex):
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(module, proj, getattr(self.floor, proj))
        assert flex.encoding is not None
        _forbid_bias(flex.encoding, bias)
        why: str | None = "--skip materialized"
        if "materialized" not in cfg.skip:
            need = materialized_need(cfg.heads, case.s, case.s, self.history.peak(bias, case.dtype))
            why = memory_skip_reason(need, cfg.memory_limit, available_memory(cfg.dev))
            why = why or self._too_slow(f"{bias}/materialized")
        self._add(f"{bias}/materialized", mat, row.materialized, why)
        why = self._too_slow(f"{bias}/flex") if cfg.run_flex else (cfg.flex_note or "--skip flex")
        self._add(f"{bias}/flex", flex, row.flex, why)

    def _attention(self, encoding: nn.Module | None, backend: str) -> Attention:
        module = Attention(
            self.dim,
            self.cfg.heads,
            head_dim=self.cfg.head_dim,
            causal=True,
            encoding=encoding,
            backend=backend,
            compile_flex=self.cfg.compile_flex,
            block_mask_cache=self.masks,
        )
        return module.to(self.cfg.dev, self.case.dtype).eval()

    def measure_block_mask(self, peak: PeakMemory) -> None:
        """Build the causal block mask (once per ``(s, t)``, shared by every layer) and note its
        time and peak memory in every row."""
        s, dev = self.case.s, self.cfg.dev
        peak.start()
        t0 = time.perf_counter()
        try:
            self.masks.causal(s, s, dev)
            _sync(dev)
        except Exception as e:  # e.g. out of memory: the flex calls then fail and say so
            note = f"causal block mask build failed: {type(e).__name__}: {e}"[:200]
        else:
            used = peak.stop()
            mem = "" if used is None else f", peak {used / MiB:.0f} MiB"
            note = f"causal block mask build (once per s): {(time.perf_counter() - t0) * 1e3:.0f} ms{mem}"
        for row in self.rows.values():
            row.notes.append(note)


def _first_call(c: _Candidate, dev: torch.device) -> tuple[torch.Tensor | None, list[Any]]:
    """The untimed first call (flex: the kernel compile), its time in ``c.result.first_s``;
    returns its output (None after an error, reported in the row) and the warnings it raised."""
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
        return None, []
    return out, list(caught)


def _first_calls(
    candidates: list[_Candidate], rows: dict[str, BiasRow], cfg: _Settings
) -> list[_Candidate]:
    """First call of each candidate; each flex output compared with the materialized one, and a
    flex call served from inductor's cache or fallen back to eager FlexAttention noted. Returns
    the candidates that ran."""
    firsts: dict[str, torch.Tensor] = {}
    live: list[_Candidate] = []
    for c in candidates:
        hits0, misses0 = _inductor_cache_counts()
        out, caught = _first_call(c, cfg.dev)
        if out is None:
            continue
        live.append(c)
        bias, _, kind = c.key.partition("/")
        if kind:
            firsts[c.key] = out.float()
            other = firsts.get(f"{bias}/{'materialized' if kind == 'flex' else 'flex'}")
            if other is not None:
                rows[bias].max_abs_diff = float((firsts[c.key] - other).abs().max())
        del out
        if kind == "flex" and cfg.compile_flex:
            hits, misses = _inductor_cache_counts()
            if hits > hits0 and misses == misses0:
                rows[bias].notes.append("flex first call: compiled from inductor's on-disk cache")
            eager = [w for w in caught if "without torch.compile" in str(w.message)]
            if eager:
                rows[bias].notes.append(
                    "flex ran EAGER (materializes the scores): " + str(eager[0].message)[:120]
                )
    return live


def _timed_passes(live: list[_Candidate], cfg: _Settings, peak: PeakMemory) -> None:
    """``cfg.repeats`` round-robin passes (like :func:`..harness.time_round_robin`: the same
    interleaving and early stop), peak memory measured in the first."""
    for rep in range(cfg.repeats):
        for c in live:
            tm = c.timing
            if len(tm.samples) >= 3 and sum(tm.samples) > cfg.budget_s:
                continue
            if rep == 0:
                peak.start()
            _sync(cfg.dev)
            t0 = time.perf_counter()
            c.fn()
            _sync(cfg.dev)
            tm.samples.append(time.perf_counter() - t0)
            if rep == 0:
                c.result.peak_bytes = peak.stop()
    for c in live:
        c.result.status = "ok"
        c.result.ms = c.timing.median * 1e3
        c.result.samples = len(c.timing.samples)
