"""The base of the relative family: content-dependent schemes that own the score computation.

``attend(q, k, v, *, q_positions, k_positions, mask, scale, dropout_p, attention) -> [b, h, s, d]``
with ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` (not yet repeated for grouped-query attention),
``mask`` a bool keep-mask ``[s, t]`` or ``[b, 1|h, s, t]`` (or None) and ``attention`` the calling
:class:`~posenc.attention.Attention` (DeBERTa reuses its projections; Transformer-XL reads
``causal``). Scores are explicit ``[b, h, s, t]``: the position term depends on the query
content, so it cannot be a content-free SDPA mask or a FlexAttention ``score_mod`` over scalars.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from ..attention import masked_softmax as softmax_probs
from ..bias.common import check_pair

__all__ = ["RelativeEncoding", "batch_heads", "check_attend_inputs", "softmax_probs"]


class RelativeEncoding(nn.Module):
    """Base class of the content-dependent relative encodings (``family = "relative"``)."""

    family: ClassVar[str] = "relative"

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        scale: float | None = None,
        dropout_p: float = 0.0,
        attention: nn.Module | None = None,
    ) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``, ``q_positions [s]|[b, s]``,
        ``k_positions [t]|[b, t]``, ``mask [s, t]|[b, 1|h, s, t]`` -> ``[b, h, s, d]``."""
        raise NotImplementedError


def check_attend_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``attend``'s shapes; return the checked positions."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            f"q must be [b, h, s, d] and k, v [b, hk, t, d], got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1] or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on b, d or heads (h % hk)"
        )
    qp, kp = check_pair(q_positions, k_positions)
    if qp.shape[-1] != q.shape[2] or kp.shape[-1] != k.shape[2]:
        raise ValueError(
            f"q_positions must end in s={q.shape[2]} and k_positions in t={k.shape[2]}, got "
            f"{list(qp.shape)} and {list(kp.shape)}"
        )
    return qp, kp


def batch_heads(idx: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """Shapes: ``[s, t]`` or ``[b, s, t]`` -> ``[b, h, s, t]`` (an expanded view, no copy)."""
    idx = idx[None, None] if idx.dim() == 2 else idx[:, None]  # [1|b, 1, s, t]
    return idx.expand(b, h, *idx.shape[-2:])  # [b, h, s, t]
