"""Parity of posenc's RoPE with transformers' own rotary classes and apply functions (CPU, float32).

cos/sin: for every rope type transformers implements, on random valid configs (4.x and 5.x forms)
and random ``position_ids`` reaching past ``original_max_position_embeddings``, the cos/sin of
``rope_from_hf(config)`` equal those of the model's rotary class. Rotation: ``apply_rotary``
equals LLaMA's ``apply_rotary_pos_emb``, GPT-J's rotation, GPT-NeoX's partial rotary and GLM's
interleaved partial rotary.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import (  # noqa: E402
    CohereConfig,
    Gemma3TextConfig,
    Gemma4TextConfig,
    GPTNeoXConfig,
    LlamaConfig,
)
from transformers.models.cohere.modeling_cohere import CohereRotaryEmbedding  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding  # noqa: E402
from transformers.models.glm import modeling_glm  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402
from transformers.models.gptj import modeling_gptj  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from posenc.functional import apply_rotary, rope_inv_freq  # noqa: E402
from posenc.hf import rope_from_hf  # noqa: E402

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TOL = 1e-6  # max |ours - transformers| on cos/sin (bounded by the attention factor) and on q, k


def _hf_cos_sin(
    rotary: torch.nn.Module, positions: torch.Tensor, **kw: object
) -> tuple[torch.Tensor, ...]:
    return rotary(torch.zeros(1, dtype=torch.float32), positions, **kw)


def _ours_full(rope, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Our cos/sin in transformers' layout (``cat(c, c)`` for half, repeated for interleaved)."""
    cos, sin = rope.cos_sin(positions)  # [b, s, n]
    if rope.layout == "half":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)


def _assert_close(ours: torch.Tensor, ref: torch.Tensor, scale: float = 1.0) -> None:
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    assert ours.dtype == ref.dtype == torch.float32
    err = (ours - ref).abs().max().item() if ref.numel() else 0.0
    assert err <= TOL * max(1.0, scale), err


@st.composite
def _scaling(draw: st.DrawFn, rope_type: str, rotary_dim: int) -> tuple[dict, int]:
    """A random valid 4.x ``rope_scaling`` dict and the original length it extends."""
    orig = draw(st.integers(8, 300))
    factor = draw(st.floats(1.0, 16.0, allow_nan=False).map(lambda f: round(f, 3)))
    key = draw(st.sampled_from(["type", "rope_type"]))
    sc: dict = {key: rope_type}
    if rope_type in ("linear", "dynamic"):
        sc["factor"] = factor
    elif rope_type == "yarn":
        sc.update(factor=factor, original_max_position_embeddings=orig)
        if draw(st.booleans()):
            sc.update(
                beta_fast=draw(st.sampled_from([16, 32, 64])),
                beta_slow=draw(st.sampled_from([1, 2])),
            )
        if draw(st.booleans()):
            sc.update(
                mscale=draw(st.sampled_from([0.707, 1.0])),
                mscale_all_dim=draw(st.sampled_from([0.5, 1.0])),
            )
        if draw(st.booleans()):
            sc["attention_factor"] = draw(st.floats(0.5, 2.0))
        if draw(st.booleans()):
            sc["truncate"] = draw(st.booleans())
    elif rope_type == "longrope":
        n = rotary_dim // 2
        sc.update(
            short_factor=draw(st.lists(st.floats(1.0, 4.0), min_size=n, max_size=n)),
            long_factor=draw(st.lists(st.floats(1.0, 64.0), min_size=n, max_size=n)),
            original_max_position_embeddings=orig,
        )
        if draw(st.booleans()):
            sc["factor"] = factor
        if draw(st.booleans()):
            sc["attention_factor"] = draw(st.floats(0.5, 2.0))
    elif rope_type == "llama3":
        low = draw(st.sampled_from([0.5, 1.0, 2.0]))
        sc.update(
            factor=factor,
            low_freq_factor=low,
            high_freq_factor=low + draw(st.sampled_from([0.5, 3.0, 7.0])),
            original_max_position_embeddings=orig,
        )
    return sc, orig


def _positions(draw: st.DrawFn, top: int) -> torch.Tensor:
    b, s = draw(st.integers(1, 2)), draw(st.integers(1, 7))
    values = draw(st.lists(st.integers(0, top), min_size=b * s, max_size=b * s))
    pos = torch.tensor(values).view(b, s)
    pos[0, -1] = top  # always reach past the original length
    return pos


@pytest.mark.parametrize(
    "rope_type", ["default", "linear", "dynamic", "yarn", "longrope", "llama3"]
)
@SETTINGS
@given(data=st.data())
def test_cos_sin_match_llama_rotary(rope_type: str, data: st.DataObject) -> None:
    """LlamaConfig in the 4.x form (``rope_theta`` + ``rope_scaling``), read both as the config
    object transformers standardizes and as the raw dict."""
    head_dim = data.draw(st.sampled_from([8, 16, 32, 64, 128]))
    heads = data.draw(st.integers(1, 3))
    base = data.draw(st.sampled_from([10000.0, 500000.0, 1e6]) | st.floats(50.0, 1e6))
    kw: dict = {
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "head_dim": head_dim,
        "rope_theta": base,
    }
    orig = 64
    if rope_type != "default":
        kw["rope_scaling"], orig = data.draw(_scaling(rope_type, head_dim))
    kw["max_position_embeddings"] = data.draw(st.integers(orig, 4 * orig))
    if rope_type == "dynamic":
        orig = kw["max_position_embeddings"]  # dynamic NTK's original length
    positions = _positions(data.draw, data.draw(st.integers(orig + 1, 4 * orig + 20)))

    # Random positions past the original length, then each side of the switch point of the
    # length-dependent types (largest position orig - 1, then orig).
    for pos in (positions, torch.tensor([[0, orig - 1]]), torch.tensor([[orig, 1]])):
        hf = modeling_llama.LlamaRotaryEmbedding(LlamaConfig(**kw))  # fresh: dynamic's history
        ref_cos, ref_sin = _hf_cos_sin(hf, pos)
        for config in (LlamaConfig(**kw), kw):  # 5.x object and 4.x dict
            rope = rope_from_hf(config)
            cos, sin = _ours_full(rope, pos)
            _assert_close(cos, ref_cos, rope.attention_factor)
            _assert_close(sin, ref_sin, rope.attention_factor)


@pytest.mark.parametrize(
    "rope_type", ["default", "linear", "dynamic", "yarn", "longrope", "llama3"]
)
@SETTINGS
@given(data=st.data())
def test_cos_sin_match_gpt_neox_partial_rotary(rope_type: str, data: st.DataObject) -> None:
    """GPT-NeoX with partial rotary, 5.x ``rope_parameters`` (rope_theta and partial inside)."""
    heads = data.draw(st.integers(1, 3))
    head_dim = data.draw(st.sampled_from([16, 32, 64]))
    partial = data.draw(st.sampled_from([0.25, 0.5, 1.0]))
    rotary_dim = int(head_dim * partial)
    params: dict = {"rope_type": "default"}
    orig = 64
    if rope_type != "default":
        params, orig = data.draw(_scaling(rope_type, rotary_dim))
        params["rope_type"] = params.pop("type", params.get("rope_type"))
    params.update(rope_theta=data.draw(st.floats(100.0, 1e6)), partial_rotary_factor=partial)
    max_pos = data.draw(st.integers(orig, 4 * orig))
    if rope_type == "dynamic":
        orig = max_pos
    config = GPTNeoXConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        max_position_embeddings=max_pos,
        rope_parameters=params,
    )
    positions = _positions(data.draw, data.draw(st.integers(orig + 1, 4 * orig + 20)))
    ref_cos, ref_sin = _hf_cos_sin(modeling_gpt_neox.GPTNeoXRotaryEmbedding(config), positions)
    rope = rope_from_hf(config)
    assert rope.rotary_dim == rotary_dim
    cos, sin = _ours_full(rope, positions)
    _assert_close(cos, ref_cos, rope.attention_factor)
    _assert_close(sin, ref_sin, rope.attention_factor)


def test_dynamic_ntk_follows_growth_and_reset_like_transformers() -> None:
    """transformers' dynamic NTK state after growing, decoding further, and shrinking back."""
    kw = {
        "hidden_size": 64,
        "num_attention_heads": 2,
        "max_position_embeddings": 32,
        "rope_theta": 10000.0,
    }
    kw["rope_scaling"] = {"type": "dynamic", "factor": 3.0}
    hf = modeling_llama.LlamaRotaryEmbedding(LlamaConfig(**kw))
    rope = rope_from_hf(kw)
    for top in (10, 40, 41, 42, 90, 20):  # within, grow, decode, decode, jump, back below 32
        positions = torch.arange(top - 5, top + 1)[None]
        ref_cos, ref_sin = _hf_cos_sin(hf, positions)
        cos, sin = _ours_full(rope, positions)
        _assert_close(cos, ref_cos)
        _assert_close(sin, ref_sin)


@SETTINGS
@given(
    partial=st.sampled_from([0.25, 0.5, 0.75, 1.0]),
    factor=st.sampled_from([1.0, 2.0, 8.0]),
    base=st.floats(100.0, 1e6),
    top=st.integers(1, 5000),
)
def test_proportional_matches_gemma4(partial: float, factor: float, base: float, top: int) -> None:
    """Gemma-4 full-attention layers: proportional RoPE over global_head_dim."""
    params = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": partial,
            "rope_theta": base,
            "factor": factor,
        },
    }
    config = Gemma4TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_hidden_layers=2,
        rope_parameters=params,
    )
    hf = Gemma4TextRotaryEmbedding(config)
    positions = torch.tensor([[0, 1, top // 2, top]])
    for layer_type in ("sliding_attention", "full_attention"):
        ref_cos, ref_sin = _hf_cos_sin(hf, positions, layer_type=layer_type)
        rope = rope_from_hf(config, layer_type)
        assert rope.head_dim == (32 if layer_type == "full_attention" else 16)
        cos, sin = _ours_full(rope, positions)
        _assert_close(cos, ref_cos)
        _assert_close(sin, ref_sin)
    with pytest.raises(ValueError, match="layer_type"):
        rope_from_hf(config)


def test_gemma3_layer_types_in_both_config_forms() -> None:
    kw = {
        "hidden_size": 64,
        "num_attention_heads": 2,
        "head_dim": 32,
        "num_hidden_layers": 6,  # five sliding layers, then a full one
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    config = Gemma3TextConfig(**kw)
    hf = Gemma3RotaryEmbedding(config)
    positions = torch.tensor([[0, 3, 700, 5000]])
    for layer_type in ("sliding_attention", "full_attention"):
        ref_cos, ref_sin = _hf_cos_sin(hf, positions, layer_type=layer_type)
        for cfg in (config, kw):
            cos, sin = _ours_full(rope_from_hf(cfg, layer_type), positions)
            _assert_close(cos, ref_cos)
            _assert_close(sin, ref_sin)


def test_cohere_interleaved_cos_sin() -> None:
    config = CohereConfig(hidden_size=64, num_attention_heads=4, rope_theta=8000.0)
    positions = torch.tensor([[0, 5, 77, 3000]])
    ref_cos, ref_sin = _hf_cos_sin(CohereRotaryEmbedding(config), positions)
    rope = rope_from_hf(config)
    assert rope.layout == "interleaved"
    cos, sin = _ours_full(rope, positions)
    _assert_close(cos, ref_cos)
    _assert_close(sin, ref_sin)


# --- rotation -----------------------------------------------------------------------------------


def _tables(
    b: int, s: int, r: int, top: int = 3000
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    positions = torch.randint(0, top, (b, s))
    inv_freq, _ = rope_inv_freq(r, 10000.0)
    angles = positions[..., None].float() * inv_freq  # [b, s, r/2]
    return positions, angles.cos(), angles.sin()


def test_apply_rotary_matches_llama_apply_rotary_pos_emb() -> None:
    q, k = torch.randn(2, 4, 6, 32), torch.randn(2, 2, 6, 32)
    _, cos, sin = _tables(2, 6, 32)
    ref_q, ref_k = modeling_llama.apply_rotary_pos_emb(
        q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    )
    _assert_close(apply_rotary(q, cos[:, None], sin[:, None], "half"), ref_q)
    _assert_close(apply_rotary(k, cos[:, None], sin[:, None], "half"), ref_k)


@pytest.mark.parametrize("rotary_dim", [8, 32])
def test_apply_rotary_matches_gptj_rotation(rotary_dim: int) -> None:
    """GPT-J: interleaved pairs, partial rotary by slicing, tensors ``[b, s, h, d]``."""
    x = torch.randn(2, 5, 3, 32)  # [b, s, h, d]
    _, cos, sin = _tables(2, 5, rotary_dim)
    rot = modeling_gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos)
    ref = torch.cat((rot, x[..., rotary_dim:]), -1)
    ours = apply_rotary(
        x.transpose(1, 2), cos[:, None], sin[:, None], "interleaved", rotary_dim
    ).transpose(1, 2)
    _assert_close(ours, ref)


def test_gptj_tables_match_rope_cos_sin() -> None:
    """GPT-J's own sin/cos table (``create_sinusoidal_positions``) equals ``rope_cos_sin``."""
    from posenc.functional import rope_cos_sin

    table = modeling_gptj.create_sinusoidal_positions(300, 16)  # [300, 16] = [sin | cos]
    inv_freq, _ = rope_inv_freq(16, 10000.0)
    cos, sin = rope_cos_sin(torch.arange(300), inv_freq)
    _assert_close(sin, table[:, :8])
    _assert_close(cos, table[:, 8:])


@pytest.mark.parametrize("partial", [0.25, 0.5, 1.0])
def test_apply_rotary_matches_gpt_neox_partial(partial: float) -> None:
    q, k = torch.randn(2, 4, 6, 32), torch.randn(2, 4, 6, 32)
    r = int(32 * partial)
    _, cos, sin = _tables(2, 6, r)
    ref_q, ref_k = modeling_gpt_neox.apply_rotary_pos_emb(
        q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    )
    _assert_close(apply_rotary(q, cos[:, None], sin[:, None], "half", r), ref_q)
    _assert_close(apply_rotary(k, cos[:, None], sin[:, None], "half", r), ref_k)


def test_apply_rotary_matches_glm_interleaved_partial() -> None:
    q, k = torch.randn(2, 4, 6, 32), torch.randn(2, 2, 6, 32)
    _, cos, sin = _tables(2, 6, 16)
    ref_q, ref_k = modeling_glm.apply_rotary_pos_emb(
        q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    )
    _assert_close(apply_rotary(q, cos[:, None], sin[:, None], "interleaved", 16), ref_q)
    _assert_close(apply_rotary(k, cos[:, None], sin[:, None], "interleaved", 16), ref_k)


@pytest.mark.parametrize(
    "scaling",
    [None, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}],
)
def test_module_forward_matches_llama_rotation_with_gqa(scaling: dict | None) -> None:
    kw = {
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
    }
    if scaling:
        kw["rope_scaling"] = scaling
    config = LlamaConfig(**kw)
    q, k = torch.randn(2, 4, 7, 32), torch.randn(2, 2, 7, 32)
    positions = torch.randint(0, 200, (2, 7))
    cos, sin = _hf_cos_sin(modeling_llama.LlamaRotaryEmbedding(config), positions)
    ref_q, ref_k = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = rope_from_hf(config)(q, k, positions)
    _assert_close(ours_q, ref_q)
    _assert_close(ours_k, ref_k)
