"""xPos (Sun et al., 2022, "A Length-Extrapolatable Transformer"): RoPE with an exponential decay.

Pair ``i`` of a query at position ``n`` is rotated by ``n f_i`` and scaled by ``zeta_i ** (n / B)``;
pair ``i`` of a key at position ``m`` is rotated by ``m f_i`` and scaled by ``zeta_i ** (-m / B)``,
with ``zeta_i = (2i / d + gamma) / (1 + gamma)`` (``gamma = 0.4``) and ``B = scale_base = 512``.
The score then carries ``zeta_i ** ((n - m) / B)``: a decay in the distance only, which keeps
RoPE's relative property (torchscale's ``XPOS``).

Folding the scale into the tables (``cos * zeta**e``, ``sin * zeta**e``, one scale per pair)
makes xPos one more caller of the common rotation path, with different tables for q and k.

The scales grow like ``zeta_min ** (-|p - center| / B)`` with ``zeta_min = gamma / (1 + gamma)``:
one side's scale overflows and the other's underflows once ``|p - center|`` passes ``~34_500``
positions in float32 and bf16 (``~2_800`` in float16, for the default ``B`` and ``gamma``), where
no float can hold them: such positions are an error (:meth:`XPos.max_offset` gives the limit)
rather than a wrong score. ``center`` is fixed, so cached keys stay valid: set it near the
middle of the positions in use (the registry takes half the model's ``max_len``). Offsets
``p - center`` are exact int64, whatever the positions.
"""

from __future__ import annotations

import math

import torch

from .._checks import (
    check_choice,
    check_even,
    check_number,
    check_positions,
    check_values,
    host_readable,
)
from .._constants import DeviceConstants
from ..functional.rotary import ROTARY_BACKENDS, ROTARY_LAYOUTS, apply_rotary_qk, rope_inv_freq
from ..kernels.rope_op import (
    DirectPlan,
    OutsideTable,
    Plans,
    mixed_backend,
    remember,
    select_backend,
)
from .base import QK, CheckedCall, Positions, RotaryEncoding, check_qk, position_range
from .embedding import resolve_angle_dtype
from .table_cache import RopeTables, table_plan, table_rows_of

#: Rows of the cached scaled tables (positions 0 .. TABLE_ROWS - 1) that eager CPU calls read.
TABLE_ROWS = 4096


# Cached scaled tables (cos_q, sin_q, cos_k, sin_k), [1, n, d/2] each.
_Table = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def xpos_zeta(
    head_dim: int, gamma: float = 0.4, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Per-pair decay bases ``zeta_i = (2i + gamma d) / ((1 + gamma) d)``, ``[d/2]``."""
    check_even("head_dim", head_dim, "xPos")
    return (torch.arange(0, head_dim, 2, dtype=dtype) + gamma * head_dim) / ((1 + gamma) * head_dim)


class XPos(RotaryEncoding):
    """xPos: RoPE whose queries are scaled by ``zeta ** (n / B)`` and keys by ``zeta ** (-m / B)``.

    Args:
        head_dim: ``d``, even.
        base: RoPE frequency base.
        scale_base: ``B`` (512 in the paper).
        gamma: ``zeta_i = (2i/d + gamma) / (1 + gamma)`` (0.4 in the paper).
        layout: ``"interleaved"`` (torchscale's, default) or ``"half"``.
        center: position whose scale is 1 (module docstring: overflow).
        angle_dtype: float64 (default) or float32 for the angles; scales are computed in float64.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        layout: str = "interleaved",
        center: int = 0,
        *,
        angle_dtype: torch.dtype | str = torch.float64,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_even("head_dim", head_dim, "xPos")
        check_choice("layout", layout, ROTARY_LAYOUTS)
        check_choice("backend", backend, ROTARY_BACKENDS)
        scale_base = check_number("scale_base", scale_base, low=0.0, low_open=True)
        gamma = check_number("gamma", gamma, low=0.0, low_open=True)
        if isinstance(center, bool) or not isinstance(center, int):
            raise TypeError(f"center must be an integer position, got {center!r}")
        if not 0 <= center < 2**63:  # positions are int64 >= 0, so p - center never wraps
            raise ValueError(f"center must be a position in [0, 2**63), got {center}")
        base = check_number("base", base, low=1.0, low_open=True)
        self.head_dim, self.base, self.scale_base, self.gamma = head_dim, base, scale_base, gamma
        self.layout, self.center, self.backend = layout, center, backend
        self.angle_dtype = resolve_angle_dtype(angle_dtype)
        # Buffers that move with the module and are never cast (module.to(bfloat16) would round
        # them); not in state_dict.
        self.constants = DeviceConstants(**self._constants())
        # Decode plans (forward), each with the cached tables it reads.
        self._plans: dict[tuple, tuple[DirectPlan, _Table]] = Plans()
        self._tables: dict[tuple[torch.device, int, int, float], _Table] = {}

    def _constants(self) -> dict[str, torch.Tensor]:
        inv_freq, _ = rope_inv_freq(self.head_dim, self.base, dtype=self.angle_dtype)  # [d/2]
        return {"inv_freq": inv_freq, "log_zeta": xpos_zeta(self.head_dim, self.gamma).log()}

    def __setstate__(self, state: dict) -> None:
        # A module pickled before the decode caches existed has neither.
        super().__setstate__(state)
        self.__dict__.setdefault("_plans", Plans())
        self.__dict__.setdefault("_tables", {})

    def reset_parameters(self) -> None:
        """Recompute the frequencies and decay bases (after ``to_empty()``; no learned weights)."""
        self.constants.reset_(**self._constants())
        self._tables.clear()
        self._plans.clear()

    def max_offset(self, dtype: torch.dtype = torch.float32) -> int:
        """The largest ``|p - center|`` whose scales a tensor of ``dtype`` holds (the tables are
        float32 whatever ``dtype``): both ``zeta_min ** (+-offset / B)`` stay normal numbers
        with 4 bits of headroom for the magnitudes of q and k."""
        tiny = max(torch.finfo(dtype).tiny, torch.finfo(torch.float32).tiny)
        log_range = -math.log(tiny) - 4 * math.log(2)  # |log scale| allowed
        log_zeta_min = math.log1p(1 / self.gamma)  # -log zeta_0 = log((1 + gamma) / gamma)
        if log_zeta_min * (2**63 - 1) <= log_range * self.scale_base:
            return 2**63 - 1  # (almost) no decay: every int64 offset is representable
        return math.floor(log_range * self.scale_base / log_zeta_min)

    def cos_sin(
        self, positions: torch.Tensor, downscale: bool = False, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``cos * scale``, ``sin * scale`` with ``scale = zeta ** (+-(p - center) / B)``.

        Shapes: ``positions [*]`` -> ``[*, d/2]``. ``downscale`` (keys) uses the negative exponent.
        ``dtype``: the dtype the scaled tensor is stored in; a position farther from ``center``
        than :meth:`max_offset` allows is a ValueError (on CPU; a device assertion on GPU; under
        ``torch.compile``, where nothing can be raised, its rows are NaN: never a wrong number).
        """
        return self._cos_sin(check_positions(positions), downscale, dtype)

    def _cos_sin(
        self, positions: torch.Tensor, downscale: bool, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`cos_sin` of checked ``positions``."""
        dev = positions.device
        inv_freq = self.constants.get("inv_freq", dev)  # [d/2]
        angles = positions.to(self.angle_dtype)[..., None] * inv_freq  # [*, d/2]
        offset = positions.long() - self.center  # [*] int64: exact (both in [0, 2**63))
        limit = self.max_offset(dtype)
        inside = offset.abs() <= limit  # [*]
        check_values(inside, lambda: self._range_message(positions, limit, dtype))
        exponent = offset.to(torch.float64)[..., None] / self.scale_base  # [*, 1]
        exponent = torch.where(inside[..., None], exponent, math.nan)
        if downscale:
            exponent = -exponent
        scale = torch.exp(self.constants.get("log_zeta", dev) * exponent)  # [*, d/2] float64
        return (angles.cos() * scale).float(), (angles.sin() * scale).float()

    def _range_message(self, positions: torch.Tensor, limit: int, dtype: torch.dtype) -> str:
        far = int((positions.long() - self.center).abs().max())
        return (
            f"positions must lie within {limit} of center={self.center} for xPos in {dtype} "
            f"(scale_base={self.scale_base}, gamma={self.gamma}): past that the scales "
            f"zeta ** (+-(p - center) / scale_base) overflow and underflow; got a position "
            f"{far} away. Set center near the positions in use"
        )

    # --- decode plans: the hooks of RotaryEncoding's stanza, a plan per layout -------------

    def planned(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: Positions
    ) -> tuple[tuple | None, QK | None]:
        """A call of a layout that passed the checks before runs its plan on the cached tables
        (the kernel checks that the positions index them; past them the checked path runs)."""
        options = (self.layout, self.backend, self.center, self.scale_base)
        key, planned = self.plan_lookup(q, k, positions, k_positions, *options)
        if planned is not None:
            plan, table = planned
            try:
                return key, plan.run(q, k, *table, positions, k_positions)
            except OutsideTable:  # past the cached tables: the checked path serves them
                pass
        return key, None

    def keep_plan(self, key: tuple, call: CheckedCall) -> None:
        """Keep the plan of a checked call that the CPU kernel ran on the cached tables (no
        gradient), with those tables, for the next call of its layout."""
        if call.tables.pq is None:  # computed per call: no table to plan on
            return
        q, k, (cq, sq, ck, sk, _, _) = call.q, call.k, call.tables
        chosen = mixed_backend(self.backend, q, k) or select_backend(self.backend, q, (cq,))
        plan = table_plan(chosen, call, self.head_dim, self.layout == "interleaved")
        remember(self._plans, key, None if plan is None else (plan, (cq, sq, ck, sk)), limit=64)

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        check_qk(q, k, self.head_dim)
        mixed_backend(self.backend, q, k)  # a kernel named for mixed dtypes: ValueError

    def tables(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> RopeTables:
        """Scaled cos/sin of the queries (up) and keys (down): per token ``[(b,) s, d/2]`` and
        ``[(b,) t, d/2]``; or, eager on the CPU with every position inside :meth:`_table`'s
        rows, those cached tables ``[1, n, d/2]`` and the positions ``[1 or b, s|t]`` that index
        them (a decode step then costs no exp, cos or sin)."""
        if host_readable(q) and positions.device.type == "cpu" and k_positions.device.type == "cpu":
            table = self._table(q.device, q.dtype, k.dtype)
            if table is not None and position_range(positions, k_positions) < table[0].shape[1]:
                return RopeTables(*table, *table_rows_of(positions, k_positions))
        cos_q, sin_q = self._cos_sin(positions, False, q.dtype)
        cos_k, sin_k = self._cos_sin(k_positions, True, k.dtype)
        return RopeTables(cos_q, sin_q, cos_k, sin_k, None, None)

    def _table(
        self, device: torch.device, q_dtype: torch.dtype, k_dtype: torch.dtype
    ) -> _Table | None:
        """Scaled cos/sin of positions ``0 .. n-1`` for queries and keys, ``[1, n, d/2]`` each,
        with ``n = min(TABLE_ROWS, center + limit + 1)`` (``limit``: the smaller
        :meth:`max_offset` of the two dtypes); None where position 0 is already out of range
        (``center > limit``). Built at first use per device and limit."""
        limit = min(self.max_offset(q_dtype), self.max_offset(k_dtype))
        if self.center > limit:
            return None
        key = (device, limit, self.center, self.scale_base)  # both public, read per call
        table = self._tables.get(key)
        if table is None:
            rows = torch.arange(min(TABLE_ROWS, self.center + limit + 1), device=device)
            cq, sq = self._cos_sin(rows, False, q_dtype)  # [n, d/2] each
            ck, sk = self._cos_sin(rows, True, k_dtype)
            table = self._tables[key] = (cq[None], sq[None], ck[None], sk[None])
        return table

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: RopeTables
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]`` -> ``(q', k')``."""
        cos_q, sin_q, cos_k, sin_k, pq, pk = tables
        return apply_rotary_qk(
            q, k, cos_q, sin_q, cos_k, sin_k, self.layout, self.head_dim, positions=pq,
            k_positions=pk, backend=self.backend,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base}, scale_base={self.scale_base}, "
            f"gamma={self.gamma}, layout={self.layout!r}, center={self.center}"
        )
