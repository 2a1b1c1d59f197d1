"""The execution paths as functions: SDPA, FlexAttention and the explicit softmax.

Each takes ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` (grouped-query keys not yet repeated) and
returns ``[b, h, s, d]``; the position terms come in already made (a bias tensor, a
``score_mod``, a relative encoding's score function), so the paths know nothing of families.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..functional.attention import ScoreFn, ValueFn, repeat_kv
from ..functional.attention import explicit_attention as explicit_path
from ..functional.bias import bias_in_dtype


@functools.cache
def flex_attention_fn(compiled: bool = True) -> Callable[..., torch.Tensor]:
    """``flex_attention``, compiled or not (the eager one materializes scores: tests and debugging).

    ``dynamic=False``: each ``(s, t)`` compiles its own kernel once. Dynamic shapes do not build
    on CPU in torch 2.13 (inductor emits C++ with an undeclared ``cur_kvSplitSize``), and past
    dynamo's recompile limit a new shape runs the eager, materializing version (with a warning).
    """
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention  # type: ignore[return-value]
    return torch.compile(flex_attention, dynamic=False)  # type: ignore[return-value]


def sdpa_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Scaled dot-product attention, a bias (if any) fused into a float mask.

    ``mask``: bool keep-mask ``[s, t]`` or ``[b, 1|h, s, t]`` (None: every key, or the plain
    causal mask when ``causal`` and ``s == t``, SDPA's fused kernel with no mask tensor).
    ``bias``: float32 ``[(b,) h, s, t]``, masked where ``mask`` is False.
    """
    h, s, t = q.shape[1], q.shape[2], k.shape[2]
    k, v = repeat_kv(k, h), repeat_kv(v, h)  # [b, h, t, d]
    if bias is not None:
        float_mask = bias_in_dtype(bias, q.dtype, mask)  # finite far rows in float16 too
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=float_mask, dropout_p=dropout_p, scale=scale
        )
    if mask is None and causal and s == t:
        # The plain causal mask: SDPA's fused causal kernel, no mask tensor.
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=dropout_p, scale=scale
        )
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def flex_path(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    score_mod: Callable[..., torch.Tensor] | None = None,
    block_mask: Any = None,
    compiled: bool = True,
) -> torch.Tensor:
    """FlexAttention: a bias as a ``score_mod`` (entry by entry), the mask as a ``BlockMask``."""
    flex = flex_attention_fn(compiled)
    return flex(
        q,
        k,
        v,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )


__all__ = ["ScoreFn", "ValueFn", "explicit_path", "flex_attention_fn", "flex_path", "sdpa_path"]
