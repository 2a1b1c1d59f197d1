"""Tiny random models of this year's attention mechanisms, for the extension tests.

Each config is written out field by field (hidden 64, 4 query / 2 key heads of 16, windows and
chunks of 8 so 40 tokens cross them), eager attention, ``torch.manual_seed(0)``:

* ``gpt_oss``: learned attention sinks on every layer, a sliding layer then a full one, YaRN
  (its default rope parameters: factor 32, so the cos/sin carry an attention factor).
* ``llama4_text``: a chunked RoPE layer, a full RoPE layer, a NoPE full layer whose queries get
  Llama-4's temperature (``floor_scale`` 8: it grows within 40 tokens), and one more chunked;
  weightless q/k norms after the rotation.
* ``qwen3_next``: a Gated DeltaNet (linear attention) layer beside a full softmax layer with
  partial rotary (0.25) and a gated output.
* ``gemma3n_text``: sliding and full layers whose last two share the keys and values of the first
  two (``num_kv_shared_layers``), a one-tensor rotation, q/k/v norms and softmax scale 1.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

transformers.logging.set_verbosity_error()

VOCAB = 128
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt_oss": {
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "llama4_text": {
        "num_hidden_layers": 4,
        "intermediate_size_mlp": 64,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "no_rope_layers": [1, 1, 0, 1],  # 1: the layer uses RoPE
        "layer_types": [
            "chunked_attention",
            "full_attention",
            "full_attention",
            "chunked_attention",
        ],
        "attention_chunk_size": 8,
        "floor_scale": 8,
        "attn_scale": 0.5,
    },
    "qwen3_next": {
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
    "gemma3n_text": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "sliding_window": 8,
        "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 16,
        "laurel_rank": 8,
        "activation_sparsity_pattern": [0.0] * 4,
    },
}


def tiny_family(model_type: str, **overrides: Any) -> Any:
    """A tiny eager causal LM of ``model_type`` (module docstring), in eval mode."""
    config = transformers.CONFIG_MAPPING[model_type](
        **{**COMMON, **CONFIGS[model_type], **overrides}
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()
