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
from posenc.hf.shadow import plain_function  # noqa: E402

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


# --- every architecture of the real-config corpus ----------------------------------------------
#
# A tiny random model per corpus architecture (hidden size, layers, experts and vocabulary shrunk;
# the RoPE parameters, head_dim, rotary dim and layer-type pattern kept) runs twice: as transformers
# built it, then with its rotary modules replaced by a stub that hands the position ids on and its
# rotation functions replaced by posenc's module (``rope_from_hf`` of the same config). Everything
# else (projections, norms, MLA latents, caches, masks) stays transformers' own.

import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
from collections.abc import Callable  # noqa: E402

from transformers import CONFIG_MAPPING, AutoModel, AutoModelForCausalLM  # noqa: E402
from transformers.models.auto.configuration_auto import model_type_to_module_name  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from _hf_corpus_paths import config_path, top_level_files  # noqa: E402
from posenc.hf import attention_temperature_from_hf  # noqa: E402
from posenc.rotary import MRoPE, RotaryEmbedding  # noqa: E402

_SHRINK = {  # config key -> tiny value (only keys the config has are set)
    "vocab_size": 97, "intermediate_size": 32, "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16, "intermediate_size_mlp": 32, "num_attention_heads": 2,
    "num_key_value_heads": 1, "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "experts_per_token": 2, "n_group": 1, "topk_group": 1,
    "first_k_dense_replace": 1, "n_shared_experts": 1, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "v_head_dim": 8, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 2, "pad_token_id": 0, "bos_token_id": 1,
    "eos_token_id": 2, "attention_chunk_size": 8, "top_k_experts": 2,
}  # fmt: skip
# Text configs the Auto classes do not map to a model (their model type is that of a sub-config).
_TEXT_MODELS = {"mllama_text_model": "MllamaForCausalLM"}


def _corpus_raw(name: str) -> dict[str, Any]:
    raw = json.loads(config_path(name).read_text())
    return {k: v for k, v in raw.items() if not k.startswith(("_source", "_via", "_notes"))}


def _compact_layers(d: dict[str, Any]) -> None:
    """Two or so layers that still hold every layer type (and RoPE and NoPE layers)."""
    types = d.get("layer_types")
    if types:
        kinds = list(dict.fromkeys(types))  # first of each type, in order
        d["layer_types"] = kinds if len(kinds) > 1 else kinds * 2
        d["num_hidden_layers"] = len(d["layer_types"])
        kept = [types.index(k) for k in d["layer_types"]]  # the original index of each
    else:
        d["num_hidden_layers"] = 2
        kept = [0, 1]
    if d.get("per_layer_config"):  # Gemma-4: the kept layers' own overrides (global_head_dim)
        overrides = {int(k): v for k, v in d["per_layer_config"].items()}
        d["per_layer_config"] = {
            new: {**overrides[old], **({"num_key_value_heads": 1} if "num_key_value_heads"
                                       in overrides[old] else {})}
            for new, old in enumerate(kept) if old in overrides
        }  # fmt: skip
    if d.get("cross_attention_layers"):  # Mllama: self, cross (to the image states), self
        d["num_hidden_layers"], d["cross_attention_layers"] = 3, [1]
    if d.get("mlp_layer_types"):  # MiMo-V2-Flash: one MLP kind per layer
        d["mlp_layer_types"] = d["mlp_layer_types"][: d["num_hidden_layers"]]
    if d.get("no_rope_layers"):
        d["no_rope_layers"] = [1, 0]  # Llama-4: a RoPE layer, then a NoPE one
        d["layer_types"], d["moe_layers"] = None, None
    if d.get("q_lora_rank") is not None:
        d["q_lora_rank"] = 16


def tiny_model(name: str, init: float = 0.2) -> tuple[nn.Module, Any]:
    """A random float32 model of the corpus file's text architecture, and its config.

    ``init``: the weights' std; large weights make attention sharp, so a wrong rotation moves
    the output (with 0.02 a base off by 1% moves DeepSeek-V3's logits by only 2e-6)."""
    config = CONFIG_MAPPING[_corpus_raw(name)["model_type"]].from_dict(_corpus_raw(name))
    text = config.get_text_config(decoder=True)
    d = text.to_dict()
    head_dim = rope_from_hf(text, _first_rope_key(text)).head_dim
    for key, value in _SHRINK.items():
        if key in d or text.attribute_map.get(key, key) in d:
            d[text.attribute_map.get(key, key)] = value
    heads = d[text.attribute_map.get("num_attention_heads", "num_attention_heads")]
    if "qk_rope_head_dim" in d:
        d["hidden_size"] = 64  # MLA: head_dim is the rope part; hidden size is free
        d["num_key_value_heads"] = heads  # MLA expands its latent to every head
    else:
        d[text.attribute_map.get("hidden_size", "hidden_size")] = heads * head_dim
        if d.get("head_dim") is not None:
            d["head_dim"] = head_dim
    if d.get("sliding_window"):
        d["sliding_window"] = min(d["sliding_window"], 8)
    if d.get("floor_scale"):
        d["floor_scale"] = 4  # Llama-4's temperature steps every 4 tokens, not every 8192
    d["initializer_range"] = init
    _compact_layers(d)
    d.pop("quantization_config", None)
    tiny = type(text).from_dict(d)
    tiny._attn_implementation = "eager"
    torch.manual_seed(0)
    auto = (
        AutoModelForCausalLM if tiny.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModel
    )
    if tiny.model_type in _TEXT_MODELS:
        model = getattr(transformers, _TEXT_MODELS[tiny.model_type])(tiny)
    else:
        model = auto.from_config(tiny, attn_implementation="eager")
    for param_name, param in model.named_parameters():
        if param_name.endswith(("cross_attn_attn_gate", "cross_attn_mlp_gate")):
            param.data.fill_(1.0)  # Mllama's gates start at 0: open, so the cross layers count
    return model.float().eval(), tiny  # the file says bf16/fp16: compare in float32


def _image_states(config: Any, batch: int) -> dict[str, torch.Tensor]:
    """Mllama's cross-attention layers attend to image states (no positions, no rotation):
    random ones, so those layers run between the rotating self-attention layers."""
    if not getattr(config, "cross_attention_layers", None):
        return {}
    generator = torch.Generator().manual_seed(1)
    return {
        "cross_attention_states": torch.randn(batch, 5, config.hidden_size, generator=generator)
    }


def _first_rope_key(text: Any) -> str | None:
    params = getattr(text, "rope_parameters", None) or {}
    keys = [k for k in params if k in set(getattr(text, "layer_types", None) or ())]
    return keys[-1] if keys else None


def _rebased(rope: nn.Module, scale: float) -> nn.Module:
    """The same module with ``base * scale`` (a deliberately wrong rotation)."""
    if hasattr(rope, "mrope_section"):
        return MRoPE(
            rope.head_dim, rope.mrope_section, rope.base * scale, rope.scaling, rope.interleaved,
            rotary_dim=rope.rotary_dim, angle_dtype="float32",
        )  # fmt: skip
    return RotaryEmbedding(
        rope.head_dim, rope.base * scale, rope.scaling, rope.layout, rope.rotary_dim,
        angle_dtype="float32",
    )  # fmt: skip


class _PositionsOut(nn.Module):
    """Stands in for a model's rotary module: returns the position ids, tagged with the posenc
    module of the layer type, where transformers' rotation functions will look for them."""

    def __init__(self, ropes: dict[str | None, nn.Module], single: bool) -> None:
        super().__init__()
        self.ropes, self.single = ropes, single

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: Any = None) -> Any:
        tagged = position_ids.clone()
        tagged.posenc_rope = self.ropes[layer_type]  # type: ignore[attr-defined]
        return tagged if self.single else (tagged, tagged)


def _rotate(rope: nn.Module, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    """posenc's rotation of ``q, k [b, h, s, w]``; ``w < head_dim``: the rotated slice only."""
    width = q.shape[-1]
    if width < rope.head_dim:  # StableLM, GPT-J hand over q[..., :rotary_dim]
        pad = (0, rope.head_dim - width)
        q, k = torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad)
    q, k = rope(q, k, positions)
    return q[..., :width], k[..., :width]


def _posenc_functions(module: Any) -> dict[str, Callable[..., Any]]:
    """Replacements for the rotation functions of a modeling module, keyed by name."""

    def pair(q, k, cos, sin=None, *args, unsqueeze_dim=1, **kwargs):  # (q, k, cos, sin)
        if unsqueeze_dim == 2:  # [b, s, h, d]
            qr, kr = _rotate(cos.posenc_rope, q.transpose(1, 2), k.transpose(1, 2), cos)
            return qr.transpose(1, 2), kr.transpose(1, 2)
        return _rotate(cos.posenc_rope, q, k, cos)

    def complex_pair(xq, xk, freqs):  # DeepSeek-V2 [b, h, s, d]; Llama-4 [b, s, h, d]
        if module.__name__.endswith("llama4"):
            qr, kr = _rotate(freqs.posenc_rope, xq.transpose(1, 2), xk.transpose(1, 2), freqs)
            return qr.transpose(1, 2), kr.transpose(1, 2)
        return _rotate(freqs.posenc_rope, xq, xk, freqs)

    def single(tensor, sin, cos):  # GPT-J: one [b, s, h, r] tensor
        x = tensor.transpose(1, 2)
        return _rotate(sin.posenc_rope, x, x, sin)[0].transpose(1, 2)

    def one(x, cos, sin, unsqueeze_dim=1):  # Gemma-4: q and k in separate calls
        if unsqueeze_dim == 2:  # [b, s, h, d]
            x = x.transpose(1, 2)
            return _rotate(cos.posenc_rope, x, x, cos)[0].transpose(1, 2)
        return _rotate(cos.posenc_rope, x, x, cos)[0]

    out: dict[str, Callable[..., Any]] = {}
    for name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb"):
        original = plain_function(getattr(module, name, None))
        if original is None:
            continue
        params = list(inspect.signature(original).parameters)
        kinds = {"x": one, "tensor": single}
        out[name] = kinds.get(params[0], complex_pair if len(params) == 3 else pair)
    return out


def with_posenc(
    model: nn.Module, config: Any, monkeypatch: pytest.MonkeyPatch, base_scale: float = 1.0
) -> nn.Module:
    """``model`` with transformers' rotary modules and rotation functions swapped for posenc's.

    Call after the reference run: the rotation functions are patched module-wide.
    ``base_scale`` != 1 builds posenc's modules with a wrong base (the negative control)."""
    swapped = copy.deepcopy(model)
    params = getattr(config, "rope_parameters", None) or {}
    keys = [k for k in params if k in set(getattr(config, "layer_types", None) or ())] or [None]
    ropes = {k: rope_from_hf(config, k) for k in keys}
    if base_scale != 1.0:
        ropes = {k: _rebased(r, base_scale) for k, r in ropes.items()}
    for parent in list(swapped.modules()):
        for child_name, child in list(parent.named_children()):
            kind = type(child).__name__
            if kind.endswith("RotaryEmbedding") and "Vision" not in kind:
                single = kind.startswith(("DeepseekV2", "Llama4"))  # complex e^{i angle} out
                setattr(parent, child_name, _PositionsOut(ropes, single))
    name = model_type_to_module_name(config.model_type)
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    for fn_name, fn in _posenc_functions(module).items():
        monkeypatch.setattr(module, fn_name, fn)
    temperature = attention_temperature_from_hf(config)
    if temperature is not None and temperature.kind == "llama4_scaling":  # Ministral-3
        monkeypatch.setattr(
            module,
            "get_llama_4_attn_scale",
            lambda positions, beta, length: temperature.scale(positions)[:, None, :, None],
        )
    elif temperature is not None:  # Llama-4: the NoPE layers' queries, by KV-cache index
        for attn in swapped.modules():
            if hasattr(attn, "attn_temperature_tuning"):
                attn.attn_temperature_tuning = False  # transformers' own scaling off
                if temperature.applies_to(attn.layer_idx):
                    _scale_queries(attn, temperature)
    return swapped


def _scale_queries(attn: nn.Module, temperature: Any) -> None:
    """Multiply ``attn.q_proj``'s output by posenc's temperature of the cache positions.

    Llama-4 scales the queries right after q_proj on its NoPE layers (no rotation or norm in
    between), so scaling the projection's output is the same product."""
    seen: dict[str, Any] = {}

    def remember_cache(module: nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        seen["cache"] = kwargs.get("cache", kwargs.get("past_key_values"))

    def scale(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        cache = seen.get("cache")
        past = cache.get_seq_length(attn.layer_idx) if cache is not None else 0
        positions = torch.arange(out.shape[1]) + past  # [s]: the cache index, not position_ids
        return (out * temperature.scale(positions)[:, None]).to(out.dtype)  # [b, s, h*d]

    attn.register_forward_pre_hook(remember_cache, with_kwargs=True)
    attn.q_proj.register_forward_hook(scale)


def _one_per_architecture() -> list[str]:
    seen: dict[tuple[str, str], str] = {}
    for path in top_level_files():
        raw = _corpus_raw(path.stem)
        text = CONFIG_MAPPING[raw["model_type"]].from_dict(copy.deepcopy(raw))
        text = text.get_text_config(decoder=True)
        params = getattr(text, "rope_parameters", None) or {}
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        seen.setdefault((text.model_type, rope_type), path.stem)
    return sorted(seen.values())


def _model_type(name: str) -> str:
    return str(_corpus_raw(name)["model_type"])


# architectures this drop-in (one rope module, no label, the leading slice) does not fit
DROPIN_SKIPS = {
    "deepseek_v4": (
        "DeepSeek-V4 (rope sets by label, trailing slice): its tiny model is checked by "
        "tests/test_hf_ds4_logits.py, with apply_posenc"
    ),
}
ARCHITECTURES = [
    pytest.param(name, marks=pytest.mark.skip(reason=DROPIN_SKIPS[_model_type(name)]))
    if _model_type(name) in DROPIN_SKIPS
    else name
    for name in _one_per_architecture()
]


def _output(result: Any) -> torch.Tensor:
    return result.logits if getattr(result, "logits", None) is not None else result[0]


def _start(config: Any) -> int:
    """A first position near the original length, so the sequences cross it (LongRoPE switches
    there); GPT-J's table has max_position_embeddings rows only."""
    params = getattr(config, "rope_parameters", None) or {}
    flat = params if "rope_type" in params else next(iter(params.values()), {}) or {}
    length = flat.get("original_max_position_embeddings") or config.max_position_embeddings
    return max(0, min(length, config.max_position_embeddings - 32) - 12)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_corpus_architecture_left_padding(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = tiny_model(name)
    ids = torch.randint(3, 97, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    mask[2, :11] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + _start(config)
    with torch.no_grad():
        image = _image_states(config, 3)
        ref = _output(model(ids, attention_mask=mask, position_ids=positions, **image))
        ours = with_posenc(model, config, monkeypatch)
        got = _output(ours(ids, attention_mask=mask, position_ids=positions, **image))
    keep = mask.bool()
    assert torch.isfinite(ref[keep]).all()
    err = (got[keep] - ref[keep]).abs().max().item()
    assert err <= TOL * max(1.0, ref[keep].abs().max().item()), err


def _decode(model: nn.Module, config: Any, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Prefill 6 tokens, then one token at a time with a KV cache; outputs ``[b, s, ...]``."""
    cache, outs = DynamicCache(config=config), []
    steps = [(0, 6)] + [(i, i + 1) for i in range(6, ids.shape[1])]
    for a, b in steps:
        positions = torch.arange(a, b)[None].expand(ids.shape[0], -1) + start
        image = _image_states(config, ids.shape[0]) if a == 0 else {}  # then read from the cache
        result = model(ids[:, a:b], position_ids=positions, cache=cache, use_cache=True, **image)
        outs.append(_output(result))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_corpus_architecture_kv_cache_decode(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, config = tiny_model(name)
    ids = torch.randint(3, 97, (2, 14))
    start = _start(config)
    with torch.no_grad():
        ref = _decode(model, config, ids, start)
        got = _decode(with_posenc(model, config, monkeypatch), config, ids, start)
    assert torch.isfinite(ref).all()
    err = (got - ref).abs().max().item()
    assert err <= TOL * max(1.0, ref.abs().max().item()), err


@pytest.mark.parametrize("name", ["deepseek-v3", "llama-3.1-8b-instruct", "qwen3-vl-8b-instruct"])
def test_corpus_architecture_detects_a_wrong_base(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guard: the comparison above moves when posenc's base is 1% off."""
    model, config = tiny_model(name)
    ids = torch.randint(3, 97, (2, 20))
    positions = torch.arange(20)[None].expand(2, -1) + _start(config)
    with torch.no_grad():
        ref = _output(model(ids, position_ids=positions))
        wrong = with_posenc(model, config, monkeypatch, base_scale=1.01)
        err = (_output(wrong(ids, position_ids=positions)) - ref).abs().max().item()
    assert err > 100 * TOL * max(1.0, ref.abs().max().item()), err


def test_tiny_deepseek_v3_gives_transformers_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acceptance: DeepSeek-V3 (MLA, YaRN with mscale, interleaved pairs) with posenc's rotary
    gives transformers' logits within 1e-5, prefill with left padding and KV-cache decode; the
    half layout that posenc read before is off by far more."""
    model, config = tiny_model("deepseek-v3", init=0.1)
    ids = torch.randint(3, 97, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :11] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0) + _start(config)
    keep = mask.bool()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, position_ids=positions).logits
        ref_decode = _decode(model, config, ids[:2, :14], _start(config))
        ours = with_posenc(model, config, monkeypatch)
        got = ours(ids, attention_mask=mask, position_ids=positions).logits
        got_decode = _decode(ours, config, ids[:2, :14], _start(config))
        half_rope = rope_from_hf(config, layout="half")  # what posenc read for DeepSeek-V3 before
        for stub in ours.modules():
            if isinstance(stub, _PositionsOut):
                stub.ropes = {None: half_rope}
        half = ours(ids, attention_mask=mask, position_ids=positions).logits
    assert (got[keep] - ref[keep]).abs().max().item() <= 1e-5
    assert (got_decode - ref_decode).abs().max().item() <= 1e-5
    assert (half[keep] - ref[keep]).abs().max().item() > 1e-3
