"""Multimodal RoPE (M-RoPE) of Qwen2-VL, Qwen3-VL and ERNIE-4.5-VL, and the positions it reads.

A token carries three positions (temporal, height, width). The ``head_dim / 2`` rotated pairs are
split into three groups by ``mrope_section``; each group turns with its own axis's position::

    Qwen2-VL  contiguous sections, e.g. [2, 1, 1] over 4 pairs:   [T T H W]
    Qwen3-VL  interleaved sections, e.g. [2, 1, 1] over 4 pairs:  [T H W T]
    ERNIE-4.5-VL  (H, W, T) sections, e.g. [2, 2, 1] over 5 pairs:  [H W H W T]

Text tokens have the same position on all three axes, so on text M-RoPE is plain RoPE. Pairs
are laid out "half" (x[i] with x[i + r/2]), as in both models.

Partial rotary (Qwen3.5, ``partial_rotary_factor=0.25``): only the first ``r = rotary_dim``
channels turn, and the sections cover their ``r / 2`` pairs; the other ``d - r`` channels pass
through::

    d = 8, r = 4, mrope_section [1, 1, 0] (interleaved):   [x0 x1 | x2 x3] x4 x5 x6 x7
                                                             T  H    T  H   (unrotated)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._checks import check_positions, check_positive_int, host_readable
from ..functional.rotary import (
    apply_rotary_qk,
    mrope_allocation,
    mrope_axis_index,
    mrope_cos_sin,
)
from ..kernels.rope_op import Plans
from .base import QK, CheckedCall, Positions, RotaryEncoding
from .embedding import RotaryEmbedding, max_position, position_range, resolve_qk_positions

Segment = tuple[str, Any] | tuple[str, Any, float]


class MRoPE(RotaryEmbedding):
    """Multimodal rotary embedding (Qwen2-VL ``mrope_section``; Qwen3-VL ``interleaved``).

    Args:
        head_dim: ``d``.
        mrope_section: pairs per axis (temporal, height, width), e.g. ``[16, 24, 24]``;
            ``sum(mrope_section)`` must equal ``rotary_dim / 2``.
        base, scaling, angle_dtype, backend: as for :class:`RotaryEmbedding` (frequencies are
            shared by the three axes).
        interleaved: how the sections assign pairs to axes (see
            :data:`posenc.functional.rotary.MROPE_ALLOCATIONS`): False (``"contiguous"``,
            Qwen2-VL ``T.. H.. W..``), True (``"interleaved"``, Qwen3-VL ``T H W T H W ... T T``)
            or ``"hw_alternating"`` (ERNIE-4.5-VL, sections (H, W, T): ``H W H W ... T T``).
        rotary_dim: ``r``, the rotated channels (default ``head_dim``); Qwen3.5 rotates a quarter
            of the head (``partial_rotary_factor``).
        layout: the channel pairs, as for :class:`RotaryEmbedding`: ``"half"`` (Qwen) or
            ``"interleaved"`` (GLM-4V, HunYuan-V4-VL: ``x[2i], x[2i+1]``). The sections assign
            pairs to axes whatever the layout: pair ``i`` takes the angle of its axis.
    """

    def __init__(
        self,
        head_dim: int,
        mrope_section: Sequence[int],
        base: float = 10000.0,
        scaling: Mapping[str, Any] | None = None,
        interleaved: bool | str = False,
        *,
        rotary_dim: int | None = None,
        angle_dtype: torch.dtype | str = torch.float64,
        backend: str = "auto",
        layout: str = "half",
    ) -> None:
        super().__init__(
            head_dim, base, scaling, layout, rotary_dim, angle_dtype=angle_dtype, backend=backend
        )
        self.mrope_section = tuple(mrope_section)
        #: the allocation's name (posenc.functional.rotary.MROPE_ALLOCATIONS)
        self.allocation = mrope_allocation(
            interleaved if isinstance(interleaved, str) else bool(interleaved)
        )
        # Qwen's flag (sections interleaved), kept for readers of Qwen configs; the pair layout
        # is ``layout``
        self.interleaved = self.allocation == "interleaved"
        # Text positions ([s] or [b, s]) are the same on every axis, where M-RoPE is RoPE: a
        # decode step of a layout seen before runs RotaryEmbedding's plan on its cached table.
        # For MRoPE's own steps only, not a subclass's that replaces one.
        own = ("check_inputs", "resolve_positions", "tables", "apply_tables")
        same = all(getattr(type(self), n) is getattr(MRoPE, n) for n in own)
        self._plans = Plans() if same else None
        axis = mrope_axis_index(self.mrope_section, self.allocation)  # validates the sections
        if axis.shape[0] != self.span // 2:
            raise ValueError(
                f"sum(mrope_section) must equal rotary_dim / 2 = {self.span // 2} (rotary_dim "
                f"{self.span} of head_dim {self.head_dim}), got {sum(self.mrope_section)} for "
                f"mrope_section={list(self.mrope_section)}"
            )

    @staticmethod
    def _as_3d(p: torch.Tensor, name: str, b: int, n: int, device: torch.device) -> torch.Tensor:
        """``[n]``/``[b, n]`` text positions -> ``[3, n]``/``[3, b, n]``; ``[3, b, n]`` checked
        (integer, on q's ``device``)."""
        p = check_positions(p, name, ranks=(1, 2, 3), device=device)
        if p.dim() < 3:
            if p.shape[-1] != n or (p.dim() == 2 and p.shape[0] not in (1, b)):
                raise ValueError(
                    f"{name} must be [{n}], [{b}, {n}] or [3, {b}, {n}], got {list(p.shape)}"
                )
            return p.unsqueeze(0).expand(3, *p.shape)  # [3, n] or [3, b, n]: same on every axis
        if p.shape[0] != 3 or p.shape[1] not in (1, b) or p.shape[2] != n:
            raise ValueError(
                f"{name} must be [{n}], [{b}, {n}] or [3, {b}, {n}], got {list(p.shape)}"
            )
        return p

    # --- forward: RotaryEncoding's stanza; positions may be [3, b, s] ------------------------
    # Text positions of a layout that passed the checks before take RotaryEmbedding's decode
    # plan (the same angles); [3, b, s] ones always the checked path.

    def planned(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: Positions
    ) -> tuple[tuple | None, QK | None]:
        """RotaryEmbedding's plan on its table for text positions ``[s]``/``[b, s]`` (no
        windows); ``(None, None)`` for others."""
        if (
            self._plans is None
            or not isinstance(positions, torch.Tensor)
            or positions.dim() > 2
            or _rank(k_positions) > 2
        ):
            return None, None
        options = (self.span, self._interleaved_pairs, self.backend)
        key, plan = self.plan_lookup(q, k, positions, k_positions, *options)
        return key, None if plan is None else self._run_plan(plan, q, k, positions, k_positions)

    def keep_plan(self, key: tuple, call: CheckedCall) -> None:
        """After a checked call with text positions: the plan RotaryEmbedding's table path
        makes for it, where that path applies (eager CPU without gradients, positions inside
        the table); nothing is computed for a call that cannot have a plan."""
        q, k, positions, k_positions = call.q, call.k, call.positions, call.k_positions
        needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
        kp = positions if k_positions is None else k_positions
        if needs_grad or not (host_readable(q) and positions.is_cpu and kp.is_cpu):
            return
        top = position_range(positions, kp)
        if not self.covers(top) or self._freq_key(top + 1) == "grown":
            return
        pos, k_pos = resolve_qk_positions(q, k, positions, k_positions)
        tables = RotaryEmbedding.tables(self, q, k, pos, k_pos)
        if tables.pq is not None:
            self._backend_for(q, k, tables.cos_q)
            RotaryEmbedding.keep_plan(self, key, call._replace(tables=tables))

    # Attention's hook runs forward per layer (the context's positions are checked there).
    prepare = RotaryEncoding.prepare_by_forward

    def resolve_positions(
        self, q: torch.Tensor, k: torch.Tensor, positions: Positions, k_positions: Positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(temporal, height, width) positions ``[3, (b,) s]`` and ``[3, (b,) t]``: Hugging Face
        ``position_ids [3, b, s]`` of Qwen2-VL, or text-only ``[s]``/``[b, s]`` (the same on
        every axis); ``k_positions`` defaults to ``positions`` when ``s == t``."""
        b, s, t = q.shape[0], q.shape[2], k.shape[2]
        if _rank(positions) < 3 and _rank(k_positions) < 3:
            positions, k_positions = resolve_qk_positions(q, k, positions, k_positions)
        elif positions is None or (k_positions is None and t != s):
            raise ValueError(
                "with [3, b, s] positions, pass both positions and k_positions (or s == t)"
            )
        pos3 = self._as_3d(positions, "positions", b, s, q.device)
        kpos3 = (
            pos3
            if k_positions is None or k_positions is positions
            else self._as_3d(k_positions, "k_positions", b, t, q.device)
        )
        return pos3, kpos3

    def tables(  # type: ignore[override]
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos/sin ``[(b,) s, n]`` and ``[(b,) t, n]`` of :meth:`resolve_positions`' positions."""
        if host_readable(positions) and host_readable(k_positions):  # eager CPU: reading is free
            inv_freq, factor = self.frequencies(max_position(positions, k_positions) + 1)
        else:  # an accelerator or torch.compile: frequencies chosen on the device
            inv_freq, factor = self._traced_frequencies(positions, k_positions)
        cos_q, sin_q = mrope_cos_sin(
            positions, inv_freq, self.mrope_section, self.allocation, factor
        )  # [(b,) s, n]
        if k_positions is positions:
            return cos_q, sin_q, cos_q, sin_q
        cos_k, sin_k = mrope_cos_sin(
            k_positions, inv_freq, self.mrope_section, self.allocation, factor
        )
        return cos_q, sin_q, cos_k, sin_k

    def apply_tables(  # type: ignore[override]
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [b, h, s, d]``, ``k [b, hk, t, d]`` with :meth:`tables`' cos/sin; the pairs
        as ``layout`` says (``self.interleaved`` is Qwen's sections flag here)."""
        cos_q, sin_q, cos_k, sin_k = tables
        return apply_rotary_qk(
            q, k, cos_q, sin_q, cos_k, sin_k, self.layout, self.span, backend=self.backend
        )

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> MRoPE:
        """A new :class:`MRoPE` with the same sections and options and another ``scaling``."""
        return MRoPE(
            self.head_dim,
            self.mrope_section,
            self.base,
            scaling,
            self.allocation,
            rotary_dim=self.rotary_dim,
            angle_dtype=self.angle_dtype,
            backend=self.backend,
            layout=self.layout,
        )

    def extra_repr(self) -> str:
        sections = list(self.mrope_section)
        return f"{super().extra_repr()}, mrope_section={sections}, allocation={self.allocation!r}"


def _rank(p: object) -> int:
    """The rank of a position tensor; 0 for None or a non-tensor (whose check then says why)."""
    return p.dim() if isinstance(p, torch.Tensor) else 0


def mrope_positions(
    segments: Sequence[Segment],
    spatial_merge_size: int = 1,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """M-RoPE positions ``[3, s]`` of a sequence of text, image and video segments.

    ``segments``: ``("text", n)``, ``("image", (t, h, w))`` or ``("video", (t, h, w))`` with the
    patch grid before spatial merging, optionally a third item ``time_interval`` (Qwen2.5-VL:
    ``tokens_per_second * seconds_per_grid_t``) scaling the temporal index. Rules (transformers'
    ``get_rope_index`` of Qwen2-VL/Qwen2.5-VL/Qwen3-VL)::

        text    T = H = W = p, p + 1, ...            (continuing from the running position p)
        vision  T = p + floor(i_t * time_interval), H = p + i_h, W = p + i_w over the merged
                grid (t, h / m, w / m) in (t, h, w) order; then p += max(h, w) // m

    Qwen3-VL separates video frames with timestamp text: pass each frame as its own ``(1, h, w)``
    segment. (transformers 4.x continued text after the largest position of a vision block,
    which differs from the rule above only for videos with more frames than rows and columns.)
    """
    m = check_positive_int("spatial_merge_size", spatial_merge_size)
    parts: list[torch.Tensor] = []
    current = 0
    for seg in segments:
        if not isinstance(seg, tuple) or len(seg) not in (2, 3):
            raise ValueError(
                f"each segment must be (kind, size) or (kind, size, time_interval), got {seg!r}"
            )
        kind, size = seg[0], seg[1]
        if kind == "text":
            n = check_positive_int("text segment length", size)
            parts.append(torch.arange(current, current + n, device=device).expand(3, n))  # [3, n]
            current += n
        elif kind in ("image", "video"):
            block, current = _vision_segment(seg, m, current, device)
            parts.append(block)
        else:
            raise ValueError(f"segment kind must be 'text', 'image' or 'video', got {kind!r}")
    if not parts:
        return torch.zeros(3, 0, dtype=torch.long, device=device)
    return torch.cat(parts, dim=1)  # [3, s]


def _vision_segment(
    seg: Segment, m: int, current: int, device: torch.device | str | None
) -> tuple[torch.Tensor, int]:
    """An image or video segment's positions ``[3, t*h*w/m^2]`` in (t, h, w) order from the
    running position ``current``, and the running position after it."""
    kind, size = seg[0], seg[1]
    if not isinstance(size, (tuple, list)) or len(size) != 3:
        raise ValueError(f"an {kind} segment needs a (t, h, w) grid, got {size!r}")
    t, h, w = (check_positive_int(f"{kind} grid {a}", v) for a, v in zip("thw", size, strict=True))
    if h % m or w % m:
        raise ValueError(f"{kind} grid h, w ({h}, {w}) must be divisible by spatial_merge_size {m}")
    interval = seg[2] if len(seg) == 3 else 1.0
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not (math.isfinite(interval) and interval > 0)
    ):
        raise ValueError(
            f"a {kind} segment's time_interval must be a finite number > 0 (temporal "
            f"positions per frame), got {interval!r}"
        )
    temporal = (torch.arange(t, device=device) * interval).long() + current  # [t]
    rows = torch.arange(h // m, device=device) + current  # [h/m]
    cols = torch.arange(w // m, device=device) + current  # [w/m]
    grid = torch.meshgrid(temporal, rows, cols, indexing="ij")  # 3 x [t, h/m, w/m]
    return torch.stack(grid).reshape(3, -1), current + max(h, w) // m  # [3, t*h*w/m^2]
