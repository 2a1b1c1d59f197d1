"""Fixed sinusoidal encodings added to token embeddings."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from .._checks import check_choice, check_positive_int
from ..functional.sinusoidal import SINUSOIDAL_LAYOUTS, sinusoidal_table
from .common import resolve_positions


class SinusoidalEncoding(nn.Module):
    """``x + PE[positions]`` with the sinusoidal table, for any length and any positions.

    The table is computed from the formula for the positions asked for (no ``max_len`` buffer to
    run past): a cache of the first ``cache_len`` rows serves the common case, and positions
    beyond it are computed on the fly.
    """

    family: ClassVar[str] = "absolute"

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        layout: str = "interleaved",
        scale_input: bool = False,
        cache_len: int = 4096,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        check_choice("layout", layout, SINUSOIDAL_LAYOUTS)
        if dim % 2 and layout != "fairseq":
            raise ValueError(f"dim must be even for the {layout!r} layout, got {dim}")
        if isinstance(cache_len, bool) or not isinstance(cache_len, int) or cache_len < 0:
            raise ValueError(f"cache_len must be a non-negative integer, got {cache_len!r}")
        self.dim, self.base, self.layout, self.scale_input = dim, base, layout, scale_input
        cache = sinusoidal_table(torch.arange(cache_len, device=device), dim, base, layout)
        # Recomputable, so non-persistent: state_dict holds learned weights only.
        self.register_buffer("cache", cache, persistent=False)  # [cache_len, dim] float32

    def table(self, positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``positions [*]`` -> ``[*, dim]`` float32."""
        cache: torch.Tensor = self.cache  # type: ignore[assignment]
        # `module.to(bfloat16)` also casts this buffer; a cast cache is not the float32 table,
        # so it is bypassed rather than served.
        exact = cache.dtype == torch.float32
        if exact and positions.numel() and int(positions.max()) < cache.shape[0]:
            return cache.to(positions.device)[positions]
        return sinusoidal_table(positions, self.dim, self.base, self.layout)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]``, ``positions [s]`` or ``[b, s]`` -> ``[b, s, dim]``."""
        positions = resolve_positions(x, positions, self.dim)
        if self.scale_input:
            x = x * math.sqrt(self.dim)
        return x + self.table(positions).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, layout={self.layout!r}, scale_input={self.scale_input}"
