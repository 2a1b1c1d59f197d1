"""Interop with Hugging Face configs: the rotary embedding a transformers model uses, exactly.

:func:`rope_from_hf` reads a transformers config object or a raw ``config.json`` dict (multimodal
ones with their ``text_config``), of transformers 4.56+ (RoPE in ``rope_scaling``) or 5.x
(``rope_parameters``), and returns the :class:`~posenc.rotary.RotaryEmbedding` (or
:class:`~posenc.rotary.MRoPE`) that reproduces the model named by ``model_type``:

* **Defaults of the config class.** A raw dict is first turned into the model's config object by
  transformers when it is installed (``CONFIG_MAPPING[model_type].from_dict``), so keys the file
  omits take the class defaults (Qwen3.5's ``partial_rotary_factor=0.25``, DeepSeek's
  ``head_dim = qk_rope_head_dim``, GPT-NeoX's ``rotary_pct``, Gemma-3's local base, ...). Without
  transformers (or with ``use_transformers=False``) a small table of those defaults stands in.
* **Pair layout by architecture.** ``"interleaved"`` (pairs ``x[2i], x[2i+1]``) for the models
  whose attention rotates every two channels or multiplies complex numbers (GPT-J, GLM, Cohere,
  DeepSeek-V2, Llama-4, ...) and for the MLA models whose config sets ``rope_interleave``
  (DeepSeek-V3 and its kin, default True); ``"half"`` (``x[i], x[i + r/2]``) otherwise.
* **Rotary dim.** ``int(head_dim * partial_rotary_factor)`` (``rotary_pct``), GPT-J's
  ``rotary_dim``, MLA's ``qk_rope_head_dim`` (the module then rotates the rope part of the head).
* **Per-layer-type parameters** (Gemma-3, OLMo-3, Gemma-4): pass ``layer_type=``; scaling that a
  4.x file gives in ``rope_scaling`` applies to the full-attention layers only, as transformers
  does.
* **M-RoPE** (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni, Qwen3-VL, Qwen3.5 with partial rotary).
* **Attention temperature** (Llama-4, Ministral-3's ``llama_4_scaling_beta``) is not part of the
  rotation: :func:`attention_temperature_from_hf` returns it as a
  :class:`~posenc.rotary.temperature.QueryTemperature`.

Bad values raise (``rope_theta <= 0``, NaN, strings where numbers go, unknown keys), naming the
key. transformers computes frequencies and angles in float32, so the module is built with
``angle_dtype=float32`` by default: its cos/sin then equal transformers' bit for bit (up to the
last ulp of ``cos``).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from ..functional.rope_scaling import ORIG, ROPE_SCALING
from ..functional.rotary import normalize_scaling
from ..rotary import MRoPE, RotaryEmbedding, TrailingRotaryEmbedding
from .architectures import (  # noqa: F401 (re-exported by posenc.hf)
    FLOAT64_ANGLE_MODEL_TYPES,
    HALF_MODEL_TYPES,
    INTERLEAVED_MODEL_TYPES,
    INTERLEAVED_MROPE_MODEL_TYPES,
    LLAMA4_MODEL_TYPES,
    LLAMA4_SCALING_MODEL_TYPES,
    MROPE_ALLOCATION_MODEL_TYPES,
    MROPE_MODEL_TYPES,
    MROPE_REFUSALS,
    NO_ROPE_MODEL_TYPES,
    ROPE_INTERLEAVE_MODEL_TYPES,
    ROTARY_DIM_MODEL_TYPES,
    ROTATION_ONLY_UNSUPPORTED,
    UNSUPPORTED_MODEL_TYPES,
    check_has_rope,
    known_model_type,
    unknown_model_type_error,
)
from .checks import check_types, is_real
from .defaults import (
    CLASS_DEFAULTS,
    CONFIG_ALIASES,
    IGNORED_ROPE_KEYS,
    ROTARY_DIM_AS_FACTOR_MODEL_TYPES,
    SPLIT_BY_LAYER_TYPE,
    TEXT_MODEL_TYPE_RENAMES,
    WINDOW_PLUS_ONE_KEYS,
)
from .labels import LABELLED_DEFAULTS, rope_label
from .load import resolve_config
from .longrope_mscale import MscaleLongRoPE, split_mscales
from .mrope_read import mrope_kwargs, temporal_rest

# Keys of a rope parameter dict that are not scaling options: the module's own, and those other
# posenc functions read. Everything else goes to the scaling dict, which rejects unknown keys.
_MODULE_KEYS = frozenset(
    {"rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section",
     "mrope_interleaved", "llama_4_scaling_beta"}
)  # fmt: skip
#: The rope types a Hugging Face config may name, from the one scaling table.
HF_ROPE_TYPES = tuple(name for name, spec in ROPE_SCALING.items() if spec.in_transformers)
# Types whose original length transformers fills in from max_position_embeddings when the rope
# parameters leave it out (dynamic NTK always takes max_position_embeddings instead).
_ORIG_FROM_CONFIG = tuple(
    name
    for name, spec in ROPE_SCALING.items()
    if ORIG in spec.derived and not spec.original_is_max_position
)

# --- defaults of the config classes, for reading a dict without transformers -------------------

# transformers' class defaults (.defaults), with the MLA models' rope_interleave default.
FALLBACK_DEFAULTS: dict[str, dict[str, Any]] = {
    **CLASS_DEFAULTS,
    **{t: {"rope_interleave": v} for t, v in ROPE_INTERLEAVE_MODEL_TYPES.items()},
}


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def _is_number(value: Any) -> bool:
    return is_real(value) and math.isfinite(value)


def _number(value: Any, name: str, allowed: str, ok: Any = lambda v: True) -> float:
    """``value`` if it is a finite number passing ``ok``, else a ValueError naming ``name``."""
    if not _is_number(value) or not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str) -> int:
    if not _is_number(value) or value != int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


# --- from a dict or an object to a transformers-5-shaped config ---------------------------------


def needs_transformers_hint(cfg: Any, what: str) -> str:
    """The advice to append when the fallback reader (a dict read without transformers) lacks a
    value the model's transformers config class would supply; empty for a config object."""
    model_type = _get(cfg, "model_type")
    if not isinstance(cfg, Mapping) or not isinstance(model_type, str):
        return ""
    return (
        f"; model_type {model_type!r} may leave {what} to its transformers config class: read "
        'it with transformers installed (pip install -e ".[hf]" in the posenc clone) and use_transformers=True'
    )


def _transformers_config(raw: Mapping[str, Any]) -> Any | None:
    """The model's transformers config built from a ``config.json`` dict, or None without one."""
    model_type = raw.get("model_type")
    try:  # transformers is optional: a test dependency of posenc, not a requirement
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return None
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return None
    try:
        return CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(dict(raw)))
    except Exception as err:  # strict-dataclass validation errors are not ValueErrors
        text_type = _get(raw.get("text_config"), "model_type")
        if isinstance(text_type, str) and text_type not in CONFIG_MAPPING:
            # An older transformers, without the text model (4.56's mistral3 has no
            # ministral3): as without the model, the reader without transformers reads it.
            return None
        raise ValueError(
            f"transformers could not build a {model_type!r} config from this dict: {err}"
        ) from err


def _has_rope_keys(cfg: Mapping[str, Any]) -> bool:
    keys = ("rope_parameters", "rope_scaling", "rope_theta", "rotary_emb_base")
    return any(cfg.get(k) is not None for k in keys)


def _standardize(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (4.56+ ``rope_scaling`` or 5.x ``rope_parameters``) in transformers 5.x's
    shape, with :data:`FALLBACK_DEFAULTS`' class defaults (the reader without transformers)."""
    cfg = dict(raw)
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and not _has_rope_keys(cfg):
        outer = cfg.get("model_type")
        cfg = dict(text)
        renamed = TEXT_MODEL_TYPE_RENAMES.get((str(outer), cfg.get("model_type")))
        if renamed is not None:
            cfg["model_type"] = renamed
    for old, new in CONFIG_ALIASES.items():
        if cfg.get(new) is None and cfg.get(old) is not None:
            cfg[new] = cfg[old]
    model_type = cfg.get("model_type") or ""
    for key, value in FALLBACK_DEFAULTS.get(model_type, {}).items():
        if cfg.get(key) is None:
            cfg[key] = value
    plus_one = WINDOW_PLUS_ONE_KEYS.get(model_type)
    if plus_one is not None and cfg.get(plus_one) is not None:
        cfg["sliding_window"] = cfg[plus_one] + 1
    # MiniMax-M2's legacy rotary_dim
    legacy = cfg.get("partial_rotary_factor") is None and cfg.get("rotary_dim") is not None
    if model_type in ROTARY_DIM_AS_FACTOR_MODEL_TYPES and legacy and cfg.get("head_dim"):
        cfg["partial_rotary_factor"] = cfg["rotary_dim"] / cfg["head_dim"]
    if model_type in LABELLED_DEFAULTS:  # DeepSeek-V4: its rope sets by label
        cfg = LABELLED_DEFAULTS[model_type](cfg)
    if cfg.get("qk_rope_head_dim") is not None:  # MLA: the module rotates the rope part only
        cfg["head_dim"] = cfg["qk_rope_head_dim"]
    if model_type == "llama4_text" and not cfg.get("no_rope_layers"):  # [] too, as the class
        interval = cfg["no_rope_layer_interval"]
        cfg["no_rope_layers"] = [
            int((i + 1) % interval != 0) for i in range(cfg["num_hidden_layers"])
        ]
    cfg["rope_parameters"] = _standard_params(cfg, model_type)
    return cfg


def _fill(params: dict[str, Any], cfg: Mapping[str, Any], theta: Any, top_orig: bool) -> None:
    """transformers' ``standardize_rope_params`` on one (flat or per-layer-type) dict."""
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", theta)
    if cfg.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    if params["rope_type"] in _ORIG_FROM_CONFIG:
        # A config-level original length (Phi-3) wins over the rope dict's, for flat parameters.
        if top_orig and cfg.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))


def _standard_params(cfg: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    given = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    params: dict[str, Any] = copy.deepcopy(dict(given))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    nested = _nested_keys(params, cfg.get("layer_types"))
    split = model_type in SPLIT_BY_LAYER_TYPE or cfg.get("rope_local_base_freq") is not None
    if not nested and split:
        local = cfg.get("rope_local_base_freq", theta)
        params = {
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
            "full_attention": {**params, "rope_theta": theta},
        }
        nested = list(params)
    for key in nested:
        if params[key] is not None:
            _fill(params[key], cfg, theta, top_orig=False)
    if not nested:
        _fill(params, cfg, theta, top_orig=True)
    return params


def _text_config(config: Any, use_transformers: bool, unknown_ok: bool = False) -> Any:
    """The decoder's config to read, in transformers 5.x's shape: a 5.x object (``rope_parameters``)
    as it is; a 4.56+ object (``rope_scaling``) or a dict, as a dict of that shape."""
    if isinstance(config, Mapping):
        check_types(config)
        model_type = config.get("model_type")
        if isinstance(model_type, str) and not known_model_type(model_type) and not unknown_ok:
            raise unknown_model_type_error(model_type)
        obj = _transformers_config(config) if use_transformers else None
        if obj is None:
            return _standardize(config)
        config = obj
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        config = get_text_config(decoder=True) or config
    if _get(config, "rope_parameters") is None and hasattr(config, "to_dict"):
        # transformers 4.x objects, and classes without rope_parameters (GPT-J)
        return _standardize(config.to_dict())
    return config


def _model_types(config: Any, text: Any) -> frozenset[str]:
    types = {_get(config, "model_type"), getattr(type(config), "model_type", None)}
    types |= {_get(text, "model_type"), getattr(type(text), "model_type", None)}
    return frozenset(t for t in types if isinstance(t, str) and t)


def read_config(
    config: Any, use_transformers: bool, unknown_ok: bool = False, tables: bool = False
) -> tuple[Any, frozenset[str]]:
    """``(text config, model types)`` of a config object or dict; ``unknown_ok``: read a
    ``model_type`` nobody knows (the caller names the pairing) as a Llama-like config;
    ``tables``: for cos/sin tables alone (a rotation posenc does not perform is no refusal, nor
    float64 angles of float32 frequencies, which HFRotaryEmbedding computes itself)."""
    if isinstance(config, Mapping) and isinstance(config.get("model_type"), str):
        # before the dict's values are checked: a ViT's list-valued keys are not the error
        check_has_rope(frozenset({config["model_type"]}), config)
    text = _text_config(config, use_transformers, unknown_ok)
    model_types = _model_types(config, text)
    check_has_rope(model_types, config)
    refused = UNSUPPORTED_MODEL_TYPES.keys() - (
        ROTATION_ONLY_UNSUPPORTED.keys() | FLOAT64_ANGLE_MODEL_TYPES if tables else set()
    )
    for model_type in sorted(model_types & refused):
        raise ValueError(
            f"posenc cannot reproduce model_type {model_type!r}: "
            f"{UNSUPPORTED_MODEL_TYPES[model_type]}"
        )
    return text, model_types


# --- the parameters of one layer type ----------------------------------------------------------


def _nested_keys(params: Mapping[str, Any], labels: Any) -> list[str]:
    """The layer types ``params`` is nested under (transformers' ``nested_rope_parameter_keys``)."""
    nested = [k for k in params if k in set(labels or ())]
    if not nested and params and all(isinstance(v, Mapping) or v is None for v in params.values()):
        nested = list(params)  # a dict config without layer_types, nested all the same
    return nested


def _layer_params(cfg: Any, layer_type: str | None) -> dict[str, Any]:
    params = _get(cfg, "rope_parameters")
    if params is None:
        raise ValueError(
            "config has no RoPE parameters (rope_parameters, rope_scaling or rope_theta)"
        )
    nested = _nested_keys(params, _get(cfg, "_rope_type_labels") or _get(cfg, "layer_types"))
    if not nested:
        return dict(params)
    if layer_type is None:
        raise ValueError(
            f"config has RoPE parameters per layer type {nested}: pass layer_type= (one of them)"
        )
    if layer_type not in params:
        raise ValueError(f"layer_type {layer_type!r} has no RoPE parameters; config has {nested}")
    if params[layer_type] is None:
        raise ValueError(f"layer type {layer_type!r} uses no RoPE (its rope parameters are None)")
    out = dict(params[layer_type])
    # transformers' YaRN reads ``config.rope_parameters.get("truncate", True)``: the top level of
    # a nested dict, never the layer type's own entry.
    out.pop("truncate", None)
    if params.get("truncate") is not None and out.get("rope_type", out.get("type")) == "yarn":
        out["truncate"] = params["truncate"]
    return out


def _rope_type(params: Mapping[str, Any], model_types: frozenset[str]) -> str:
    # "mrope": Qwen2-VL's 4.x name for plain frequencies with mrope_section.
    rope_type, alias = (
        "default" if t == "mrope" else t for t in (params.get("rope_type"), params.get("type"))
    )
    if rope_type is not None and alias is not None and rope_type != alias:
        raise ValueError(f"rope parameters disagree: rope_type {rope_type!r} but type {alias!r}")
    rope_type = rope_type or alias or "default"
    if rope_type == "axial":
        raise ValueError(
            "rope_type 'axial' (vision towers) has model-specific layouts: build "
            "posenc.rotary.Axial2DRoPE(head_dim, frequencies=..., arrangement=...) directly"
        )
    if rope_type not in HF_ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r} in config; supported: {HF_ROPE_TYPES}")
    if "llama_4_scaling_beta" in params and not model_types & LLAMA4_SCALING_MODEL_TYPES:
        raise ValueError(
            "rope parameter 'llama_4_scaling_beta' is read by the attention of "
            f"{sorted(LLAMA4_SCALING_MODEL_TYPES)} only; model_type {sorted(model_types)} "
            "would ignore it"
        )
    return rope_type


def _head_dim(cfg: Any, layer_type: str | None) -> int:
    head_dim = None
    if layer_type is not None:
        per_layer = _get(cfg, "per_layer_config")
        if per_layer is not None and not isinstance(per_layer, Mapping):
            try:  # transformers 5.x heterogeneous configs (Gemma-4: global_head_dim on full layers)
                head_dim = getattr(per_layer[layer_type], "head_dim", None)
            except (KeyError, ValueError, TypeError, IndexError):
                head_dim = None
        if head_dim is None and layer_type == "full_attention":
            head_dim = _get(cfg, "global_head_dim")
    if head_dim is None:
        head_dim = _get(cfg, "head_dim")
    if head_dim is None:
        hidden, heads = _get(cfg, "hidden_size"), _get(cfg, "num_attention_heads")
        if hidden is None or heads is None:
            raise ValueError(
                "config has no head_dim and no hidden_size / num_attention_heads to derive it"
                + needs_transformers_hint(cfg, "head_dim")
            )
        hidden = _positive_int(hidden, "hidden_size")
        heads = _positive_int(heads, "num_attention_heads")
        if hidden % heads:
            raise ValueError(
                f"hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}) "
                "for head_dim = hidden_size / num_attention_heads; or give head_dim"
            )
        head_dim = hidden // heads
    return _positive_int(head_dim, "head_dim")


def _rotary_dim(
    cfg: Any, params: Mapping[str, Any], head_dim: int, model_types: frozenset[str], rope_type: str
) -> int:
    if model_types & ROTARY_DIM_MODEL_TYPES:  # GPT-J: ``config.rotary_dim or config.hidden_size``
        return _positive_int(_get(cfg, "rotary_dim") or _get(cfg, "hidden_size"), "rotary_dim")
    partial = params.get("partial_rotary_factor")
    if partial is None:
        partial = _get(cfg, "partial_rotary_factor")
    if partial is None:
        return head_dim
    partial = _number(partial, "partial_rotary_factor", "a number in (0, 1]", lambda v: 0 < v <= 1)
    if rope_type == "proportional":  # Gemma-4: an even count of rotated channels
        return 2 * int(partial * head_dim // 2)
    return int(head_dim * partial)  # transformers truncates


def _scaling(cfg: Any, params: Mapping[str, Any], rope_type: str) -> dict[str, Any] | None:
    if rope_type == "default":
        extra = sorted(set(params) - _MODULE_KEYS)
        normalize_scaling({"rope_type": "default", **{k: params[k] for k in extra}})
        return None
    scaling = {k: v for k, v in params.items() if k not in _MODULE_KEYS}
    scaling["rope_type"] = rope_type
    max_pos = _get(cfg, "max_position_embeddings")
    orig_name = "original_max_position_embeddings"
    if rope_type in _ORIG_FROM_CONFIG and scaling.get(orig_name) is None:
        scaling[orig_name] = max_pos  # what transformers' standardization fills in
    spec = ROPE_SCALING[rope_type]
    if spec.original_is_max_position:  # transformers' dynamic NTK grows past max_position
        scaling[orig_name] = max_pos
    if rope_type == "yarn" and "factor" not in scaling:
        raise ValueError(
            "YaRN rope parameters need 'factor' (transformers reads rope_parameters['factor']); "
            "give the extension factor, or null for max_position_embeddings / "
            "original_max_position_embeddings"
        )
    if rope_type == "yarn" and _is_number(max_pos):
        mismatch = yarn_factor_mismatch(max_pos, scaling["factor"], scaling.get(orig_name))
        if mismatch:
            warnings.warn(mismatch, stacklevel=2)
    if "factor" in spec.derived and scaling.get("factor") is None:
        # DeepSeek-V3, Phi-3: the factor is the extension ratio of the two lengths.
        length = _positive_int(max_pos, "max_position_embeddings")
        scaling["factor"] = length / _positive_int(scaling.get(orig_name), orig_name)
    if rope_type == "longrope" and scaling.get("attention_factor") is None:
        scaling.pop("attention_factor", None)
    for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if scaling.get(key) is not None:
            _number(scaling[key], key, "a finite number")
    return normalize_scaling(scaling)  # the checks the module makes, with the rope type named


def yarn_factor_mismatch(max_pos: float, factor: Any, orig: Any) -> str | None:
    """transformers' YaRN check: the message when an explicit ``factor`` disagrees with
    ``max_position_embeddings / original_max_position_embeddings`` (and that ratio is not 1, as
    it is when the original length was filled in from ``max_position_embeddings``), else None.
    transformers warns and uses the factor."""
    if factor is None or not _is_number(orig) or orig <= 0:
        return None
    implicit = max_pos / orig
    if implicit in (factor, 1):
        return None
    return (
        f"YaRN factor {factor:g} disagrees with max_position_embeddings / "
        f"original_max_position_embeddings = {max_pos} / {orig} = {implicit:g} "
        f"(transformers warns and uses the factor {factor:g})"
    )


def _layout(cfg: Any, model_types: frozenset[str]) -> str:
    flagged = model_types & ROPE_INTERLEAVE_MODEL_TYPES.keys()
    if flagged:
        flag = _get(cfg, "rope_interleave")
        if flag is None:
            flag = ROPE_INTERLEAVE_MODEL_TYPES[min(flagged)]
        return "interleaved" if flag else "half"
    return "interleaved" if model_types & INTERLEAVED_MODEL_TYPES else "half"


def hf_rope_kwargs(
    config: Any, layer_type: str | None = None, *, use_transformers: bool = True
) -> dict[str, Any]:
    """The posenc arguments of a Hugging Face config's RoPE (see :func:`rope_from_hf`).

    Returns a dict with ``head_dim``, ``base``, ``scaling``, ``layout``, ``rotary_dim`` and, for
    multimodal RoPE, ``mrope_section`` and ``mrope_interleaved``; for PhiMoE's LongRoPE,
    ``mscales`` (``(short_mscale, long_mscale)``, :mod:`.longrope_mscale`).
    ``use_transformers=False`` reads a dict with posenc's table of class defaults instead of
    building the transformers config (what happens when transformers is not installed).
    """
    cfg, model_types = read_config(resolve_config(config), use_transformers)
    return rope_kwargs(cfg, model_types, layer_type)


def rope_kwargs(cfg: Any, model_types: frozenset[str], layer_type: str | None) -> dict[str, Any]:
    """:func:`hf_rope_kwargs` of a config already read by :func:`read_config`."""
    label, layer_type = rope_label(model_types, layer_type)  # DeepSeek-V4, DSA indexers
    params = _layer_params(cfg, layer_type)
    rope_type = _rope_type(params, model_types)
    ignored = set().union(*(IGNORED_ROPE_KEYS.get(t, frozenset()) for t in model_types))
    params = {k: v for k, v in params.items() if k not in ignored}
    params, mscales = split_mscales(params, model_types, rope_type)  # PhiMoE's, not the scaling's
    base = params.get("rope_theta")
    if base is None:
        base = _get(cfg, "rope_theta", 10000.0)
    base = _number(base, "rope_theta", "a finite number > 0", lambda v: v > 0)
    head_dim = _head_dim(cfg, layer_type)
    out: dict[str, Any] = {
        "head_dim": head_dim,
        "base": base,
        "scaling": _scaling(cfg, params, rope_type),
        "layout": _layout(cfg, model_types),
        "rotary_dim": _rotary_dim(cfg, params, head_dim, model_types, rope_type),
    }
    out.update(mrope_kwargs(params, model_types))
    temporal_rest(out)
    if mscales is not None:
        out["mscales"] = mscales
    return out if label is None else label.apply(out, cfg)


def rope_from_hf(
    config: Any,
    layer_type: str | None = None,
    *,
    layout: str | None = None,
    angle_dtype: torch.dtype | str = torch.float32,
    cache_len: int = 4096,
    backend: str = "auto",
    use_transformers: bool = True,
) -> RotaryEmbedding:
    """The rotary embedding of a Hugging Face config: a config object, a ``config.json`` dict, a
    path to a ``config.json`` or a model folder, or a cached model id (:func:`.load.resolve_config`).

    Returns a :class:`RotaryEmbedding`, or an :class:`MRoPE` for multimodal RoPE (Qwen2-VL,
    Qwen2.5-VL, Qwen3-VL, Qwen3.5). ``layer_type`` selects the entry of per-layer-type parameters
    (Gemma-3/4, OLMo-3: ``"sliding_attention"``, ``"full_attention"``) or a label
    (:mod:`.labels`: DeepSeek-V4's ``"main"``/``"compress"``, ``"indexer"``). ``layout`` overrides the
    pairing inferred from ``model_type`` and makes readable a ``model_type`` nobody knows (remote
    code: MiniCPM's ``minicpm``), read as Llama's keys. ``angle_dtype=float32`` (default) reproduces
    transformers' arithmetic. DeepSeek-V4's labels give a
    :class:`~posenc.rotary.TrailingRotaryEmbedding` (the whole head in, its trailing rope slice
    rotated). For MLA models (DeepSeek-V2/V3) the module's ``head_dim`` is
    ``qk_rope_head_dim``: apply it to the rope part of the queries and keys.

    >>> from posenc.hf import rope_from_hf
    >>> rope_from_hf({"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 1e4,
    ...               "rope_scaling": {"type": "linear", "factor": 2.0}}).scaling
    {'rope_type': 'linear', 'factor': 2.0}
    """
    raw = resolve_config(config)
    cfg, model_types = read_config(raw, use_transformers, unknown_ok=layout is not None)
    kw = rope_kwargs(cfg, model_types, layer_type)
    return rope_module(kw, layout, angle_dtype, cache_len, backend)


def rope_module(
    kw: Mapping[str, Any],
    layout: str | None = None,
    angle_dtype: torch.dtype | str = torch.float32,
    cache_len: int = 4096,
    backend: str = "auto",
) -> RotaryEmbedding:
    """The module of :func:`hf_rope_kwargs`' result ``kw``."""
    if "mrope_section" in kw:
        return MRoPE(
            kw["head_dim"],
            kw["mrope_section"],
            kw["base"],
            kw["scaling"],
            kw["mrope_interleaved"],
            rotary_dim=kw["rotary_dim"],
            angle_dtype=angle_dtype,
            backend=backend,
            layout=layout or kw["layout"],
        )
    if kw.get("mscales") is not None:  # PhiMoE's LongRoPE
        return MscaleLongRoPE(
            kw["head_dim"], kw["base"], kw["scaling"], layout or kw["layout"], kw["rotary_dim"],
            angle_dtype=angle_dtype, cache_len=cache_len, backend=backend, mscales=kw["mscales"],
        )  # fmt: skip
    cls = TrailingRotaryEmbedding if kw.get("rope_slice") == "trailing" else RotaryEmbedding
    return cls(
        kw["head_dim"],
        kw["base"],
        kw["scaling"],
        layout or kw["layout"],
        kw["rotary_dim"],
        angle_dtype=angle_dtype,
        cache_len=cache_len,
        backend=backend,
    )
