"""Learned absolute position tables: BERT/GPT-2 (1-D) and ViT (2-D grid with prefix tokens)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from .._checks import INIT_STD_MAX, check_int_in, check_number, check_positive_int, check_values
from ..functional.resample import resample_1d, resample_2d
from .common import check_table_size, resolve_positions


class _LearnedTable(nn.Module):
    """A learned table ``weight [rows, dim]`` drawn from ``N(0, init_std**2)``."""

    weight: nn.Parameter

    def _init_table(
        self,
        rows: int,
        dim: int,
        init_std: float,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        self.init_std = init_std
        self.weight = nn.Parameter(torch.empty(rows, dim, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the table from ``N(0, init_std**2)``."""
        nn.init.normal_(self.weight, std=self.init_std)


class LearnedEncoding(_LearnedTable):
    """``x + W[positions]`` with a learned table ``W [max_positions, dim]`` (BERT, GPT-2).

    A position ``>= max_positions`` is an error naming the limit; use :meth:`resized` to make a
    longer (interpolated) copy.
    """

    family: ClassVar[str] = "absolute"

    def __init__(
        self,
        max_positions: int,
        dim: int,
        init_std: float = 0.02,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.max_positions = check_positive_int("max_positions", max_positions)
        self.dim = check_positive_int("dim", dim)
        init_std = check_number("init_std", init_std, low=0.0, high=INIT_STD_MAX)
        check_table_size("max_positions", max_positions, dim, "the learned table")
        self._init_table(max_positions, dim, init_std, device, dtype)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]``, ``positions [s]`` or ``[b, s]`` -> ``[b, s, dim]``."""
        positions = resolve_positions(x, positions, self.dim)
        # Checked where it is free (eager CPU), a device assertion elsewhere, skipped under
        # torch.compile (where an out-of-range index fails in the gather instead).
        check_values(
            positions < self.max_positions,
            lambda: (
                f"positions must be in 0..{self.max_positions - 1} for a learned table of "
                f"max_positions={self.max_positions}, got position {int(positions.max())}; "
                "use .resized(new_max) for an interpolated longer table"
            ),
        )
        return x + self.weight[positions].to(x.dtype)

    @torch.no_grad()
    def resized(self, new_max: int, mode: str = "linear") -> LearnedEncoding:
        """A copy whose table is interpolated to ``new_max`` positions."""
        new = LearnedEncoding(new_max, self.dim, device=self.weight.device, dtype=self.weight.dtype)
        new.weight.copy_(resample_1d(self.weight.detach(), new_max, mode))
        return new

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, dim={self.dim}"


class Learned2D(_LearnedTable):
    """ViT's learned table over a patch grid plus ``num_prefix_tokens`` (class/register) rows.

    ``x [b, num_prefix_tokens + h*w, dim]`` (prefix tokens first, then patches row-major) gets
    ``x + W``. :meth:`resample` adapts it to a new grid as timm's ``resample_abs_pos_embed``.
    """

    family: ClassVar[str] = "absolute"

    def __init__(
        self,
        grid_h: int,
        grid_w: int,
        dim: int,
        num_prefix_tokens: int = 1,
        init_std: float = 0.02,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.grid = (check_positive_int("grid_h", grid_h), check_positive_int("grid_w", grid_w))
        self.dim = check_positive_int("dim", dim)
        self.num_prefix_tokens = check_int_in("num_prefix_tokens", num_prefix_tokens, 0)
        init_std = check_number("init_std", init_std, low=0.0, high=INIT_STD_MAX)
        n = num_prefix_tokens + grid_h * grid_w
        check_table_size("num_prefix_tokens + grid_h * grid_w", n, dim, "the learned table")
        self._init_table(n, dim, init_std, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Shapes: ``x [b, num_prefix_tokens + h*w, dim]`` -> same."""
        if x.dim() != 3 or tuple(x.shape[1:]) != tuple(self.weight.shape):
            raise ValueError(
                f"x must be [batch, {self.weight.shape[0]}, {self.dim}] (prefix tokens + "
                f"{self.grid[0]}x{self.grid[1]} patches), got shape {tuple(x.shape)}; "
                "use .resample(new_grid) for another grid"
            )
        return x + self.weight.to(x.dtype)

    @torch.no_grad()
    def resample(
        self,
        new_grid: tuple[int, int],
        num_prefix_tokens: int | None = None,
        mode: str = "bicubic",
        antialias: bool = True,
    ) -> Learned2D:
        """A copy for ``new_grid``: the grid part interpolated, prefix rows copied unchanged."""
        npt = self.num_prefix_tokens if num_prefix_tokens is None else num_prefix_tokens
        if npt != self.num_prefix_tokens:
            raise ValueError(
                f"num_prefix_tokens={npt} does not match this table's {self.num_prefix_tokens}"
            )
        grid = (int(new_grid[0]), int(new_grid[1]))
        table = resample_2d(self.weight.detach(), self.grid, grid, npt, mode, antialias)
        new = Learned2D(
            new_grid[0],
            new_grid[1],
            self.dim,
            npt,
            device=self.weight.device,
            dtype=self.weight.dtype,
        )
        new.weight.copy_(table)
        return new

    def extra_repr(self) -> str:
        return f"grid={self.grid}, dim={self.dim}, num_prefix_tokens={self.num_prefix_tokens}"
