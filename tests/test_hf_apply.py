"""posenc inside a transformers model: ``apply_posenc`` on a tiny random model of every supported
architecture gives stock transformers' logits (prefill, left padding, decode with a KV cache) and
greedy tokens; bf16 is no worse than transformers' own bf16; ``scaling=`` equals transformers
built with the same ``rope_parameters``; a wrong rotation planted inside posenc is caught."""

from __future__ import annotations

import copy
import importlib
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from packaging.version import Version  # noqa: E402
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, DynamicCache  # noqa: E402

import posenc.hf.rotary as hf_rotary  # noqa: E402
from _decode import hf_prefill_then_decode  # noqa: E402
from _tiny import PARITY_SIZES  # noqa: E402
from _tiny_families import CONFIGS as FAMILIES  # noqa: E402
from posenc.hf.patch import (  # noqa: E402
    SUPPORTED,
    apply_posenc,
    remove_posenc,
    supported_model_types,
)

TOL = 1e-6
# DeepSeek-V2 rotates by a complex product in float32 ((a + ib)(c + id), rounded as the complex
# kernel rounds it), posenc by x cos - y sin: a few ulps apart, 5e-6 in its logits of size ~5.
TOLS = {"deepseek_v2": 1e-5}
# transformers 5 configs take rope_parameters; 4.x ones rope_theta and rope_scaling (rope_kwargs).
TRANSFORMERS_5 = Version(transformers.__version__).major >= 5
COMMON: dict[str, Any] = {**PARITY_SIZES, "attn_implementation": "eager"}
SLIDING = {"sliding_window": 4}
EXTRA: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "qwen3_next": FAMILIES["qwen3_next"],  # a Gated DeltaNet layer, then a softmax one
    "phi3": {"partial_rotary_factor": 0.5},
    "gemma2": SLIDING,
    "gemma3_text": {
        **SLIDING,
        "num_hidden_layers": 3,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        },
    },
    "olmo3": {**SLIDING, "num_hidden_layers": 4},
    "cohere2": {**SLIDING, "num_hidden_layers": 4},
    "smollm3": {"num_hidden_layers": 4},
    "gpt_neox": {"partial_rotary_factor": 0.5},
    "stablelm": {"partial_rotary_factor": 0.5},
    "glm": {"partial_rotary_factor": 0.5},
    # a rope slice of 8 (the class's 64/512 of head_dim 16 is one pair, where every pairing agrees)
    "deepseek_v4": {"partial_rotary_factor": 0.5},
    "deepseek_v3": {
        "head_dim": 8,  # the rope part: qk_rope_head_dim
        "num_key_value_heads": 4,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
    },
}
# DSA: DeepSeek-V3's MLA plus an indexer (its own rotation) keeping every key: a discrete top-k
# flips under bf16 rounding, whoever rounds (tests/test_hf_indexer.py selects 4 in float32).
DSA = {**EXTRA["deepseek_v3"], "index_topk": 64, "index_head_dim": 16, "index_n_heads": 2}
EXTRA |= {"deepseek_v32": DSA, "glm_moe_dsa": DSA}
# DeepSeek-V2: the same MLA sizes, its complex rotation (DeepSeek-V3's keys: V2 has no dense
# first layers' switch of the same name, and its default router leaves top-k unset).
EXTRA["deepseek_v2"] = {**EXTRA["deepseek_v3"], "topk_method": "greedy"}
# LongCat-Flash: DeepSeek-V3's MLA sizes and rotation; its query/key head the nope and rope
# parts together.
EXTRA["longcat_flash"] = {**EXTRA["deepseek_v3"], "qk_head_dim": 16}
# Bailing's hybrid: a linear-attention layer, then an MLA one (its experts by another name).
EXTRA["bailing_hybrid"] = {
    **EXTRA["deepseek_v3"], "num_experts": 4, "num_hidden_layers": 2, "layer_group_size": 2,
    "layer_types": ["linear_attention", "full_attention"],
}  # fmt: skip
# The text decoders of the vision-language models are built inside the full model.
VL = {"qwen2_vl": [2, 3, 3], "qwen2_5_vl": [2, 3, 3]}
ARCHS = [t for t in supported_model_types() if not t.endswith("_text") or t == "gemma3_text"]
ARCHS = [t for t in ARCHS if t != "gemma3"]  # gemma3 (multimodal) shares gemma3_text's module
# apply_posenc refuses these with transformers 4.x: their attention calls
# apply_multimodal_rotary_pos_emb there (the M-RoPE sections are chosen inside), not
# apply_rotary_pos_emb (test_every_supported_type_has_its_modeling_module checks it).
NEEDS_TRANSFORMERS_5 = {"qwen2_vl", "qwen2_5_vl", "qwen2_vl_text", "qwen2_5_vl_text", "glm4v_text"}


LONGROPE_FACTORS = ("short_factor", "long_factor")


def rope_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """``rope_parameters`` as the installed transformers' config classes take them: 5.x's own
    key; 4.x's ``rope_theta``, ``partial_rotary_factor`` and ``rope_scaling`` (the rest), and
    for Gemma-3's per-layer-type dict ``rope_local_base_freq`` (the sliding layers' base)."""
    if TRANSFORMERS_5:
        return {"rope_parameters": params}
    if "full_attention" in params:
        sliding = params.get("sliding_attention") or {}
        if sliding.get("rope_type", "default") != "default":
            pytest.skip("transformers 4.x's Gemma-3 rotates its sliding layers with default RoPE")
        local = {"rope_local_base_freq": sliding.get("rope_theta", 10000.0)}
        return {**rope_kwargs(params["full_attention"]), **local}
    top = {k: params[k] for k in ("rope_theta", "partial_rotary_factor") if k in params}
    return {**top, "rope_scaling": {k: v for k, v in params.items() if k not in top}}


def own_rope(model: torch.nn.Module) -> dict[str, Any]:
    """The text config's ``rope_theta`` and ``partial_rotary_factor`` (5.x: its rope_parameters)."""
    text = model.config.get_text_config(decoder=True)
    own = text.rope_parameters if TRANSFORMERS_5 else vars(text)
    return {k: own[k] for k in ("rope_theta", "partial_rotary_factor") if own.get(k) is not None}


def require_model_type(model_type: str) -> None:
    """Skip where the installed transformers lacks ``model_type`` or apply_posenc refuses it."""
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    if model_type in NEEDS_TRANSFORMERS_5 and not TRANSFORMERS_5:
        pytest.skip(
            f"apply_posenc refuses {model_type} on transformers 4.x: its attention calls "
            "apply_multimodal_rotary_pos_emb, not apply_rotary_pos_emb"
        )


def tiny(model_type: str, rope_parameters: dict | None = None, **kw: Any) -> torch.nn.Module:
    require_model_type(model_type)
    torch.manual_seed(0)
    if model_type in VL:
        text = {**COMMON, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": VL[model_type]}}  # fmt: skip
        if rope_parameters is not None:
            text["rope_parameters"] = {**rope_parameters, "mrope_section": VL[model_type]}
        vision = {"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2,
                  "out_hidden_size": 64, "intermediate_size": 32}  # fmt: skip
        cfg = CONFIG_MAPPING[model_type](text_config=text, vision_config=vision, **kw)
        cfg._attn_implementation = "eager"
        module = importlib.import_module(f"transformers.models.{model_type}")
        cls = next(
            getattr(module, n) for n in dir(module) if n.endswith("ForConditionalGeneration")
        )
        return cls(cfg).eval()
    args = {**COMMON, **EXTRA.get(model_type, {}), **kw}
    if rope_parameters is not None:
        args["rope_parameters"] = rope_parameters
    if "rope_parameters" in args:
        args |= rope_kwargs(args.pop("rope_parameters"))
    if model_type == "phi3" and not TRANSFORMERS_5 and args.get("rope_scaling"):
        # 4.x's Phi-3 takes type, short_factor and long_factor only (the length: config-level)
        sc = args["rope_scaling"]
        args["rope_scaling"] = {"type": sc["rope_type"]} | {k: sc[k] for k in LONGROPE_FACTORS}
    return AutoModelForCausalLM.from_config(CONFIG_MAPPING[model_type](**args)).eval()


def patched(model: torch.nn.Module, **kw: Any) -> torch.nn.Module:
    return apply_posenc(copy.deepcopy(model), **kw)


def left_padded(batch: int = 3, seq: int = 10) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, COMMON["vocab_size"], (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[1, :1] = 0
    ids = ids.masked_fill(mask == 0, COMMON["pad_token_id"])
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


def logits(model: torch.nn.Module, ids, mask, positions, model_type: str) -> torch.Tensor:
    kw = {} if model_type in VL else {"position_ids": positions}
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, **kw).logits


def worst(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b).abs()[mask.bool()].max())


@pytest.mark.parametrize("model_type", ARCHS)
def test_prefill_with_left_padding_gives_stock_logits(model_type: str) -> None:
    stock = tiny(model_type)
    ids, mask, positions = left_padded()
    want = logits(stock, ids, mask, positions, model_type)
    got = logits(patched(stock), ids, mask, positions, model_type)
    assert worst(want, got, mask) <= TOLS.get(model_type, TOL)


@pytest.mark.parametrize("model_type", ARCHS)
def test_decode_with_cache_gives_stock_logits(model_type: str) -> None:
    stock = tiny(model_type)
    fused = patched(stock)
    ids, _, _ = left_padded(batch=2, seq=9)

    def run(model: torch.nn.Module) -> torch.Tensor:
        return hf_prefill_then_decode(model, ids, 5, cache=DynamicCache(config=model.config))

    assert float((run(stock) - run(fused)).abs().max()) <= TOLS.get(model_type, TOL)


@pytest.mark.parametrize("model_type", ARCHS)
def test_greedy_generate_gives_stock_tokens(model_type: str) -> None:
    stock = tiny(model_type)
    ids, mask, _ = left_padded(batch=2, seq=6)
    kw = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = stock.generate(input_ids=ids, attention_mask=mask, **kw)
        got = patched(stock).generate(input_ids=ids, attention_mask=mask, **kw)
    assert torch.equal(want, got)


@pytest.mark.parametrize("model_type", ARCHS)
def test_bf16_is_no_worse_than_transformers_bf16(model_type: str) -> None:
    """The logits' RMS error against float32, patched bf16 vs stock bf16. Per rotation posenc
    rounds once where transformers rounds three times (tests/test_hf_rotary_pieces.py); through a
    whole bf16 model the two errors are of one size and either may be the larger by chance
    (measured over these architectures: posenc/stock 0.30-1.19), hence the 1.25 bound."""
    if model_type == "mixtral" and not TRANSFORMERS_5:
        pytest.skip(
            "transformers 4.x's Mixtral in bf16: its top-2 routing flips by chance on these "
            "inputs (7 tokens patched, 3 stock, of 60), beyond what the 1.25 bound absorbs"
        )
    stock = tiny(model_type)
    ids, mask, positions = left_padded(batch=4, seq=16)
    reference = logits(stock, ids, mask, positions, model_type)

    def rms(model: torch.nn.Module) -> float:
        out = logits(model.to(torch.bfloat16), ids, mask, positions, model_type).float()
        return float(((out - reference)[mask.bool()] ** 2).mean().sqrt())

    err_stock, err_fused = rms(copy.deepcopy(stock)), rms(patched(stock))
    assert err_fused <= 1.25 * err_stock + 1e-4, (err_fused, err_stock)


def test_state_dict_is_unchanged_and_remove_restores_the_model() -> None:
    stock = tiny("llama")
    model = copy.deepcopy(stock)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_posenc(model, scaling={"rope_type": "linear", "factor": 2.0})
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all("forward" in a.__dict__ for a in model.posenc_patch.attention)
    remove_posenc(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert type(model.model.rotary_emb).__name__ == "LlamaRotaryEmbedding"
    ids, mask, positions = left_padded()
    assert torch.equal(
        logits(model, ids, mask, positions, "llama"), logits(stock, ids, mask, positions, "llama")
    )


def test_other_models_of_the_same_class_are_untouched() -> None:
    a, b = tiny("llama"), tiny("llama")
    apply_posenc(a)
    assert not any("forward" in m.__dict__ for m in b.modules())
    from transformers.models.llama import modeling_llama

    assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__


def test_the_patched_layers_run_posenc(monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.hf import patch as hf_patch

    calls = []
    real = hf_patch.apply_rotary_pos_emb  # what the patched forward's rotation calls
    model = patched(tiny("llama"))
    monkeypatch.setattr(
        hf_patch, "apply_rotary_pos_emb", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    ids, mask, positions = left_padded()
    logits(model, ids, mask, positions, "llama")
    assert len(calls) == COMMON["num_hidden_layers"]


class _Unplanned(dict):
    """A plan cache that keeps nothing: every drop-in call runs its checked path."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _swapped_pairs(real: Any) -> Any:
    def planted(q, k, cos, sin, *, layout: str = "half", **kw: Any):  # the wrong pairing
        return real(q, k, cos, sin, layout="interleaved" if layout == "half" else "half", **kw)

    return planted


@pytest.mark.parametrize("model_type", ARCHS)
def test_a_wrong_rotation_inside_posenc_is_caught(
    model_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stock = tiny(model_type)
    monkeypatch.setattr(hf_rotary, "rope_qk", _swapped_pairs(hf_rotary.rope_qk))
    # No drop-in plans: a layout seen before would run its plan, not the planted rope_qk.
    monkeypatch.setattr(hf_rotary, "_DROP_IN_PLANS", _Unplanned())
    with pytest.raises(RuntimeError, match="no longer rotates as posenc expects"):
        patched(stock)  # the check at patch time
    # Past that check, the logits comparison of these tests fails too.
    monkeypatch.setattr("posenc.hf.patch.check_rotation", lambda *a: None)
    ids, mask, positions = left_padded()
    want = logits(stock, ids, mask, positions, model_type)
    assert worst(want, logits(patched(stock), ids, mask, positions, model_type), mask) > 1e-3


def test_a_changed_transformers_rotation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    def interleaved_apply(q, k, cos, sin, unsqueeze_dim=1):
        def rot(x):
            return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)

        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin

    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", interleaved_apply)
    with pytest.raises(RuntimeError, match=r"modeling_llama\.apply_rotary_pos_emb no longer"):
        apply_posenc(tiny("llama"))


def test_a_missing_transformers_rotation_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A modeling module without the rotation posenc replaces (4.x's Qwen2-VL) is refused."""
    from transformers.models.llama import modeling_llama

    model = tiny("llama")
    monkeypatch.delattr(modeling_llama, "apply_rotary_pos_emb")
    with pytest.raises(RuntimeError, match=r"modeling_llama has no apply_rotary_pos_emb: this "):
        apply_posenc(model)
    assert getattr(model, "posenc_patch", None) is None


# (model type, scaling, config keys both models get: lengths the scaling must cross at seq 12)
SCALINGS = [
    ("llama", {"rope_type": "linear", "factor": 4.0}, {}),
    ("llama", {"rope_type": "dynamic", "factor": 2.0}, {"max_position_embeddings": 8}),
    ("llama", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}, {}),
    (
        "llama",
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8,
        },
        {},
    ),
    (
        "phi3",
        {
            "rope_type": "longrope",
            "short_factor": [1.0 + i / 8 for i in range(4)],
            "long_factor": [2.0 + i for i in range(4)],
            "original_max_position_embeddings": 6,
        },
        {"original_max_position_embeddings": 6},  # Phi-3's config-level length wins
    ),
    ("cohere", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}, {}),
    (
        "deepseek_v3",
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        {},
    ),
    ("qwen2_vl", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}, {}),
]


@pytest.mark.parametrize(("model_type", "scaling", "lengths"), SCALINGS)
def test_scaling_equals_transformers_with_the_same_rope_parameters(
    model_type: str, scaling: dict, lengths: dict
) -> None:
    base = tiny(model_type, **lengths)
    kept = own_rope(base)  # theta, partial rotary: kept
    reference = tiny(model_type, {**kept, **scaling}, **lengths)
    reference.load_state_dict(base.state_dict())
    ids, mask, positions = left_padded(seq=12)  # past every original length above
    want = logits(reference, ids, mask, positions, model_type)
    got = logits(patched(base, scaling=scaling), ids, mask, positions, model_type)
    assert worst(want, got, mask) <= 1e-5
    assert worst(want, logits(base, ids, mask, positions, model_type), mask) > 1e-3


def test_scaling_per_layer_type_equals_transformers() -> None:
    full = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    base = tiny("gemma3_text")
    params = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_theta": 1e6, **full},
    }
    reference = tiny("gemma3_text", params)
    reference.load_state_dict(base.state_dict())
    ids, mask, positions = left_padded(seq=12)
    want = logits(reference, ids, mask, positions, "gemma3_text")
    got = logits(
        patched(base, scaling={"full_attention": full}), ids, mask, positions, "gemma3_text"
    )
    assert worst(want, got, mask) <= 1e-5


def test_torch_compile_gives_the_eager_logits() -> None:
    # Compiling reorders float32 reductions (matmuls, RMSNorm, softmax): stock transformers
    # compiled differs from itself eager by up to 1.19e-5 on this model (AMD EPYC, 3 of 3 runs),
    # so the bound on compiled-vs-eager is the stock model's own drift with a 4x margin, never
    # below 1e-5; the patched model must not add drift of its own beyond that.
    stock = tiny("llama")
    ids, mask, positions = left_padded()
    stock_eager = logits(stock, ids, mask, positions, "llama")
    stock_drift = worst(
        stock_eager,
        logits(torch.compile(stock, fullgraph=False), ids, mask, positions, "llama"),
        mask,
    )
    torch._dynamo.reset()
    model = patched(stock)
    want = logits(model, ids, mask, positions, "llama")
    assert worst(want, stock_eager, mask) <= 1e-6  # patched equals stock in eager
    # fullgraph: a left-padded prefill of the patched model is one graph (the decode test
    # compiles only the decode step and relies on this for the prefill).
    compiled = torch.compile(model, fullgraph=True)
    got = logits(compiled, ids, mask, positions, "llama")
    assert worst(want, got, mask) <= max(1e-5, 4 * stock_drift)


def test_refusals_name_what_is_wrong() -> None:
    gpt2 = AutoModelForCausalLM.from_config(
        CONFIG_MAPPING["gptj"](vocab_size=32, n_embd=32, n_layer=1, n_head=2, rotary_dim=8)
    )
    gptj = r"does not support model_type 'gptj' \(its apply_rotary_pos_emb takes .*by name: .*llama"
    with pytest.raises(ValueError, match=gptj):
        apply_posenc(gpt2)
    with pytest.raises(TypeError, match="takes a transformers model"):
        apply_posenc(torch.nn.Linear(2, 2))
    model = tiny("llama")
    with pytest.raises(ValueError, match="backend must be one of"):
        apply_posenc(model, backend="cuda")
    with pytest.raises(ValueError, match="rope_type"):
        apply_posenc(model, scaling={"rope_type": "yarnn", "factor": 2.0})
    assert getattr(model, "posenc_patch", None) is None  # nothing changed by the failed calls
    assert not any("forward" in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="has no posenc applied"):
        remove_posenc(model)
    apply_posenc(model)
    with pytest.raises(ValueError, match="already has posenc applied"):
        apply_posenc(model)
    with pytest.raises(ValueError, match="keyed by layer type"):
        apply_posenc(remove_posenc(model), scaling={"full_attention": {"rope_type": "linear"}})


def test_every_supported_type_has_its_modeling_module() -> None:
    for model_type, (module, names) in SUPPORTED.items():
        if model_type not in CONFIG_MAPPING:  # a model newer than the installed transformers
            continue
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        has = all(callable(getattr(modeling, n, None)) for n in names)
        assert has == (TRANSFORMERS_5 or model_type not in NEEDS_TRANSFORMERS_5), model_type


# --- a patched model as users handle it -----------------------------------------------------


def test_deepcopy_pickle_and_torch_save_keep_the_patch(tmp_path: Any) -> None:
    import io
    import pickle

    stock = tiny("llama")
    model = patched(stock)
    ids, mask, positions = left_padded()
    want = logits(model, ids, mask, positions, "llama")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    copies = [
        copy.deepcopy(model),
        pickle.loads(pickle.dumps(model)),
        torch.load(buffer, weights_only=False),
    ]
    for other in copies:
        assert (
            other.posenc_patch is not None
            and other.posenc_patch.attention[0] is not (model.posenc_patch.attention[0])
        )
        assert torch.equal(logits(other, ids, mask, positions, "llama"), want)
        remove_posenc(other)
        assert not any("forward" in m.__dict__ for m in other.modules())
    # A fresh process rebuilds what the patched forwards read.
    path = tmp_path / "patched.pt"
    with torch.no_grad():
        plain = model(input_ids=ids).logits
    torch.save({"model": model, "ids": ids, "want": plain}, path)
    code = (
        f"import torch; d = torch.load({str(path)!r}, weights_only=False); m = d['model']; "
        "out = m(input_ids=d['ids']).logits; assert (out - d['want']).abs().max() < 1e-5; "
        "assert type(m.model.layers[0].self_attn.forward).__name__ == 'PatchedForward'; print('ok')"
    )
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_shadow_modules_do_not_pile_up() -> None:
    import sys

    model = tiny("llama")
    apply_posenc(model)
    remove_posenc(model)
    before = sorted(n for n in sys.modules if n.startswith("posenc_shadow"))
    for _ in range(4):
        remove_posenc(apply_posenc(model))
        apply_posenc(tiny("llama"))
    assert sorted(n for n in sys.modules if n.startswith("posenc_shadow")) == before


def test_an_accelerate_style_hook_is_kept() -> None:
    """accelerate's device hooks set ``layer._old_forward`` and a ``layer.forward`` that calls
    it: posenc replaces the old forward under the hook, and remove_posenc puts it back."""
    import functools

    model = tiny("llama")
    calls = []
    for layer in (lay.self_attn for lay in model.model.layers):
        layer._old_forward = layer.forward

        def hooked(module: torch.nn.Module, *args: Any, **kw: Any) -> Any:
            calls.append(1)
            return module._old_forward(*args, **kw)

        layer.forward = functools.partial(hooked, layer)
    stock = tiny("llama")
    ids, mask, positions = left_padded()
    apply_posenc(model)
    got = logits(model, ids, mask, positions, "llama")
    assert len(calls) == COMMON["num_hidden_layers"]
    assert worst(got, logits(stock, ids, mask, positions, "llama"), mask) <= TOL
    assert type(model.model.layers[0].self_attn._old_forward).__name__ == "PatchedForward"
    remove_posenc(model)
    assert isinstance(model.model.layers[0].self_attn.forward, functools.partial)
    assert type(model.model.layers[0].self_attn._old_forward).__name__ == "method"
    other = tiny("llama")
    other.model.layers[0].self_attn.forward = lambda *a, **k: None
    with pytest.raises(ValueError, match="already has a forward of its own"):
        apply_posenc(other)
    assert getattr(other, "posenc_patch", None) is None  # the refusal changed nothing
    assert not any(
        type(m.__dict__.get("forward")).__name__ == "PatchedForward" for m in other.modules()
    )


def test_backward_gives_the_stock_gradients() -> None:
    stock = tiny("llama")
    model = patched(stock)
    ids, mask, positions = left_padded()
    for m in (stock, model):
        m.zero_grad()
        m(input_ids=ids, attention_mask=mask, position_ids=positions, labels=ids).loss.backward()
    for (name, a), b in zip(stock.named_parameters(), model.parameters(), strict=True):
        assert float((a.grad - b.grad).abs().max()) <= 1e-6, name


def test_torch_compile_fullgraph_decode_with_cache() -> None:
    # The prefill fills the cache eagerly and only the decode step is compiled: a compiled
    # prefill is test_torch_compile_gives_the_eager_logits' (fullgraph too), and each graph is
    # 10-25 s of inductor's C++ builds on a cold cache (CI's every run).
    model = patched(tiny("llama"))
    ids, _, _ = left_padded(batch=2, seq=8)
    compiled = torch.compile(model, fullgraph=True)
    outs = []
    for m in (model, compiled):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids[:, :6], cache=cache, use_cache=True)
            outs.append(m(input_ids=ids[:, 6:7], cache=cache, use_cache=True).logits)
    assert float((outs[0] - outs[1]).abs().max()) <= 1e-5


def test_deepseek_v3_without_rope_interleave() -> None:
    stock = tiny("deepseek_v3", rope_interleave=False)
    ids, mask, positions = left_padded()
    want = logits(stock, ids, mask, positions, "deepseek_v3")
    assert worst(want, logits(patched(stock), ids, mask, positions, "deepseek_v3"), mask) <= TOL


@pytest.mark.parametrize("model_type", sorted(VL))
def test_vision_language_text_with_3d_positions(model_type: str) -> None:
    stock = tiny(model_type)
    ids, mask, positions = left_padded()
    p3 = torch.stack([positions, positions // 2, positions % 3])  # [3, b, s]: t, h, w differ
    with torch.no_grad():
        want = stock(input_ids=ids, attention_mask=mask, position_ids=p3).logits
        got = patched(stock)(input_ids=ids, attention_mask=mask, position_ids=p3).logits
    assert worst(want, got, mask) <= TOL


def test_dynamic_ntk_keeps_transformers_history_across_calls() -> None:
    """transformers' dynamic NTK keeps the frequencies of the longest call until a call falls
    within the original length; scaling={'rope_type': 'dynamic'} does the same."""
    dynamic = {"rope_type": "dynamic", "factor": 2.0}
    base = tiny("llama", max_position_embeddings=8)
    reference = tiny("llama", {"rope_theta": 10000.0, **dynamic}, max_position_embeddings=8)
    reference.load_state_dict(base.state_dict())
    model = patched(base, scaling=dynamic)
    g = torch.Generator().manual_seed(3)
    for length in (20, 12, 20, 6, 12):
        ids = torch.randint(1, 97, (1, length), generator=g)
        with torch.no_grad():
            want, got = reference(input_ids=ids).logits, model(input_ids=ids).logits
        assert float((want - got).abs().max()) <= 1e-5, length


def test_flat_scaling_with_layers_all_rescales_every_type() -> None:
    # (the default puts a flat scaling where transformers does: tests/test_hf_scaling_layers.py)
    if not TRANSFORMERS_5:  # no reference model: its sliding layers cannot be scaled there
        pytest.skip("transformers 4.x's Gemma-3 rotates its sliding layers with default RoPE")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    base = tiny("gemma3_text")
    own = base.config.rope_parameters
    params = {t: {"rope_theta": own[t]["rope_theta"], **yarn} for t in own}
    reference = tiny("gemma3_text", params)
    reference.load_state_dict(base.state_dict())
    ids, mask, positions = left_padded(seq=12)
    want = logits(reference, ids, mask, positions, "gemma3_text")
    model = apply_posenc(copy.deepcopy(base), scaling=yarn, scaling_layers="all")
    got = logits(model, ids, mask, positions, "gemma3_text")
    assert worst(want, got, mask) <= 1e-5
