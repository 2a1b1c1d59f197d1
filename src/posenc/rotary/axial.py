"""2-D axial RoPE for vision tokens: half the pairs turn with the row, half with the column.

The ``d/2`` pairs are split in two groups of ``d/4``: row pairs then column pairs. Frequencies::

    axis       both axes use a 1-D RoPE of d/2 channels: f_i = base ** (-2i / (d/2)), i < d/4
               (Qwen2-VL and Gemma-4 vision towers, EVA-02/timm)
    alternate  one 1-D RoPE of d channels, f_i = base ** (-2i / d), i < d/2, dealt out in turn:
               rows get f_0 f_2 f_4 ..., columns f_1 f_3 f_5 ... (Pixtral)

Channel arrangement, for ``d = 8`` (``r0 r1`` row angles, ``c0 c1`` column angles)::

    merged  one rotation over the head, row angles first (Qwen2-VL, Pixtral); with the half layout
            pairs (x0, x4) r0, (x1, x5) r1, (x2, x6) c0, (x3, x7) c1
    blocks  rows rotate the first half of the head, columns the second, each as its own RoPE
            (Gemma-4 vision); half layout: (x0, x2) r0, (x1, x3) r1 | (x4, x6) c0, (x5, x7) c1

With the interleaved layout the two arrangements coincide: (x0, x1) r0, (x2, x3) r1, (x4, x5) c0...

Prefix tokens (class token, registers) come first in the sequence and are not rotated.
"""

from __future__ import annotations

import torch

from .._checks import (
    check_choice,
    check_int_in,
    check_number,
    check_positions,
    check_positive_int,
    check_values,
)
from .._constants import DeviceConstants
from ..functional.rotary import ROTARY_BACKENDS, ROTARY_LAYOUTS, apply_rotary_qk, rope_inv_freq
from .base import RotaryEncoding, check_qk
from .embedding import resolve_angle_dtype

AXIAL_FREQUENCIES = ("axis", "alternate")
AXIAL_ARRANGEMENTS = ("merged", "blocks")


def axial_inv_freq(
    head_dim: int,
    base: float = 10000.0,
    frequencies: str = "axis",
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column frequencies ``([d/4], [d/4])`` of a 2-D axial RoPE (module docstring)."""
    check_choice("frequencies", frequencies, AXIAL_FREQUENCIES)
    if head_dim % 4:
        raise ValueError(f"head_dim must be divisible by 4 for 2-D axial RoPE, got {head_dim}")
    if frequencies == "axis":
        f, _ = rope_inv_freq(head_dim // 2, base, dtype=dtype)  # [d/4]
        return f, f
    f, _ = rope_inv_freq(head_dim, base, dtype=dtype)  # [d/2]: f0 f1 f2 ...
    return f[0::2], f[1::2]  # rows f0 f2 ..., columns f1 f3 ...


def grid_coords(grid_h: int, grid_w: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Row-major (row, column) coordinates of a ``grid_h x grid_w`` patch grid: ``[h*w, 2]``."""
    rows = torch.arange(check_positive_int("grid_h", grid_h), device=device)
    cols = torch.arange(check_positive_int("grid_w", grid_w), device=device)
    r, c = torch.meshgrid(rows, cols, indexing="ij")  # [h, w] each
    return torch.stack((r.flatten(), c.flatten()), dim=-1)  # [h*w, 2]


class Axial2DRoPE(RotaryEncoding):
    """2-D axial rotary embedding of patch tokens (module docstring for the variants).

    Args:
        head_dim: ``d``, divisible by 4.
        grid_size: ``(grid_h, grid_w)`` of the patch grid, used to map token indices to
            (row, column) in :meth:`forward`; not needed by :meth:`rotate`.
        base: frequency base.
        num_prefix_tokens: leading tokens (class token, registers) left unrotated.
        layout: ``"half"`` or ``"interleaved"`` pairing of channels.
        frequencies: ``"axis"`` or ``"alternate"``.
        arrangement: ``"merged"`` or ``"blocks"``.
        angle_dtype: float64 (default) or float32 (bit-compatible with transformers).
    """

    def __init__(
        self,
        head_dim: int,
        grid_size: tuple[int, int] | None = None,
        base: float = 10000.0,
        num_prefix_tokens: int = 0,
        layout: str = "half",
        frequencies: str = "axis",
        arrangement: str = "merged",
        *,
        angle_dtype: torch.dtype | str = torch.float64,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_choice("layout", layout, ROTARY_LAYOUTS)
        check_choice("arrangement", arrangement, AXIAL_ARRANGEMENTS)
        check_choice("backend", backend, ROTARY_BACKENDS)
        check_positive_int("head_dim", head_dim)
        check_int_in("num_prefix_tokens", num_prefix_tokens, 0)
        if grid_size is not None:
            if not isinstance(grid_size, (tuple, list)) or len(grid_size) != 2:
                raise TypeError(f"grid_size must be a pair (grid_h, grid_w), got {grid_size!r}")
            grid_size = (
                check_positive_int("grid_size[0] (grid_h)", grid_size[0]),
                check_positive_int("grid_size[1] (grid_w)", grid_size[1]),
            )
        base = check_number("base", base, low=1.0, low_open=True)
        self.head_dim, self.base, self.grid_size = head_dim, base, grid_size
        self.num_prefix_tokens, self.layout = num_prefix_tokens, layout
        self.frequencies, self.arrangement, self.backend = frequencies, arrangement, backend
        self.angle_dtype = resolve_angle_dtype(angle_dtype)
        # Buffers that move with the module and are never cast (module.to(bfloat16) would round
        # them); not in state_dict.
        self.constants = DeviceConstants(**self._constants())

    def _constants(self) -> dict[str, torch.Tensor]:
        rows, cols = axial_inv_freq(self.head_dim, self.base, self.frequencies, self.angle_dtype)
        return {
            "inv_freq": torch.cat((rows, cols)),  # [d/2]: row pairs then column pairs
            "axis": torch.arange(2).repeat_interleave(self.head_dim // 4),  # [d/2]: 0 0 .. 1 1 ..
        }

    def reset_parameters(self) -> None:
        """Recompute the frequencies (after ``to_empty()``; no learned weights)."""
        self.constants.reset_(**self._constants())

    def cos_sin(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``cos``, ``sin`` of (row, column) coordinates: ``[*, 2]`` -> ``[*, d/2]``.

        Entries ``0 .. d/4 - 1`` are the row angles, ``d/4 .. d/2 - 1`` the column angles.
        """
        coords = check_positions(coords, "coords")
        if coords.dim() < 1 or coords.shape[-1] != 2:
            raise ValueError(f"coords must end in 2 (row, column), got shape {tuple(coords.shape)}")
        return self._cos_sin(coords)

    def _cos_sin(self, coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`cos_sin` of checked ``coords [*, 2]``."""
        dev = coords.device
        per_pair = coords[..., self.constants.get("axis", dev)]  # [*, d/2]: row or column
        angles = per_pair.to(self.angle_dtype) * self.constants.get("inv_freq", dev)  # [*, d/2]
        return angles.cos().float(), angles.sin().float()

    def _rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cq: torch.Tensor,
        sq: torch.Tensor,
        ck: torch.Tensor,
        sk: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate with per-token tables ``[s, d/2]`` / ``[b, s, d/2]`` (and ``t`` for keys)."""
        if self.arrangement == "merged" or self.layout == "interleaved":
            return apply_rotary_qk(
                q, k, cq, sq, ck, sk, self.layout, self.head_dim, backend=self.backend
            )
        # blocks: split each token's head into its row half and column half, as two "tokens"
        # of d/2 channels; the tables split the same way, so one rotation call does both.
        b, h, s, d = q.shape
        hk, t = k.shape[1], k.shape[2]
        q2 = q.reshape(b, h, s * 2, d // 2)  # [b, h, 2s, d/2]: token j -> rows 2j (row half), 2j+1
        k2 = k.reshape(b, hk, t * 2, d // 2)  # [b, hk, 2t, d/2]

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(*x.shape[:-2], x.shape[-2] * 2, x.shape[-1] // 2)  # [.., 2n, d/4]

        q2, k2 = apply_rotary_qk(
            q2, k2, split(cq), split(sq), split(ck), split(sk), "half", d // 2, backend=self.backend
        )
        return q2.reshape(b, h, s, d), k2.reshape(b, hk, t, d)  # [b, h, s, d], [b, hk, t, d]

    def _tables(
        self, coords: torch.Tensor, unrotated: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._cos_sin(coords)  # [*, s, d/2]
        if unrotated is not None:
            # cos 1, sin 0 is the identity exactly: x*1 - y*0 == x.
            cos = torch.where(unrotated[..., None], torch.ones_like(cos), cos)
            sin = torch.where(unrotated[..., None], torch.zeros_like(sin), sin)
        return cos, sin

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        coords: torch.Tensor,
        k_coords: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate by explicit (row, column) coordinates of the patch tokens.

        Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]``; ``coords [s - p, 2]`` or
        ``[b, s - p, 2]`` for the tokens after the ``p = num_prefix_tokens`` prefix tokens
        (which stay unrotated); ``k_coords`` likewise with ``t`` (default ``coords``).
        """
        check_qk(q, k, self.head_dim)
        p = self.num_prefix_tokens
        k_coords = coords if k_coords is None else k_coords
        if k_coords is coords and k.shape[2] != q.shape[2]:
            raise ValueError(f"k has {k.shape[2]} tokens and q {q.shape[2]}: pass k_coords")
        tables = []
        for name, c, n in (("coords", coords, q.shape[2]), ("k_coords", k_coords, k.shape[2])):
            c = check_positions(c, name, ranks=(2, 3), device=q.device)
            if (
                c.shape[-2] != n - p
                or c.shape[-1] != 2
                or (c.dim() == 3 and c.shape[0] not in (1, q.shape[0]))
            ):
                raise ValueError(
                    f"{name} must be [{n - p}, 2] or [b, {n - p}, 2] ({p} prefix tokens), "
                    f"got {list(c.shape)}"
                )
            cos, sin = self.cos_sin(c)  # [(b,) n - p, d/2]
            if p:
                pad = (0, 0, p, 0)  # prepend p rows: cos 1, sin 0 (identity)
                cos = torch.nn.functional.pad(cos, pad, value=1.0)  # [(b,) n, d/2]
                sin = torch.nn.functional.pad(sin, pad, value=0.0)
            tables.append((cos, sin))
        (cq, sq), (ck, sk) = tables
        return self._rotate(q, k, cq, sq, ck, sk)

    def _require_grid(self) -> tuple[int, int]:
        if self.grid_size is None:
            raise ValueError(
                "forward maps token indices to the grid: pass grid_size=(h, w), or call rotate()"
            )
        return self.grid_size

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        self._require_grid()
        check_qk(q, k, self.head_dim)

    def tables(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """By token index: ``p < num_prefix_tokens`` unrotated, else row-major grid cell
        ``p - num_prefix_tokens`` of ``grid_size``. Shapes: ``positions [s]|[b, s]``,
        ``k_positions [t]|[b, t]`` -> cos/sin ``[(b,) s, d/2]`` and ``[(b,) t, d/2]``."""
        gh, gw = self._require_grid()
        p = self.num_prefix_tokens
        tables = []
        for name, idx in (("positions", positions), ("k_positions", k_positions)):
            _check_in_grid(name, idx, p, gh, gw)
            cell = (idx - p).clamp(min=0)
            coords = torch.stack((cell // gw, cell % gw), dim=-1)  # [(b,) n, 2]
            tables.append(self._tables(coords, idx < p if p else None))
        return tables

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        (cq, sq), (ck, sk) = tables
        return self._rotate(q, k, cq, sq, ck, sk)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, grid_size={self.grid_size}, base={self.base}, "
            f"num_prefix_tokens={self.num_prefix_tokens}, layout={self.layout!r}, "
            f"frequencies={self.frequencies!r}, arrangement={self.arrangement!r}"
        )


def _check_in_grid(name: str, idx: torch.Tensor, prefix: int, gh: int, gw: int) -> None:
    """Token indices must fall in the prefix tokens or the grid (checked where that is free)."""
    check_values(
        idx < prefix + gh * gw,
        lambda: (
            f"{name} (token indices) must be below {prefix} prefix tokens + a {gh}x{gw} grid "
            f"= {prefix + gh * gw}, got token index {int(idx.max())}"
        ),
    )
