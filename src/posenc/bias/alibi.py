"""ALiBi: attention with linear biases (Press et al., 2022)."""

from __future__ import annotations

import torch

from ..functional.bias import alibi_slopes, relative_position_matrix
from .common import PositionBias, ScoreMod, check_pair, exact_buffer, per_head, position_reader


class ALiBi(PositionBias):
    """``B[h, i, j] = -m_h * (i - j)`` (causal) or ``-m_h * |i - j|`` (symmetric), no parameters.

    ``i``, ``j`` are the query and key *positions*. The causal form is the paper's; on the keys a
    causal mask keeps (``j <= i``) both forms agree, and the linear one is also what BLOOM's
    ``m_h * j`` becomes after softmax's shift invariance. The symmetric form is for encoders.
    Slopes ``m_h`` from :func:`posenc.functional.alibi_slopes`.
    """

    def __init__(
        self, num_heads: int, causal: bool = True, device: torch.device | str | None = None
    ) -> None:
        super().__init__(num_heads)
        self.causal = bool(causal)
        # Recomputable, so non-persistent: state_dict stays empty.
        self.register_buffer("slopes", alibi_slopes(num_heads).to(device), persistent=False)  # [h]

    def _slopes(self) -> torch.Tensor:
        slopes: torch.Tensor = self.slopes  # type: ignore[assignment]
        return exact_buffer(slopes, lambda: alibi_slopes(self.num_heads))  # [h]

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[h, s, t]`` or ``[b, h, s, t]`` float32."""
        q, k = check_pair(q_positions, k_positions)
        rel = relative_position_matrix(q, k)  # [s, t] or [b, s, t]: j - i
        m = self._slopes().to(rel.device).view(-1, *([1] * rel.dim()))  # [h, 1, 1(, 1)]
        dist = rel.float()  # exact for |j - i| < 2**24
        out = m * dist if self.causal else -m * dist.abs()  # [h, s, t] or [h, b, s, t]
        return per_head(out, rel)

    def score_mod(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> ScoreMod:
        q, k = check_pair(q_positions, k_positions)
        read_q, read_k = position_reader(q), position_reader(k)
        slopes = self._slopes().to(q.device)
        causal = self.causal

        def alibi(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            qi: torch.Tensor,
            ki: torch.Tensor,
        ) -> torch.Tensor:
            dist = (read_k(b, ki) - read_q(b, qi)).to(torch.float32)  # j - i
            bias = slopes[h] * dist if causal else -slopes[h] * dist.abs()
            return score + bias.to(score.dtype)

        return alibi

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, causal={self.causal}"
