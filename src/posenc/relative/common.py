"""The base of the relative family: content-dependent schemes that own the score computation.

``attend(q, k, v, *, positions, k_positions, index_layout, mask, scale, dropout_p, attention)``
``-> [b, h, s, d]``
with ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` (not yet repeated for grouped-query attention),
``mask`` a bool keep-mask ``[s, t]`` or ``[b, 1|h, s, t]`` (or None) and ``attention`` the calling
:class:`~posenc.attention.Attention` (DeBERTa reuses its projections; Transformer-XL reads
``causal``). Scores are explicit ``[b, h, s, t]``: the position term depends on the query
content, so it cannot be a content-free SDPA mask or a FlexAttention ``score_mod`` over scalars.

Positions (``positions [s]|[b, s]`` of the queries, ``k_positions [t]|[b, t]`` of the keys) default
to the *index layout*: keys at ``0 .. t - 1`` and the queries the last ``s`` of them
(``t - s .. t - 1``), the layout of a plain, cached or Transformer-XL-memory call.
``index_layout=True`` is the caller's promise that the given positions are of that layout up to a
shift (``k_positions = c + arange(t)``), known from how the call was made (default positions),
never read from the values; Transformer-XL then takes its rel-shift path.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from .._checks import default_positions
from ..attention import masked_softmax as softmax_probs
from ..bias.common import check_index_layout, check_pair

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
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        index_layout: bool = False,
        mask: torch.Tensor | None = None,
        scale: float | None = None,
        dropout_p: float = 0.0,
        attention: nn.Module | None = None,
    ) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``, ``positions [s]|[b, s]``,
        ``k_positions [t]|[b, t]`` (default: the index layout, module docstring),
        ``mask [s, t]|[b, 1|h, s, t]`` -> ``[b, h, s, d]``."""
        raise NotImplementedError


def check_attend_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    index_layout: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``attend``'s shapes; return the checked positions (defaults: the index layout).

    ``index_layout``: check that promise too, where that is free (eager CPU)."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            f"q must be [b, h, s, d] and k, v [b, hk, t, d], got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if q.shape[1] % k.shape[1] or q.shape[-1] != k.shape[-1] or q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree on b, d or heads (h % hk)"
        )
    s, t = q.shape[2], k.shape[2]
    if positions is None:
        positions = default_positions(s, q.device, offset=t - s)
    if k_positions is None:
        k_positions = default_positions(t, q.device)
    qp, kp = check_pair(positions, k_positions)
    if qp.shape[-1] != s or kp.shape[-1] != t:
        raise ValueError(
            f"positions must end in s={s} and k_positions in t={t}, got "
            f"{list(qp.shape)} and {list(kp.shape)}"
        )
    if index_layout:
        check_index_layout(qp, kp)
    return qp, kp


def batch_heads(idx: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """Shapes: ``[s, t]`` or ``[b, s, t]`` -> ``[b, h, s, t]`` (an expanded view, no copy)."""
    idx = idx[None, None] if idx.dim() == 2 else idx[:, None]  # [1|b, 1, s, t]
    return idx.expand(b, h, *idx.shape[-2:])  # [b, h, s, t]
