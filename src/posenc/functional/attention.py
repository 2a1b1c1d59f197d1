"""Attention helpers every family uses: grouped-query key expansion, the masked softmax and the
explicit attention path (the one the relative family and the plots read probabilities from)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .bias import bias_in_dtype

#: ``scores(q, k) -> [b, h, s, t]`` scaled logits, ``k [b, h, t, d]`` already repeated.
ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``values(probs [b, h, s, t]) -> [b, h, s, d]``: a relative value term added to ``probs @ v``.
ValueFn = Callable[[torch.Tensor], torch.Tensor | None]


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Shapes: ``[b, hk, t, d]`` -> ``[b, h, t, d]``, each kv head serving ``h // hk`` query heads."""
    hk = x.shape[1]
    if hk == num_heads:
        return x
    return x.repeat_interleave(num_heads // hk, dim=1)


def masked_softmax(
    scores: torch.Tensor, mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """``dropout(softmax(scores with ~mask at -inf))``, softmax in at least float32, in ``scores``' dtype.

    Shapes: ``scores [b, h, s, t]`` (already scaled), ``mask [s, t]`` or ``[b, 1|h, s, t]``.
    """
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    probs = probs.to(scores.dtype)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scores: ScoreFn | None = None,
    values: ValueFn | None = None,
    dropout_p: float = 0.0,
    return_probs: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q k^T * scale + bias) v`` written out (a reference for the other paths).

    ``mask``: bool keep-mask ``[s, t]`` or ``[b, 1|h, s, t]``; ``bias``: float32
    ``[(b,) h, s, t]``. A content-dependent encoding gives ``scores(q, k)`` (its scaled logits,
    in place of ``q k^T * scale``) and, where its values carry position too, ``values(probs)``
    (added to ``probs @ v``). ``return_probs``: also return the probabilities ``[b, h, s, t]``
    (after dropout; zero on masked keys), as ``(out, probs)``.
    """
    h = q.shape[1]
    k, v = repeat_kv(k, h), repeat_kv(v, h)  # [b, h, t, d]
    # [b, h, s, t]: the encoding's logits, or the plain ones
    logits = scores(q, k) if scores is not None else (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        logits = logits + bias_in_dtype(bias, logits.dtype, mask)
    probs = masked_softmax(logits, mask, dropout_p)
    out = probs @ v  # [b, h, s, d]
    extra = values(probs) if values is not None else None
    if extra is not None:
        out = out + extra
    return (out, probs) if return_probs else out
