"""Resampling learned position tables to a new length or grid."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_choice, check_positive_int

RESAMPLE_1D_MODES = ("linear", "nearest")
RESAMPLE_2D_MODES = ("bicubic", "bilinear", "nearest", "area")


def resample_1d(table: torch.Tensor, new_len: int, mode: str = "linear") -> torch.Tensor:
    """Interpolate a learned 1-D table along positions.

    Shapes: ``table [n, dim]`` -> ``[new_len, dim]``. ``linear`` uses ``align_corners=False``
    (each row is the value at the centre of its cell), as ``F.interpolate`` does by default.
    """
    check_positive_int("new_len", new_len)
    check_choice("mode", mode, RESAMPLE_1D_MODES)
    if table.dim() != 2:
        raise ValueError(f"table must be 2-D [positions, dim], got shape {tuple(table.shape)}")
    x = table.float().t().unsqueeze(0)  # [1, dim, n]
    kwargs = {"align_corners": False} if mode == "linear" else {}
    x = F.interpolate(x, size=new_len, mode=mode, **kwargs)  # [1, dim, new_len]
    return x.squeeze(0).t().to(table.dtype)  # [new_len, dim]


def resample_2d(
    table: torch.Tensor,
    old_grid: tuple[int, int],
    new_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    mode: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """Resample a ViT position table to a new patch grid; prefix (class, register) rows are kept.

    Shapes: ``table [num_prefix_tokens + gh * gw, dim]`` -> ``[num_prefix_tokens + nh * nw, dim]``.
    Same semantics as timm's ``resample_abs_pos_embed``: the grid is interpolated in float32 as an
    image with one channel per dimension (``align_corners=None``), then cast back.
    """
    check_choice("mode", mode, RESAMPLE_2D_MODES)
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    for name, grid in (("old_grid", old_grid), ("new_grid", new_grid)):
        if len(grid) != 2:
            raise ValueError(f"{name} must be (height, width), got {grid!r}")
        check_positive_int(f"{name}[0]", grid[0])
        check_positive_int(f"{name}[1]", grid[1])
    if table.dim() != 2 or table.shape[0] != num_prefix_tokens + old_grid[0] * old_grid[1]:
        raise ValueError(
            f"table must be [num_prefix_tokens + h*w, dim] = [{num_prefix_tokens + old_grid[0] * old_grid[1]}, dim] "
            f"for old_grid={tuple(old_grid)}, got shape {tuple(table.shape)}"
        )
    prefix, cells = table[:num_prefix_tokens], table[num_prefix_tokens:]
    dim = table.shape[-1]
    img = cells.float().reshape(1, old_grid[0], old_grid[1], dim)  # [1, gh, gw, dim]
    img = img.permute(0, 3, 1, 2)  # [1, dim, gh, gw]
    kwargs = {"antialias": antialias} if mode in ("bicubic", "bilinear") else {}
    size = (new_grid[0], new_grid[1])
    img = F.interpolate(img, size=size, mode=mode, **kwargs)  # [1, dim, nh, nw]
    cells = img.permute(0, 2, 3, 1).reshape(-1, dim).to(table.dtype)  # [nh * nw, dim]
    return torch.cat((prefix, cells), dim=0)
