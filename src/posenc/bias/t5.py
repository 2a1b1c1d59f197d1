"""T5's bucketed relative position bias (Raffel et al., 2020)."""

from __future__ import annotations

import torch
from torch import nn

from ..functional.bias import t5_bucket_layout, t5_relative_bucket
from ..registry import BuildContext, register
from .common import PositionBias, Term, at_least_float32


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

    def term(self, device: torch.device) -> Term:
        weight = at_least_float32(self.relative_attention_bias.weight)  # [num_buckets, h]
        m = self.max_distance
        # The bucket of each clamped distance j - i in [-m, m] (index r + m): every distance at
        # or beyond max_distance is in the last bucket of its direction, so clamping first
        # changes nothing, and the term needs a table of O(max_distance), never O(s * t).
        buckets = self._buckets(torch.arange(-m, m + 1, device=weight.device))  # [2m + 1]

        def t5(q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
            return weight[buckets[(k_pos - q_pos).clamp(-m, m) + m], head]

        return t5

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}, bidirectional={self.bidirectional}"
        )


@register("t5", "bias", description="T5 bucketed relative bias, one table shared by all layers")
def _t5(
    ctx: BuildContext,
    *,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool | None = None,
) -> T5RelativeBias:
    # T5's encoder buckets both directions, its decoder only the past.
    bidirectional = not ctx.causal if bidirectional is None else bidirectional
    return T5RelativeBias(ctx.num_heads, num_buckets, max_distance, bidirectional=bidirectional)
