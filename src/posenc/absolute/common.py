"""Helpers shared by the absolute encodings."""

from __future__ import annotations

import torch

from .._checks import check_positions, default_positions

# The most values an absolute table (a learned weight or a cache of sinusoidal rows) may hold:
# 2**28 float32 values are 1 GiB. A larger option is an error naming it, not an allocation that
# fails (or succeeds and swaps) far from the cause.
MAX_TABLE_ELEMENTS = 1 << 28


def check_table_size(name: str, rows: int, dim: int, what: str) -> None:
    """``rows * dim`` within :data:`MAX_TABLE_ELEMENTS`; the error names ``name`` and its limit."""
    if rows * dim > MAX_TABLE_ELEMENTS:
        raise ValueError(
            f"{name} must be <= {MAX_TABLE_ELEMENTS // dim} for dim={dim} ({what} has that "
            f"many rows of dim values, at most 2**28 in all), got {rows}"
        )


def resolve_positions(x: torch.Tensor, positions: torch.Tensor | None, dim: int) -> torch.Tensor:
    """Check ``x [b, s, dim]`` and return int64 positions ``[s]`` or ``[b, s]`` on x's device
    (default ``arange(s)``)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(
            f"x must be a floating-point tensor [batch, seq, dim], got {getattr(x, 'dtype', x)!r}"
        )
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [batch, seq, dim], got shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"x's last dimension must equal the encoding dim {dim}, got {x.shape[-1]}")
    if positions is None:
        return default_positions(x.shape[1], x.device)
    positions = check_positions(positions, ranks=(1, 2), device=x.device, device_of="x")
    expected = ((x.shape[1],), (x.shape[0], x.shape[1]), (1, x.shape[1]))
    if tuple(positions.shape) not in expected:
        raise ValueError(
            f"positions must have shape [seq]={[x.shape[1]]} or [batch, seq]="
            f"{[x.shape[0], x.shape[1]]}, got {list(positions.shape)}"
        )
    # int64 row indices: a uint8 index would be read as a mask, int8/int16 not at all.
    return positions if positions.dtype == torch.int64 else positions.long()
