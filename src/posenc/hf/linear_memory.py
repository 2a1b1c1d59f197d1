"""Attention in memory linear in the length for a transformers model's long forwards.

transformers hands SDPA a boolean ``[b, 1, s, t]`` mask for every layer it cannot run with
``is_causal`` alone: each sliding-window layer (Gemma-2/3, gpt-oss, a Mistral with a window) and
every soft-capped one. At 64k tokens that mask is 4 GiB, and PyTorch's CPU kernel turns it into
a float mask of 16 GiB: a 64k forward of Gemma-3-270M (1.1 GB of weights) was killed at 23.8 GB.

Inside :func:`linear_memory`, a model's fresh prefills (no cache offset, no padding: the
evaluation forward of ``posenc extend``) build no ``[s, t]`` mask at all, and attend

* on a full-attention layer: SDPA with ``is_causal`` (the fused kernels: no mask, no ``s x t``
  scores);
* on a sliding-window layer: SDPA over blocks of :data:`BLOCK` query rows, each against its own
  keys only (the block's span and the ``window - 1`` keys before it), with that block's small
  mask: memory ``O(BLOCK x (BLOCK + window))``;
* with Gemma-2's soft cap (which SDPA does not take): the same blocks computed explicitly,
  ``cap * tanh(scores / cap)`` before the mask, as transformers' eager attention.

Every other call (a decode step, a padded batch, a cache offset, a model's own extra masks) gets
the mask and attention of the implementation the model had (eager or SDPA), unchanged. The logits equal transformers' SDPA and eager paths
to float32 rounding (tests/test_hf_linear_memory.py).

Shapes: ``query [b, h, s, d]``, ``key, value [b, hk, t, d]`` -> ``[b, s, h, d]`` (transformers'
attention-function convention).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

NAME = "posenc_linear_memory"
BASE = "_posenc_base_attention"  # on each config inside: the implementation it had before

#: Query rows per block on a sliding-window or soft-capped layer.
BLOCK = 1024


def _fresh_prefill(q_length: int, kv_length: int, q_offset: Any, kv_offset: Any) -> bool:
    """A forward over a whole sequence from position 0 with no cache (offsets are ints then)."""
    return q_length == kv_length and isinstance(q_offset, int) and q_offset == 0 and not kv_offset


def linear_memory_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: Any = 0,
    attention_mask: torch.Tensor | None = None,
    allow_is_causal_skip: bool = True,
    **kwargs: Any,
) -> torch.Tensor | None:
    """transformers' mask-interface signature: None for a fresh prefill with no padding and no
    extra mask (the attention below then attends by index), else the model's own mask."""
    fresh = _fresh_prefill(q_length, kv_length, q_offset, kv_offset)
    if attention_mask is None and allow_is_causal_skip and fresh:
        return None
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    base = getattr(kwargs.get("config"), BASE, "sdpa")  # the model's own implementation's mask
    return ALL_MASK_ATTENTION_FUNCTIONS[base](
        batch_size=batch_size,
        q_length=q_length,
        kv_length=kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        attention_mask=attention_mask,
        allow_is_causal_skip=allow_is_causal_skip,
        **kwargs,
    )


def _visible(r0: int, r1: int, k0: int, window: int | None, device: torch.device) -> torch.Tensor:
    """``[r, n]`` bool: query rows ``r0..r1-1`` against keys ``k0..r1-1``, causal by index and
    (with a window) ``q - k < window``, as transformers' sliding overlay."""
    dist = torch.arange(r0, r1, device=device)[:, None] - torch.arange(k0, r1, device=device)
    keep = dist >= 0
    return keep & (dist < window) if window else keep


def _block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """One block: ``q [b, h, r, d]``, ``k, v [b, h, n, d]`` (heads repeated), ``keep [r, n]`` ->
    ``[b, h, r, d]``."""
    if not softcap:
        return nn.functional.scaled_dot_product_attention(q, k, v, keep, scale=scale)
    w = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, h, r, n]
    w = torch.tanh(w / softcap) * softcap
    w = w.masked_fill(~keep, torch.finfo(w.dtype).min)
    probs = torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def linear_memory_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (see the module docstring)."""
    s, t = query.shape[2], key.shape[2]
    rest = {"dropout": dropout, "scaling": scaling, **kwargs}
    if sliding_window is not None:
        rest["sliding_window"] = sliding_window
    if softcap is not None:
        rest["softcap"] = softcap
    if attention_mask is not None or s != t:  # the model's own attention with its own mask
        return _base_attention(module)(module, query, key, value, attention_mask, **rest)
    if not sliding_window and not softcap:  # causal by is_causal: the fused kernels
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, None, **rest)
    if dropout and module.training:
        raise ValueError("linear_memory is for inference: call model.eval() first")
    h = query.shape[1]
    key = key.repeat_interleave(h // key.shape[1], dim=1)  # [b, h, t, d]
    value = value.repeat_interleave(h // value.shape[1], dim=1)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out = query.new_empty(query.shape[0], h, s, value.shape[-1])
    for r0 in range(0, s, BLOCK):
        r1 = min(s, r0 + BLOCK)
        k0 = max(0, r0 - sliding_window + 1) if sliding_window else 0
        keep = _visible(r0, r1, k0, sliding_window, query.device)
        out[:, :, r0:r1] = _block(
            query[:, :, r0:r1], key[:, :, k0:r1], value[:, :, k0:r1], keep, scale, softcap
        )
    return out.transpose(1, 2).contiguous(), None


def _base_attention(module: nn.Module) -> Any:
    """The attention function of the implementation the model had before :func:`linear_memory`
    (eager: its modeling module's own, which applies Gemma-2's soft cap)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    base = getattr(getattr(module, "config", None), BASE, "sdpa")
    if base == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[base]


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, linear_memory_attention)
    AttentionMaskInterface.register(NAME, linear_memory_mask)


def _configs(model: nn.Module) -> list[Any]:
    """The model's config and every sub-config whose ``_attn_implementation`` a layer reads."""
    found: dict[int, Any] = {}
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            found.setdefault(id(cfg), cfg)
    return list(found.values())


@contextmanager
def linear_memory(model: nn.Module) -> Iterator[nn.Module]:
    """Run ``model``'s forwards inside with attention in memory linear in the length (see the
    module docstring); its own attention implementation comes back on the way out.

    >>> import torch, transformers
    >>> cfg = transformers.Gemma3TextConfig(vocab_size=32, hidden_size=32, intermediate_size=32,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
    ...     sliding_window=4)
    >>> model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    >>> with linear_memory(model), torch.no_grad():
    ...     logits = model(torch.arange(1, 20)[None]).logits
    >>> model.config._attn_implementation != NAME
    True
    """
    _register()
    configs = _configs(model)
    before = [cfg._attn_implementation for cfg in configs]
    try:
        for cfg, impl in zip(configs, before, strict=True):
            setattr(cfg, BASE, impl or "sdpa")
            cfg._attn_implementation = NAME
        yield model
    finally:
        for cfg, impl in zip(configs, before, strict=True):
            cfg._attn_implementation = impl
            cfg.__dict__.pop(BASE, None)
