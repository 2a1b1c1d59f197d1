"""The cos/sin tables :class:`~posenc.rotary.RotaryEmbedding` serves eager CPU calls from.

Two kinds, both float32 ``[1, N, n]`` (the kernels' canonical table form), both keyed by device
and frequency set, both computed by :func:`posenc.functional.rotary.rope_cos_sin` from integer
positions, so a row is the same whichever table holds it:

* the **table** of positions ``0 .. N-1``: ``N`` starts at ``cache_len`` and doubles until it
  covers the call's largest position, up to ``max_cache_len`` rows; the kernel gathers rows by
  position;
* past ``max_cache_len``, a **window** of :data:`WINDOW_ROWS` rows for positions
  ``start .. start + WINDOW_ROWS - 1``, ``start`` a multiple of :data:`WINDOW_STEP`: a call whose
  positions span less than ``WINDOW_STEP`` fits in one, and its positions minus ``start`` index
  the rows. A decode step moves it every ``WINDOW_STEP`` tokens (a few milliseconds).

Sizes are read from the positions on the host, which callers do only where that is free (eager
mode, CPU tensors): nothing here runs in a traced or captured region.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from .._checks import host_readable
from ..functional.rotary import rope_cos_sin
from ..kernels.canonical import small_range
from ..kernels.reference import RopeArgs
from ..kernels.rope_op import DirectPlan, OutsideTable, Plans, direct_plan, remember
from .base import CheckedCall

#: Rows of a window table past ``max_cache_len``, and the step its start moves by.
WINDOW_ROWS = 1 << 13
WINDOW_STEP = WINDOW_ROWS // 2
#: Rows computed at once when a table is filled (bounds the float64 angles held meanwhile).
BUILD_ROWS = 1 << 16


class RopeTables(NamedTuple):
    """cos/sin of one call (float32), RoPE's or xPos' (scaled, k on its own table): per token,
    ``[(1 or b,) s, n]`` per query and ``[(1 or b,) t, n]`` per key with ``pq = pk = None``, or
    cached ``[1, N, n]`` tables with the rows ``pq [1|b, s]``, ``pk [1|b, t]`` that the kernels
    gather (positions, or positions minus a window's start)."""

    cos_q: torch.Tensor
    sin_q: torch.Tensor
    cos_k: torch.Tensor
    sin_k: torch.Tensor
    pq: torch.Tensor | None
    pk: torch.Tensor | None


def table_rows_of(
    positions: torch.Tensor, k_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``pq [1 or b, s]`` and ``pk [1 or b, t]`` that checked int64 ``positions [s]|[b,
    s]`` and ``k_positions [t]|[b, t]`` index a cached table by (``pk`` is ``pq`` when shared)."""
    pq = positions if positions.dim() == 2 else positions[None]  # [1 or b, s]
    pk = pq if k_positions is positions else k_positions
    return pq, pk if pk.dim() == 2 else pk[None]  # [1 or b, t]


def table_plan(
    chosen: str | None, call: CheckedCall, rotary_dim: int, interleaved: bool
) -> DirectPlan | None:
    """The decode plan of a checked ``call`` that the CPU kernel (``chosen``: its backend) ran
    directly, without gradient, on the rows of cached tables: k on its own table (xPos) or on
    q's (the same tensors: RoPE). None where none applies."""
    q, k = call.q, call.k
    if chosen != "cpu" or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)):
        return None
    cos_q, sin_q, cos_k, sin_k, pq, pk = call.tables
    args = RopeArgs(q, k, cos_q, sin_q, cos_k, sin_k, pq, pk, rotary_dim, interleaved)
    k_table = (None, None) if cos_k is cos_q else (cos_k, sin_k)
    given = (q, k, cos_q, sin_q, *k_table, call.positions, call.k_positions)
    return direct_plan(args, given, call.out, fallback=True)


class TableCache(dict):
    """``(device, frequency set) -> (cos, sin, cache_len or window start)``: a cache, so a copy
    (deepcopy, pickle) starts empty and builds its own (a grown table is up to 512 MiB)."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (TableCache, ())


def table_rows(cache_len: int, limit: int, top: int) -> int:
    """Rows of a table that covers position ``top < limit``: ``cache_len`` doubled as often as
    needed, at most ``limit``."""
    rows = cache_len
    while rows <= top:
        rows *= 2
    return min(rows, limit)


def fill(
    inv_freq: torch.Tensor,
    factor: float,
    rows: int,
    *,
    start: int = 0,
    keep: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``[1, rows, n]`` of positions ``start .. start + rows - 1`` on
    ``inv_freq``'s device: the rows of ``keep`` (a smaller table of the same positions) copied
    as they are, the others computed a block of :data:`BUILD_ROWS` at a time."""
    device = inv_freq.device
    cos = torch.empty(1, rows, inv_freq.shape[0], device=device)  # [1, N, n]
    sin = torch.empty_like(cos)
    done = 0
    if keep is not None:
        done = keep[0].shape[1]
        cos[:, :done], sin[:, :done] = keep
    for lo in range(done, rows, BUILD_ROWS):
        hi = min(lo + BUILD_ROWS, rows)
        positions = torch.arange(start + lo, start + hi, device=device)
        cos[0, lo:hi], sin[0, lo:hi] = rope_cos_sin(positions, inv_freq, factor)  # [hi - lo, n]
    return cos, sin


def grown(
    cache: TableCache, key: tuple, inv_freq: torch.Tensor, factor: float, top: int, first: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``[1, N, n]`` of positions ``0 .. N-1`` with ``N > top``: ``cache[key]``'s
    table (``(cos, sin, first)``), grown where it is short (``first`` doubled as often as
    needed, its rows kept) -- the table of :class:`~posenc.rotary.RotaryEmbedding`, for callers
    without one (:mod:`posenc.extend.methods.fused`, whose key names the frequency set's values)."""
    entry = cache.get(key)
    if entry is None or entry[0].shape[1] <= top:
        rows = table_rows(first, 1 << 62, top)
        keep = None if entry is None else (entry[0], entry[1])
        cos, sin = fill(inv_freq, factor, rows, keep=keep)
        entry = cache[key] = (cos, sin, first)
    return entry[0], entry[1]


def value_span(*positions: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` over non-empty integer tensors (``(0, -1)`` when all are empty): a host
    read, for eager CPU tensors only."""
    low, high = None, -1
    for p in positions:
        if p.numel():
            lo, hi = small_range(p) if p.numel() <= 64 else (int(v) for v in p.aminmax())
            low = lo if low is None else min(low, lo)
            high = max(high, hi)
    return (0 if low is None else low), high


def window_start(low: int, high: int) -> int | None:
    """The start of the window holding positions ``low .. high``, None where they span too
    much for one."""
    start = low // WINDOW_STEP * WINDOW_STEP
    return start if high < start + WINDOW_ROWS else None


class Windows:
    """A module's window tables (past ``max_cache_len``) and, per call layout, the plan of the
    last call a window served with that window: later calls of the layout whose positions fall
    in it run the plan on their positions minus its start, the kernel checking each one lies
    in the window (a call outside it raises :class:`~posenc.kernels.rope_op.OutsideTable`).
    A copy starts empty."""

    __slots__ = ("hot", "plans", "tables")

    def __init__(self) -> None:
        self.tables = TableCache()  # (device, frequency set) -> (cos, sin, start)
        self.plans: dict[tuple, tuple[DirectPlan, tuple]] = Plans()  # key -> (plan, window)
        self.hot = False  # the module's last call ran on a window

    def __reduce__(self) -> tuple:
        return (Windows, ())

    def clear(self) -> None:
        self.tables.clear()
        self.plans.clear()
        self.hot = False

    def table(
        self,
        device: torch.device,
        key: str,
        inv_freq: torch.Tensor,
        factor: float,
        low: int,
        high: int,
    ) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """``(cos, sin, start)``: the window of frequency set ``key`` holding positions
        ``low .. high`` (``inv_freq``: that set on the CPU); None where they span too much."""
        start = window_start(low, high)
        if start is None:
            return None
        entry = self.tables.get((device, key))
        if entry is None or entry[2] != start:
            cos, sin = fill(inv_freq.to(device), factor, WINDOW_ROWS, start=start)
            entry = self.tables[(device, key)] = (cos, sin, start)
        return entry

    def run(
        self,
        key: tuple,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor | None,
        rope: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layout's plan on its window; where it has none, or a position falls outside its
        window, ``rope``'s call served from a new window (:meth:`serve`; without ``rope``, or
        where no window serves it: None)."""
        hit = self.plans.get(key)
        if hit is not None:
            plan, (cos, sin, start) = hit
            rows = positions - start  # [s] or [b, s]: rows of the window
            k_rows = (
                None
                if k_positions is None
                else rows
                if k_positions is positions
                else k_positions - start
            )
            try:
                return plan.run(q, k, cos, sin, None, None, rows, k_rows)
            except OutsideTable:  # past this window: a new one, where rope is given
                pass
        return None if rope is None else self.serve(rope, key, q, k, positions, k_positions)

    def serve(
        self,
        rope: Any,
        key: tuple,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``rope``'s (a :class:`~posenc.rotary.RotaryEmbedding`) checked call on a window, for positions past its largest table spanning
        less than :data:`WINDOW_STEP`, leaving its plan for the layout's next calls (a fixed
        frequency set); None where ``rope``'s checked path serves the call (eager CPU int64
        positions only; the table covers them; a span too wide; dynamic NTK's frequencies of
        the length)."""
        kp = positions if k_positions is None else k_positions
        if not (_cpu_int64(positions) and _cpu_int64(kp) and host_readable(q)) or (
            k_positions is None and k.shape[2] != q.shape[2]  # k's default: arange(t)
        ):
            return None
        low, high = value_span(positions) if kp is positions else value_span(positions, kp)
        if low < 0 or rope.covers(high):  # free to read here: eager, CPU
            return None
        set_key = rope._freq_key(high + 1)
        window = None if set_key == "grown" else rope._window(q.device, set_key, low, high)
        if window is None:
            return None
        cos, sin, start = window  # [1, WINDOW_ROWS, n]: positions start ..
        rows = positions - start  # [s] or [b, s]: indices of the window's rows
        k_rows = None if k_positions is None else rows if kp is positions else kp - start
        rope.check_inputs(q, k)
        pos, k_pos = rope.resolve_positions(q, k, rows, k_rows)
        tables = RopeTables(cos, sin, cos, sin, *table_rows_of(pos, k_pos))
        out = rope.apply_tables(q, k, tables)
        plan = rope._plan_of(CheckedCall(q, k, tables, rows, k_rows, out))
        if plan is not None and not rope.spec.length_dependent:  # one set past the table
            remember(self.plans, key, (plan, window), limit=64)  # type: ignore[arg-type]
        return out


def _cpu_int64(p: object) -> bool:
    return isinstance(p, torch.Tensor) and p.dtype == torch.int64 and p.device.type == "cpu"
