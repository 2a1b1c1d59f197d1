"""T5's bucketed relative position bias (Raffel et al., 2020)."""

from __future__ import annotations

import torch
from torch import nn

from ..functional.bias import relative_position_matrix, t5_bucket_layout, t5_relative_bucket
from .common import PositionBias, ScoreMod, at_least_float32, position_reader


class T5RelativeBias(PositionBias):
    """``B[h, i, j] = table[bucket(j - i), h]``: a learned scalar per head and distance bucket.

    T5 computes it once (in the first layer) and shares it across all layers, so build one
    instance and pass it to every :class:`~posenc.attention.Attention`. Encoders use
    ``bidirectional=True`` (separate buckets for keys before and after the query), decoders
    ``False``. T5 does not scale ``q . k`` (``Attention(scale=1.0)`` to match T5 checkpoints).

    The weight is ``relative_attention_bias.weight [num_buckets, h]``, the same name and layout
    as transformers' ``T5Attention``, so checkpoints load directly.
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_heads)
        t5_bucket_layout(
            bidirectional, num_buckets, max_distance
        )  # validates, says what is allowed
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bool(bidirectional)
        self.relative_attention_bias = nn.Embedding(
            num_buckets, num_heads, device=device, dtype=dtype
        )

    def reset_parameters(self) -> None:
        """Redraw the table as ``nn.Embedding`` draws it (``N(0, 1)``)."""
        self.relative_attention_bias.reset_parameters()

    def _buckets(self, rel: torch.Tensor) -> torch.Tensor:
        return t5_relative_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)

    def bias(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[h, s, t]`` or ``[b, h, s, t]`` float32."""
        q, k = self.check_pair(positions, k_positions)
        rel = relative_position_matrix(q, k)  # [s, t] or [b, s, t]
        values = self.relative_attention_bias(self._buckets(rel))  # [(b,) s, t, h]
        return at_least_float32(values.movedim(-1, -3))  # [(b,) h, s, t]

    def distance_table(self) -> torch.Tensor:
        """Bias by clamped distance: ``[h, 2 * max_distance + 1]``, column ``r + max_distance``
        for ``r = j - i`` in ``[-max_distance, max_distance]``.

        Every distance at or beyond ``max_distance`` falls in the last bucket of its direction,
        so clamping ``j - i`` to that range first changes nothing. Differentiable in the table.
        """
        weight = self.relative_attention_bias.weight  # [num_buckets, h]
        m = self.max_distance
        rel = torch.arange(-m, m + 1, device=weight.device)  # [2m + 1]
        return at_least_float32(weight[self._buckets(rel)].t())  # [h, 2m + 1]

    def score_mod(
        self, positions: torch.Tensor, k_positions: torch.Tensor, *, index_layout: bool = False
    ) -> ScoreMod:
        q, k = self.check_pair(positions, k_positions)
        read_q, read_k = position_reader(q), position_reader(k)
        table = self.distance_table()  # [h, 2m + 1]: O(max_distance), not O(s * t)
        m = self.max_distance

        def t5(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            qi: torch.Tensor,
            ki: torch.Tensor,
        ) -> torch.Tensor:
            col = (read_k(b, ki) - read_q(b, qi)).clamp(-m, m) + m
            return score + table[h, col].to(score.dtype)

        return t5

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )
