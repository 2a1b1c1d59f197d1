"""The base of the relative family: content-dependent schemes whose position term needs the
query or key content, so it cannot be a content-free SDPA mask or a FlexAttention ``score_mod``.

Each encoding gives its scaled logits, ``scores(q, k, call) -> [b, h, s, t]``, and where its
values carry position too (Shaw's), ``values(probs, call) -> [b, h, s, d]`` added to
``probs @ v``; the mask, the softmax and ``@ v`` belong to the attention's explicit path
(:func:`posenc.attention.explicit_path`). ``q [b, h, s, d]``, ``k [b, h, t, d]`` (keys already
repeated for grouped-query attention); ``call`` is a :class:`~posenc.attention.ScoreContext`:
checked ``positions``/``k_positions``, ``index_layout``, the keep-``mask`` ``[s, t]`` or
``[b, 1|h, s, t]`` (or None), ``scale``, ``causal`` and the layer's ``q_proj``/``k_proj`` (DeBERTa
with ``share_att_key`` projects its relative embeddings with them).

``attend(q, k, v, *, positions, k_positions, index_layout, mask, scale, dropout_p, q_proj, k_proj)``
runs one encoding alone (validating its inputs) through the same explicit path.

Positions (``positions [s]|[b, s]`` of the queries, ``k_positions [t]|[b, t]`` of the keys) default
to the *index layout*: keys at ``0 .. t - 1`` and the queries the last ``s`` of them
(``t - s .. t - 1``), the layout of a plain, cached or Transformer-XL-memory call.
``index_layout=True`` is the caller's promise that the given positions are of that layout up to a
shift (``k_positions = c + arange(t)``), known from how the call was made (default positions),
never read from the values; Transformer-XL then takes its rel-shift path.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from .._checks import check_positive_int, default_positions, resolve_head_dim
from .._context import ScoreContext
from ..bias.common import check_index_layout, check_pair
from ..functional.attention import explicit_attention as explicit_path
from ..functional.attention import masked_softmax as softmax_probs

__all__ = [
    "RelativeEncoding",
    "batch_heads",
    "check_attend_inputs",
    "check_mask",
    "softmax_probs",
]


def checked_sizes(dim: int, num_heads: int, head_dim: int | None) -> tuple[int, int, int]:
    """``(dim, num_heads, head_dim)`` checked, ``head_dim`` defaulting to ``dim // num_heads``:
    the sizes of an encoding that projects the model's ``dim`` (DeBERTa, Transformer-XL)."""
    dim = check_positive_int("dim", dim)
    num_heads = check_positive_int("num_heads", num_heads)
    return dim, num_heads, resolve_head_dim(dim, num_heads, head_dim)


class RelativeEncoding(nn.Module):
    """Base class of the content-dependent relative encodings (``family = "relative"``)."""

    family: ClassVar[str] = "relative"

    def scores(self, q: torch.Tensor, k: torch.Tensor, call: ScoreContext) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k [b, h, t, d]`` -> scaled logits ``[b, h, s, t]``."""
        raise NotImplementedError

    def values(self, probs: torch.Tensor, call: ScoreContext) -> torch.Tensor | None:
        """The position term of the values, ``probs [b, h, s, t]`` -> ``[b, h, s, d]``, or None."""
        return None

    def check_heads(self, q: torch.Tensor) -> None:
        """Shape checks of this encoding on ``q [b, h, s, d]`` (head count, head_dim)."""

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
        q_proj: nn.Module | None = None,
        k_proj: nn.Module | None = None,
        causal: bool | None = None,
    ) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``, ``positions [s]|[b, s]``,
        ``k_positions [t]|[b, t]`` (default: the index layout, module docstring),
        ``mask [s, t]|[b, 1|h, s, t]`` -> ``[b, h, s, d]``.

        ``q_proj``/``k_proj``: the projections DeBERTa's ``share_att_key`` uses; ``causal``: the
        mask hides keys after each query by index (Transformer-XL then skips negative
        distances). ``attention`` (an :class:`~posenc.attention.Attention`) supplies all three
        when they are not given.
        """
        call = self.call(
            q, k, v, positions, k_positions, index_layout, mask, scale,
            attention=attention, q_proj=q_proj, k_proj=k_proj, causal=causal,
        )  # fmt: skip
        out = explicit_path(
            q, k, v, scale=call.scale, mask=mask, dropout_p=dropout_p,
            scores=lambda q_, k_: self.scores(q_, k_, call),
            values=lambda probs: self.values(probs, call),
        )  # fmt: skip
        assert isinstance(out, torch.Tensor)
        return out

    def call(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
        index_layout: bool,
        mask: torch.Tensor | None,
        scale: float | None,
        **layer: Any,
    ) -> ScoreContext:
        """The :class:`~posenc.attention.ScoreContext` of a standalone call, inputs checked."""
        index_layout = self.implied_index_layout(index_layout, positions, k_positions)
        qp, kp = check_attend_inputs(q, k, v, positions, k_positions, index_layout, mask)
        self.check_heads(q)
        attention = layer.get("attention")
        causal = layer.get("causal")
        causal = bool(getattr(attention, "causal", False)) if causal is None else bool(causal)
        return ScoreContext(
            qp, kp, index_layout, 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
            causal, mask,
            q_proj=layer.get("q_proj") or getattr(attention, "q_proj", None),
            k_proj=layer.get("k_proj") or getattr(attention, "k_proj", None),
        )  # fmt: skip

    def implied_index_layout(
        self, index_layout: bool, positions: torch.Tensor | None, k_positions: torch.Tensor | None
    ) -> bool:
        """The index layout a standalone call promises (Transformer-XL: also no positions)."""
        return index_layout


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
