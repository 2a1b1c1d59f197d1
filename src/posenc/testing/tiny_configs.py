"""The tiny random model of a transformers model type that :mod:`posenc.testing.coverage`
sweeps: the type's own default config, shrunk (hidden 64, 4 query / 2 key heads of 16, vocabulary
128, 4 MoE experts, windows and chunks of 8) to enough layers to hold every layer type of its
pattern, with what a shrink must keep consistent (a rotary part of whole pairs and M-RoPE
sections that add up to it, per-layer tables and layer indices within the depth, Mamba heads
that fill the inner size, one attention layer in a hybrid whose default has none, MLA head sizes
that are sums of their parts), and what a type's default config leaves unset that its
checkpoints set (expert counts, indexer sizes, a layer pattern, rope parameters per layer type,
RoPE where it is an option). Text configs registered only under their multimodal type (Mllama's,
Emu3's) are built with the causal LM whose config class they are (:func:`causal_lm_class`).
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import torch

#: The tiny model's sizes, on the keys the type's config has.
SIZES: dict[str, int] = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
}  # fmt: skip
#: Other integer keys shrunk wherever a config has them (name pattern -> value).
_SHRINK: list[tuple[re.Pattern[str], int]] = [
    (re.compile(k), v)
    for k, v in {
        r"^(moe_|shared_expert_|expert_|ffn_|dense_)?intermediate_size(_mlp)?$": 64,
        r"^moe_intermediate_size$": 32,
        r"^(num_experts|n_routed_experts|num_local_experts|n_experts|moe_num_experts)$": 4,
        r"^(num_experts_per_tok|moe_k|moe_topk|n_activated_experts|num_experts_per_token)$": 2,
        r"^(n_shared_experts|num_shared_experts)$": 1,
        r"^(n_group|topk_group|num_expert_group)$": 1,
        r"^q_lora_rank$": 32, r"^kv_lora_rank$": 16, r"^qk_rope_head_dim$": 8,
        r"^qk_nope_head_dim$": 8, r"^v_head_dim$": 16, r"^rotary_dim$": 8,
        r"^(linear_key_head_dim|linear_value_head_dim)$": 16, r"^linear_num_key_heads$": 2,
        r"^linear_num_value_heads$": 4, r"^sliding_window$": 8, r"^attention_chunk_size$": 8,
        r"^vocab_size_per_layer_input$": 128, r"^hidden_size_per_layer_input$": 16,
        r"^laurel_rank$": 8, r"^num_kv_shared_layers$": 0, r"^index_(n|num)_heads$": 2,
        r"^index_head_dim$": 16, r"^index_topk$": 4, r"^first_k_dense_replace$": 1,
        # recurrent mixers: their chunked scans are Python loops over state of these sizes
        r"^mamba_d_state$": 16, r"^mamba_chunk_size$": 8, r"^linear_head_dim$": 16,
        r"^linear_num_heads$": 4, r"^ffn_hidden_size$": 64,
    }.items()
]  # fmt: skip
#: Shrunk keys never raised past the type's own value (ZAYA routes to exactly one expert).
_NO_GROWTH = frozenset({"num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token"})
_EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts", "n_experts",
                  "moe_num_experts")  # fmt: skip
#: Sizes a type's default config leaves unset (None) that its modeling reads: Dots1's experts,
#: the Qwen4-exp indexer's heads and budget (their checkpoints set them).
_UNSET: dict[str, int] = {
    "n_routed_experts": 4, "n_shared_experts": 1, "indexer_n_heads": 2, "indexer_kv_heads": 1,
    "indexer_head_dim": 16, "indexer_budget": 8, "indexer_compress_ratio": 2,
}  # fmt: skip
#: A layer pattern for a type whose default config has none (``layer_types`` None) and whose
#: model reads one: LFM2-MoE's checkpoints mix short convolutions with attention layers.
_LAYER_PATTERNS: dict[str, list[str]] = {
    "lfm2_moe": ["conv", "conv", "full_attention", "conv"],
}
_MAX_PARAMETERS = 25_000_000  # a generic shrink that leaves more missed a size key: not tiny


def _layer_count(layer_types: list[str] | None, low: int = 4, high: int = 12) -> int:
    """The fewest layers (at least ``low``) whose prefix of ``layer_types`` holds every type."""
    if not layer_types:
        return low
    kinds = set(layer_types)
    for n in range(low, min(high, len(layer_types)) + 1):
        if set(layer_types[:n]) == kinds:
            return n
    return max(low, min(high, len(layer_types)))


def tiny_config(model_type: str, layers: int | None = None) -> Any:
    """``model_type``'s text config, shrunk (module docstring), eager attention."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = CONFIG_MAPPING[model_type]().get_text_config(decoder=True)
    own = text.to_dict()
    aliases = getattr(type(text), "attribute_map", {})
    kw: dict[str, Any] = {}
    kw.update({key: v for key, value in own.items() if (v := _shrunk(key, value)) is not None})
    # a size under the config's own name where it aliases ours (DBRX's d_model, n_heads)
    kw.update({aliases.get(k, k): v for k, v in SIZES.items() if k in own or k in aliases})
    _shrink_blocks(own, kw)
    _fit_mla(own, kw)
    _fit_mamba(own, kw)
    kw.update({k: v for k, v in _UNSET.items() if k in own and own[k] is None})
    for key in _NO_GROWTH & own.keys():  # a router left unset (DeepSeek-V2's own default)
        if own[key] is None and any(isinstance({**own, **kw}.get(k), int) for k in _EXPERT_COUNTS):
            kw[key] = 2
    if own.get("layer_types", []) is None and model_type in _LAYER_PATTERNS:
        own["layer_types"] = _LAYER_PATTERNS[model_type]
    _fill_rope(own, kw)
    if "position_embedding_type" in own and own["position_embedding_type"] is None:
        kw["position_embedding_type"] = "rope"  # RoPE an option, off by default (Granite-4.0-H)
    kinds = own.get("layer_types") if isinstance(own.get("layer_types"), list) else None
    if kinds and "mlp" in kinds:  # Dory's to_dict: an (attention, mlp) block pair per layer
        kinds = own["layer_types"] = kinds[::2]
        for key in ("num_hidden_layers", "n_input_layers", "n_recurrent_layers",
                    "n_output_layers"):  # fmt: skip
            if isinstance(own.get(key), int):
                own[key] //= 2
    n = layers or _layer_count(kinds)
    kw["num_hidden_layers"] = n
    depth = own.get("num_hidden_layers")
    for key, value in own.items():  # per-layer lists follow the layer count
        if isinstance(value, list) and value and (key == "layer_types" or len(value) == depth):
            kw[key] = (value * n)[:n]
        elif _is_layer_index_list(key, value, depth):  # indices of layers: those kept
            kw[key] = [i for i in value if i < n]
    _fit_layer_blocks(own, kw, n)
    _one_attention_layer(own, kw, n)
    _fit_per_layer(own, kw, n)
    _fit_rotary(model_type, own, kw)
    kw.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = type(text)(**{**own, **kw})
    config._attn_implementation = "eager"
    return config


def _shrunk(key: str, value: Any) -> int | None:
    """The shrunk value of an integer ``key`` of a config (the last :data:`_SHRINK` pattern
    that matches it; never above the type's own for :data:`_NO_GROWTH`), None for another."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    out = None
    for pattern, v in _SHRINK:
        if pattern.match(key):
            out = min(v, value) if key in _NO_GROWTH else v
    return out


def _shrink_blocks(own: dict[str, Any], kw: dict[str, Any]) -> None:
    """Sub-configs of one block (DBRX's ``attn_config``, ``ffn_config``) shrunk as the config
    is, their unset query clip set (its checkpoints clip at 8; unset, its clamp fails)."""
    for key, block in own.items():
        if not (key.endswith(("attn_config", "ffn_config", "vision_config", "audio_config"))
                and isinstance(block, dict)):  # fmt: skip
            continue
        sub = dict(block)
        for k, v in block.items():
            small = SIZES.get(k, _shrunk(k, v)) if isinstance(v, int) else None
            sub[k] = v if small is None or isinstance(v, bool) else small
        if "clip_qkv" in sub and sub["clip_qkv"] is None:
            sub["clip_qkv"] = 8.0
        kw[key] = sub


def _fit_mla(own: dict[str, Any], kw: dict[str, Any]) -> None:
    """MLA: head sizes that are sums of their parts stay sums (LongCat's ``qk_head_dim``), the
    others the rope part; one key head per query head."""
    if "qk_rope_head_dim" in kw:
        whole = kw["qk_rope_head_dim"] + kw.get("qk_nope_head_dim", 0)
        parts = own["qk_rope_head_dim"] + (own.get("qk_nope_head_dim") or 0)
        for key in ("head_dim", "qk_head_dim"):
            if key in own:
                kw[key] = whole if own[key] == parts else kw["qk_rope_head_dim"]
    if "kv_lora_rank" in kw and "num_key_value_heads" in kw:
        kw["num_key_value_heads"] = kw["num_attention_heads"]


def _fit_mamba(own: dict[str, Any], kw: dict[str, Any]) -> None:
    """Mamba heads x head size = the inner size: Falcon-H1's ``d_ssm``, else expand x hidden."""
    if isinstance(own.get("mamba_d_ssm"), int) and "mamba_d_head" in own:
        kw.update(mamba_n_heads=4, mamba_d_head=16, mamba_d_ssm=64)
    elif "mamba_d_head" in own and isinstance(own.get("mamba_expand"), int):
        if "mamba_n_heads" in own:
            kw["mamba_n_heads"] = 4
        kw["mamba_d_head"] = (
            own["mamba_expand"] * SIZES["hidden_size"] // kw.get("mamba_n_heads", 4)
        )


def _fill_rope(own: dict[str, Any], kw: dict[str, Any]) -> None:
    """RoPE parameters a type's default config leaves out where its model reads them: one
    default set per layer type where ``rope_parameters`` is empty (Cohere-Compass reads them by
    type), DBRX's ``attn_config.rope_theta`` from its ``rope_parameters``."""
    params = own.get("rope_parameters")
    kinds = own.get("layer_types")
    if params == {} and isinstance(kinds, list) and kinds:
        kw["rope_parameters"] = {k: {"rope_type": "default", "rope_theta": 10000.0}
                                 for k in dict.fromkeys(kinds)}  # fmt: skip
    attn = kw.get("attn_config", own.get("attn_config"))
    if isinstance(attn, dict) and "rope_theta" not in attn and isinstance(params, dict) and \
            "rope_theta" in params:  # fmt: skip
        kw["attn_config"] = {**attn, "rope_theta": params["rope_theta"]}


def _is_layer_index_list(key: str, value: Any, depth: Any) -> bool:
    """Whether ``value`` names layers by index (Kolibri's ``index_layers``)."""
    return (
        isinstance(value, list) and bool(value) and isinstance(depth, int)
        and key.endswith(("_layers", "_idxs", "_indices"))
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth for i in value)
    )  # fmt: skip


def _fit_layer_blocks(own: dict[str, Any], kw: dict[str, Any], n: int) -> None:
    """Dory's input, looped and output blocks, whose layer counts must add up to the depth:
    a third each at the ends, the rest looped."""
    keys = ("n_input_layers", "n_recurrent_layers", "n_output_layers")
    if all(isinstance(own.get(k), int) for k in keys):
        end = max(1, n // 3)
        kw.update(n_input_layers=end, n_recurrent_layers=n - 2 * end, n_output_layers=end)


def _one_attention_layer(own: dict[str, Any], kw: dict[str, Any], n: int) -> None:
    """A hybrid whose default config has no attention layer (Bamba's ``attn_layer_indices``
    unset, Granite-4.0-H's ``layer_types`` all Mamba; their checkpoints interleave them) gets
    its last layer as one: without it there are no positions to check."""
    kinds = kw.get("layer_types")
    if isinstance(kinds, list) and kinds and set(kinds) == {"linear_attention"}:
        kw["layer_types"] = [*kinds[:-1], "full_attention"]
    elif "attn_layer_indices" in own and not own["attn_layer_indices"]:
        kw["attn_layer_indices"] = [n - 1]


def _fit_per_layer(own: dict[str, Any], kw: dict[str, Any], n: int) -> None:
    """A per-layer override table (Gemma-4's ``per_layer_config``, keyed by layer index) kept for
    the ``n`` layers left, its head sizes shrunk by the same ratio as the model's."""
    table = own.get("per_layer_config")
    if not isinstance(table, dict):
        return
    ratio = kw.get("head_dim", 0) / own["head_dim"] if own.get("head_dim") else None
    kept: dict[str, Any] = {}
    for key, entry in table.items():
        if not (str(key).isdigit() and int(key) < n):
            continue
        entry = dict(entry) if isinstance(entry, dict) else entry
        if isinstance(entry, dict) and ratio and isinstance(entry.get("head_dim"), int):
            entry["head_dim"] = max(2, round(entry["head_dim"] * ratio))
        kept[key] = entry
    kw["per_layer_config"] = kept


def _fit_rotary(model_type: str, own: dict[str, Any], kw: dict[str, Any]) -> None:
    """A head size whose rotary part (``int(head_dim * partial_rotary_factor)``, as transformers
    rounds it) is even and holds at least three pairs, and an M-RoPE split of those pairs in
    the proportions of the type's own sections: the shrink must not make a config no real model
    has (an odd rotary part, sections summing past it)."""
    from ..hf.architectures import MROPE_MODEL_TYPES

    params = kw.get("rope_parameters", own.get("rope_parameters"))
    groups = [params] if isinstance(params, dict) and "rope_type" in params else (
        [v for v in params.values() if isinstance(v, dict)] if isinstance(params, dict) else []
    )  # fmt: skip
    factors = {float(g.get("partial_rotary_factor", 1.0)) for g in groups}
    if isinstance(own.get("partial_rotary_factor"), float):
        factors.add(own["partial_rotary_factor"])
    if "head_dim" in kw and factors != {1.0}:
        kw["head_dim"] = next(
            (d for d in (16, 24, 32, 48, 64)
             if all(int(d * f) % 2 == 0 and int(d * f) >= 6 for f in factors)),
            kw["head_dim"],
        )  # fmt: skip
    sections = [g.get("mrope_section") for g in groups if g.get("mrope_section")]
    default = MROPE_MODEL_TYPES.get(model_type)
    if not (sections or default) or not groups:
        return
    section = list(sections[0] if sections else default)  # type: ignore[arg-type]
    pairs = int(kw.get("head_dim", own.get("head_dim") or 0) * min(factors)) // 2
    total = sum(section)
    split = [s * pairs // total for s in section]
    for i in sorted(range(len(split)), key=lambda i: -(section[i] * pairs % total))[
        : pairs - sum(split)
    ]:
        split[i] += 1  # largest remainders first: the split sums to the pairs
    if len(groups) == 1 and groups[0] is params:
        kw["rope_parameters"] = {**params, "mrope_section": split}
    elif isinstance(params, dict):  # by layer type (Cohere-Compass): each type's sections
        kw["rope_parameters"] = {k: {**v, "mrope_section": split} if isinstance(v, dict) else v
                                 for k, v in params.items()}  # fmt: skip


def causal_lm_class(config: Any) -> Any:
    """The causal-LM class of ``config``: ``AutoModelForCausalLM``'s, or for a text config that
    mapping leaves out (Mllama's, Emu3's: registered under their multimodal type) the causal LM
    of the registry whose ``config_class`` it is."""
    import transformers
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    )

    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    for name in dict.fromkeys(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is not None and getattr(cls, "config_class", None) is type(config):
            return cls
    raise ValueError(f"transformers has no causal LM for {type(config).__name__}")


def tiny_model(model_type: str) -> Any:
    """A random causal LM of :func:`tiny_config` (seed 0) in eval mode; ValueError naming why
    where none builds (too large after the generic shrink, or the config refuses it)."""
    errors = []
    for layers in (None, 0):  # 0: the type's own depth, for per-layer tables keyed by index
        try:
            config = tiny_config(model_type, layers or None)
            if layers == 0:
                config = tiny_config(model_type, min(int(_own_depth(model_type)), 64))
            with torch.device("meta"):
                meta = causal_lm_class(config)._from_config(config)
            count = sum(p.numel() for p in meta.parameters())
            if count > _MAX_PARAMETERS:
                raise ValueError(f"{count / 1e6:.1f}M parameters after the generic shrink")
            torch.manual_seed(0)
            model = causal_lm_class(config)._from_config(config).eval()
            with torch.no_grad():
                model(torch.arange(3, 11)[None])  # it runs
            return model
        except Exception as e:  # any reason is the family's verdict
            errors.append(one_line(e))
    raise ValueError(
        errors[0] if errors[0] == errors[-1] else f"{errors[0]}; at full depth: {errors[-1]}"
    )


def _own_depth(model_type: str) -> int:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return int(CONFIG_MAPPING[model_type]().get_text_config(decoder=True).num_hidden_layers)


def one_line(e: BaseException, width: int = 160) -> str:
    """``e``'s message on one line, cut to ``width`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= width else text[: width - 3] + "..."
