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

__all__ = [
    "RelativeEncoding",
    "batch_heads",
    "check_attend_inputs",
    "check_mask",
    "softmax_probs",
]


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
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate ``attend``'s inputs; return the checked positions (defaults: the index layout).

    ``index_layout``: check that promise too, where that is free (eager CPU)."""
    _check_qkv(q, k, v)
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
    check_mask(mask, q.shape[0], q.shape[1], s, t)
    if positions is None and s > t:
        raise ValueError(
            f"default positions put the s queries at the last s of the t keys, so s <= t; got "
            f"s={s} > t={t}: pass positions and k_positions"
        )
    if positions is None:
        positions = default_positions(s, q.device, offset=t - s)
    if k_positions is None:
        k_positions = default_positions(t, q.device)
    qp, kp = check_pair(positions, k_positions, q.device)
    if qp.shape[-1] != s or kp.shape[-1] != t:
        raise ValueError(
            f"positions must end in s={s} and k_positions in t={t}, got "
            f"{list(qp.shape)} and {list(kp.shape)}"
        )
    if index_layout:
        check_index_layout(qp, kp)
    return qp, kp


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q, k, v are floating-point tensors of one dtype on one device."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}"
            )
    if not q.dtype == k.dtype == v.dtype or not q.device == k.device == v.device:
        raise TypeError(
            f"q, k and v must share a dtype and a device, got {q.dtype}/{q.device}, "
            f"{k.dtype}/{k.device} and {v.dtype}/{v.device}"
        )


def check_mask(mask: torch.Tensor | None, b: int, h: int, s: int, t: int) -> None:
    """``mask``: None or a bool keep-mask ``[s, t]`` or ``[b, h, s, t]`` (any of them 1)."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = attend), got {mask!r:.80}")
    full = (b, h, s, t)[-mask.dim() :] if mask.dim() in (2, 4) else None
    if full is None or any(n not in (1, m) for n, m in zip(mask.shape, full, strict=True)):
        raise ValueError(
            f"mask must be [s, t]={[s, t]} or [b, h, s, t]={[b, h, s, t]} (each may be 1), "
            f"got {list(mask.shape)}"
        )


def batch_heads(idx: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """Shapes: ``[s, t]`` or ``[b, s, t]`` -> ``[b, h, s, t]`` (an expanded view, no copy)."""
    idx = idx[None, None] if idx.dim() == 2 else idx[:, None]  # [1|b, 1, s, t]
    return idx.expand(b, h, *idx.shape[-2:])  # [b, h, s, t]
