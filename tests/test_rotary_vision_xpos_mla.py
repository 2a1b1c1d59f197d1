"""2-D axial RoPE (Qwen2-VL, Pixtral, Gemma-4 vision towers), xPos (the paper's formula in
float64) and MLA's decoupled RoPE (DeepSeek-V3's attention in transformers)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)
from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import (  # noqa: E402
    Gemma4VisionRotaryEmbedding,
    apply_multidimensional_rope,
)
from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig  # noqa: E402
from transformers.models.pixtral.modeling_pixtral import (  # noqa: E402
    PixtralVisionRotaryEmbedding,
)
from transformers.models.pixtral.modeling_pixtral import (  # noqa: E402
    apply_rotary_pos_emb as pixtral_apply,
)
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig  # noqa: E402
from transformers.models.qwen2_vl.modeling_qwen2_vl import (  # noqa: E402
    Qwen2VLVisionRotaryEmbedding,
    apply_rotary_pos_emb_vision,
)

from posenc.hf import hf_rope_kwargs  # noqa: E402
from posenc.rotary import (  # noqa: E402
    Axial2DRoPE,
    DecoupledRoPE,
    XPos,
    expand_shared_key,
    grid_coords,
    mla_softmax_scale,
)

TOL = 1e-6


# --- 2-D axial ----------------------------------------------------------------------------------


def _grid(h: int = 5, w: int = 7) -> torch.Tensor:
    return grid_coords(h, w)  # [h*w, 2]


def test_axial_matches_qwen2_vl_vision_tower() -> None:
    config = Qwen2VLVisionConfig(embed_dim=128, num_heads=4)  # head_dim 32
    coords = _grid()
    cos, sin = Qwen2VLVisionRotaryEmbedding(config)(torch.zeros(1), coords)  # [n, 32]
    q, k = torch.randn(coords.shape[0], 4, 32), torch.randn(coords.shape[0], 4, 32)  # [n, h, d]
    ref_q, ref_k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    rope = Axial2DRoPE(32, frequencies="axis", arrangement="merged", angle_dtype="float32")
    got_q, got_k = rope.rotate(q.transpose(0, 1)[None], k.transpose(0, 1)[None], coords)
    assert (got_q[0].transpose(0, 1) - ref_q).abs().max() <= TOL
    assert (got_k[0].transpose(0, 1) - ref_k).abs().max() <= TOL


def test_axial_alternate_frequencies_match_pixtral() -> None:
    config = PixtralVisionConfig(
        hidden_size=128, num_attention_heads=4, head_dim=32, rope_theta=10000.0
    )
    coords = _grid(4, 6)
    cos, sin = PixtralVisionRotaryEmbedding(config)(torch.zeros(1), coords)  # [n, 32]
    q, k = torch.randn(1, 4, coords.shape[0], 32), torch.randn(1, 4, coords.shape[0], 32)
    ref_q, ref_k = pixtral_apply(q, k, cos, sin, unsqueeze_dim=0)
    rope = Axial2DRoPE(32, frequencies="alternate", arrangement="merged", angle_dtype="float32")
    got_q, got_k = rope.rotate(q, k, coords)
    assert (got_q - ref_q).abs().max() <= TOL
    assert (got_k - ref_k).abs().max() <= TOL


def test_axial_blocks_match_gemma4_vision_tower() -> None:
    config = Gemma4VisionConfig(hidden_size=128, num_attention_heads=4, head_dim=32)
    coords = _grid(3, 5)[None]  # [1, n, 2]
    cos, sin = Gemma4VisionRotaryEmbedding(config)(torch.zeros(1), coords)  # [1, n, 32]
    x = torch.randn(1, coords.shape[1], 4, 32)  # [b, s, h, d]
    ref = apply_multidimensional_rope(x, cos, sin, coords)
    rope = Axial2DRoPE(
        32, base=100.0, frequencies="axis", arrangement="blocks", angle_dtype="float32"
    )
    got, _ = rope.rotate(x.transpose(1, 2), x.transpose(1, 2), coords)
    assert (got.transpose(1, 2) - ref).abs().max() <= TOL


@pytest.mark.parametrize("arrangement", ["merged", "blocks"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_axial_prefix_tokens_stay_and_scores_are_relative(arrangement: str, layout: str) -> None:
    h, w, p = 3, 4, 2
    rope = Axial2DRoPE(
        16, grid_size=(h, w), num_prefix_tokens=p, layout=layout, arrangement=arrangement
    )
    q, k = (
        torch.randn(2, 3, p + h * w, 16, dtype=torch.float64),
        torch.randn(2, 3, p + h * w, 16, dtype=torch.float64),
    )
    got_q, got_k = rope(q, k)
    assert torch.equal(got_q[:, :, :p], q[:, :, :p]) and torch.equal(got_k[:, :, :p], k[:, :, :p])
    via_coords = rope.rotate(q, k, grid_coords(h, w))
    assert torch.equal(got_q, via_coords[0]) and torch.equal(got_k, via_coords[1])
    # Score between grid cells depends only on their (row, column) offset.
    one = torch.randn(16, dtype=torch.float64)
    vec = one.expand(1, 1, p + h * w, 16)
    rq, rk = rope(vec, vec)
    scores = rq[0, 0] @ rk[0, 0].T  # [s, s]
    cell = lambda r, c: p + r * w + c  # noqa: E731
    assert math.isclose(
        scores[cell(0, 0), cell(1, 2)], scores[cell(1, 1), cell(2, 3)], rel_tol=1e-6
    )
    assert not math.isclose(
        scores[cell(0, 0), cell(1, 2)], scores[cell(0, 0), cell(2, 1)], rel_tol=1e-3
    )


def test_axial_errors() -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        Axial2DRoPE(18)
    rope = Axial2DRoPE(16, grid_size=(2, 2), num_prefix_tokens=1)
    q = torch.randn(1, 1, 6, 16)
    with pytest.raises(ValueError, match="outside 1 prefix tokens"):
        rope(q, q)
    with pytest.raises(ValueError, match="grid_size"):
        Axial2DRoPE(16)(q, q)
    with pytest.raises(ValueError, match="coords must be"):
        rope.rotate(q[:, :, :5], q[:, :, :5], grid_coords(2, 3))


# --- xPos -----------------------------------------------------------------------------------------


def _xpos_reference(
    x: torch.Tensor, positions: list[int], downscale: bool, center: int
) -> torch.Tensor:
    """The paper's formula, pair by pair, float64: rotate (x[2i], x[2i+1]) by p * theta_i and
    scale by zeta_i ** ((p - center) / 512) (its inverse for keys)."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for j, p in enumerate(positions):
        for i in range(d // 2):
            theta = 10000.0 ** (-2 * i / d)
            zeta = (2 * i / d + 0.4) / 1.4
            scale = zeta ** ((p - center) / 512.0)
            scale = 1 / scale if downscale else scale
            c, s = math.cos(p * theta), math.sin(p * theta)
            a, b = x[..., j, 2 * i], x[..., j, 2 * i + 1]
            out[..., j, 2 * i] = (a * c - b * s) * scale
            out[..., j, 2 * i + 1] = (b * c + a * s) * scale
    return out


def test_xpos_matches_the_paper_formula() -> None:
    positions = [0, 3, 600, 1500]
    q, k = (
        torch.randn(1, 2, 4, 16, dtype=torch.float64),
        torch.randn(1, 2, 4, 16, dtype=torch.float64),
    )
    got_q, got_k = XPos(16, center=200)(q, k, torch.tensor(positions))
    ref_q = _xpos_reference(q, positions, downscale=False, center=200)
    ref_k = _xpos_reference(k, positions, downscale=True, center=200)
    # The tables are float32: one float32 rounding of cos * scale (relative 6e-8).
    assert (got_q - ref_q).abs().max() <= 1e-6 * ref_q.abs().max()
    assert (got_k - ref_k).abs().max() <= 1e-6 * ref_k.abs().max()


def test_xpos_scores_depend_on_distance_and_decay() -> None:
    xpos = XPos(32, layout="half")
    q, k = (
        torch.randn(1, 1, 1, 32, dtype=torch.float64),
        torch.randn(1, 1, 1, 32, dtype=torch.float64),
    )

    def score(n: int, m: int) -> float:
        rq, _ = xpos(q, q, torch.tensor([n]))
        _, rk = xpos(k, k, torch.tensor([m]))
        return float((rq * rk).sum())

    assert math.isclose(score(10, 3), score(1010, 1003), rel_tol=1e-6)
    # The decay: for q = k = ones, the score at distance 4000 is far below the one at 0.
    ones = torch.ones(1, 1, 1, 32, dtype=torch.float64)

    def self_score(distance: int) -> float:
        rq, _ = xpos(ones, ones, torch.tensor([distance]))
        _, rk = xpos(ones, ones, torch.tensor([0]))
        return float((rq * rk).sum())

    assert self_score(0) == pytest.approx(32.0)
    assert abs(self_score(4000)) < 0.1 * self_score(0)


# --- MLA ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {
            "type": "yarn",
            "factor": 40.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        {
            "type": "yarn",
            "factor": 8.0,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 16,
        },
    ],
)
def test_decoupled_rope_reproduces_deepseek_v3_attention(
    interleave: bool, scaling: dict | None
) -> None:
    config = DeepseekV3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        kv_lora_rank=32,
        q_lora_rank=None,
        max_position_embeddings=640,
        rope_interleave=interleave,
        rope_scaling=scaling,
        attn_implementation="eager",
    )
    attn = DeepseekV3Attention(config, layer_idx=0).eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    b, s, h = 2, 9, 4
    x = torch.randn(b, s, 64)
    positions = torch.randint(0, 600, (1, s))
    with torch.no_grad():
        ref, _ = attn(x, DeepseekV3RotaryEmbedding(config)(x, positions), None)

        kw = hf_rope_kwargs(config)
        rope = DecoupledRoPE(
            kw["rotary_dim"],
            16,
            kw["base"],
            kw["scaling"],
            "interleaved" if interleave else "half",
            angle_dtype="float32",
        )
        q = attn.q_proj(x).view(b, s, h, 24).transpose(1, 2)  # [b, h, s, nope + rope]
        kv_nope, k_rope = attn.kv_a_proj_with_mqa(x).split([32, 8], dim=-1)
        kv_nope = attn.kv_a_layernorm(kv_nope)  # [b, s, rank]
        k_rope = k_rope.view(b, 1, s, 8)  # [b, 1, s, rope]: one shared rotary key head
        q, k_rope = rope(q, k_rope, positions[0])
        k_nope, v = (
            attn.kv_b_proj(kv_nope).view(b, s, h, 32).transpose(1, 2).split([16, 16], dim=-1)
        )
        k = expand_shared_key(k_nope, k_rope)  # [b, h, s, 24]
        out = F.scaled_dot_product_attention(
            q, k, v, scale=mla_softmax_scale(24, config.rope_parameters)
        )
        got = attn.o_proj(out.transpose(1, 2).reshape(b, s, h * 16))
    assert math.isclose(mla_softmax_scale(24, config.rope_parameters), attn.scaling, rel_tol=1e-12)
    assert (got - ref).abs().max() <= 1e-5 * max(1.0, ref.abs().max().item())


def test_mla_softmax_scale_rule() -> None:
    yarn = {
        "rope_type": "yarn",
        "factor": 40.0,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4,
    }
    mscale = 0.1 * 0.707 * math.log(40.0) + 1
    assert math.isclose(mla_softmax_scale(192, yarn), 192**-0.5 * mscale**2)
    assert mla_softmax_scale(192, None) == 192**-0.5
    assert mla_softmax_scale(192, {**yarn, "mscale_all_dim": 0}) == 192**-0.5
    assert mla_softmax_scale(192, {**yarn, "factor": 1.0}) == 192**-0.5


def test_decoupled_rope_inside_attention() -> None:
    from posenc import Attention

    yarn = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "mscale_all_dim": 1.0,
    }
    rope = DecoupledRoPE(8, 16, scaling=yarn)
    attn = Attention(64, 4, head_dim=24, encoding=rope, scale=mla_softmax_scale(24, yarn))
    x = torch.randn(2, 5, 64)
    out = attn(x)
    assert out.shape == (2, 5, 64) and torch.isfinite(out).all()
    q = torch.randn(2, 4, 5, 24)
    got_q, _ = rope(q, q)
    assert torch.equal(got_q[..., :16], q[..., :16])  # the nope part is untouched
    with pytest.raises(ValueError, match="nope \\+ rope"):
        rope(q[..., :20], q)
