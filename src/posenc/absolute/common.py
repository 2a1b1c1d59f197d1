"""Helpers shared by the absolute encodings."""

from __future__ import annotations

import torch

from .._checks import check_positions, default_positions


def resolve_positions(x: torch.Tensor, positions: torch.Tensor | None, dim: int) -> torch.Tensor:
    """Check ``x [b, s, dim]`` and return positions ``[s]`` or ``[b, s]`` (default ``arange(s)``)."""
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [batch, seq, dim], got shape {tuple(x.shape)}")
    if x.shape[-1] != dim:
        raise ValueError(f"x's last dimension must equal the encoding dim {dim}, got {x.shape[-1]}")
    if positions is None:
        return default_positions(x.shape[1], x.device)
    positions = check_positions(positions, ranks=(1, 2))
    expected = ((x.shape[1],), (x.shape[0], x.shape[1]), (1, x.shape[1]))
    if tuple(positions.shape) not in expected:
        raise ValueError(
            f"positions must have shape [seq]={[x.shape[1]]} or [batch, seq]="
            f"{[x.shape[0], x.shape[1]]}, got {list(positions.shape)}"
        )
    return positions
