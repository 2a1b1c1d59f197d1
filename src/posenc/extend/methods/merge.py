"""Attention over disjoint key sets merged into the attention over their union.

A softmax over the union of disjoint key sets is the merge of the softmaxes over each set, each
partial output weighted by ``exp(lse_set - lse_union)`` (flash-attn's and ChunkLlama's
``merge_attn_outputs``): what both fused paths of the key-set methods end with
(:mod:`posenc.extend.methods.fused`, CPU flash-kernel calls; :mod:`posenc.extend.methods.flex`, FlexAttention
calls). A learned attention sink (gpt-oss: one logit per head with no value) is one more
log-sum-exp in the union's, with no output.
"""

from __future__ import annotations

import torch

Part = tuple[torch.Tensor, torch.Tensor]  # (out [b, h, r, d], lse [b, h, r] float32)


def merge(parts: list[Part], sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The partial outputs over disjoint key sets merged into the softmax over their union:
    each weighted by ``exp(lse - logsumexp(lses))``, in float32 -> ``[b, h, r, d]``; ``sinks
    [h]``: one more term of the union's log-sum-exp per head, with no output."""
    if len(parts) == 1 and sinks is None:
        return parts[0][0]
    lses = [p[1] for p in parts]
    if sinks is not None:
        lses.append(sinks.float().view(1, -1, 1).expand_as(lses[0]))  # [b, h, r]
    lse = torch.stack(lses)  # [n, b, h, r]
    weights = torch.exp(lse - torch.logsumexp(lse, dim=0))[..., None]  # [n, b, h, r, 1]
    out = parts[0][0].float() * weights[0]
    for (o, _), w in zip(parts[1:], weights[1 : len(parts)], strict=True):
        out.addcmul_(o.float(), w)
    return out
