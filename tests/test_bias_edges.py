"""The bias family at its edges: empty sequences, far positions (costs and numbers follow the
offsets, never the position values), KERPLE's one parametrization on every path."""

import math

import pytest
import torch

from posenc import Attention
from posenc.bias import FIRE, KERPLE, ALiBi, Sandwich, T5RelativeBias
from test_bias_functional import paper_alibi_slopes

FAR = 2**40  # a table indexed by position would need 2**40 rows (8 TB of int64)

BIASES = {
    "alibi": lambda: ALiBi(4),
    "alibi-symmetric": lambda: ALiBi(4, causal=False),
    "t5": lambda: T5RelativeBias(4, bidirectional=True),
    "t5-causal": lambda: T5RelativeBias(4, bidirectional=False),
    "kerple-log": lambda: KERPLE(4, "log"),
    "kerple-power": lambda: KERPLE(4, "power"),
    "fire": lambda: FIRE(4, mlp_width=8),
    "sandwich": lambda: Sandwich(4, d_prime=16),
}
# Every bias but FIRE depends on j - i alone; FIRE also reads the query position i.
SHIFT_INVARIANT = [n for n in BIASES if n != "fire"]


def score_mod_bias(enc, positions, k_positions, index_layout: bool = False) -> torch.Tensor:
    """Evaluate ``enc.score_mod`` entry by entry on CPU: ``[b, h, s, t]`` float32 (score 0)."""
    fn = enc.score_mod(positions, k_positions, index_layout=index_layout)
    b = max(positions.shape[0] if positions.dim() == 2 else 1, 1)
    if k_positions.dim() == 2:
        b = max(b, k_positions.shape[0])
    s, t = positions.shape[-1], k_positions.shape[-1]
    grids = torch.meshgrid(
        torch.arange(b),
        torch.arange(enc.num_heads),
        torch.arange(s),
        torch.arange(t),
        indexing="ij",
    )
    return fn(torch.zeros(b, enc.num_heads, s, t), *grids)


@pytest.mark.parametrize("name", list(BIASES))
@pytest.mark.parametrize(("s", "t"), [(0, 5), (5, 0), (0, 0)])
def test_empty_queries_or_keys_give_empty_biases(name: str, s: int, t: int) -> None:
    enc = BIASES[name]()
    q, k = torch.arange(s) + 7, torch.arange(t)
    assert enc.bias(q, k).shape == (4, s, t)
    assert enc.bias(q[None].expand(2, s), k).shape == (2, 4, s, t)
    assert score_mod_bias(enc, q, k).shape == (1, 4, s, t)


@pytest.mark.parametrize("name", SHIFT_INVARIANT)
@pytest.mark.parametrize("offset", [2**31, FAR, 2**62])
def test_far_positions_give_the_numbers_of_near_ones(name: str, offset: int) -> None:
    """The same sequence at offset 2**40 gives the same bias as at offset 0, bit for bit, on both
    paths: the schemes work in offset space (a table by position would not even fit)."""
    enc = BIASES[name]()
    q, k = torch.tensor([3, 4, 9, 20]), torch.arange(24)
    near, far = enc.bias(q, k), enc.bias(q + offset, k + offset)
    assert torch.equal(far, near)
    assert torch.equal(score_mod_bias(enc, q + offset, k + offset), score_mod_bias(enc, q, k))
    qb = torch.stack((q, q + 1))  # [2, s]: batched positions take the same route
    assert torch.equal(enc.bias(qb + offset, k + offset), enc.bias(qb, k))


def _sandwich_formula(r: int, d_prime: int, h: int, num_heads: int) -> float:
    shared = sum(math.cos(r / 10000.0 ** (2 * kk / d_prime)) for kk in range(1, d_prime // 2 + 1))
    return (shared - d_prime // 2) / (8.0 * (h + 1) / num_heads)


def test_two_tokens_far_apart_match_the_formulas() -> None:
    """Positions 0 and 2**40 in one call: O(s t) work, and the paper's float64 formula."""
    q = k = torch.tensor([0, FAR])
    dist = torch.tensor([[0.0, FAR], [-FAR, 0.0]], dtype=torch.float64)  # j - i
    m = torch.tensor(paper_alibi_slopes(4), dtype=torch.float64)[:, None, None]
    torch.testing.assert_close(ALiBi(4).bias(q, k).double(), m * dist)
    sw = Sandwich(4, d_prime=16)
    want = torch.tensor(
        [[[_sandwich_formula(int(r), 16, h, 4) for r in row] for row in dist] for h in range(4)],
        dtype=torch.float64,
    )
    torch.testing.assert_close(sw.bias(q, k).double(), want, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(score_mod_bias(sw, q, k)[0].double(), want, atol=1e-5, rtol=1e-6)
    t5 = T5RelativeBias(4, bidirectional=True)
    w = t5.relative_attention_bias.weight  # [32, h]: 2**40 is in the last bucket each way
    torch.testing.assert_close(t5.bias(q, k)[:, 0, 1], w[31])
    torch.testing.assert_close(t5.bias(q, k)[:, 1, 0], w[15])


def test_kerple_power_bias_stays_finite_at_the_farthest_positions() -> None:
    """``-r1 * |i - j| ** 2`` at ``|i - j| = 2**62`` is past float32: it stops at the most
    negative finite float32 instead of -inf (a row of -inf would be a NaN softmax)."""
    enc = KERPLE(2, "power")
    with torch.no_grad():
        enc.r1.fill_(100.0)
        enc.r2.fill_(2.0)
    q, k = torch.tensor([0]), torch.tensor([2**62])
    for got in (enc.bias(q, k), score_mod_bias(enc, q, k)[0]):
        assert torch.isfinite(got).all() and float(got.max()) == torch.finfo(torch.float32).min


def test_fire_far_positions_match_the_formula_on_both_paths() -> None:
    """FIRE reads the query position itself, so far positions are a different bias: both paths
    must give the float64 formula there (the score_mod rounded positions to float32 before
    subtracting them: at 2**31 neighbours were 256 apart or 0)."""
    enc = FIRE(2, mlp_width=4, init_c=0.3, init_threshold=6.0)
    w1, b1 = enc.mlp[0].weight[:, 0].tolist(), enc.mlp[0].bias.tolist()
    w2, b2 = enc.mlp[2].weight.tolist(), enc.mlp[2].bias.tolist()

    def formula(h: int, i: int, j: int) -> float:
        x = math.log(abs(0.3 * (i - j)) + 1) / (math.log(abs(0.3 * max(6.0, i)) + 1) + 1e-6)
        return b2[h] + sum(w2[h][u] * max(0.0, w1[u] * x + b1[u]) for u in range(4))

    for offset in (2**31, FAR):
        q, k = torch.tensor([3, 4, 9]) + offset, torch.arange(10) + offset
        want = torch.tensor(
            [[[formula(h, int(i), int(j)) for j in k] for i in q] for h in range(2)],
            dtype=torch.float64,
        )
        torch.testing.assert_close(enc.bias(q, k).double(), want, atol=1e-5, rtol=1e-5)
        got = score_mod_bias(enc, q, k)[0].double()
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", list(BIASES))
def test_attention_flex_equals_sdpa_at_far_positions(name: str) -> None:
    """Attention's FlexAttention path (eager: the same score_mod) against SDPA with the
    materialized bias, 16 tokens at offset 2**40."""
    enc = BIASES[name]()
    sdpa = Attention(32, 4, encoding=enc, backend="sdpa").eval()
    flex = Attention(32, 4, encoding=enc, backend="flex", compile_flex=False).eval()
    flex.load_state_dict(sdpa.state_dict())
    x, pos = torch.randn(2, 16, 32), torch.arange(16) + FAR
    with torch.no_grad():
        torch.testing.assert_close(flex(x, pos), sdpa(x, pos), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_out_of_range_parameters_give_one_bias_on_every_path(variant: str) -> None:
    """Training can push r1, r2 out of their ranges without clamp_parameters_() being called:
    SDPA's bias, the explicit path and FlexAttention's score_mod all read them through one
    parametrization (clamped), so they agree, and agree with the formula at the clamped values."""
    enc = KERPLE(3, variant)
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([-0.5, 1.5, 0.001]))  # below eps = 0.01 twice
        enc.r2.copy_(torch.tensor([3.0, -1.0, 2.5]))  # power: above 2 twice; one below eps
    r1 = [0.01, 1.5, 0.01]
    r2 = [3.0, 0.01, 2.5] if variant == "log" else [2.0, 0.01, 2.0]
    q, k = torch.tensor([2, 5, 6]), torch.arange(8)

    def kernel(h: int, r: int) -> float:
        if variant == "log":
            return -r1[h] * math.log1p(r2[h] * abs(r))
        return -r1[h] * abs(r) ** r2[h]

    want = torch.tensor(
        [[[kernel(h, int(j - i)) for j in k] for i in q] for h in range(3)], dtype=torch.float64
    )
    torch.testing.assert_close(enc.bias(q, k).double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(score_mod_bias(enc, q, k)[0], enc.bias(q, k), rtol=0, atol=0)
    sdpa = Attention(24, 3, encoding=enc, backend="sdpa").eval()
    explicit = Attention(24, 3, encoding=enc, backend="explicit").eval()
    flex = Attention(24, 3, encoding=enc, backend="flex", compile_flex=False).eval()
    explicit.load_state_dict(sdpa.state_dict())
    flex.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 8, 24)
    with torch.no_grad():
        ref = sdpa(x)
        torch.testing.assert_close(explicit(x), ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(flex(x), ref, atol=1e-6, rtol=1e-5)


def test_kerple_clamp_is_exact_in_value_and_identity_in_gradient() -> None:
    """The straight-through clamp gives exactly the clamped value (``p + (clamp - p)`` rounded:
    r2 = -1000 clamped to eps = 0.01 came out 0.01 +- 3e-5, a 0.3 % error in the exponent) and
    passes the gradient through unchanged."""
    enc = KERPLE(3, "power")
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([-1000.0, 0.5, 7.0]))
        enc.r2.copy_(torch.tensor([-1000.0, 1e6, 1.5]))
    r1, r2 = enc.constrained()
    assert r1.tolist() == torch.tensor([0.01, 0.5, 7.0]).tolist()
    assert r2.tolist() == torch.tensor([0.01, 2.0, 1.5]).tolist()
    (r1.sum() + 2 * r2.sum()).backward()
    assert enc.r1.grad.tolist() == [1.0] * 3 and enc.r2.grad.tolist() == [2.0] * 3


def test_compiled_flex_at_offset_2_31_is_bounded_and_equals_sdpa() -> None:
    """64 tokens at offset 2**31 through compiled FlexAttention (it once wanted 17 GB: a table by
    position); Sandwich's score_mod is the heaviest (its embeddings' dot product). Costs follow
    s * t: peak RSS grows by far less than a 2**31-entry table (8 GB of int32)."""
    import resource

    from posenc.attention import flex_available

    if not flex_available("cpu"):
        pytest.skip("compiled FlexAttention needs a C++ compiler on CPU")
    enc = Sandwich(4, d_prime=16)
    sdpa = Attention(32, 4, encoding=enc, backend="sdpa").eval()
    flex = Attention(32, 4, encoding=enc, backend="flex", compile_flex=True).eval()
    flex.load_state_dict(sdpa.state_dict())
    x, pos = torch.randn(1, 64, 32), torch.arange(64) + 2**31
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with torch.no_grad():
        got = flex(x, pos)
        torch.testing.assert_close(got, sdpa(x, pos), atol=2e-6, rtol=1e-5)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 2048, grown_mib  # the compile itself takes a few hundred MiB at most
