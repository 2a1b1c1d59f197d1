"""Drop-in proof: tiny random LLaMA and Qwen2 models whose attention rotates q and k with posenc's
``RotaryEmbedding`` (built by ``rope_from_hf``) give transformers' logits, with left padding and
with a KV cache (prefill, then token-by-token decode)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import (  # noqa: E402
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import eager_attention_forward  # noqa: E402

from posenc.hf import rope_from_hf  # noqa: E402

TOL = 1e-5


class _PassPositions(nn.Module):
    """Stands in for the model's rotary module: hands ``position_ids`` to the attention layers."""

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return position_ids


def _posenc_attention_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' LlamaAttention/Qwen2Attention forward with the rotation done by posenc."""
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [b, h, s, d]
    k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # [b, hk, s, d]
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    q, k = self.posenc_rope(q, k, position_embeddings)  # position_embeddings: the position ids
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(
        self.config._attn_implementation, eager_attention_forward
    )
    extra = {"sliding_window": self.sliding_window} if hasattr(self, "sliding_window") else {}
    out, weights = attention(
        self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **extra, **kwargs
    )
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def _with_posenc_rotary(model: nn.Module) -> nn.Module:
    swapped = copy.deepcopy(model)
    rope = rope_from_hf(swapped.config)
    swapped.model.rotary_emb = _PassPositions()
    for layer in swapped.model.layers:
        attn = layer.self_attn
        attn.posenc_rope = rope
        attn.forward = _posenc_attention_forward.__get__(attn)
    return swapped


def _tiny(kind: str, rope_scaling: dict | None) -> nn.Module:
    common: dict[str, Any] = {
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16,
        "rope_theta": 10000.0,
        "rope_scaling": rope_scaling,
        "attn_implementation": "eager",
        # Large weights make attention scores large, so a wrong rotation moves the logits (with
        # the default 0.02, changing base by 1 moves them by only 2e-7).
        "initializer_range": 0.3,
    }
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    return model.eval()


CASES = [
    ("llama", None),
    (
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
    ),
    ("llama", {"type": "dynamic", "factor": 2.0}),
    ("qwen2", None),
    ("qwen2", {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
]


@pytest.mark.parametrize(("kind", "scaling"), CASES)
def test_left_padded_batch_gives_transformers_logits(kind: str, scaling: dict | None) -> None:
    model = _tiny(kind, scaling)
    ours = _with_posenc_rotary(model)
    ids = torch.randint(0, 97, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    mask[2, :11] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what generate() builds for left padding
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, position_ids=positions).logits
        got = ours(ids, attention_mask=mask, position_ids=positions).logits
    keep = mask.bool()
    assert torch.isfinite(ref[keep]).all()
    err = (got[keep] - ref[keep]).abs().max().item()
    assert err <= TOL, err


@pytest.mark.parametrize(("kind", "scaling"), CASES)
def test_kv_cache_decode_gives_transformers_logits(kind: str, scaling: dict | None) -> None:
    """Prefill 6 tokens, then decode one at a time past max_position_embeddings (16)."""
    model = _tiny(kind, scaling)
    ours = _with_posenc_rotary(model)
    ids = torch.randint(0, 97, (2, 22))
    caches = (DynamicCache(config=model.config), DynamicCache(config=ours.config))
    with torch.no_grad():
        steps = [(0, 6)] + [(i, i + 1) for i in range(6, 22)]
        for start, end in steps:
            positions = torch.arange(start, end)[None].expand(2, -1)
            ref = model(
                ids[:, start:end], position_ids=positions, cache=caches[0], use_cache=True
            ).logits
            got = ours(
                ids[:, start:end], position_ids=positions, cache=caches[1], use_cache=True
            ).logits
            err = (got - ref).abs().max().item()
            assert err <= TOL, (start, err)
    # And the cached run equals one full forward (the cache holds rotated keys correctly).
    with torch.no_grad():
        full = ours(ids, position_ids=torch.arange(22)[None]).logits[:, -1]
    if (
        scaling is None or scaling.get("type") != "dynamic"
    ):  # dynamic NTK: cached keys keep old frequencies
        assert (full - got[:, -1]).abs().max().item() <= 1e-3


def test_the_comparison_detects_a_wrong_rotation() -> None:
    """Guard: the logits above do move when the rotation is off (base 10001 instead of 10000)."""
    from posenc.rotary import RotaryEmbedding

    model = _tiny("llama", None)
    ours = _with_posenc_rotary(model)
    for layer in ours.model.layers:
        layer.self_attn.posenc_rope = RotaryEmbedding(16, base=10001.0, angle_dtype="float32")
    ids = torch.randint(0, 97, (2, 20))
    with torch.no_grad():
        err = (model(ids).logits - ours(ids).logits).abs().max().item()
    assert err > 100 * TOL
