"""Custom ALiBi slopes with batched positions, signed sinusoidal positions, per-head Shaw tables:
each against a naive loop or the formula in float64."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.bias import ALiBi
from posenc.functional import alibi_slopes, sinusoidal_table
from posenc.relative import ShawRelative

# --- ALiBi ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("as_tensor", [True, False])
def test_alibi_custom_slopes_batched_positions_match_a_loop(causal: bool, as_tensor: bool) -> None:
    torch.manual_seed(0)
    h, b, s, t = 3, 2, 4, 5
    slopes = [0.5, 0.125, 1.75]
    alibi = ALiBi(h, causal=causal, slopes=torch.tensor(slopes) if as_tensor else slopes)
    q = torch.randint(0, 50, (b, s))
    k = torch.randint(0, 50, (b, t))
    out = alibi.bias(q, k)
    assert out.shape == (b, h, s, t)
    ref = torch.empty(b, h, s, t, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(s):
                for j in range(t):
                    rel = int(k[bi, j]) - int(q[bi, i])
                    ref[bi, hi, i, j] = slopes[hi] * rel if causal else -slopes[hi] * abs(rel)
    assert torch.allclose(out.double(), ref, rtol=1e-6, atol=0)
    # differs from the paper's slopes (the test can fail)
    assert not torch.allclose(ALiBi(h, causal=causal).bias(q, k), out)


def test_alibi_default_slopes_unchanged() -> None:
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** (-i) for i in range(1, 9)]))
    assert torch.equal(ALiBi(8).slopes(), alibi_slopes(8))
    assert ALiBi(8).extra_repr() == "num_heads=8, causal=True"


def test_alibi_custom_slopes_survive_reset() -> None:
    alibi = ALiBi(2, slopes=[0.3, 0.7])
    alibi.reset_parameters()
    assert torch.equal(alibi.slopes(), torch.tensor([0.3, 0.7]))
    assert torch.equal(
        alibi_slopes(2, torch.float64, slopes=(0.3, 0.7)),
        torch.tensor([0.3, 0.7], dtype=torch.float64),
    )
    assert alibi.extra_repr() == "num_heads=2, causal=True, slopes=custom"


@pytest.mark.parametrize(
    "slopes",
    [[0.5], [0.5, 0.5, 0.5], torch.ones(2, 1), [0.5, float("nan")], [0.5, "x"], [True, 0.5],
     torch.tensor([True, False]), 0.5, "ab"],
)  # fmt: skip
def test_alibi_bad_slopes_say_what_is_allowed(slopes: object) -> None:
    with pytest.raises(ValueError, match="slopes must be a tensor or sequence of num_heads = 2"):
        ALiBi(2, slopes=slopes)  # type: ignore[arg-type]


# --- sinusoidal ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["interleaved", "concat", "fairseq"])
def test_signed_sinusoid_matches_the_formula(layout: str) -> None:
    dim, base = 8, 10000.0
    rel = torch.arange(-6, 7)
    out = sinusoidal_table(rel, dim, base, layout, torch.float64, signed=True)
    half = dim // 2
    for n, p in enumerate(rel.tolist()):
        for i in range(half):
            f = (
                math.exp(-i * math.log(base) / (half - 1))
                if layout == "fairseq"
                else base ** (-2 * i / dim)
            )
            s_, c_ = math.sin(p * f), math.cos(p * f)
            if layout == "interleaved":
                got = (out[n, 2 * i].item(), out[n, 2 * i + 1].item())
            else:
                got = (out[n, i].item(), out[n, half + i].item())
            assert got == pytest.approx((s_, c_), abs=1e-12)


def test_signed_is_opt_in() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        sinusoidal_table(torch.tensor([-1, 0]), 8)
    pos = torch.arange(5)
    assert torch.equal(sinusoidal_table(pos, 8), sinusoidal_table(pos, 8, signed=True))


# --- Shaw ----------------------------------------------------------------------------------------


def _shaw_loop(shaw: ShawRelative, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:  # fmt: skip
    b, h, s, d = q.shape
    t, mk = k.shape[2], shaw.max_distance
    out = torch.zeros(b, h, s, d, dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    ak, av = shaw.rel_k.double(), shaw.rel_v.double()  # type: ignore[union-attr]
    for bi in range(b):
        for hi in range(h):
            for i in range(s):
                e = torch.empty(t, dtype=torch.float64)
                for j in range(t):
                    r = max(-mk, min(mk, int(kp[j]) - int(qp[i]))) + mk
                    e[j] = q[bi, hi, i] @ (k[bi, hi, j] + ak[r, hi]) / math.sqrt(d)
                a = e.softmax(0)
                for j in range(t):
                    r = max(-mk, min(mk, int(kp[j]) - int(qp[i]))) + mk
                    out[bi, hi, i] += a[j] * (v[bi, hi, j] + av[r, hi])
    return out


def test_shaw_per_head_matches_a_loop() -> None:
    torch.manual_seed(0)
    b, h, s, t, d = 2, 3, 5, 6, 4
    shaw = ShawRelative(d, max_distance=2, per_head=True, num_heads=h, init_std=0.5)
    assert shaw.rel_k.shape == (5, h, d) and shaw.rel_v is not None
    q, k, v = (torch.randn(b, h, n, d) for n in (s, t, t))
    qp, kp = torch.arange(s) + 1, torch.arange(t)
    out = shaw.attend(q, k, v, positions=qp, k_positions=kp)
    ref = _shaw_loop(shaw, q, k, v, qp, kp)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    # a shared table (every head head 0's) gives other numbers: the loop can fail
    with torch.no_grad():
        shaw.rel_k.copy_(shaw.rel_k[:, :1].expand_as(shaw.rel_k))
    assert not torch.allclose(shaw.attend(q, k, v, positions=qp, k_positions=kp), out, atol=1e-3)


def test_shaw_default_unchanged() -> None:
    torch.manual_seed(0)
    shaw = ShawRelative(4, max_distance=2)
    torch.manual_seed(0)
    ref = torch.randn(5, 4) * 0.02
    assert shaw.rel_k.shape == (5, 4) and torch.allclose(shaw.rel_k, ref)
    assert shaw.extra_repr() == "head_dim=4, max_distance=2, values=True"


def test_shaw_per_head_errors() -> None:
    with pytest.raises(ValueError, match="per_head=True needs num_heads"):
        ShawRelative(4, per_head=True)
    with pytest.raises(ValueError, match="allowed only with per_head=True"):
        ShawRelative(4, num_heads=2)
    shaw = ShawRelative(4, max_distance=2, per_head=True, num_heads=2)
    q = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="num_heads = 2"):
        shaw.attend(q, q, q)


def test_registry_offers_per_head_shaw() -> None:
    from posenc.registry import build, options

    assert options("shaw")["per_head"] is False
    shaw = build("shaw", dim=32, num_heads=4, per_head=True)
    assert isinstance(shaw, ShawRelative) and shaw.rel_k.shape == (33, 4, 8)
    assert build("shaw", dim=32, num_heads=4).rel_k.shape == (33, 8)
