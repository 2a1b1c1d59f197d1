"""The query temperature of a Hugging Face config (Llama-4, Ministral-3), read as
:mod:`.config` reads the rotation: :func:`attention_temperature_from_hf`."""

from __future__ import annotations

from typing import Any

from ..rotary.temperature import QueryTemperature
from .config import (
    LLAMA4_MODEL_TYPES,
    _get,
    _nested_keys,
    _positive_int,
    _rope_type,
    read_config,
)
from .load import resolve_config


def attention_temperature_from_hf(
    config: Any, *, use_transformers: bool = True
) -> QueryTemperature | None:
    """The query temperature of a Hugging Face config, or None when the model has none.

    * Llama-4 (``attn_temperature_tuning``): ``log1p(floor((p + 1) / floor_scale)) * attn_scale
      + 1`` on the layers without RoPE (``layers``), ``p`` the absolute index in the KV cache.
    * Ministral-3 (rope parameter ``llama_4_scaling_beta``): ``1 + beta * log(1 + floor(p / L))``
      on every layer, ``L = original_max_position_embeddings``, ``p`` the ``position_ids``.

    Multiply the queries by it after the rotation: ``q = temperature(q, positions)``.
    """
    cfg, model_types = read_config(resolve_config(config), use_transformers)
    return temperature_of(cfg, model_types)


def temperature_of(cfg: Any, model_types: frozenset[str]) -> QueryTemperature | None:
    """:func:`attention_temperature_from_hf` of a config already read by :func:`read_config`."""
    if model_types & LLAMA4_MODEL_TYPES:
        if not _get(cfg, "attn_temperature_tuning"):
            return None
        no_rope = _get(cfg, "no_rope_layers") or ()
        layers = tuple(i for i, uses_rope in enumerate(no_rope) if not uses_rope)
        beta = _get(cfg, "attn_scale")
        length = _get(cfg, "floor_scale")
        return QueryTemperature(
            "llama4_temperature", beta, _positive_int(length, "floor_scale"), layers
        )
    every = _get(cfg, "rope_parameters") or {}
    nested = _nested_keys(every, _get(cfg, "_rope_type_labels") or _get(cfg, "layer_types"))
    per_type = [every[k] for k in nested if every[k] is not None] if nested else [every]
    with_beta = [p for p in per_type if p.get("llama_4_scaling_beta") is not None]
    if not with_beta:
        return None
    if len(with_beta) < len(per_type):
        raise ValueError("llama_4_scaling_beta must be in every layer type's rope parameters")
    params = with_beta[0]
    beta = params["llama_4_scaling_beta"]
    _rope_type(params, model_types)  # the key must belong to this architecture
    orig = params.get("original_max_position_embeddings")
    if orig is None:
        raise ValueError(
            "llama_4_scaling_beta needs original_max_position_embeddings in the rope parameters"
        )
    length = _positive_int(orig, "original_max_position_embeddings")
    return QueryTemperature("llama4_scaling", beta, length, None)
