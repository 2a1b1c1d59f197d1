"""RoPE as a module: ``RotaryEmbedding(head_dim, base, scaling, layout, rotary_dim)``.

Every scaling variant is a frequency transform (:func:`posenc.functional.rope_inv_freq`); this
module picks the frequencies for the current length, turns positions into cos/sin, and hands
them to the one rotation path, :func:`posenc.functional.apply_rotary_qk`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._checks import check_choice, check_even, check_int_at_most, check_positions, host_readable
from ..functional.rope_scaling import (
    ROPE_SCALING,
    Ctx,
    check_base,
    longrope_is_long,
    normalize_scaling,
    rope_inv_freq,
    scaled_inv_freq,
)
from ..functional.rotary import angles_cos_sin, rope_cos_sin
from ..kernels.constants import ANGLE_DTYPES, ROTARY_BACKENDS, ROTARY_LAYOUTS
from ..kernels.reference import RopeArgs
from ..kernels.rope_op import (
    DirectPlan,
    OutsideTable,
    Plans,
    mixed_backend,
    remember,
    rope_qk_canonical,
    select_backend,
    unit_last,
)
from .base import (
    QK,
    CheckedCall,
    Positions,
    RotaryEncoding,
    check_qk,
    max_position,
    position_range,
    resolve_qk_positions,
)
from .table_cache import (
    RopeTables,
    TableCache,
    Windows,
    fill,
    table_plan,
    table_rows,
    table_rows_of,
    value_span,
)

__all__ = [
    "MAX_CACHE_LEN",
    "MAX_HEAD_DIM",
    "RopeTables",
    "RotaryEmbedding",
    "check_qk",
    "max_position",
    "position_range",
    "resolve_angle_dtype",
    "resolve_qk_positions",
]


def resolve_angle_dtype(angle_dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32``/``torch.float64`` or their names (registry and CLI options are strings)."""
    names = {"float32": torch.float32, "float64": torch.float64}
    dtype = names.get(angle_dtype) if isinstance(angle_dtype, str) else angle_dtype
    if dtype not in ANGLE_DTYPES:
        raise ValueError(
            "angle_dtype must be torch.float32 or torch.float64 ('float32'/'float64'), "
            f"got {angle_dtype!r}"
        )
    assert dtype is not None
    return dtype


#: The largest ``head_dim`` (real models use up to 512): a table of ``head_dim / 2`` frequencies.
MAX_HEAD_DIM = 1 << 14
#: The largest cos/sin table (``cache_len``, ``max_cache_len``): ``2 ** 20`` rows of ``r / 2``
#: pairs, 512 MiB of float32 cos and sin at ``r = 128``; positions past it are computed per call.
MAX_CACHE_LEN = 1 << 20


class RotaryEmbedding(RotaryEncoding):
    """Rotary position embedding of queries and keys, with any Hugging Face scaling.

    Args:
        head_dim: ``d``, even.
        base: ``theta`` of ``f_i = base ** (-2i / r)``.
        scaling: None, or a dict with Hugging Face key names: ``{"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 4096, ...}`` (``type`` is accepted for
            ``rope_type``); types ``linear``, ``ntk``, ``dynamic``, ``yarn``, ``longrope``,
            ``llama3``, ``proportional`` (see :func:`posenc.functional.rope_inv_freq`).
        layout: ``"half"`` (NeoX/LLaMA) or ``"interleaved"`` (GPT-J/GLM).
        rotary_dim: ``r``, the rotated channels (partial rotary; the rest pass through);
            default ``head_dim``. For ``proportional`` it is the number of channels with a
            non-zero frequency, spread over the whole head as Gemma-4 does.
        angle_dtype: dtype of frequencies and angles. float64 (default) keeps angles exact at any
            position (float32 angles drift by ``position * 6e-8`` rad: 0.06 at 1e6); float32
            reproduces transformers bit for bit (:func:`posenc.hf.rope_from_hf` selects it).
        cache_len: rows of the cos/sin table built first (below); it doubles on demand.
        max_cache_len: the rows a table may grow to (at most ``MAX_CACHE_LEN``, ``2 ** 20``:
            1,048,576 positions); later positions are served by a window table (below).
        backend: ``"auto"`` (fused kernel where it applies), ``"torch"`` (reference), ``"triton"`` or
            ``"cpu"`` (that kernel, or an error saying why not); see :func:`apply_rotary_qk`.

    Cache: on the CPU in eager mode, where reading the positions is free, calls are served from
    cos/sin tables (float32, ``[1, N, n]``) built lazily, one per device and frequency set
    (plain; LongRoPE short/long; dynamic NTK within the original length); they depend only on
    those keys and on ``cache_len``, so they are never stale, and the fused kernel gathers their
    rows itself. A table starts with ``N = cache_len`` rows; a call whose largest position
    ``p >= N`` (read on the host, free there) doubles ``N`` until it covers ``p``, keeping the
    rows it had and computing the new ones from the same frequencies, so decoding at any
    position up to ``max_cache_len`` runs at the table's speed (a table of ``2 ** 20`` rows at
    ``r = 128`` is 512 MiB; ``max_cache_len=cache_len`` keeps it at ``cache_len``). Past it,
    ``forward`` and :meth:`cos_sin` read a window of 8192 rows holding the call's positions (a
    decode step moves it every 4096 tokens; :mod:`.table_cache`), indexed by the positions
    minus its start; a call whose positions span 4096 or more there, and dynamic NTK beyond its
    original length (its frequencies change with every length), compute cos/sin for the call.
    Elsewhere (a GPU, torch.compile, CUDA-graph capture) no position is read back to the host:
    cos/sin are computed on the device for the call's positions, from frequencies copied to the
    device once, and the length-dependent types choose theirs with a ``where`` on the device.

    Dynamic NTK follows transformers: the frequencies for a call are those of its length
    ``max(position) + 1`` when it exceeds ``original_max_position_embeddings``, and the original
    ones otherwise. Unlike transformers it keeps no history: a call after a longer one uses its
    own length (transformers keeps the longer length's frequencies until the length drops below
    the original). During decoding the length only grows, and both agree.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        scaling: Mapping[str, Any] | None = None,
        layout: str = "half",
        rotary_dim: int | None = None,
        *,
        angle_dtype: torch.dtype | str = torch.float64,
        cache_len: int = 4096,
        max_cache_len: int = MAX_CACHE_LEN,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_even("head_dim", head_dim, "RoPE")
        check_int_at_most("head_dim", head_dim, MAX_HEAD_DIM, "the channels of one head")
        check_choice("layout", layout, ROTARY_LAYOUTS)
        check_choice("backend", backend, ROTARY_BACKENDS)
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_even("rotary_dim", rotary_dim, "RoPE")
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
        self.head_dim, self.layout, self.rotary_dim = head_dim, layout, rotary_dim
        self.base = check_base(base)
        self.scaling = normalize_scaling(scaling)
        self.rope_type = "default" if self.scaling is None else self.scaling["rope_type"]
        self.spec = ROPE_SCALING[self.rope_type]
        self.angle_dtype = resolve_angle_dtype(angle_dtype)
        self.cache_len = check_int_at_most(
            "cache_len", cache_len, MAX_CACHE_LEN,
            "rows of the cached cos/sin table; later positions are computed per call",
        )  # fmt: skip
        self.max_cache_len = check_int_at_most(
            "max_cache_len", max_cache_len, MAX_CACHE_LEN,
            "rows a cached cos/sin table may grow to; later positions are computed per call",
        )  # fmt: skip
        self.backend = backend
        self.interleaved = layout == "interleaved"
        # The pair layout the kernels read (a subclass may give ``interleaved`` another meaning:
        # MRoPE's is Qwen's sections flag).
        self._interleaved_pairs = self.interleaved
        # Channels the rotation touches: proportional spreads its r/2 frequencies over the head.
        self.span = head_dim if self.rope_type == "proportional" else rotary_dim
        self._sets: dict[str, tuple[torch.Tensor, float]] = {}
        self._tables: dict[tuple[torch.device, str], tuple[torch.Tensor, torch.Tensor, int]] = (
            TableCache()
        )
        self._windows = Windows()  # tables and plans past max_cache_len
        self._on_device: dict[tuple[torch.device, str], torch.Tensor] = {}
        self._backends: dict[tuple[str, torch.dtype, torch.dtype], str] = {}
        # Decode plans (forward): for this class's own steps only, not a subclass's.
        own = ("check_inputs", "resolve_positions", "tables", "apply_tables")
        cls = type(self)
        same = all(getattr(cls, n) is getattr(RotaryEmbedding, n) for n in own)
        self._plans: dict[tuple, DirectPlan] | None = Plans() if same else None
        self.reset_parameters()

    def __setstate__(self, state: dict) -> None:
        # A module pickled before the tables grew: no window, no cap, tables of another form.
        super().__setstate__(state)
        self.__dict__.setdefault("max_cache_len", MAX_CACHE_LEN)
        self.__dict__.setdefault("_windows", Windows())
        if not isinstance(self._tables, TableCache):
            self._tables = TableCache()

    def reset_parameters(self) -> None:
        """Compute the frequency sets and empty the caches (no learned weights here).

        Frequencies live on the CPU as plain attributes, not buffers: ``module.to(bfloat16)``
        would round a floating buffer (the classic inv_freq bug), and they are computed on the
        CPU even under ``with torch.device("meta")``, so a meta-built module has them exact
        (:mod:`posenc.deferred`). Copies per device are cached.
        """
        with torch.device("cpu"):
            sets = {
                "base": rope_inv_freq(
                    self.rotary_dim, self.base, self.scaling, self.head_dim, dtype=self.angle_dtype
                )
            }
            self._sets = sets
            if self.rope_type == "longrope":
                sets["long"] = self._compute(self._original_len() + 1)
        self.attention_factor = sets["base"][1]
        self._tables.clear()
        self._windows.clear()
        self._on_device.clear()
        self._backends.clear()
        if self._plans is not None:
            self._plans.clear()

    # --- frequencies ---------------------------------------------------------------------------

    def _compute(
        self, seq_len: int | torch.Tensor | None, device: Any = None
    ) -> tuple[torch.Tensor, float]:
        # The arguments were checked by the first call (rope_inv_freq in __init__).
        ctx = Ctx(self.base, self.rotary_dim, self.head_dim, seq_len, self.angle_dtype, device)
        return scaled_inv_freq(self.spec, self.scaling, ctx)

    def _original_len(self) -> int:
        assert self.scaling is not None
        return int(self.scaling["original_max_position_embeddings"])

    def _freq_key(self, seq_len: int) -> str:
        """Which frequency set serves a call of length ``seq_len`` (``"grown"``: not cacheable)."""
        if self.rope_type == "dynamic" and seq_len > self._original_len():
            return "grown"
        if self.rope_type == "longrope" and longrope_is_long(seq_len, self._original_len()):
            return "long"
        return "base"

    def frequencies(self, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """``(inv_freq [n], attention_factor)`` in effect for a call of length ``seq_len``.

        ``inv_freq`` is on the CPU, in ``angle_dtype``; ``n = span / 2``.
        """
        key = "base" if seq_len is None else self._freq_key(seq_len)
        return self._compute(seq_len) if key == "grown" else self._sets[key]

    def _inv_freq_on(self, device: torch.device, key: str = "base") -> torch.Tensor:
        """A frequency set on ``device``, copied there once (a copy per call would be a
        host-to-device transfer on every step, which CUDA-graph capture forbids)."""
        if torch.compiler.is_compiling():
            # Rebuilt in the graph from Python ints (a few fused ops): a stored tensor would be
            # a graph input whose size Dynamo may tie to a sequence length and recompile on.
            return self._compute(self._original_len() + 1 if key == "long" else None, device)[0]
        entry = self._on_device.get((device, key))
        if entry is None:
            entry = self._on_device[(device, key)] = self._sets[key][0].to(device)
        return entry

    def _traced_frequencies(
        self, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """The frequencies of a call whose positions cannot be read on the host (an accelerator,
        torch.compile): the length-dependent types choose on the device from a 0-d length."""
        device = positions.device
        if not self.spec.length_dependent or positions.numel() + k_positions.numel() == 0:
            return self._inv_freq_on(device), self.attention_factor
        tops = [p.max() for p in (positions, k_positions) if p.numel()]
        top = tops[0] if len(tops) == 1 else torch.maximum(*tops)  # 0-d, stays on the device
        if self.rope_type == "longrope":  # the same attention factor for both sets
            long, short = self._inv_freq_on(device, "long"), self._inv_freq_on(device)
            is_long = longrope_is_long(top + 1, self._original_len())
            return torch.where(is_long, long, short), self.attention_factor
        return self._compute(top + 1, device)  # dynamic NTK: a where() over both bases

    # --- cos/sin -------------------------------------------------------------------------------

    def covers(self, top: int) -> bool:
        """Whether a table serves position ``top`` (``< max(cache_len, max_cache_len)``)."""
        return top < max(self.cache_len, self.max_cache_len)

    def _table(
        self, device: torch.device, key: str, top: int = -1
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached ``[1, N, n]`` float32 cos/sin table of a frequency set on a device (the
        kernels' canonical table form) with a row for position ``top``; None where ``top`` lies
        past the largest table (:meth:`covers`).

        ``N`` starts at ``cache_len`` and doubles until it covers ``top``. ``top`` is a host
        integer: callers read it where that is free (eager, CPU positions), so the table never
        grows inside a traced or captured region (those compute cos/sin per call)."""
        if not self.covers(top):
            return None
        entry = self._tables.get((device, key))
        if entry is not None and entry[2] != self.cache_len:  # cache_len was set: start again
            entry = None
        if entry is None or entry[0].shape[1] <= top:
            rows = table_rows(self.cache_len, max(self.cache_len, self.max_cache_len), top)
            inv_freq, factor = self._sets[key]
            keep = None if entry is None else (entry[0], entry[1])
            cos, sin = fill(inv_freq.to(device), factor, rows, keep=keep)
            old = self._tables.get((device, key))
            entry = self._tables[(device, key)] = (cos, sin, self.cache_len)
            if old is not None and self._plans is not None:
                self._plans.clear()  # they hold the old table: keep them from keeping it alive
        return entry[0], entry[1]

    def _far_and_few(self, device: torch.device, key: str, top: int, count: int) -> bool:
        """Whether :meth:`cos_sin`'s ``count`` positions up to ``top`` lie so far past the table
        (twice its rows or more) that growing it would fill over 64 rows for each: they are
        computed for the call instead (7 positions up to 1e6: 0.4 ms, against 1.5 s and 512 MiB
        of table at r = 128). Positions a call walks up to (a prefill, decode steps) grow the
        table as before; ``forward``'s tables are not this method's."""
        entry = self._tables.get((device, key))
        rows = entry[0].shape[1] if entry is not None else self.cache_len
        return top >= 2 * rows and 64 * count < top - rows

    def _window(
        self, device: torch.device, key: str, low: int, high: int
    ) -> tuple[torch.Tensor, torch.Tensor, int] | None:
        """``(cos, sin, start)``: the window of a frequency set holding positions ``low ..
        high`` past the largest table (:mod:`.table_cache`); None where they span too much."""
        return self._windows.table(device, key, *self._sets[key], low, high)

    def _backend_for(self, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor) -> str:
        """The backend this module's calls on q's and k's device and dtypes run, chosen (and
        checked) once: its tables are float32 and never need gradients, so nothing else decides."""
        key = (q.device.type, q.dtype, k.dtype)
        chosen = self._backends.get(key)
        if chosen is None:
            chosen = self._backends[key] = mixed_backend(self.backend, q, k) or select_backend(
                self.backend, q, (table,)
            )
        return chosen

    def cos_sin(
        self, positions: torch.Tensor, seq_len: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``cos``, ``sin`` (attention factor included) of integer ``positions``.

        Shapes: ``positions [*]`` -> ``[*, n]``. ``seq_len`` (default ``max(positions) + 1``)
        selects the frequencies of the length-dependent types (dynamic NTK, LongRoPE).
        """
        if not isinstance(positions, torch.Tensor) or not host_readable(positions):
            positions = check_positions(positions)
            inv_freq, factor = self._traced_frequencies(positions, positions)
            return rope_cos_sin(positions, inv_freq, factor)
        # Eager CPU: one read of the range checks the values and sizes the table (free here).
        positions = check_positions(positions, allow_negative=True)
        top = position_range(positions, positions)
        seq_len = top + 1 if seq_len is None else seq_len
        key = self._freq_key(seq_len)
        if key != "grown" and self._far_and_few(positions.device, key, top, positions.numel()):
            return rope_cos_sin(positions, *self.frequencies(seq_len))
        table = None if key == "grown" else self._table(positions.device, key, top)
        if table is not None:
            cos, sin = table  # [1, N, n], N > top
            return cos[0][positions], sin[0][positions]  # [*, n]
        low, high = value_span(positions)
        window = None if key == "grown" else self._window(positions.device, key, low, high)
        if window is not None:  # past the largest table: rows of a window of positions
            cos, sin, start = window  # [1, WINDOW_ROWS, n]: positions start ..
            rows = positions - start
            return cos[0][rows], sin[0][rows]  # [*, n]
        inv_freq, factor = self.frequencies(seq_len)
        return rope_cos_sin(positions, inv_freq, factor)

    # --- decode plans: the hooks of RotaryEncoding's stanza, a plan per layout -------------

    def planned(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: Positions
    ) -> tuple[tuple | None, QK | None]:
        """A call of a layout seen before (shapes, strides, dtypes, device passed the checks
        then): its plan on the table, or past the largest table one on a window
        (:class:`.table_cache.Windows`; tried first while the calls run there). The kernel
        checks the positions index the cached table (those past it take the checked path); the
        length-dependent types read their range to pick the frequencies."""
        if self._plans is None:
            return None, None
        options = (self.span, self._interleaved_pairs, self.backend)
        key, plan = self.plan_lookup(q, k, positions, k_positions, *options)
        if key is None:
            return None, None
        windows = self._windows
        if windows.hot:
            out = windows.run(key, q, k, positions, k_positions)
            if out is not None:
                return key, out
            windows.hot = False
        out = None if plan is None else self._run_plan(plan, q, k, positions, k_positions)
        if out is None:
            out = windows.run(key, q, k, positions, k_positions, rope=self)
            windows.hot = out is not None
        return key, out

    def _run_plan(
        self,
        plan: DirectPlan,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A planned step, or None where its positions need the checked path (dynamic NTK past
        the original length, positions past the cached table, which the kernel finds)."""
        tables = plan.tables  # the table of a fixed frequency set, kept with the plan
        if tables is None:  # dynamic NTK and LongRoPE: the set follows the length
            top = position_range(positions, positions if k_positions is None else k_positions)
            key = self._freq_key(top + 1)
            if key == "grown":
                return None
            tables = self._table(q.device, key, top)  # [1, N, n], N > top
            if tables is None:
                return None
        elif plan.table_len != self.cache_len:  # set since: the checked path plans again
            return None
        try:
            return plan.run(q, k, *tables, None, None, positions, k_positions)
        except OutsideTable:  # past the plan's table: the checked path grows it (or computes)
            return None

    def _plan_of(self, call: CheckedCall) -> DirectPlan | None:
        """The plan of a checked call that the CPU kernel ran directly (no gradient) on the
        rows of a cached table (:func:`.table_cache.table_plan`); None where none applies."""
        q, k = call.q, call.k
        chosen = self._backends.get((q.device.type, q.dtype, k.dtype))
        return table_plan(chosen, call, self.span, self._interleaved_pairs)

    def keep_plan(self, key: tuple, call: CheckedCall) -> None:
        """Keep the plan of a checked call served from the cached table, for the next call of
        its layout."""
        if call.tables.pq is None:  # computed per call: no table to plan on
            return
        assert self._plans is not None
        plan = self._plan_of(call)
        if plan is not None and not self.spec.length_dependent:
            plan.tables = (call.tables.cos_q, call.tables.sin_q)  # every length: the one "base" set
            plan.table_len = self.cache_len
        remember(self._plans, key, plan, limit=64)

    # --- the two steps of the stanza -----------------------------------------------------------

    def checks_position_values(self, q: torch.Tensor) -> bool:
        # Eager on the CPU the positions' range is read (free there) to pick the table, which
        # checks them too.
        return not host_readable(q)

    def tables(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> RopeTables:
        """cos/sin of a call: rows of the cached table with the positions that index them (eager
        CPU, positions read there for free; the kernels gather the rows themselves), or computed
        for the call's positions on the device (an accelerator, torch.compile, CUDA-graph
        capture: nothing read back to the host)."""
        if host_readable(q) and positions.device.type == "cpu" and k_positions.device.type == "cpu":
            top = position_range(positions, k_positions)
            key = self._freq_key(top + 1)
            table = None if key == "grown" else self._table(q.device, key, top)
            if table is not None:
                cos, sin = table  # [1, N, n], N > top
                return RopeTables(cos, sin, cos, sin, *table_rows_of(positions, k_positions))
            inv_freq, factor = self.frequencies(top + 1)
            inv_freq = inv_freq.to(q.device)
        else:
            inv_freq, factor = self._traced_frequencies(positions, k_positions)
        # Checked already: the unchecked core (one validation per call).
        cos_q, sin_q = _batched(angles_cos_sin(positions[..., None], inv_freq, factor))
        cos_k, sin_k = (
            (cos_q, sin_q)
            if k_positions is positions
            else _batched(angles_cos_sin(k_positions[..., None], inv_freq, factor))
        )  # [1 or b, s, n], [1 or b, t, n]
        return RopeTables(cos_q, sin_q, cos_k, sin_k, None, None)

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: RopeTables
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [b, h, s, d]``, ``k [b, hk, t, d]`` with :meth:`tables`' cos/sin: table rows
        gathered by the kernel itself, or per-token cos/sin."""
        q, k = unit_last(q), unit_last(k)
        cos_q, sin_q, cos_k, sin_k, pq, pk = tables
        args = RopeArgs(
            q, k, cos_q, sin_q, cos_k, sin_k, pq, pk, self.span, self._interleaved_pairs
        )
        if pq is not None:
            return rope_qk_canonical(args, self._backend_for(q, k, cos_q), checked=True)
        return rope_qk_canonical(args, self.backend)

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> RotaryEmbedding:
        """A copy with the same head_dim, base, layout, rotary_dim and options, but ``scaling``.

        Rescales a trained model at inference, e.g. YaRN with ``factor = eval_len / train_len``
        and ``original_max_position_embeddings = train_len``.
        """
        return RotaryEmbedding(
            self.head_dim,
            self.base,
            scaling,
            self.layout,
            self.rotary_dim,
            angle_dtype=self.angle_dtype,
            cache_len=self.cache_len,
            max_cache_len=self.max_cache_len,
            backend=self.backend,
        )

    def extra_repr(self) -> str:
        scaling = "" if self.scaling is None else f", scaling={self.scaling}"
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"layout={self.layout!r}{scaling}, angle_dtype={self.angle_dtype}"
        )


def _batched(cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cos/sin ``[s, n]`` or ``[b, s, n]`` as the kernels' ``[1 or b, s, n]``."""
    cos, sin = cos_sin
    return (cos[None], sin[None]) if cos.dim() == 2 else (cos, sin)
