"""RoPE properties (hypothesis), precision at large positions, the cos/sin cache, scaling
formulas evaluated independently in float64, the registry and model, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _decode import prefill_then_decode
from posenc import Attention, KVCache, ModelConfig, TransformerLM
from posenc.functional import (
    apply_rotary,
    apply_rotary_qk,
    normalize_scaling,
    rope_cos_sin,
    rope_inv_freq,
)
from posenc.registry import build, options
from posenc.rotary import RotaryEmbedding

SETTINGS = settings(max_examples=25, deadline=None)

# Scalings whose attention factor is 1 (rotations proper).
UNIT_SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "ntk", "factor": 8.0},
    {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 32},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "attention_factor": 1.0,
    },
    {"rope_type": "proportional", "factor": 2.0},
]

rope_configs = st.builds(
    lambda d, frac, layout, scaling, base: (d, d * frac // 4 * 2 or 2, layout, scaling, base),
    st.sampled_from([4, 8, 16, 32]),
    st.sampled_from([1, 2]),
    st.sampled_from(["half", "interleaved"]),
    st.sampled_from(UNIT_SCALINGS),
    st.sampled_from([10000.0, 500000.0, 100.0]),
)


def _rope(cfg: tuple) -> RotaryEmbedding:
    d, r, layout, scaling, base = cfg
    if scaling is not None and scaling["rope_type"] in ("ntk", "dynamic") and r < 4:
        r = 4 if d >= 4 else d
    return RotaryEmbedding(d, base, scaling, layout, r)


# --- properties -------------------------------------------------------------------------------


@SETTINGS
@given(cfg=rope_configs, top=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_rotation_preserves_norms(cfg: tuple, top: int, seed: int) -> None:
    rope = _rope(cfg)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 5, cfg[0], dtype=torch.float64, generator=g)
    positions = torch.randint(0, top + 1, (2, 5), generator=g)
    rq, rk = rope(q, q[:, :1], positions)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), rtol=1e-6, atol=0)
    torch.testing.assert_close(rk.norm(dim=-1), q[:, :1].norm(dim=-1), rtol=1e-6, atol=0)


@SETTINGS
@given(
    cfg=rope_configs,
    m=st.integers(0, 5000),
    n=st.integers(0, 5000),
    shift=st.integers(0, 10**5),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_relative_position(
    cfg: tuple, m: int, n: int, shift: int, seed: int
) -> None:
    rope = _rope(cfg)
    if rope.rope_type == "dynamic":  # its frequencies depend on the call's length by design
        rope = rope.with_scaling(None)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 1, cfg[0], dtype=torch.float64, generator=g)
    k = torch.randn(1, 1, 1, cfg[0], dtype=torch.float64, generator=g)

    def score(a: int, b: int) -> float:
        rq, _ = rope(q, q, torch.tensor([a]))
        _, rk = rope(k, k, torch.tensor([b]))
        return float((rq * rk).sum())

    # cos/sin are float32: each carries a rounding of 6e-8.
    bound = 1e-6 * float(q.norm() * k.norm())
    assert abs(score(m, n) - score(m + shift, n + shift)) <= bound


@SETTINGS
@given(cfg=rope_configs, s=st.integers(1, 9), t_extra=st.integers(0, 4))
def test_explicit_arange_equals_default(cfg: tuple, s: int, t_extra: int) -> None:
    rope = _rope(cfg)
    q, k = torch.randn(2, 2, s, cfg[0]), torch.randn(2, 1, s + t_extra, cfg[0])
    got = rope(q, k)
    ref = rope(q, k, torch.arange(t_extra, s + t_extra), torch.arange(s + t_extra))
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    if t_extra == 0:
        ref = rope(q, k, torch.arange(s).expand(2, s))
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@SETTINGS
@given(
    cfg=rope_configs, total=st.integers(2, 40), data=st.data(), cache_len=st.sampled_from([4, 4096])
)
def test_offset_positions_equal_slicing_a_longer_run(
    cfg: tuple, total: int, data: st.DataObject, cache_len: int
) -> None:
    d, r, layout, scaling, base = cfg
    if scaling is not None and scaling["rope_type"] == "dynamic":
        scaling = None  # length-dependent by design: a slice is a shorter call
    rope = RotaryEmbedding(
        d, base, scaling, layout, max(r, 4) if d >= 4 else r, cache_len=cache_len
    )
    start = data.draw(st.integers(0, total - 1))
    end = data.draw(st.integers(start + 1, total))
    x = torch.randn(1, 2, total, d)
    full_q, full_k = rope(x, x)
    part_q, part_k = rope(x[:, :, start:end], x[:, :, start:end], torch.arange(start, end))
    assert torch.equal(part_q, full_q[:, :, start:end]) and torch.equal(
        part_k, full_k[:, :, start:end]
    )


_FAR: dict[tuple[str, str], RotaryEmbedding] = {}


def _far_rope(d: int, layout: str, angle_dtype: str = "float64") -> RotaryEmbedding:
    """One module per layout and angle dtype for every example below: its table, grown to
    ``2 ** 20`` rows by the first example's positions (the default path), serves the others
    (built for each example, the tables cost the test 11 s of its 12)."""
    key = (layout, angle_dtype)
    if key not in _FAR:
        _FAR[key] = RotaryEmbedding(d, layout=layout, angle_dtype=angle_dtype)
    return _FAR[key]


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**16), layout=st.sampled_from(["half", "interleaved"]))
def test_bf16_at_positions_up_to_1e6_is_within_one_bf16_step(seed: int, layout: str) -> None:
    """The output equals the float64 rotation of the bf16 input, rounded once to bf16."""
    g = torch.Generator().manual_seed(seed)
    d = 64
    positions = torch.randint(0, 10**6 + 1, (2, 16), generator=g)
    positions[0, 0] = 10**6
    q = torch.randn(2, 2, 16, d, generator=g).to(torch.bfloat16)
    got, _ = _far_rope(d, layout)(q, q, positions)
    ref = _rope_float64(q.double(), positions, d, layout)
    assert got.dtype == torch.bfloat16
    # One bf16 step, plus the float32 arithmetic's absolute error (about 2^-24 of the inputs):
    # where x c - y s cancels to near zero, that is more than a step of the tiny result.
    slack = 2.0**-22 * float(q.double().abs().max())
    assert _bf16_steps(got, ref, slack) <= 1.0
    # The bug this guards against: positions in the input's dtype (1e6 in bf16 is off by ~2000).
    bug = _rope_float64(q.double(), positions.to(torch.bfloat16).long(), d, layout).to(
        torch.bfloat16
    )
    assert _bf16_steps(bug, ref) > 1.0
    # float32 angles drift by position * 6e-8 rad: also more than a step at 1e6 (why float64 is
    # the default; float32 reproduces transformers).
    f32, _ = _far_rope(d, layout, "float32")(q, q, positions)
    assert _bf16_steps(f32, ref) > 1.0


def _rope_float64(x: torch.Tensor, positions: torch.Tensor, d: int, layout: str) -> torch.Tensor:
    """RoPE from the formula, in float64: ``theta_i = p * 10000 ** (-2i / d)``."""
    inv = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    ang = positions.double()[:, None, :, None] * inv  # [b, 1, s, d/2]
    c, s = ang.cos(), ang.sin()
    if layout == "half":
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), -1).flatten(-2)


def _bf16_steps(got: torch.Tensor, ref: torch.Tensor, slack: float = 0.0) -> float:
    """Largest ``max(|got - ref| - slack, 0)`` in units of the bf16 spacing at ``ref`` (8
    significant bits)."""
    spacing = torch.exp2(torch.floor(torch.log2(ref.abs().clamp_min(1e-30))) - 7)
    return float((((got.double() - ref).abs() - slack).clamp_min(0) / spacing).max())


def test_inputs_are_not_modified_and_dtypes_kept() -> None:
    rope = RotaryEmbedding(16, rotary_dim=8)
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        q, k = torch.randn(2, 4, 5, 16, dtype=dtype), torch.randn(2, 2, 5, 16, dtype=dtype)
        q0, k0 = q.clone(), k.clone()
        rq, rk = rope(q, k)
        assert torch.equal(q, q0) and torch.equal(k, k0)
        assert rq.dtype == rk.dtype == dtype
        assert torch.equal(rq[..., 8:], q[..., 8:])  # partial rotary leaves the tail


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_gradcheck(layout: str) -> None:
    cos, sin = rope_cos_sin(torch.arange(5), rope_inv_freq(6, 100.0)[0])
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin, layout, 6), (x,))


# --- cache -------------------------------------------------------------------------------------


def test_table_and_on_the_fly_paths_agree() -> None:
    positions = torch.tensor([[0, 3, 7, 9000], [1, 2, 4096, 5]])
    q = torch.randn(2, 2, 4, 32)
    for scaling in UNIT_SCALINGS[:3]:
        big, small = (
            RotaryEmbedding(32, scaling=scaling),
            RotaryEmbedding(32, scaling=scaling, cache_len=2),
        )
        for got, ref in zip(big(q, q, positions), small(q, q, positions), strict=True):
            assert torch.equal(got, ref)


def test_dynamic_ntk_is_a_function_of_the_current_length() -> None:
    sc = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 16}
    rope = RotaryEmbedding(16, scaling=sc)
    short = torch.arange(8)
    before = rope.cos_sin(short)
    long_cos, _ = rope.cos_sin(torch.arange(40))
    after = rope.cos_sin(short)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])  # back to original
    plain, _ = RotaryEmbedding(16).cos_sin(torch.arange(40))
    assert not torch.allclose(long_cos, plain)  # grew past 16: NTK base
    assert torch.equal(rope.cos_sin(short)[0], plain[:8])  # within 16: the plain frequencies
    # A length grown call, then a shorter one still past the original: its own frequencies.
    mid = rope.cos_sin(torch.arange(24))[0]
    fresh = RotaryEmbedding(16, scaling=sc).cos_sin(torch.arange(24))[0]
    assert torch.equal(mid, fresh)


def test_longrope_switches_at_the_original_length() -> None:
    sc = {
        "rope_type": "longrope",
        "short_factor": [1.0] * 4,
        "long_factor": [4.0] * 4,
        "original_max_position_embeddings": 10,
        "factor": 4.0,
    }
    rope = RotaryEmbedding(8, scaling=sc)
    af = math.sqrt(1 + math.log(4.0) / math.log(10))
    c_short, _ = rope.cos_sin(torch.arange(10))
    c_long, _ = rope.cos_sin(torch.arange(11))
    inv = rope_inv_freq(8, dtype=torch.float64)[0]
    torch.testing.assert_close(
        c_short, (torch.arange(10.0, dtype=torch.float64)[:, None] * inv).cos().float() * af
    )
    torch.testing.assert_close(
        c_long, (torch.arange(11.0, dtype=torch.float64)[:, None] * inv / 4).cos().float() * af
    )


def test_no_buffers_no_state_and_module_to_keeps_precision() -> None:
    rope = RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 2.0})
    assert rope.state_dict() == {} and list(rope.buffers()) == []
    q = torch.randn(1, 2, 6, 16)
    ref = rope(q, q, torch.arange(1000, 1006))
    rope.to(torch.bfloat16)
    got = rope(q, q, torch.arange(1000, 1006))
    assert torch.equal(ref[0], got[0])


def test_with_scaling_keeps_the_rest() -> None:
    rope = RotaryEmbedding(
        32, base=500000.0, layout="interleaved", rotary_dim=16, angle_dtype="float32"
    )
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}
    scaled = rope.with_scaling(yarn)
    assert (scaled.head_dim, scaled.base, scaled.layout, scaled.rotary_dim, scaled.angle_dtype) == (
        32,
        500000.0,
        "interleaved",
        16,
        torch.float32,
    )
    assert scaled.scaling == yarn and rope.scaling is None
    assert scaled.attention_factor == pytest.approx(0.1 * math.log(4.0) + 1)
    assert rope.with_scaling(None).scaling is None


# --- scaling formulas, independently in float64 --------------------------------------------------


def _plain64(base: float, d: int) -> torch.Tensor:
    return torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)


@pytest.mark.parametrize("d", [4, 16, 128])
@pytest.mark.parametrize("factor", [2.0, 8.0, 32.0])
def test_static_ntk_is_the_published_base_change(d: int, factor: float) -> None:
    inv, af = rope_inv_freq(d, 10000.0, {"rope_type": "ntk", "factor": factor}, dtype=torch.float64)
    ref = _plain64(10000.0 * factor ** (d / (d - 2)), d)
    torch.testing.assert_close(inv, ref, rtol=1e-12, atol=0)
    assert af == 1.0
    # The lowest frequency is interpolated by exactly `factor`, the highest kept.
    assert inv[0] == 1.0
    assert inv[-1].item() == pytest.approx(_plain64(10000.0, d)[-1].item() / factor, rel=1e-12)


def test_linear_is_position_interpolation() -> None:
    rope = RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 4.0})
    plain = RotaryEmbedding(16)
    got, _ = rope.cos_sin(torch.arange(0, 400, 4))
    ref, _ = plain.cos_sin(torch.arange(100))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-7)


def test_dynamic_ntk_formula() -> None:
    sc = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 100}
    inv, _ = rope_inv_freq(16, 10000.0, sc, seq_len=300, dtype=torch.float64)
    ref = _plain64(10000.0 * (2.0 * 300 / 100 - 1.0) ** (16 / 14), 16)
    torch.testing.assert_close(inv, ref, rtol=1e-12, atol=0)
    torch.testing.assert_close(
        rope_inv_freq(16, 10000.0, sc, seq_len=50, dtype=torch.float64)[0], _plain64(1e4, 16)
    )


def test_proportional_spreads_over_the_head() -> None:
    inv, _ = rope_inv_freq(
        8, 10000.0, {"rope_type": "proportional", "factor": 2.0}, head_dim=32, dtype=torch.float64
    )
    assert inv.shape == (16,)
    torch.testing.assert_close(inv[:4], _plain64(10000.0, 32)[:4] / 2.0, rtol=1e-12, atol=0)
    assert torch.equal(inv[4:], torch.zeros(12, dtype=torch.float64))
    rope = RotaryEmbedding(32, scaling={"rope_type": "proportional"}, rotary_dim=8)
    x = torch.randn(1, 1, 3, 32)
    out, _ = rope(x, x, torch.tensor([5, 9, 100]))
    moved = (out != x).any(dim=(0, 1, 2))  # half layout: pairs (i, i + 16), i < 4
    assert moved.nonzero().flatten().tolist() == [0, 1, 2, 3, 16, 17, 18, 19]


# --- registry, model, attention ---------------------------------------------------------------


def test_registry_entries() -> None:
    rope = build("rope", dim=64, num_heads=4, partial_rotary_factor=0.5)
    assert rope.family == "rotary" and rope.rotary_dim == 8 and rope.head_dim == 16
    assert set(options("rope")) >= {
        "base",
        "scaling",
        "layout",
        "rotary_dim",
        "partial_rotary_factor",
    }
    xpos = build("xpos", dim=64, num_heads=4, max_len=100)
    assert xpos.family == "rotary" and xpos.center == 50
    with pytest.raises(ValueError, match="not both"):
        build("rope", dim=64, num_heads=4, partial_rotary_factor=0.5, rotary_dim=8)


@pytest.mark.parametrize(
    ("encoding", "kwargs"),
    [
        ("rope", {}),
        (
            "rope",
            {
                "scaling": {
                    "rope_type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 8,
                }
            },
        ),
        ("xpos", {}),
    ],
)
def test_transformer_lm_with_rotary_decodes_like_a_full_forward(
    encoding: str, kwargs: dict
) -> None:
    cfg = ModelConfig(
        vocab_size=50,
        dim=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_len=16,
        encoding=encoding,
        encoding_kwargs=kwargs,
    )
    model = TransformerLM(cfg).eval()
    tokens = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        full = model(tokens)
        caches = model.new_caches()
        got = prefill_then_decode(lambda part: model(part, caches=caches), tokens, 5)
    torch.testing.assert_close(got, full, rtol=1e-4, atol=1e-5)


def test_attention_with_memory_passes_key_positions() -> None:
    rope = RotaryEmbedding(8)
    attn = Attention(16, 2, encoding=rope)
    x, mem = torch.randn(1, 3, 16), torch.randn(1, 4, 16)
    out = attn(x, positions=torch.arange(4, 7), memory=mem)
    assert out.shape == (1, 3, 16)
    # Same as a cache holding the memory's keys: memory then x at positions 0..6.
    cache = KVCache()
    attn(mem, cache=cache)
    torch.testing.assert_close(attn(x, cache=cache), out)


# --- bad input ----------------------------------------------------------------------------------


def test_bad_construction() -> None:
    with pytest.raises(ValueError, match="head_dim must be even for RoPE, got 63"):
        RotaryEmbedding(63)
    with pytest.raises(ValueError, match="rotary_dim must be even for RoPE, got 7"):
        RotaryEmbedding(16, rotary_dim=7)
    with pytest.raises(ValueError, match=r"rotary_dim \(32\) must be <= head_dim \(16\)"):
        RotaryEmbedding(16, rotary_dim=32)
    with pytest.raises(ValueError, match="layout must be one of 'half', 'interleaved'"):
        RotaryEmbedding(16, layout="gptj")
    with pytest.raises(ValueError, match=r"base \(rope_theta\) must be a finite number > 1"):
        RotaryEmbedding(16, base=1.0)
    with pytest.raises(ValueError, match="angle_dtype"):
        RotaryEmbedding(16, angle_dtype="bfloat16")


def test_bad_scaling() -> None:
    with pytest.raises(
        ValueError, match=r"scaling\['rope_type'\] must be one of .*got 'ntk-by-parts'"
    ):
        normalize_scaling({"rope_type": "ntk-by-parts", "factor": 2.0})
    with pytest.raises(
        ValueError,
        match=r"rope_type 'yarn' is missing required key\(s\) "
        r"\['original_max_position_embeddings'\]",
    ):
        RotaryEmbedding(16, scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(
        ValueError, match=r"unknown scaling key\(s\) \['low_freq_factor'\] for rope_type 'linear'"
    ):
        RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0})
    with pytest.raises(ValueError, match="needs a 'rope_type'"):
        RotaryEmbedding(16, scaling={"factor": 2.0})
    with pytest.raises(ValueError, match="pass base= instead"):
        RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    with pytest.raises(
        ValueError, match=r"scaling\['factor'\] must be a finite number >= 1 .* rope_type 'linear'"
    ):
        RotaryEmbedding(16, scaling={"rope_type": "linear", "factor": -2.0})
    with pytest.raises(ValueError, match="must hold rotary_dim/2=8 numbers"):
        RotaryEmbedding(
            16,
            scaling={
                "rope_type": "longrope",
                "short_factor": [1.0],
                "long_factor": [1.0] * 8,
                "original_max_position_embeddings": 4,
                "factor": 2.0,
            },
        )
    with pytest.warns(UserWarning, match="high_freq_factor"):  # as transformers: read, warned
        RotaryEmbedding(
            16,
            scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 64,
            },
        )
    with pytest.raises(TypeError, match="scaling must be a dict"):
        RotaryEmbedding(16, scaling="yarn")  # type: ignore[arg-type]
    assert normalize_scaling({"type": "default"}) is None


BAD_SCALING = [
    ({"rope_type": "linear", "factor": 0.5}, r"scaling\['factor'\] must be a finite number >= 1"),
    ({"rope_type": "linear", "factor": float("nan")}, r"scaling\['factor'\] must be a finite"),
    ({"rope_type": "ntk", "factor": "2"}, r"scaling\['factor'\] must be a finite number"),
    ({"rope_type": "linear", "factor": True}, r"scaling\['factor'\] must be a finite number"),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "beta_fast": 1.0, "beta_slow": 32.0},
        r"beta_fast'\] must be greater than scaling\['beta_slow'\]",
    ),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0},
        r"original_max_position_embeddings'\] must be a positive integer",
    ),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64.5},
        r"original_max_position_embeddings'\] must be a positive integer",
    ),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "mscale": float("nan")},
        r"scaling\['mscale'\] must be a finite number >= 0",
    ),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "beta_fast": -1},
        r"scaling\['beta_fast'\] must be a finite number > 0",
    ),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
         "truncate": "no"},
        r"scaling\['truncate'\] must be True or False",
    ),
    (
        {"rope_type": "longrope", "factor": 0, "short_factor": [1.0] * 4,
         "long_factor": [1.0] * 4, "original_max_position_embeddings": 8},
        r"scaling\['factor'\] must be a finite number >= 1",
    ),
    (
        {"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0] * 4,
         "long_factor": [1.0, float("nan"), 1.0, 1.0], "original_max_position_embeddings": 8},
        r"scaling\['long_factor'\] must be a list of finite numbers > 0",
    ),
    (
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": None, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64},
        r"missing required key\(s\) \['low_freq_factor'\]",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("scaling", "message"), BAD_SCALING)
def test_bad_scaling_values_raise_naming_the_key(scaling: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RotaryEmbedding(8, scaling=scaling)


@pytest.mark.parametrize("base", [0.0, -1e4, float("nan"), float("inf"), "1e4", None])
def test_bad_theta_raises(base: object) -> None:
    with pytest.raises(ValueError, match=r"base \(rope_theta\) must be a finite number > 1"):
        RotaryEmbedding(8, base=base)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"base \(rope_theta\) must be a finite number > 1"):
        rope_inv_freq(8, base)  # type: ignore[arg-type]


def test_bad_forward_input() -> None:
    rope = RotaryEmbedding(16)
    q = torch.randn(2, 4, 5, 16)
    with pytest.raises(ValueError, match="same head_dim, got 16 and 8"):
        rope(q, torch.randn(2, 4, 5, 8))
    with pytest.raises(ValueError, match="head_dim 16 \\(this encoding's\\), got 8"):
        rope(q[..., :8], q[..., :8])
    with pytest.raises(ValueError, match="4-D"):
        rope(q[0], q[0])
    with pytest.raises(ValueError, match="same batch size"):
        rope(q, q[:1])
    with pytest.raises(ValueError, match=r"positions must be \[5\] or \[2, 5\], got \[6\]"):
        rope(q, q, torch.arange(6))
    with pytest.raises(ValueError, match=r"positions must be \[5\] or \[2, 5\], got \[3, 5\]"):
        rope(q, q, torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must be 1-D or 2-D"):
        rope(q, q, torch.zeros(1, 2, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="positions must have an integer dtype"):
        rope(q, q, torch.arange(5.0))
    with pytest.raises(TypeError, match="positions must have an integer dtype"):
        rope(q, q, torch.arange(5).to(torch.bfloat16))
    with pytest.raises(ValueError, match="non-negative"):
        rope(q, q, torch.arange(-1, 4))
    with pytest.raises(ValueError, match="pass k_positions"):
        rope(q, torch.randn(2, 4, 7, 16), torch.arange(5))
    with pytest.raises(TypeError, match="floating point"):
        rope(q.long(), q.long())


def test_bad_functional_input() -> None:
    cos, sin = rope_cos_sin(torch.arange(5), rope_inv_freq(8)[0])
    x = torch.randn(5, 16)
    with pytest.raises(ValueError, match="cos and sin must end in rotary_dim/2=3"):
        apply_rotary(x, cos, sin, rotary_dim=6)
    with pytest.raises(ValueError, match=r"rotary_dim \(32\) must be <= head_dim \(16\)"):
        apply_rotary(x, *rope_cos_sin(torch.arange(5), rope_inv_freq(32)[0]))
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'torch', 'triton', 'cpu'"):
        apply_rotary_qk(x[None, None], x[None, None], cos, sin, cos, sin, backend="tpu")
    with pytest.raises(ValueError, match=r"must index the table's 5 rows, got values in \[5, 9\]"):
        apply_rotary_qk(
            x[None, None], x[None, None], cos, sin, cos, sin, positions=torch.arange(5, 10)
        )
    with pytest.raises(ValueError, match="rotary_dim must be even for RoPE, got 5"):
        rope_inv_freq(5)
    with pytest.raises(TypeError, match=r"dtype must be torch\.float32 or torch\.float64"):
        rope_inv_freq(8, dtype=torch.bfloat16)


@pytest.mark.parametrize("top", [10, 5000])  # inside the cached table, and past it
def test_q_and_k_of_different_dtypes_rotate_each_in_its_own(top: int) -> None:
    """One fused launch takes one dtype: a float32 q with a bf16 k (or the reverse) goes to the
    reference, never to a kernel reading k's bf16 bytes as float32."""
    positions = torch.arange(top - 3, top)
    for dq, dk in ((torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)):
        q, k = torch.randn(2, 4, 3, 16).to(dq), torch.randn(2, 2, 3, 16).to(dk)
        got = RotaryEmbedding(16)(q, k, positions)
        want = RotaryEmbedding(16, backend="torch")(q, k, positions)
        assert got[0].dtype == dq and got[1].dtype == dk
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="backend='cpu' needs q and k of one dtype"):
        RotaryEmbedding(16, backend="cpu")(q, k, positions)


def test_functional_rotation_of_q_and_k_in_different_dtypes() -> None:
    from posenc.kernels import rope_qk

    cos, sin = rope_cos_sin(torch.arange(6), rope_inv_freq(16)[0])
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 1, 6, 16).bfloat16()
    got = rope_qk(q, k, cos, sin)
    want = rope_qk(q, k, cos, sin, backend="torch")
    assert got[1].dtype == torch.bfloat16
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="needs q and k of one dtype"):
        apply_rotary_qk(q, k, cos, sin, backend="cpu")


@pytest.mark.parametrize("angle_dtype", ["float32", "float64"])
def test_cos_sin_of_a_few_far_positions_is_the_tables_without_growing_it(angle_dtype: str) -> None:
    """A few positions far past the table (51 up to 130k against 4096 rows) are computed for the
    call, bit for bit the rows a table holding them gives, and no table is built; positions a
    call walks up to (a prefill of 10k) grow it as before."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    positions = torch.randint(0, 130_000, (3, 17), generator=torch.Generator().manual_seed(0))
    few = RotaryEmbedding(128, scaling=scaling, angle_dtype=angle_dtype)
    table = RotaryEmbedding(128, scaling=scaling, angle_dtype=angle_dtype, cache_len=2**17)
    for got, want in zip(few.cos_sin(positions), table.cos_sin(positions), strict=True):
        assert torch.equal(got, want)
    assert not few._tables and table._tables
    few.cos_sin(torch.arange(10_000))
    assert next(iter(few._tables.values()))[0].shape[1] >= 10_000
