"""``rope_from_hf``: the config forms of real models (4.x dicts, 5.x objects) and clear errors."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import (  # noqa: E402
    DeepseekV3Config,
    GlmConfig,
    GPTJConfig,
    Phi3Config,
    Qwen2VLConfig,
)
from transformers.models.gptj.modeling_gptj import GPTJRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding  # noqa: E402
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig  # noqa: E402

from posenc.hf import hf_rope_kwargs, rope_from_hf  # noqa: E402
from posenc.rotary import MRoPE  # noqa: E402

TOL = 1e-6


def test_gptj_interleaved_partial() -> None:
    config = GPTJConfig(n_embd=64, n_head=4, rotary_dim=8, n_positions=512)
    positions = torch.tensor([[0, 1, 100, 511]])
    ref_sin, ref_cos = GPTJRotaryEmbedding(config)(torch.zeros(1), positions)  # [b, s, r/2]
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
    with pytest.raises(ValueError, match="rope_type 'axial'"):
        rope_from_hf(Qwen2VLVisionConfig(embed_dim=64, num_heads=4))
    with pytest.raises(ValueError, match="rotary_dim must be even for RoPE, got 9"):
        rope_from_hf({"hidden_size": 72, "num_attention_heads": 4, "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="no head_dim"):
        rope_from_hf({"rope_theta": 1e4})
