"""Interop with Hugging Face configs: the rotary embedding a transformers model uses.

:func:`rope_from_hf` reads a config object or its ``config.json`` dict in either form:

* transformers 4.x: ``rope_theta``, ``rope_scaling`` (``type`` or ``rope_type``),
  ``partial_rotary_factor`` (``rotary_pct`` for GPT-NeoX, ``rotary_dim`` for GPT-J), ``head_dim``,
  ``max_position_embeddings``, ``original_max_position_embeddings`` (Phi-3);
* transformers 5.x: ``rope_parameters``, flat or one dict per layer type (Gemma 3/4:
  ``{"sliding_attention": {...}, "full_attention": {...}}``).

transformers computes frequencies and angles in float32, so the module is built with
``angle_dtype=float32`` by default: its cos/sin then equal transformers' bit for bit (up to the
last ulp of ``cos``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .functional.rotary import ROPE_TYPES, normalize_scaling
from .rotary import MRoPE, RotaryEmbedding

# Models whose rotary pairs are (x[2i], x[2i+1]) instead of (x[i], x[i + r/2]).
INTERLEAVED_MODEL_TYPES = frozenset(
    {
        "codegen",
        "cohere",
        "cohere2",
        "cohere2_moe",
        "ernie4_5",
        "ernie4_5_moe",
        "glm",
        "glm4",
        "gptj",
        "helium",
        "moonshine",
    }
)
# Models whose M-RoPE sections are interleaved (T H W T H W ...) rather than contiguous.
INTERLEAVED_MROPE_MODEL_TYPES = frozenset(
    {"qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"}
)

# Keys of a rope parameter dict that are not scaling options, besides each type's own keys.
_GENERAL_KEYS = {
    "rope_type",
    "type",
    "rope_theta",
    "partial_rotary_factor",
    "mrope_section",
    "mrope_interleaved",
}
_TYPE_KEYS: dict[str, set[str]] = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "longrope": {
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
    },
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "proportional": {"factor"},
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _rope_params(config: Any) -> tuple[Any, dict[str, Any] | None]:
    """``(config holding the rope parameters, parameters)``; descends into ``text_config``."""
    params = _get(config, "rope_parameters")
    if params is None:
        params = _get(config, "rope_scaling")
    if params is None and _get(config, "rope_theta") is None:
        text = _get(config, "text_config")
        if text is not None:
            return _rope_params(text)
    return config, (dict(params) if params is not None else None)


def _nested_keys(config: Any, params: Mapping[str, Any]) -> list[str]:
    layer_types = set(_get(config, "layer_types") or ())
    keys = [k for k in params if k in layer_types]
    if not keys and params and all(isinstance(v, Mapping) or v is None for v in params.values()):
        keys = list(params)  # a dict config without layer_types, nested all the same
    return keys


def _head_dim(config: Any, layer_type: str | None) -> int:
    head_dim = None
    if layer_type is not None:
        per_layer = _get(config, "per_layer_config")
        if per_layer is not None and not isinstance(per_layer, Mapping):
            try:  # transformers 5.x heterogeneous configs (Gemma-4: global_head_dim on full layers)
                head_dim = getattr(per_layer[layer_type], "head_dim", None)
            except (KeyError, ValueError, TypeError, IndexError):
                head_dim = None
        if head_dim is None and layer_type == "full_attention":
            head_dim = _get(config, "global_head_dim")
    head_dim = head_dim or _get(config, "head_dim")
    if head_dim is None:
        hidden = _get(config, "hidden_size") or _get(config, "n_embd") or _get(config, "d_model")
        heads = _get(config, "num_attention_heads") or _get(config, "n_head")
        if hidden is None or heads is None:
            raise ValueError(
                "config has no head_dim and no hidden_size / num_attention_heads to derive it"
            )
        head_dim = hidden // heads
    return int(head_dim)


def hf_rope_kwargs(config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The posenc arguments of a Hugging Face config's RoPE (see :func:`rope_from_hf`).

    Returns a dict with ``head_dim``, ``base``, ``scaling``, ``layout``, ``rotary_dim`` and, for
    multimodal RoPE, ``mrope_section`` and ``mrope_interleaved``.
    """
    config, params = _rope_params(config)
    model_type = _get(config, "model_type") or getattr(type(config), "model_type", None) or ""
    base = _get(config, "rope_theta") or _get(config, "rotary_emb_base")  # GPT-NeoX 4.x
    if params:
        nested = _nested_keys(config, params)
        if nested:
            if layer_type is None:
                raise ValueError(
                    f"config has RoPE parameters per layer type {nested}: "
                    "pass layer_type= (one of them)"
                )
            if layer_type not in params:
                raise ValueError(
                    f"layer_type {layer_type!r} has no RoPE parameters; config has {nested}"
                )
            params = params[layer_type]
            if params is None:
                raise ValueError(
                    f"layer type {layer_type!r} uses no RoPE (its rope parameters are None)"
                )
            params = dict(params)
    params = params or {}
    local_base = _get(config, "rope_local_base_freq")
    if (
        layer_type == "sliding_attention"
        and local_base is not None
        and "sliding_attention" not in (_get(config, "rope_parameters") or {})
    ):
        # Gemma 3 (transformers 4.x): local layers use plain RoPE with their own base.
        params, base = {}, local_base

    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type == "mrope":  # Qwen2-VL's 4.x name for plain frequencies with mrope_section
        rope_type = "default"
    if rope_type == "axial":
        raise ValueError(
            "rope_type 'axial' (vision towers) has model-specific layouts: build "
            "posenc.rotary.Axial2DRoPE(head_dim, frequencies=..., arrangement=...) directly"
        )
    if rope_type not in _TYPE_KEYS:
        hf_types = sorted(_TYPE_KEYS)
        raise ValueError(
            f"unknown rope_type {rope_type!r} in config; supported: {hf_types} "
            f"(posenc: {ROPE_TYPES})"
        )
    unknown = sorted(set(params) - _GENERAL_KEYS - _TYPE_KEYS[rope_type])
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in the rope parameters for rope_type {rope_type!r}; "
            f"allowed: {sorted(_GENERAL_KEYS | _TYPE_KEYS[rope_type])}"
        )
    missing = [k for k in _REQUIRED.get(rope_type, ()) if k not in params]
    if missing:
        raise ValueError(
            f"rope parameters for rope_type {rope_type!r} are missing required key(s) {missing}"
        )

    base = params.get("rope_theta") or base
    if base is None:
        base = (
            getattr(type(config), "default_theta", 10000.0)
            if not isinstance(config, Mapping)
            else 10000.0
        )
    head_dim = _head_dim(config, layer_type)
    partial = params.get("partial_rotary_factor")
    if partial is None:
        partial = _get(config, "partial_rotary_factor")
    if partial is None:
        partial = _get(config, "rotary_pct")  # GPT-NeoX 4.x
    rotary_dim = (
        int(head_dim * partial) if partial is not None else (_get(config, "rotary_dim") or head_dim)
    )
    if rope_type == "proportional":
        rotary_dim = 2 * int((1.0 if partial is None else partial) * head_dim // 2)

    max_pos = _get(config, "max_position_embeddings")
    scaling: dict[str, Any] | None = None
    if rope_type != "default":
        scaling = {"rope_type": rope_type}
        scaling.update({k: v for k, v in params.items() if k in _TYPE_KEYS[rope_type]})
        if rope_type in ("yarn", "longrope", "llama3"):
            # transformers: a config-level original_max_position_embeddings (Phi-3) wins, else the
            # rope parameters', else max_position_embeddings.
            orig = _get(config, "original_max_position_embeddings") or params.get(
                "original_max_position_embeddings"
            )
            orig = orig or max_pos
            if orig is None:
                raise ValueError(
                    f"rope_type {rope_type!r} needs original_max_position_embeddings or "
                    "max_position_embeddings"
                )
            scaling["original_max_position_embeddings"] = int(orig)
            if rope_type in ("yarn", "longrope") and scaling.get("factor") is None:
                if max_pos is None:
                    raise ValueError(
                        f"rope_type {rope_type!r} without a factor needs max_position_embeddings"
                    )
                scaling["factor"] = max_pos / orig  # DeepSeek-V3, Phi-3: the extension ratio
        if rope_type == "dynamic":
            if max_pos is None:
                raise ValueError(
                    "rope_type 'dynamic' needs max_position_embeddings (the original length)"
                )
            scaling["original_max_position_embeddings"] = int(max_pos)
        if rope_type == "longrope" and scaling.get("attention_factor") is None:
            scaling.pop("attention_factor", None)
        normalize_scaling(scaling)  # same checks as the module will make, with the rope type named

    layout = "interleaved" if model_type in INTERLEAVED_MODEL_TYPES else "half"
    out: dict[str, Any] = {
        "head_dim": head_dim,
        "base": float(base),
        "scaling": scaling,
        "layout": layout,
        "rotary_dim": rotary_dim,
    }
    if params.get("mrope_section") is not None:
        out["mrope_section"] = list(params["mrope_section"])
        out["mrope_interleaved"] = bool(
            params.get("mrope_interleaved", model_type in INTERLEAVED_MROPE_MODEL_TYPES)
        )
    return out


def rope_from_hf(
    config: Any,
    layer_type: str | None = None,
    *,
    layout: str | None = None,
    angle_dtype: torch.dtype | str = torch.float32,
    cache_len: int = 4096,
    backend: str = "auto",
) -> RotaryEmbedding:
    """The rotary embedding of a Hugging Face config (object or ``config.json`` dict).

    Returns a :class:`RotaryEmbedding`, or an :class:`MRoPE` when the parameters carry an
    ``mrope_section`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL). ``layer_type`` selects the entry of
    per-layer-type parameters (Gemma 3/4: ``"sliding_attention"``, ``"full_attention"``).
    ``layout`` overrides the pairing inferred from ``model_type`` (interleaved for GPT-J, GLM,
    Cohere, ...). ``angle_dtype=float32`` (default) reproduces transformers' arithmetic.

    >>> from posenc.hf import rope_from_hf
    >>> rope_from_hf({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4,
    ...               "rope_scaling": {"type": "linear", "factor": 2.0}}).scaling
    {'rope_type': 'linear', 'factor': 2.0}
    """
    kw = hf_rope_kwargs(config, layer_type)
    if "mrope_section" in kw:
        if kw["rotary_dim"] != kw["head_dim"]:
            raise ValueError("M-RoPE with partial rotary is not supported")
        return MRoPE(
            kw["head_dim"],
            kw["mrope_section"],
            kw["base"],
            kw["scaling"],
            kw["mrope_interleaved"],
            angle_dtype=angle_dtype,
            backend=backend,
        )
    return RotaryEmbedding(
        kw["head_dim"],
        kw["base"],
        kw["scaling"],
        layout or kw["layout"],
        kw["rotary_dim"],
        angle_dtype=angle_dtype,
        cache_len=cache_len,
        backend=backend,
    )
