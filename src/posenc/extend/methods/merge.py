"""Attention over disjoint key sets merged into the attention over their union.

A softmax over the union of disjoint key sets is the merge of the softmaxes over each set, each
partial output weighted by ``exp(lse_set - lse_union)`` (flash-attn's and ChunkLlama's
``merge_attn_outputs``): what both fused paths of Self-Extend and DCA end with
(:mod:`posenc.extend.methods.fused`, CPU flash-kernel calls; :mod:`posenc.extend.methods.flex`, FlexAttention
calls).
"""

from __future__ import annotations

import torch

Part = tuple[torch.Tensor, torch.Tensor]  # (out [b, h, r, d], lse [b, h, r] float32)


def merge(parts: list[Part]) -> torch.Tensor:
    """The partial outputs over disjoint key sets merged into the softmax over their union:
    each weighted by ``exp(lse - logsumexp(lses))``, in float32 -> ``[b, h, r, d]``."""
    if len(parts) == 1:
        return parts[0][0]
    lse = torch.stack([p[1] for p in parts])  # [n, b, h, r]
    weights = torch.exp(lse - torch.logsumexp(lse, dim=0))[..., None]  # [n, b, h, r, 1]
    out = parts[0][0].float() * weights[0]
    for (o, _), w in zip(parts[1:], weights[1:], strict=True):
        out.addcmul_(o.float(), w)
    return out
