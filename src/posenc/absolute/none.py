"""NoPE: no positional encoding at all."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class NoPE(nn.Module):
    """The identity. Without a causal mask, attention over it is permutation-equivariant."""

    family: ClassVar[str] = "none"

    def reset_parameters(self) -> None:
        """Nothing to initialize (the deferred-init convention, :mod:`posenc.deferred`)."""

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]`` -> ``x`` unchanged (``positions`` ignored)."""
        return x
