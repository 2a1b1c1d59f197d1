"""Bias modules against the papers' formulas (float64, in the test), T5 against transformers,
KV-cache/offset invariance, gradients and errors."""

import math

import pytest
import torch
from torch.func import functional_call
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from _decode import prefill_then_decode
from posenc import Attention, KVCache
from posenc.bias import FIRE, KERPLE, ALiBi, Sandwich, T5RelativeBias
from posenc.functional.bias import sandwich_distance_table
from test_bias_functional import paper_alibi_slopes

QP = torch.tensor([3, 4, 5, 9])  # query positions (a gap: any positions work)
KP = torch.arange(12)  # key positions


def formula(fn, h: int, q=QP, k=KP) -> torch.Tensor:
    """``[h, s, t]`` float64 from a per-entry formula ``fn(head, i, j)``."""
    return torch.tensor(
        [[[fn(hh, int(i), int(j)) for j in k] for i in q] for hh in range(h)], dtype=torch.float64
    )


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_is_the_paper_formula(causal: bool) -> None:
    m = paper_alibi_slopes(6)
    if causal:
        want = formula(lambda h, i, j: -m[h] * (i - j), 6)
    else:
        want = formula(lambda h, i, j: -m[h] * abs(i - j), 6)
    got = ALiBi(6, causal=causal).bias(QP, KP)
    assert got.shape == (6, 4, 12) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert ALiBi(6).state_dict() == {}


@pytest.mark.parametrize("variant", ["log", "power"])
def test_kerple_is_the_paper_formula(variant: str) -> None:
    enc = KERPLE(3, variant).double()
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([0.5, 1.5, 0.001]))  # the last is used clamped to eps = 0.01
        enc.r2.copy_(torch.tensor([0.3, 2.5, 1.0]))  # 2.5: clamped to 2 for power, not for log
    r1 = [0.5, 1.5, 0.01]
    if variant == "log":
        r2 = [0.3, 2.5, 1.0]
        want = formula(lambda h, i, j: -r1[h] * math.log(1 + r2[h] * abs(i - j)), 3)
    else:
        r2 = [0.3, 2.0, 1.0]
        want = formula(lambda h, i, j: -r1[h] * abs(i - j) ** r2[h], 3)
    torch.testing.assert_close(enc.bias(QP, KP), want)
    enc.clamp_parameters_()
    assert float(enc.r1.detach().min()) == 0.01
    assert float(enc.r2.detach().max()) == (2.5 if variant == "log" else 2.0)
    assert set(enc.state_dict()) == {"r1", "r2"}


def test_fire_is_the_paper_formula() -> None:
    enc = FIRE(3, mlp_width=5, init_c=0.3, init_threshold=6.5).double()
    with torch.no_grad():
        enc.L_multiplier.fill_(-1.2)  # the threshold is |multiplier * init|: 7.8
    w1, b1 = enc.mlp[0].weight[:, 0].tolist(), enc.mlp[0].bias.tolist()
    w2, b2 = enc.mlp[2].weight.tolist(), enc.mlp[2].bias.tolist()
    c, big_l, eps = 0.3, 7.8, 1e-6

    def fire(h: int, i: int, j: int) -> float:
        x = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(big_l, i)) + 1) + eps)
        hidden = [max(0.0, w1[u] * x + b1[u]) for u in range(5)]
        return b2[h] + sum(w2[h][u] * hidden[u] for u in range(5))

    q = torch.tensor([0, 3, 8, 15])
    torch.testing.assert_close(enc.bias(q, KP), formula(fire, 3, q=q))


def test_sandwich_is_the_paper_formula() -> None:
    d_prime, h = 8, 4

    def sandwich(hh: int, i: int, j: int) -> float:
        dot = sum(
            math.cos((i - j) / 10000 ** (2 * k / d_prime)) for k in range(1, d_prime // 2 + 1)
        )
        return (dot - d_prime / 2) / (8 * (hh + 1) / h)

    got = Sandwich(h, d_prime=d_prime).bias(QP, KP)
    torch.testing.assert_close(got.double(), formula(sandwich, h), rtol=1e-5, atol=1e-5)
    assert Sandwich(h).state_dict() == {}


def _t5_config(is_decoder: bool) -> T5Config:
    cfg = T5Config(
        d_model=32,
        d_kv=8,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        is_decoder=is_decoder,
    )
    cfg._attn_implementation = "eager"
    return cfg


@pytest.mark.parametrize("decoder", [False, True])
def test_t5_self_attention_equals_transformers(decoder: bool) -> None:
    """A random T5 self-attention layer (with the bias) transplanted into Attention."""
    ref = (
        T5Attention(_t5_config(decoder), has_relative_attention_bias=True, layer_idx=0)
        .double()
        .eval()
    )
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    enc = T5RelativeBias(4, num_buckets=8, max_distance=20, bidirectional=not decoder)
    attn = Attention(32, 4, head_dim=8, causal=decoder, scale=1.0, encoding=enc).double()
    attn.load_state_dict(
        {
            "q_proj.weight": ref.q.weight,
            "k_proj.weight": ref.k.weight,
            "v_proj.weight": ref.v.weight,
            "o_proj.weight": ref.o.weight,
            "encoding.relative_attention_bias.weight": ref.relative_attention_bias.weight,
        }
    )
    s = 30  # past max_distance, so the log buckets and the saturated bucket are exercised
    x = torch.randn(2, s, 32, dtype=torch.float64)
    mask = None
    if decoder:
        future = torch.ones(s, s, dtype=torch.bool).triu(1)
        mask = torch.zeros(1, 1, s, s, dtype=torch.float64).masked_fill(
            future, torch.finfo(torch.float64).min
        )
    want = ref(x, mask=mask)[0]
    got = attn(x)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


BIASES = {
    "alibi": lambda: ALiBi(4),
    "alibi-symmetric": lambda: ALiBi(4, causal=False),
    "t5": lambda: T5RelativeBias(4, num_buckets=8, max_distance=6, bidirectional=False),
    "kerple-log": lambda: KERPLE(4, "log"),
    "kerple-power": lambda: KERPLE(4, "power"),
    "fire": lambda: FIRE(4, mlp_width=6, init_threshold=3.0),
    "sandwich": lambda: Sandwich(4, d_prime=8),
}


@pytest.mark.parametrize("name", list(BIASES))
def test_kv_cache_prefill_then_decode_equals_full_run(name: str) -> None:
    attn = Attention(16, 4, 2, causal=True, encoding=BIASES[name]()).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    full = attn(x)
    cache = KVCache()
    got = prefill_then_decode(lambda part: attn(part, cache=cache), x, 4)
    torch.testing.assert_close(got, full)


@pytest.mark.parametrize("name", [n for n in BIASES if n != "fire"])
def test_distance_only_biases_are_offset_invariant(name: str) -> None:
    enc = BIASES[name]()
    torch.testing.assert_close(enc.bias(QP + 1000, KP + 1000), enc.bias(QP, KP))


@pytest.mark.parametrize("name", list(BIASES))
def test_batched_positions_equal_per_row(name: str) -> None:
    enc = BIASES[name]()
    qb = torch.stack([QP, QP + 7])
    kb = torch.stack([KP, KP + 7])
    got = enc.bias(qb, kb)
    assert got.shape == (2, 4, 4, 12)
    torch.testing.assert_close(got[0], enc.bias(QP, KP))
    torch.testing.assert_close(got[1], enc.bias(QP + 7, KP + 7))
    torch.testing.assert_close(enc.bias(qb, KP)[1], enc.bias(QP + 7, KP))


@pytest.mark.parametrize("name", ["t5", "kerple-log", "kerple-power", "fire"])
def test_gradcheck_learnable_biases(name: str) -> None:
    enc = BIASES[name]().double()
    if name.startswith("kerple"):
        with torch.no_grad():  # inside the clamp range: the gradient is the formula's
            enc.r1.uniform_(0.2, 1.0)
            enc.r2.uniform_(0.2, 1.5)
    names = [n for n, _ in enc.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for _, p in enc.named_parameters())
    q, k = torch.tensor([0, 2, 5]), torch.arange(7)

    def bias(*ps: torch.Tensor) -> torch.Tensor:
        return functional_call(enc, dict(zip(names, ps, strict=True)), (q, k))

    assert torch.autograd.gradcheck(bias, params)


def test_gradcheck_through_attention_with_t5_bias() -> None:
    enc = T5RelativeBias(2, num_buckets=4, max_distance=3, bidirectional=True).double()
    attn = Attention(8, 2, causal=False, encoding=enc).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64, requires_grad=True)
    table = enc.relative_attention_bias.weight

    def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return functional_call(attn, {"encoding.relative_attention_bias.weight": w}, (x,))

    assert torch.autograd.gradcheck(run, (x, table.detach().clone().requires_grad_(True)))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: ALiBi(0), ValueError, "num_heads must be a positive integer"),
        (
            lambda: T5RelativeBias(4, num_buckets=1),
            ValueError,
            r"num_buckets must be an integer in \[2, 65536\]",
        ),
        (lambda: T5RelativeBias(4, 32, max_distance=8), ValueError, "above the exact-bucket range"),
        (lambda: KERPLE(4, "cubic"), ValueError, "variant must be one of 'log', 'power'"),
        (lambda: KERPLE(4, eps=0.0), ValueError, "eps must be a finite number >= 0.0001"),
        (lambda: FIRE(4, init_threshold=0.0), ValueError, "init_threshold must be a finite"),
        (lambda: Sandwich(4, d_prime=7), ValueError, "d_prime must be even"),
        # Options that used to give NaN biases (or a 32 GB table) without a word.
        (lambda: KERPLE(4, eps=math.inf), ValueError, "eps must be a finite number >= 0.0001"),
        (
            lambda: KERPLE(4, "power", eps=3.0),
            ValueError,
            "eps must be a finite number >= 0.0001 and <= 1",
        ),
        (lambda: FIRE(4, init_c=math.nan), ValueError, "init_c must be a finite number"),
        (lambda: FIRE(4, eps=math.nan), ValueError, "eps must be a finite number >= 1e-30"),
        (lambda: FIRE(4, init_threshold=math.inf), ValueError, "init_threshold must be a finite"),
        (lambda: FIRE(4, mlp_width=10**6), ValueError, "mlp_width must be <= 1024"),
        (lambda: Sandwich(4, base=0.0), ValueError, "base must be a finite number > 1"),
        (lambda: Sandwich(4, base=-100.0), ValueError, "base must be a finite number > 1"),
        (lambda: Sandwich(4, base=math.nan), ValueError, "base must be a finite number > 1"),
        (lambda: Sandwich(4, base="1e4"), TypeError, "base must be a finite number > 1"),
        (lambda: Sandwich(4, cache_len=10**9), ValueError, "cache_len must be <= 65536"),
        (lambda: Sandwich(4, d_prime=10**6), ValueError, "d_prime must be <= 2048"),
        (lambda: T5RelativeBias(4, 32, max_distance=2**40), ValueError, "at most 65536"),
        (
            lambda: ALiBi(4).bias(torch.zeros(2, 3).long(), torch.zeros(3, 4).long()),
            ValueError,
            "same batch size",
        ),
        (
            lambda: ALiBi(4).bias(torch.zeros(3), torch.zeros(4).long()),
            TypeError,
            "positions must have an integer",
        ),
        (
            lambda: FIRE(4).score_mod(torch.arange(3), torch.zeros(1, 1, 4).long()),
            ValueError,
            "k_positions must be",
        ),
    ],
)
def test_bad_input(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("name", ["alibi", "sandwich"])
def test_reduced_precision_module_keeps_exact_tables(name: str) -> None:
    """``module.to(bfloat16)`` casts buffers; the bias must not move with them."""

    def make():
        return ALiBi(12) if name == "alibi" else Sandwich(12, d_prime=16)

    torch.testing.assert_close(make().to(torch.bfloat16).bias(QP, KP), make().bias(QP, KP))


# --- costs follow the work, not the values -----------------------------------------------------


def score_mod_grid(mod, h: int, s: int, t: int) -> torch.Tensor:
    """A ``score_mod`` evaluated on every ``(h, q_idx, kv_idx)`` at once: ``[h, s, t]``."""
    hi = torch.arange(h)[:, None, None]
    qi, ki = torch.arange(s)[None, :, None], torch.arange(t)[None, None, :]
    return mod(torch.zeros(h, s, t), torch.zeros((), dtype=torch.long), hi, qi, ki)


def sandwich_formula(q: torch.Tensor, k: torch.Tensor, h: int, d_prime: int) -> torch.Tensor:
    """Sandwich in float64 from the distance table (the paper's sum): ``[h, s, t]``."""
    dist = (k[None, :] - q[:, None]).abs()  # [s, t]
    table = sandwich_distance_table(int(dist.max()), d_prime)  # [n] float64
    ratio = 8 * torch.arange(1, h + 1, dtype=torch.float64) / h  # [h]
    return table[dist][None] / ratio[:, None, None]


@pytest.mark.parametrize("offset", [0, 10**6])
def test_sandwich_at_full_width_and_large_positions(offset: int) -> None:
    """d' = 128 and positions near a million: the bias is the float64 formula rounded to float32
    (what the old distance table stored), and both score_mods are within a few float32 ulps."""
    h, s, t = 8, 40, 96
    q, k = torch.arange(t - s, t) + offset, torch.arange(t) + offset
    enc = Sandwich(h, cache_len=64)  # t > cache_len: the index table is built per call
    want = sandwich_formula(q, k, h, 128)  # entries down to about -35
    got = enc.bias(q, k)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=4e-6)
    by_index = score_mod_grid(enc.score_mod(q, k, index_layout=True), h, s, t)
    torch.testing.assert_close(by_index.double(), want, rtol=0, atol=4e-6)
    by_dot = score_mod_grid(enc.score_mod(q, k), h, s, t)
    torch.testing.assert_close(by_dot.double(), want, rtol=0, atol=1.5e-5)


def test_sandwich_cost_does_not_follow_position_values() -> None:
    """No table sized by a position: the same work at position 0 and at 10^9."""
    enc = Sandwich(4, d_prime=16, cache_len=8)
    q = torch.tensor([10**9 + 5, 10**9 + 8])
    got = enc.bias(q, q - 5)
    torch.testing.assert_close(got, enc.bias(q - 10**9, q - 10**9 - 5), rtol=0, atol=2e-6)


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple-log", "fire", "sandwich"])
def test_score_mod_equals_bias_in_both_layouts(name: str) -> None:
    enc = BIASES[name]()
    q, k = torch.arange(5, 12), torch.arange(12)  # the index layout: queries are the last keys
    want = enc.bias(q, k)
    with torch.no_grad():
        for index_layout in (True, False):
            got = score_mod_grid(enc.score_mod(q, k, index_layout=index_layout), 4, 7, 12)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_broken_index_layout_promise_is_refused() -> None:
    with pytest.raises(ValueError, match="index_layout=True needs"):
        Sandwich(4, d_prime=8).score_mod(QP, KP, index_layout=True)  # QP has a gap
    with pytest.raises(ValueError, match="s <= t"):
        Sandwich(4, d_prime=8).score_mod(KP, QP, index_layout=True)


def test_constants_move_with_the_module_and_keep_their_dtype() -> None:
    """Slopes, ratios and tables are buffers of a DeviceConstants: ``.to(bfloat16)`` or
    ``.half()`` would round a plain buffer; these keep float32/float64 and follow the device."""
    enc = Sandwich(12, d_prime=16).to(torch.bfloat16).half()
    assert enc.constants.inv_ratio.dtype == enc.constants.table.dtype == torch.float32
    assert enc.to("meta").constants.table.device.type == "meta"
    alibi = ALiBi(8).double().bfloat16()
    assert alibi.slopes().dtype == torch.float32 and alibi.state_dict() == {}
