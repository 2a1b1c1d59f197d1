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

from posenc import Attention  # noqa: E402
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
    with pytest.raises(ValueError, match="must be below 1 prefix tokens"):
        rope(q, q)
    with pytest.raises(ValueError, match="grid_size"):
        Axial2DRoPE(16)(q, q)
    with pytest.raises(ValueError, match="coords must be"):
        rope.rotate(q[:, :, :5], q[:, :, :5], grid_coords(2, 3))
    # Wrong types name the option (they were Python's own '<' and indexing errors).
    with pytest.raises(ValueError, match="num_prefix_tokens must be an integer >= 0"):
        Axial2DRoPE(16, num_prefix_tokens="1")
    with pytest.raises(TypeError, match=r"grid_size must be a pair \(grid_h, grid_w\)"):
        Axial2DRoPE(16, grid_size=4)


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


def _xpos_score_reference(q: list, k: list, distance: int, d: int) -> float:
    """The paper's score of a query and a key ``distance = n - m`` apart, float64, from the offset
    alone: pair i turns k against q by ``-distance * theta_i`` and decays by ``zeta_i ** (distance
    / 512)``."""
    total = 0.0
    for i in range(d // 2):
        theta = 10000.0 ** (-2 * i / d)
        zeta = (2 * i / d + 0.4) / 1.4
        c, s = math.cos(-distance * theta), math.sin(-distance * theta)
        qa, qb, ka, kb = q[2 * i], q[2 * i + 1], k[2 * i], k[2 * i + 1]
        total += (qa * (ka * c - kb * s) + qb * (kb * c + ka * s)) * zeta ** (distance / 512.0)
    return total


@pytest.mark.parametrize("center", [0, 2**40, 2**62])
def test_xpos_is_the_formula_at_far_positions(center: int) -> None:
    """Around any int64 center the scales are the float64 formula (exact int64 offsets), and the
    scores of far tokens are the paper's score of their distance (float32 q and k, 16 tokens)."""
    xpos = XPos(16, center=center)
    offsets = torch.tensor([-30_000, -5, 0, 7, 29_000, 30_000])
    positions = (offsets + center).clamp(min=0)
    cos, sin = xpos.cos_sin(positions)
    got = (cos.double() ** 2 + sin.double() ** 2).sqrt()  # [n, d/2]: the scale of each pair
    zeta = (torch.arange(0, 16, 2, dtype=torch.float64) / 16 + 0.4) / 1.4
    want = zeta ** ((positions - center).double()[:, None] / 512.0)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    if center > 2**40:
        return  # absolute angles (RoPE's, and the paper's) mean nothing in float64 there
    q, k = torch.randn(1, 1, 6, 16), torch.randn(1, 1, 6, 16)
    rq, rk = xpos(q, k, positions)
    for n, m in [(4, 3), (5, 4), (3, 2), (2, 2)]:
        ref = _xpos_score_reference(
            q[0, 0, n].tolist(), k[0, 0, m].tolist(), int(positions[n] - positions[m]), 16
        )
        # Angles of absolute positions (RoPE's, and the paper's) carry ~1e-4 rad at 2**40.
        assert float((rq[0, 0, n] * rk[0, 0, m]).sum()) == pytest.approx(ref, rel=2e-3, abs=1e-4)


@pytest.mark.parametrize(("dtype", "limit"), [(torch.float32, 34_561), (torch.float16, 2_832)])
def test_xpos_past_its_range_is_an_error_not_a_wrong_score(dtype, limit: int) -> None:
    """Past ``max_offset`` one side's scale overflows and the other's underflows: it used to give
    finite wrong scores (a key scaled to 0) and NaN on the explicit path; now a ValueError."""
    xpos = XPos(16, center=50_000)
    assert xpos.max_offset(dtype) == limit
    q = torch.randn(1, 2, 2, 16, dtype=dtype)
    qr, kr = xpos(q, q, torch.tensor([50_000 - limit, 50_000 + limit]))
    assert torch.isfinite(qr).all() and torch.isfinite(kr).all()
    with pytest.raises(ValueError, match=rf"within {limit} of center=50000 .* {limit + 1} away"):
        xpos(q, q, torch.tensor([50_000, 50_001 + limit]))
    attn = Attention(32, 2, encoding=XPos(16, center=0), backend="explicit").to(dtype)
    with pytest.raises(ValueError, match="positions must lie within"):
        attn(torch.randn(1, 2, 32, dtype=dtype), torch.tensor([0, 10**6]))


def test_xpos_out_of_range_rows_are_nan_where_nothing_can_raise(monkeypatch) -> None:
    """Under torch.compile (no value checks) an out-of-range row is NaN, never a wrong number."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    cos, sin = XPos(16).cos_sin(torch.tensor([0, 10**6]))
    assert torch.isfinite(cos[0]).all() and torch.isnan(cos[1]).all() and torch.isnan(sin[1]).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"scale_base": math.nan}, ValueError, "scale_base must be a finite number > 0"),
        ({"scale_base": math.inf}, ValueError, "scale_base must be a finite number > 0"),
        ({"scale_base": "512"}, TypeError, "scale_base must be a finite number > 0"),
        ({"gamma": math.nan}, ValueError, "gamma must be a finite number > 0"),
        ({"gamma": 0.0}, ValueError, "gamma must be a finite number > 0"),
        ({"center": -1}, ValueError, r"center must be a position in \[0, 2\*\*63\)"),
        ({"center": 2**63}, ValueError, r"center must be a position in \[0, 2\*\*63\)"),
        ({"center": 1.5}, TypeError, "center must be an integer position"),
    ],
)
def test_xpos_bad_options(kwargs: dict, error, words: str) -> None:
    with pytest.raises(error, match=words):
        XPos(16, **kwargs)


def test_xpos_named_kernel_with_mixed_dtypes_is_a_value_error() -> None:
    """backend="cpu" (one fused launch takes one dtype) for float32 q and bfloat16 k."""
    q, k = torch.randn(1, 1, 3, 16), torch.randn(1, 1, 3, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="backend='cpu' needs q and k of one dtype"):
        XPos(16, backend="cpu")(q, k)


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
