"""ALiBi: attention with linear biases (Press et al., 2022)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._constants import DeviceConstants
from ..functional.bias import alibi_slopes
from ..registry import BuildContext, register
from .common import PositionBias, Term


class ALiBi(PositionBias):
    """``B[h, i, j] = -m_h * (i - j)`` (causal) or ``-m_h * |i - j|`` (symmetric), no parameters.

    ``i``, ``j`` are the query and key *positions*. The causal form is the paper's; on the keys a
    causal mask keeps (``j <= i``) both forms agree, and the linear one is also what BLOOM's
    ``m_h * j`` becomes after softmax's shift invariance. The symmetric form is for encoders.
    Slopes ``m_h`` from :func:`posenc.functional.alibi_slopes`: the paper's, or ``slopes`` (a
    tensor or sequence of ``num_heads`` finite numbers, e.g. a checkpoint's) when given.
    """

    def __init__(
        self,
        num_heads: int,
        causal: bool = True,
        device: torch.device | str | None = None,
        *,
        slopes: torch.Tensor | Sequence[float] | None = None,
    ) -> None:
        super().__init__(num_heads)
        self.causal = bool(causal)
        # float64 CPU copy of custom slopes (None: the paper's), kept for reset_parameters.
        self.custom_slopes = (
            None if slopes is None else alibi_slopes(num_heads, torch.float64, slopes=slopes)
        )
        # Moves with the module, never cast (module.to(bfloat16) would round it); not in state_dict.
        self.constants = DeviceConstants(slopes=self._slopes()).to(device)  # [h] float32

    def _slopes(self) -> torch.Tensor:
        return alibi_slopes(self.num_heads, slopes=self.custom_slopes)

    def reset_parameters(self) -> None:
        """Recompute the slopes (after ``to_empty()``; no learned weights)."""
        self.constants.reset_(slopes=self._slopes())

    def slopes(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The head slopes ``m_h`` on ``device``, float32 ``[h]``."""
        return self.constants.get("slopes", torch.device(device))

    def term(self, device: torch.device) -> Term:
        slopes, causal = self.slopes(device), self.causal  # [h] float32

        def alibi(q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
            dist = (k_pos - q_pos).to(torch.float32)  # j - i, exact for |j - i| < 2**24
            return slopes[head] * dist if causal else -slopes[head] * dist.abs()

        return alibi

    def extra_repr(self) -> str:
        custom = "" if self.custom_slopes is None else ", slopes=custom"
        return f"num_heads={self.num_heads}, causal={self.causal}{custom}"


@register(
    "alibi", "bias", description="ALiBi: -m_h * distance, paper slopes; symmetric when not causal"
)
def _alibi(ctx: BuildContext) -> ALiBi:
    return ALiBi(ctx.num_heads, causal=ctx.causal)
