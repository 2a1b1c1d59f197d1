"""Defaults of transformers' config classes, for reading a ``config.json`` dict without
transformers (a leaf module: :mod:`.architectures` and :mod:`.config` both read it).

:data:`CLASS_DEFAULTS` holds the values a config class fills in when the file omits them;
:data:`ROTARY_DIM_AS_FACTOR_MODEL_TYPES` the classes that turn a legacy ``rotary_dim`` into
``partial_rotary_factor = rotary_dim / head_dim``; :data:`TEXT_MODEL_TYPE_RENAMES` the composite
classes that build their text config under another model type.
"""

from __future__ import annotations

from typing import Any

_LLAMA4_DEFAULTS = {
    "rope_theta": 500000.0, "attn_temperature_tuning": True, "floor_scale": 8192,
    "attn_scale": 0.1, "no_rope_layer_interval": 4, "num_hidden_layers": 48,
}  # fmt: skip
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt_neox": {"partial_rotary_factor": 0.25},
    "stablelm": {"partial_rotary_factor": 0.25},
    "phi": {"partial_rotary_factor": 0.5},
    "persimmon": {"partial_rotary_factor": 0.5},
    "glm": {"partial_rotary_factor": 0.5},
    "glm4": {"partial_rotary_factor": 0.5},
    "qwen3_next": {"partial_rotary_factor": 0.25},
    "qwen3_5_text": {"partial_rotary_factor": 0.25},
    "qwen3_5_moe_text": {"partial_rotary_factor": 0.25},
    "gptj": {"rotary_dim": 64},
    "codegen": {"rotary_dim": 64},
    "gpt_oss": {"rope_theta": 150000.0},
    "cohere": {"rope_theta": 500000.0},
    "ernie4_5": {"rope_theta": 500000.0},
    "helium": {"rope_theta": 100000.0},
    "llama4_text": _LLAMA4_DEFAULTS,
    "gemma3_text": {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
    # MiMoV2FlashConfig ignores the file's rope_theta / swa_rope_theta: without rope_parameters
    # it sets these (full 5e6, sliding 1e4, both over 0.334 of the head).
    "mimo_v2_flash": {
        "rope_parameters": {
            "full_attention": {
                "rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334,
            },
            "sliding_attention": {
                "rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334,
            },
        },
    },
}  # fmt: skip
# MiniMaxM2Config: ``partial_rotary_factor = rotary_dim / head_dim`` from the legacy key.
ROTARY_DIM_AS_FACTOR_MODEL_TYPES = frozenset({"minimax_m2"})
# (composite model_type, its text_config's model_type) -> the type its class builds the text
# config as (KimiK25Config: a ``kimi_k2`` text config becomes ``deepseek_v3``).
TEXT_MODEL_TYPE_RENAMES: dict[tuple[str, str | None], str] = {
    ("kimi_k25", "kimi_k2"): "deepseek_v3",
    ("kimi_k25", None): "deepseek_v3",
}
# The key whose value + 1 is the sliding window (MiMoV2FlashConfig: the reference attends to
# ``sliding_window_size`` previous tokens plus the query).
WINDOW_PLUS_ONE_KEYS: dict[str, str] = {"mimo_v2_flash": "sliding_window_size"}
# ``layer_types`` the class derives when the file gives none: (every, first) -> full attention
# on layer 0 when ``first``, and on every ``every``-th layer (1-based).
FULL_EVERY_LAYER_TYPES: dict[str, tuple[int, bool]] = {"mimo_v2_flash": (6, True)}
# Ministral-3's and Mistral-4's class defaults store max_position_embeddings in their rope
# parameters (unused there).
IGNORED_ROPE_KEYS = {t: frozenset({"max_position_embeddings"}) for t in ("ministral3", "mistral4")}
# 4.x files of these give one rope_scaling that applies to the full-attention layers only; their
# sliding-window layers use plain RoPE (Gemma-3 with its own local base).
SPLIT_BY_LAYER_TYPE = frozenset({"gemma3_text", "olmo3"})
CONFIG_ALIASES = {  # older names, as the config classes' attribute maps read them
    "n_embd": "hidden_size", "n_head": "num_attention_heads", "n_positions": "max_position_embeddings",
    "n_layer": "num_hidden_layers",
    "rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta",
}  # fmt: skip
