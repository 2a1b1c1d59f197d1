"""``rope_from_hf``: the config forms of real models (4.x dicts, 5.x objects) and clear errors."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from packaging.version import Version  # noqa: E402
from transformers import (  # noqa: E402
    DeepseekV3Config,
    GlmConfig,
    GPTJConfig,
    LlamaConfig,
    Phi3Config,
    Qwen2VLConfig,
)
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig  # noqa: E402

from posenc.hf import hf_rope_kwargs, rope_from_hf  # noqa: E402
from posenc.rotary import MRoPE  # noqa: E402

TOL = 1e-6
# transformers 5 configs take rope_parameters; 4.x ones rope_theta and rope_scaling.
TRANSFORMERS_5 = Version(transformers.__version__).major >= 5


def gptj_sin_cos(config: GPTJConfig, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """GPT-J's own sin, cos ``[b, s, r/2]``: transformers 5's GPTJRotaryEmbedding, or the table
    4.x's attention reads (``create_sinusoidal_positions``, sin then cos)."""
    rotary = getattr(modeling_gptj, "GPTJRotaryEmbedding", None)
    if rotary is not None:
        return tuple(rotary(config)(torch.zeros(1), positions))
    table = modeling_gptj.create_sinusoidal_positions(config.n_positions, config.rotary_dim)
    return tuple(table[positions].chunk(2, dim=-1))


def test_gptj_interleaved_partial() -> None:
    config = GPTJConfig(n_embd=64, n_head=4, rotary_dim=8, n_positions=512)
    positions = torch.tensor([[0, 1, 100, 511]])
    ref_sin, ref_cos = gptj_sin_cos(config, positions)  # [b, s, r/2]
    for cfg in (config, {"n_embd": 64, "n_head": 4, "rotary_dim": 8, "model_type": "gptj"}):
        rope = rope_from_hf(cfg)
        assert (rope.head_dim, rope.rotary_dim, rope.layout, rope.base) == (
            16,
            8,
            "interleaved",
            10000.0,
        )
        cos, sin = rope.cos_sin(positions)
        assert (cos - ref_cos).abs().max() <= TOL and (sin - ref_sin).abs().max() <= TOL


def test_gpt_neox_4x_dict() -> None:
    kw = hf_rope_kwargs(
        {"hidden_size": 256, "num_attention_heads": 8, "rotary_pct": 0.25, "rotary_emb_base": 10000}
    )
    assert kw == {
        "head_dim": 32,
        "base": 10000.0,
        "scaling": None,
        "layout": "half",
        "rotary_dim": 8,
    }


def test_glm_partial_interleaved() -> None:
    rope = rope_from_hf(
        GlmConfig(hidden_size=64, num_attention_heads=4, head_dim=16, partial_rotary_factor=0.5)
    )
    assert (rope.rotary_dim, rope.layout) == (8, "interleaved")
    assert (
        rope_from_hf(
            GlmConfig(hidden_size=64, num_attention_heads=4, head_dim=16), layout="half"
        ).layout
        == "half"
    )


def test_phi3_longrope_with_config_level_original_length() -> None:
    config = Phi3Config(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=512,
        original_max_position_embeddings=128,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + i / 8 for i in range(8)],
            "long_factor": [2.0 + i for i in range(8)],
        },
    )
    rope = rope_from_hf(config)
    assert rope.scaling["original_max_position_embeddings"] == 128 and rope.scaling["factor"] == 4.0
    for top in (100, 400):  # short factors, then long ones
        positions = torch.arange(top - 3, top + 1)[None]
        ref_cos, ref_sin = Phi3RotaryEmbedding(config)(torch.zeros(1), positions)
        cos, sin = rope.cos_sin(positions)
        assert (torch.cat((cos, cos), -1) - ref_cos).abs().max() <= TOL
        assert (torch.cat((sin, sin), -1) - ref_sin).abs().max() <= TOL


def test_deepseek_yarn_reads_all_keys() -> None:
    config = DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=4,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        kv_lora_rank=32,
        q_lora_rank=None,
        max_position_embeddings=4096,
        rope_scaling={
            "type": "yarn",
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
        },
    )
    kw = hf_rope_kwargs(config)
    assert kw["head_dim"] == kw["rotary_dim"] == 8
    assert kw["scaling"] == {
        "rope_type": "yarn",
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    # A yarn factor of None is the extension ratio, as transformers computes it.
    d = {
        "hidden_size": 64,
        "num_attention_heads": 8,
        "max_position_embeddings": 8192,
        "rope_scaling": {"type": "yarn", "factor": None, "original_max_position_embeddings": 2048},
    }
    assert rope_from_hf(d).scaling["factor"] == 4.0


def test_qwen2_vl_forms_give_mrope() -> None:
    d = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    }
    rope = rope_from_hf(d)
    assert isinstance(rope, MRoPE) and rope.mrope_section == (2, 3, 3) and rope.base == 1e6
    full = Qwen2VLConfig(
        text_config={
            "hidden_size": 64,
            "num_attention_heads": 4,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]},
        }
    )
    assert isinstance(rope_from_hf(full), MRoPE)


def test_clear_errors() -> None:
    base = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64}
    with pytest.raises(ValueError, match="unknown rope_type 'su'"):
        rope_from_hf({**base, "rope_scaling": {"type": "su", "factor": 2.0}})
    with pytest.raises(
        ValueError, match=r"unknown scaling key\(s\) \['short_mscale'\] for rope_type 'longrope'"
    ):
        rope_from_hf(
            {
                **base,
                "rope_scaling": {
                    "type": "longrope",
                    "short_factor": [1.0] * 8,
                    "long_factor": [1.0] * 8,
                    "short_mscale": 1.0,
                },
            }
        )
    with pytest.raises(
        ValueError, match=r"rope_type 'llama3' is missing required key\(s\) \['low_freq_factor'\]"
    ):
        rope_from_hf(
            {
                **base,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0},
            }
        )
    with pytest.raises(
        ValueError, match=r"rope_type 'linear' is missing required key\(s\) \['factor'\]"
    ):
        rope_from_hf({**base, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}})
    nested = {
        **base,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default"},
            "full_attention": {"rope_type": "linear", "factor": 2.0},
        },
    }
    with pytest.raises(ValueError, match="pass layer_type"):
        rope_from_hf(nested)
    with pytest.raises(ValueError, match="layer_type 'chunked_attention' has no RoPE parameters"):
        rope_from_hf(nested, "chunked_attention")
    assert rope_from_hf(nested, "full_attention").scaling == {"rope_type": "linear", "factor": 2.0}
    # transformers 5's vision config names its rope 'axial'; 4.x's has no rope keys, no heads
    axial = "rope_type 'axial'" if TRANSFORMERS_5 else "no head_dim"
    with pytest.raises(ValueError, match=axial):
        rope_from_hf(Qwen2VLVisionConfig(embed_dim=64, num_heads=4))
    with pytest.raises(ValueError, match="rotary_dim must be even for RoPE, got 9"):
        rope_from_hf({"hidden_size": 72, "num_attention_heads": 4, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="no head_dim"):
        rope_from_hf({"rope_theta": 1e4})


# --- model-aware reading -----------------------------------------------------------------------

import math  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
from pathlib import Path  # noqa: E402

from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.configuration_auto import model_type_to_module_name  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402
from transformers.models.deepseek_v2.configuration_deepseek_v2 import (  # noqa: E402
    DeepseekV2Config,
)

from posenc.hf import (  # noqa: E402
    FALLBACK_DEFAULTS,
    ROPE_INTERLEAVE_MODEL_TYPES,
    UNSUPPORTED_MODEL_TYPES,
    attention_temperature_from_hf,
)
from posenc.rotary.temperature import (  # noqa: E402
    QueryTemperature,
    llama4_scaling_scale,
    llama4_temperature_scale,
)

_MLA = {"hidden_size": 64, "num_attention_heads": 4, "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16, "v_head_dim": 16, "kv_lora_rank": 32, "q_lora_rank": None}  # fmt: skip


def _rotation_kind(source: str) -> str | None:
    """How a modeling file rotates pairs, read from its source: "half", "interleaved", "flag"."""
    if re.search(r"[^m]rope_interleave", source):
        return "flag"
    if "view_as_complex" in source:
        return "interleaved"
    unconditional = re.search(r"^\s+q_rot, k_rot = apply_rotary_pos_emb_interleave\(", source, re.M)
    if unconditional and "if self.config.rope_interleave" not in source:
        return "interleaved"
    body = re.search(r"def rotate_half\(x\):(.*?)\n\n", source, re.S)
    if body is None:
        return None
    return "interleaved" if "::2" in body.group(1) else "half"


def test_layout_table_matches_transformers_source() -> None:
    """Every causal LM in transformers: posenc's pairing is the one its modeling code uses."""
    from posenc.hf import config as hf

    root = os.path.dirname(transformers.models.__file__)
    wrong = []
    for model_type in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        name = model_type_to_module_name(model_type)
        path = os.path.join(root, name, f"modeling_{name}.py")
        if model_type in UNSUPPORTED_MODEL_TYPES or not os.path.exists(path):
            continue
        with open(path) as f:
            kind = _rotation_kind(f.read())
        if kind == "flag":
            ok = model_type in ROPE_INTERLEAVE_MODEL_TYPES
        else:
            ok = kind is None or hf._layout({}, frozenset({model_type})) == kind
        if not ok:
            wrong.append((model_type, kind))
    assert not wrong


def test_rope_interleave_defaults_are_the_config_classes() -> None:
    for model_type, default in ROPE_INTERLEAVE_MODEL_TYPES.items():
        if model_type in CONFIG_MAPPING:
            assert CONFIG_MAPPING[model_type]().rope_interleave is default, model_type


def test_fallback_table_is_the_config_classes_defaults() -> None:
    """The defaults posenc uses without transformers are those of transformers' classes."""
    if not TRANSFORMERS_5:
        pytest.skip(
            "the table holds transformers 5's class defaults; 4.x's differ (Cohere's rope_theta "
            "10000, Llama-4's layer interval and Gemma-3's local base outside rope_parameters)"
        )
    for model_type, defaults in FALLBACK_DEFAULTS.items():
        if model_type not in CONFIG_MAPPING:
            continue
        config = CONFIG_MAPPING[model_type]()
        params = getattr(config, "rope_parameters", None) or {}
        for key, value in defaults.items():
            if key in ("partial_rotary_factor", "rope_theta") and "full_attention" in params:
                got = params["full_attention"][key]  # Gemma-3: the global layers' base
            elif key in ("partial_rotary_factor", "rope_theta"):
                got = params.get(key, getattr(config, key, None))
            elif key == "rope_local_base_freq":
                got = params["sliding_attention"]["rope_theta"]
            else:
                got = getattr(config, key)
            assert got == value, (model_type, key, got, value)


def test_deepseek_layouts() -> None:
    """DeepSeek-V2 multiplies complex numbers, DeepSeek-V3 follows rope_interleave (default on);
    both rotate the qk_rope_head_dim part of the head."""
    v2 = hf_rope_kwargs(DeepseekV2Config(**_MLA))
    v3 = hf_rope_kwargs(DeepseekV3Config(**_MLA))
    v3_half = hf_rope_kwargs(DeepseekV3Config(**_MLA, rope_interleave=False))
    assert (v2["layout"], v3["layout"], v3_half["layout"]) == ("interleaved",) * 2 + ("half",)
    assert v2["head_dim"] == v2["rotary_dim"] == v3["head_dim"] == v3["rotary_dim"] == 8
    raw = {"model_type": "deepseek_v3", **_MLA}
    for use_transformers in (True, False):
        kw = hf_rope_kwargs(raw, use_transformers=use_transformers)
        assert (kw["layout"], kw["head_dim"]) == ("interleaved", 8)


def test_unsupported_architectures_raise() -> None:
    with pytest.raises(ValueError, match=r"nanochat.*minus the angle"):
        rope_from_hf({"model_type": "nanochat", "hidden_size": 64, "num_attention_heads": 4})


def test_qwen3_5_partial_mrope_matches_transformers() -> None:
    """Qwen3.5: M-RoPE over the first quarter of the head (class default 0.25), interleaved."""
    qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    Qwen3_5TextConfig, qwen3_5_apply = qwen3_5.Qwen3_5TextConfig, qwen3_5.apply_rotary_pos_emb
    Qwen3_5TextRotaryEmbedding = qwen3_5.Qwen3_5TextRotaryEmbedding
    kw = {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64, "num_hidden_layers": 4}
    params = {"rope_type": "default", "rope_theta": 1e7, "mrope_section": [3, 3, 2]}
    config = Qwen3_5TextConfig(**kw, rope_parameters=dict(params))
    positions = torch.randint(0, 300000, (3, 2, 7))
    cos, sin = Qwen3_5TextRotaryEmbedding(config)(torch.zeros(1), positions)
    q, k = torch.randn(2, 2, 7, 64), torch.randn(2, 1, 7, 64)
    ref = qwen3_5_apply(q, k, cos, sin)
    raw = {"model_type": "qwen3_5_text", **kw, "rope_parameters": params}
    for form, use_transformers in ((config, True), (raw, True), (raw, False)):
        rope = rope_from_hf(form, use_transformers=use_transformers)
        assert isinstance(rope, MRoPE) and rope.interleaved and rope.rotary_dim == 16
        for ours, theirs in zip(rope(q, k, positions), ref, strict=True):
            assert (ours - theirs).abs().max() <= TOL


def test_mrope_of_unverified_architectures_raises() -> None:
    raw = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
           "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}}  # fmt: skip
    with pytest.raises(ValueError, match="posenc reproduces the M-RoPE of"):
        rope_from_hf(raw, use_transformers=False)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("rope_theta", 0, "rope_theta must be a finite number > 0, got 0"),
        ("rope_theta", -1e4, "rope_theta must be a finite number > 0"),
        ("rope_theta", float("nan"), "rope_theta must be a finite number > 0, got nan"),
        ("rope_theta", "1e4", r"\['rope_theta'\] must be a number, got '1e4'"),
        ("rope_theta", True, r"\['rope_theta'\] must be a number, got True"),
        ("partial_rotary_factor", 0.0, r"partial_rotary_factor must be a number in \(0, 1\]"),
        ("partial_rotary_factor", 1.5, r"partial_rotary_factor must be a number in \(0, 1\]"),
        ("partial_rotary_factor", "half", r"\['partial_rotary_factor'\] must be a number"),
        ("head_dim", "16", r"\['head_dim'\] must be a number, got '16'"),
        ("head_dim", 16.5, r"head_dim.*16\.5"),  # transformers' strict field check, or ours
        ("head_dim", 0, "head_dim must be a positive integer, got 0"),
    ],
)
def test_bad_values_raise(key: str, value: object, message: str) -> None:
    """Bad values are refused, never replaced by a default."""
    for model_type in ({}, {"model_type": "llama", "num_hidden_layers": 2}):
        raw = {**model_type, "hidden_size": 64, "num_attention_heads": 4, key: value}
        for use_transformers in (True, False):
            with pytest.raises(ValueError, match=message):
                rope_from_hf(raw, use_transformers=use_transformers)


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"rope_type": "linear", "factor": float("nan")}, "factor"),
        ({"rope_type": "linear", "factor": "2"}, r"\['factor'\] must be a number, got '2'"),
        ({"rope_type": "yarn", "factor": 4.0, "beta_fast": "32"}, r"\['beta_fast'\] must be a number"),
        ({"rope_type": "yarn", "factor": 4.0, "mscale": float("inf")}, "mscale"),
        ({"rope_type": "yarn", "factor": 4.0, "bogus": 1}, r"unknown scaling key\(s\) \['bogus'\]"),
        ({"rope_type": "default", "factor": 2.0}, r"unknown scaling key\(s\) \['factor'\]"),
        ({"rope_type": "yarn", "factor": 4.0, "llama_4_scaling_beta": 0.1},
         "'llama_4_scaling_beta' is read by the attention of"),
    ],
)  # fmt: skip
def test_bad_scaling_raises_naming_the_key(scaling: dict, message: str) -> None:
    raw = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "num_hidden_layers": 2, "max_position_embeddings": 64, "rope_scaling": scaling}  # fmt: skip
    for use_transformers in (True, False):
        with pytest.raises(ValueError, match=message):
            rope_from_hf(raw, use_transformers=use_transformers)


# --- attention temperature ---------------------------------------------------------------------


def test_llama4_scaling_matches_transformers_function() -> None:
    """Ministral-3's ``get_llama_4_attn_scale``, bit for bit, across many multiples of L."""
    modeling_ministral3 = pytest.importorskip("transformers.models.ministral3.modeling_ministral3")
    positions = torch.randint(0, 40 * 16384, (3, 257))
    positions[0, :5] = torch.tensor([0, 16383, 16384, 16385, 2 * 16384])
    ref = modeling_ministral3.get_llama_4_attn_scale(positions, 0.1, 16384)  # [b, 1, s, 1]
    ours = llama4_scaling_scale(positions, 0.1, 16384)
    assert torch.equal(ours[:, None, :, None], ref)


def test_llama4_temperature_matches_the_formula() -> None:
    """Llama-4's NoPE-layer scale (inline in transformers' attention) against the formula in
    float64; the tiny Llama-4 model test checks it inside transformers' own attention."""
    positions = torch.arange(0, 200000, 7)
    expected = [math.log1p(math.floor((p + 1) / 8192)) * 0.1 + 1 for p in positions.tolist()]
    ours = llama4_temperature_scale(positions, 0.1, 8192)
    assert (ours.double() - torch.tensor(expected, dtype=torch.float64)).abs().max() <= 1e-6
    assert ours[positions < 8191].eq(1).all() and ours[positions >= 8191].gt(1).all()


def test_attention_temperature_from_hf() -> None:
    ministral = {"model_type": "ministral3", "hidden_size": 64, "num_attention_heads": 4,
                 "num_hidden_layers": 2, "max_position_embeddings": 65536,
                 "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                     "original_max_position_embeddings": 16384,
                                     "llama_4_scaling_beta": 0.1, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}}  # fmt: skip
    llama4 = {"model_type": "llama4_text", "hidden_size": 64, "num_attention_heads": 4,
              "num_hidden_layers": 8, "head_dim": 16}  # fmt: skip
    for use_transformers in (True, False):
        t = attention_temperature_from_hf(ministral, use_transformers=use_transformers)
        assert t == QueryTemperature("llama4_scaling", 0.1, 16384, None)
        t = attention_temperature_from_hf(llama4, use_transformers=use_transformers)
        assert t == QueryTemperature("llama4_temperature", 0.1, 8192, (3, 7))  # NoPE every 4th
        llama = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
        assert attention_temperature_from_hf(llama, use_transformers=use_transformers) is None
    off = {**llama4, "attn_temperature_tuning": False}
    assert attention_temperature_from_hf(off) is None
    # The rope module ignores the key; the query scale goes through QueryTemperature.
    assert rope_from_hf(ministral).scaling["rope_type"] == "yarn"
    q = torch.randn(2, 4, 3, 16)
    positions = torch.tensor([[0, 16384, 40000], [1, 2, 3]])
    scaled = QueryTemperature("llama4_scaling", 0.1, 16384)(q, positions)
    assert torch.equal(scaled[1], q[1]) and torch.equal(scaled[0, :, 0], q[0, :, 0])
    assert torch.allclose(scaled[0, :, 1], q[0, :, 1] * (1 + 0.1 * math.log(2)))


def test_query_temperature_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="kind must be one of"):
        QueryTemperature("yarn", 0.1, 8)
    with pytest.raises(ValueError, match="beta must be a finite number, got 'x'"):
        QueryTemperature("llama4_scaling", "x", 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="length must be a positive integer, got 0"):
        QueryTemperature("llama4_scaling", 0.1, 0)
    ministral = {"model_type": "ministral3", "hidden_size": 64, "num_attention_heads": 4,
                 "rope_parameters": {"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 16,
                                     "llama_4_scaling_beta": "0.1"}}  # fmt: skip
    with pytest.raises(ValueError, match=r"\['llama_4_scaling_beta'\] must be a number"):
        attention_temperature_from_hf(ministral)


def test_hf_doc_page_examples_run() -> None:
    """The examples of docs/api/hf.md (the docs test runs docs/*.md only)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "api" / "hf.md").read_text()
    blocks = re.findall(r"^```python[ \t]*\n(.*?)^```[ \t]*$", text, re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/api/hf.md", "exec"), namespace)


def _cos_sin_error(rope, hf_rotary, positions: torch.Tensor, *extra: str) -> float:
    """Max |posenc - transformers| over cos and sin (transformers' cat(c, c) or repeat layout)."""
    ref_cos, ref_sin = hf_rotary(torch.zeros(1), positions, *extra)
    cos, sin = rope.cos_sin(positions)
    n = cos.shape[-1]
    if ref_cos.shape[-1] == 2 * n:
        pick = slice(0, n) if torch.equal(ref_cos[..., :n], ref_cos[..., n:]) else slice(0, None, 2)
        ref_cos, ref_sin = ref_cos[..., pick], ref_sin[..., pick]
    return max((cos - ref_cos).abs().max().item(), (sin - ref_sin).abs().max().item())


def test_olmo3_scaling_applies_to_full_attention_only() -> None:
    """OLMo-3's 4.x rope_scaling (YaRN) goes to its full-attention layers; the sliding-window
    layers keep plain RoPE with the same base."""
    Olmo3RotaryEmbedding = pytest.importorskip(
        "transformers.models.olmo3.modeling_olmo3"
    ).Olmo3RotaryEmbedding

    raw = {"model_type": "olmo3", "hidden_size": 128, "num_attention_heads": 2,
           "num_hidden_layers": 4, "max_position_embeddings": 65536, "rope_theta": 500000,
           "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "attention_factor": 1.2079441541679836,
                            "original_max_position_embeddings": 8192}}  # fmt: skip
    config = CONFIG_MAPPING["olmo3"].from_dict(raw)
    positions = torch.tensor([[0, 1, 8191, 8192, 60000, 262143]])
    for layer_type in ("sliding_attention", "full_attention"):
        for form, use_transformers in ((config, True), (raw, True), (raw, False)):
            rope = rope_from_hf(form, layer_type, use_transformers=use_transformers)
            assert (rope.scaling is None) == (layer_type == "sliding_attention")
            hf = Olmo3RotaryEmbedding(config)
            assert _cos_sin_error(rope, hf, positions, layer_type) <= 2 * TOL


def test_qwen3_yarn_recipe_and_glm4_partial_interleaved() -> None:
    """Qwen3's model-card YaRN recipe, and GLM-4's half-rotary interleaved RoPE."""
    from transformers.models.glm4.modeling_glm4 import Glm4RotaryEmbedding
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    qwen3 = {"model_type": "qwen3", "hidden_size": 256, "num_attention_heads": 2, "head_dim": 128,
             "max_position_embeddings": 131072, "rope_theta": 1000000,
             "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                              "original_max_position_embeddings": 32768}}  # fmt: skip
    glm4 = {"model_type": "glm4", "hidden_size": 256, "num_attention_heads": 2, "head_dim": 128,
            "max_position_embeddings": 32768, "rope_theta": 10000,
            "partial_rotary_factor": 0.5}  # fmt: skip
    positions = torch.tensor([[0, 5, 32767, 32768, 100000, 524287]])
    for raw, rotary in ((qwen3, Qwen3RotaryEmbedding), (glm4, Glm4RotaryEmbedding)):
        config = CONFIG_MAPPING[raw["model_type"]].from_dict(raw)
        for use_transformers in (True, False):
            rope = rope_from_hf(raw, use_transformers=use_transformers)
            assert _cos_sin_error(rope, rotary(config), positions) <= 2 * TOL
    assert (rope.layout, rope.rotary_dim) == ("interleaved", 64)


# --- names and YaRN factors that used to be read silently --------------------------------------


@pytest.mark.parametrize("use_transformers", [True, False])
def test_unknown_model_type_raises_naming_close_matches(use_transformers: bool) -> None:
    raw = {"model_type": "GPTJ", "n_embd": 64, "n_head": 4, "rotary_dim": 8}
    with pytest.raises(ValueError, match=r"unknown model_type 'GPTJ'.*close matches: \['gptj'"):
        rope_from_hf(raw, use_transformers=use_transformers)
    raw["model_type"] = "gptj"  # the right name reads
    assert rope_from_hf(raw, use_transformers=use_transformers).layout == "interleaved"


@pytest.mark.parametrize("use_transformers", [True, False])
def test_yarn_without_factor_raises(use_transformers: bool) -> None:
    if not TRANSFORMERS_5:
        pytest.skip("transformers 4.x's LlamaConfig takes no rope_parameters to refuse")
    raw = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "max_position_embeddings": 8192,
           "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
                               "original_max_position_embeddings": 2048}}  # fmt: skip
    # posenc's own reader says so; transformers refuses to build the config (its message)
    match = "YaRN rope parameters need 'factor'" if not use_transformers else "keys.*'factor'"
    with pytest.raises(ValueError, match=match):
        rope_from_hf(raw, use_transformers=use_transformers)
    with pytest.raises(Exception, match="factor"):
        LlamaConfig.from_dict(copy.deepcopy(raw))
    obj = LlamaConfig.from_dict(
        {**raw, "rope_parameters": {**raw["rope_parameters"], "factor": 4.0}}
    )
    del obj.rope_parameters["factor"]  # a config object without it: posenc's message
    with pytest.raises(ValueError, match="YaRN rope parameters need 'factor'"):
        rope_from_hf(obj)
    raw["rope_parameters"]["factor"] = None  # null: the ratio of the lengths, as transformers
    assert rope_from_hf(raw, use_transformers=use_transformers).scaling["factor"] == 4.0


@pytest.mark.parametrize("use_transformers", [True, False])
def test_yarn_factor_that_disagrees_with_the_lengths_warns(use_transformers: bool) -> None:
    raw = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
           "max_position_embeddings": 8192,
           "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4,
                               "original_max_position_embeddings": 2048}}  # fmt: skip
    with pytest.warns(UserWarning, match=r"YaRN factor 2 disagrees .* = 8192 / 2048 = 4"):
        rope_from_hf(raw, use_transformers=use_transformers)
    raw["rope_parameters"]["factor"] = 4.0  # agrees: silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rope_from_hf(raw, use_transformers=use_transformers)


@pytest.mark.parametrize("numerator", [139, 141, 51])  # 512 * factor odd: 69, 70, 25 pairs
def test_gemma4_odd_rotary_dim_rounds_as_transformers(numerator: int) -> None:
    """Gemma-4's proportional RoPE rotates 2 * int(factor * head_dim // 2) channels."""
    gemma4 = pytest.importorskip("transformers.models.gemma4.modeling_gemma4")
    Gemma4TextConfig, Gemma4TextRotaryEmbedding = (
        gemma4.Gemma4TextConfig,
        gemma4.Gemma4TextRotaryEmbedding,
    )

    config = Gemma4TextConfig()
    config.rope_parameters["full_attention"]["partial_rotary_factor"] = numerator / 512
    rope = rope_from_hf(config, "full_attention")
    assert rope.rotary_dim == 2 * (numerator // 2) and rope.span == 512
    positions = torch.tensor([[0, 5, 1000, 100000]])
    cos_ref, sin_ref = Gemma4TextRotaryEmbedding(config)(
        torch.zeros(1), positions, "full_attention"
    )
    cos, sin = rope.cos_sin(positions, seq_len=100001)
    assert (cos - cos_ref[..., :256]).abs().max() <= TOL
    assert (sin - sin_ref[..., :256]).abs().max() <= TOL
    assert torch.equal(cos_ref[..., :256], cos_ref[..., 256:])  # half layout, as posenc reads it


@pytest.mark.parametrize("traced", [False, True])
def test_longrope_switch_at_original_length_matches_transformers(traced: bool) -> None:
    """Lengths L and L + 1 (L = original_max_position_embeddings): short factors at L, long
    ones at L + 1, on the host path and on the traced (device-side) path alike."""
    n = 16  # pairs of head_dim 32
    factors = {"short_factor": [1.0 + i / 10 for i in range(n)],
               "long_factor": [2.0 + i for i in range(n)]}  # fmt: skip
    rope = (  # transformers 4.x: rope_theta and a rope_scaling of exactly these three keys
        {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, **factors}}
        if TRANSFORMERS_5
        else {"rope_theta": 1e4, "rope_scaling": {"type": "longrope", **factors}}
    )
    config = Phi3Config(hidden_size=64, num_attention_heads=2, max_position_embeddings=4096,
                        original_max_position_embeddings=1024, **rope)  # fmt: skip
    rope = rope_from_hf(config)
    for length in (1024, 1025):
        positions = torch.arange(length)[None]
        cos_ref, sin_ref = Phi3RotaryEmbedding(config)(torch.zeros(1), positions)
        if traced:
            inv_freq, factor = rope._traced_frequencies(positions, positions)
            angles = positions[0, :, None].float() * inv_freq
            cos, sin = angles.cos() * factor, angles.sin() * factor
        else:
            cos, sin = rope.cos_sin(positions, seq_len=length)
        assert (cos - cos_ref[..., :n]).abs().max() <= TOL, length
        assert (sin - sin_ref[..., :n]).abs().max() <= TOL, length
