"""What a transformers model built from a config does with positions, layer by layer.

:func:`tiny_text_config` keeps a config's position keys and shrinks everything else (at most
``layers`` decoder layers, or up to Gemma-4's first full layer; two heads of the same head_dim,
per-layer head sizes kept and per-layer kv heads cut to one; small MLPs and vocabulary; per-layer
lists and layer indices cut to the kept layers; windows and chunks to ``window``/``chunk`` when
asked). :func:`probe` builds the model from it and runs one
forward pass with the modeling module's functions wrapped, recording per layer:

* ``rope``: whether the layer called the module's rotary function (``apply_rotary*``) before its
  attention;
* ``sliding_window``: the ``sliding_window`` argument it passed to the attention function;
* ``span``: what its attention mask lets each query see (``"full"``, ``("sliding", w)``,
  ``("chunk", c)``), read from the mask itself;
* ``temperature``: ``(kind, beta, length)`` of the query scale (Llama-4's attributes of its
  attention, Ministral-3's ``get_llama_4_attn_scale`` calls), or None;
* ``inv_freq``: the model's rotary frequencies for the layer's type.
"""

from __future__ import annotations

import copy
import functools
import importlib
from typing import Any

import pytest
import torch
import transformers
from transformers import CONFIG_MAPPING, AutoModel
from transformers.models.auto.configuration_auto import model_type_to_module_name

SEQ = 16
_SMALL = {
    "intermediate_size": 16, "moe_intermediate_size": 8, "shared_expert_intermediate_size": 8,
    "num_local_experts": 2, "num_experts": 2, "n_routed_experts": 2, "num_experts_per_tok": 1,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "vocab_size": 64,
    "vocab_size_per_layer_input": 64, "hidden_size_per_layer_input": 8, "laurel_rank": 4,
    "q_lora_rank": 16, "kv_lora_rank": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
    "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_kv_shared_layers": 0,
    "intermediate_size_mlp": 16, "first_k_dense_replace": 1, "top_k_experts": 1,
}  # fmt: skip
# Text configs AutoModel does not map to a model (their model type is that of a sub-config),
# and their modeling module (transformers 4.x maps mllama_text_model to no module of its own).
_TEXT_MODELS = {"mllama_text_model": "MllamaTextModel"}
_TEXT_MODEL_MODULES = {"mllama_text_model": "mllama"}
# The rotary functions the probe records: apply_rotary*, and transformers 4.x's Qwen2-VL and
# Qwen2.5-VL apply_multimodal_rotary_pos_emb (5.x renamed it apply_rotary_pos_emb).
_ROTARY_PREFIXES = ("apply_rotary", "apply_multimodal_rotary")
_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id")


def text_config(raw: dict[str, Any]) -> Any:
    """The decoder config transformers builds from ``raw``."""
    config = CONFIG_MAPPING[raw["model_type"]].from_dict(copy.deepcopy(raw))
    return config.get_text_config(decoder=True)


def tiny_text_config(
    raw: dict[str, Any], layers: int = 8, window: int | None = None, chunk: int | None = None
) -> Any:
    cfg = text_config(raw)
    if getattr(cfg, "per_layer_config", None) is not None:  # Gemma-4: heterogeneous config
        cfg.allow_global_per_layer_attribute_access = True
    n = cfg.num_hidden_layers
    keep = min(n, layers)
    types = getattr(cfg, "layer_types", None) or []
    heterogeneous = vars(cfg).get("_heterogeneity_spec") is not None  # per-layer overrides
    if heterogeneous and "full_attention" in types:  # Gemma-4's class makes the last layer full:
        full = [i for i, t in enumerate(types) if t == "full_attention"]  # end the kept ones on one
        keep = max([i for i in full if i < keep] or full[:1]) + 1
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    for key, value in list(vars(cfg).items()):  # per-layer lists follow the layer count
        if isinstance(value, list) and len(value) == n and key != "mrope_section":
            setattr(cfg, key, value[:keep])
    cfg.num_hidden_layers = keep
    if getattr(cfg, "max_window_layers", None) is not None:
        cfg.max_window_layers = min(cfg.max_window_layers, keep)
    cfg.num_attention_heads, cfg.num_key_value_heads = 2, 2
    if cfg.model_type == "mimo_v2_flash":  # its sliding layers have twice the kv heads
        cfg.num_key_value_heads = 1
    if hasattr(cfg, "head_dim"):
        cfg.head_dim = head_dim
    cfg.hidden_size = 2 * head_dim
    for key, value in _SMALL.items():
        current = getattr(cfg, key, None)
        if isinstance(current, list):
            setattr(cfg, key, [value] * len(current))
        elif current is not None:
            setattr(cfg, key, value)
    for key in ("moe_layers", "cross_attention_layers"):  # layer indices
        if getattr(cfg, key, None) is not None:
            setattr(cfg, key, [i for i in getattr(cfg, key) if i < keep])
    for key in _TOKENS:
        if getattr(cfg, key, None) is not None:
            setattr(cfg, key, 0)
    if window is not None and getattr(cfg, "sliding_window", None) is not None:
        cfg.sliding_window = window
    if chunk is not None and getattr(cfg, "attention_chunk_size", None) is not None:
        cfg.attention_chunk_size = chunk
    if heterogeneous:  # the per-layer overrides (Gemma-4: head_dim, num_key_value_heads)
        d = cfg.to_dict()
        d["per_layer_config"] = {
            k: {**v, **({"num_key_value_heads": 1} if "num_key_value_heads" in v else {})}
            for k, v in d["per_layer_config"].items()
            if int(k) < keep
        }  # the kept layers' own, their kv heads shrunk as the others' (1 of 2 heads)
        cfg = type(cfg).from_dict(d)
        cfg.allow_global_per_layer_attribute_access = True
    return cfg


def _span(mask: torch.Tensor | None) -> Any:
    if mask is None:
        return "full"
    m = mask[0, 0]  # [s, t]
    allowed = m if m.dtype == torch.bool else m == 0
    counts = allowed[:, -SEQ:].sum(-1).tolist()  # keys each query sees
    if counts == [q + 1 for q in range(SEQ)]:
        return "full"
    width = max(counts)
    if counts == [min(q + 1, width) for q in range(SEQ)]:
        return ("sliding", width)
    if counts == [q % width + 1 for q in range(SEQ)]:
        return ("chunk", width)
    return ("unknown", tuple(counts))


def probe(cfg: Any) -> dict[int, dict[str, Any]]:
    """Per attending decoder layer (by index) of the model built from ``cfg``: rope,
    sliding_window, span, temperature, inv_freq (see the module docstring)."""
    torch.manual_seed(0)
    cfg._attn_implementation = "eager"
    if cfg.model_type in _TEXT_MODELS:
        model = getattr(transformers, _TEXT_MODELS[cfg.model_type])(cfg).eval()
    else:
        model = AutoModel.from_config(cfg).eval()
    name = _TEXT_MODEL_MODULES.get(cfg.model_type) or model_type_to_module_name(cfg.model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    if not hasattr(module, "eager_attention_forward"):
        pytest.skip(
            f"transformers {transformers.__version__}'s modeling_{name} has no "
            "eager_attention_forward for the probe to record (its attention is inline)"
        )
    events: list[tuple[str, Any]] = []
    patched: dict[str, Any] = {}

    def wrap(fn_name: str, kind: str) -> None:
        original = getattr(module, fn_name)

        @functools.wraps(original)
        def recorder(*args: Any, **kwargs: Any) -> Any:
            if kind == "attn":
                mask = args[4] if len(args) > 4 else kwargs.get("attention_mask")
                key = args[2] if len(args) > 2 else kwargs.get("key")
                if mask is not None and key is not None:
                    # the columns of the keys, as the attention reads them (transformers 4.x's
                    # Mllama passes a mask one column wider than its keys)
                    mask = mask[..., : key.shape[-2]]
                events.append(("attn", (args[0], kwargs.get("sliding_window"), mask)))
            elif kind == "temp":
                events.append(("temp", args[1:3]))
            else:
                events.append(("rope", None))
            return original(*args, **kwargs)

        patched[fn_name] = original
        setattr(module, fn_name, recorder)

    for fn_name in list(vars(module)):
        if fn_name.startswith(_ROTARY_PREFIXES) and callable(getattr(module, fn_name)):
            wrap(fn_name, "rope")
    wrap("eager_attention_forward", "attn")
    if hasattr(module, "get_llama_4_attn_scale"):
        wrap("get_llama_4_attn_scale", "temp")
    try:
        with torch.no_grad():
            model(input_ids=torch.arange(SEQ)[None] % 60 + 1)
    finally:
        for fn_name, original in patched.items():
            setattr(module, fn_name, original)
    rotary = getattr(model, "rotary_emb", None)
    out: dict[int, dict[str, Any]] = {}
    rope = False
    temp = None
    for kind, value in events:
        if kind == "rope":
            rope = True
        elif kind == "temp":
            temp = ("llama4_scaling", float(value[0]), int(value[1]))
        else:
            attn, window, mask = value
            if getattr(attn, "attn_temperature_tuning", False) and not attn.use_rope:
                temp = ("llama4_temperature", float(attn.attn_scale), int(attn.floor_scale))
            index = attn.layer_idx
            layer_type = getattr(cfg, "layer_types", None)
            layer_type = layer_type[index] if layer_type else None
            freq = getattr(rotary, f"{layer_type}_inv_freq", None) if layer_type else None
            if freq is None and layer_type == "sliding_attention":
                # transformers 4.x's Gemma-3 and Gemma-3n: a second module for the sliding layers
                freq = getattr(getattr(model, "rotary_emb_local", None), "inv_freq", None)
            if freq is None:
                freq = getattr(rotary, "inv_freq", None)
            out[index] = {
                "rope": rope, "sliding_window": window, "span": _span(mask),
                "temperature": temp, "inv_freq": freq,
            }  # fmt: skip
            rope, temp = False, None
    return out
