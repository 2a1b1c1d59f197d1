"""Fixed sinusoidal encodings added to token embeddings."""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from .._checks import check_choice, check_number, check_positive_int, host_readable
from .._constants import DeviceConstants
from ..functional.sinusoidal import SINUSOIDAL_LAYOUTS, sinusoidal_inv_freq, sinusoidal_table
from .common import check_table_size, resolve_positions


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
        # Positions past the cache are computed on the fly: a cache is never needed for range.
        check_table_size("cache_len", cache_len, dim, "the cache of first rows")
        base = check_number("base", base, low=1.0, low_open=True)
        self.dim, self.base, self.layout = dim, base, layout
        self.scale_input = bool(scale_input)
        self.cache_len = cache_len
        # The float32 table's first rows and the float64 frequencies: recomputable, so not in
        # state_dict; moved with the module, never cast (module.to(bfloat16) would round them).
        self.constants = DeviceConstants(**self._constants()).to(device)

    def _constants(self) -> dict[str, torch.Tensor]:
        positions = torch.arange(self.cache_len)
        return {
            "cache": sinusoidal_table(positions, self.dim, self.base, self.layout),  # [n, dim]
            "inv_freq": sinusoidal_inv_freq(self.dim, self.base, self.layout),  # [dim//2]
        }

    def reset_parameters(self) -> None:
        """Recompute the cached rows and frequencies (after ``to_empty()``; no weights)."""
        self.constants.reset_(**self._constants())

    def table(self, positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``positions [*]`` -> ``[*, dim]`` float32.

        The cached rows serve a call only where checking that the positions fall inside the
        cache is free (eager, CPU tensors). Elsewhere (a GPU, ``torch.compile``, CUDA-graph
        capture) the table is computed from the formula, ``O(s dim)``, which reads no position
        value back to the host and gives the same numbers.
        """
        if not host_readable(positions):
            return self._formula(positions)
        cache = self.constants.get("cache", positions.device)  # [cache_len, dim]
        if positions.numel() and int(positions.max()) < len(cache):
            return cache[positions]
        return sinusoidal_table(positions, self.dim, self.base, self.layout)

    def _formula(self, positions: torch.Tensor) -> torch.Tensor:
        """:func:`~posenc.functional.sinusoidal_table` with the frequencies this module keeps on
        the device (no host-to-device copy per call: CUDA-graph capture forbids one)."""
        inv_freq = self.constants.get("inv_freq", positions.device)  # [dim//2] float64
        return sinusoidal_table(positions, self.dim, self.base, self.layout, inv_freq=inv_freq)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]``, ``positions [s]`` or ``[b, s]`` -> ``[b, s, dim]``."""
        positions = resolve_positions(x, positions, self.dim)
        if self.scale_input:
            x = x * math.sqrt(self.dim)
        return x + self.table(positions).to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, layout={self.layout!r}, scale_input={self.scale_input}"
