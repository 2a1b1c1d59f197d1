"""Decoding through a KV cache, written once for the tests that compare it with a full forward:
a prefill of the first tokens, then one token per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def prefill_then_decode(
    step: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, prefill: int
) -> torch.Tensor:
    """``step`` (a call that keeps one KV cache: an ``Attention`` with ``cache=``, a model with
    ``caches=``) on ``x[:, :prefill]``, then on each later position alone; the outputs joined
    along the sequence, ``[b, n, ...]``: what a full forward on ``x [b, n, ...]`` gives."""
    parts = [step(x[:, :prefill])]
    parts += [step(x[:, i : i + 1]) for i in range(prefill, x.shape[1])]
    return torch.cat(parts, 1)


def hf_prefill_then_decode(
    model: Any,
    ids: torch.Tensor,
    prefill: int,
    *,
    cache: Any = None,
    mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits ``[b, n, vocab]`` of a transformers model on ``ids [b, n]`` run as a prefill
    of its first ``prefill`` tokens, then one token per call through its KV cache (``cache``: the
    one to start from, default the model's own). ``mask [b, n]`` and ``positions [b, n]``: the
    attention mask (each call the part up to its last token) and position ids (its tokens')."""

    def call(a: int, b: int) -> Any:
        kw: dict[str, Any] = {"past_key_values": cache, "use_cache": True}
        if mask is not None:
            kw["attention_mask"] = mask[:, :b]
        if positions is not None:
            kw["position_ids"] = positions[:, a:b]
        return model(ids[:, a:b], **kw)

    with torch.no_grad():
        out = call(0, prefill)
        cache, logits = out.past_key_values, [out.logits]
        for i in range(prefill, ids.shape[1]):
            out = call(i, i + 1)
            cache = out.past_key_values
            logits.append(out.logits)
    return torch.cat(logits, 1)
