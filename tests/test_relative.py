"""Relative (content-dependent) schemes: naive loops for Shaw and Transformer-XL (with memory and
segment recurrence), transformers' DeBERTa-v2 attention transplanted, caches, gradients, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call
from transformers import DebertaV2Config
from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention

from _decode import prefill_then_decode
from posenc import Attention, KVCache
from posenc.functional import rel_shift
from posenc.relative import DeBERTaRelative, ShawRelative, TransformerXLRelative
from posenc.relative.transformer_xl import rel_shift_is_cheaper

F64 = torch.float64


def projections(attn: Attention, x: torch.Tensor, kv: torch.Tensor):
    """Per-head q ``[b, s, h, d]`` and k, v ``[b, t, h, d]`` (kv heads repeated), float64."""
    b, s, _ = x.shape
    h, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, s, h, d)
    k = attn.k_proj(kv).view(b, kv.shape[1], hk, d).repeat_interleave(h // hk, dim=2)
    v = attn.v_proj(kv).view(b, kv.shape[1], hk, d).repeat_interleave(h // hk, dim=2)
    return q, k, v


def naive(attn, x, kv, qpos, kpos, allowed, score_fn, value_fn=None):
    """One (batch, head, query) at a time: softmax over allowed keys of ``score_fn``."""
    q, k, v = projections(attn, x, kv)
    b, s, h, d = q.shape
    out = torch.zeros(b, s, h, d, dtype=F64)
    for bi in range(b):
        for hi in range(h):
            for i in range(s):
                scores = torch.stack(
                    [
                        score_fn(q[bi, i, hi], k[bi, j, hi], hi, int(qpos[i]), int(kpos[j]))
                        if allowed(i, j)
                        else torch.tensor(-math.inf, dtype=F64)
                        for j in range(kv.shape[1])
                    ]
                )
                p = torch.softmax(scores, 0)
                for j in range(kv.shape[1]):
                    extra = value_fn(int(qpos[i]), int(kpos[j])) if value_fn else 0.0
                    out[bi, i, hi] += p[j] * (v[bi, j, hi] + extra)
    return attn.o_proj(out.reshape(b, s, h * d))


# --- Shaw --------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("values", [True, False])
def test_shaw_equals_naive_loop(causal: bool, values: bool) -> None:
    enc = ShawRelative(4, max_distance=2, values=values, init_std=0.5)
    attn = Attention(16, 4, 2, causal=causal, encoding=enc).double()
    x = torch.randn(2, 6, 16, dtype=F64)
    pos = torch.tensor([0, 1, 2, 4, 7, 8])  # gaps: clipping at 2 shows

    def clip(i: int, j: int) -> int:
        return max(-2, min(2, j - i)) + 2

    def score(qi, kj, h, i, j):
        return qi @ (kj + enc.rel_k[clip(i, j)]) / 2.0  # scale 1/sqrt(4)

    value_fn = (lambda i, j: enc.rel_v[clip(i, j)]) if values else None
    want = naive(attn, x, x, pos, pos, lambda i, j: not causal or j <= i, score, value_fn)
    torch.testing.assert_close(attn(x, pos), want)


# --- Transformer-XL ----------------------------------------------------------------------------


def txl_naive(attn, enc, x, kv, qpos, kpos, allowed):
    dim, d = enc.dim, enc.head_dim
    freq = [1.0 / 10000 ** (2 * k / dim) for k in range(dim // 2)]

    def sinusoid(r: int) -> torch.Tensor:
        return torch.tensor(
            [math.sin(r * f) for f in freq] + [math.cos(r * f) for f in freq], dtype=F64
        )

    def score(qi, kj, h, i, j):
        wr = enc.r_net(sinusoid(i - j)).view(-1, d)[h]
        return ((qi + enc.r_w_bias[h]) @ kj + (qi + enc.r_r_bias[h]) @ wr) / math.sqrt(d)

    return naive(attn, x, kv, qpos, kpos, allowed, score)


@pytest.mark.parametrize("causal", [True, False])
def test_transformer_xl_equals_naive_loop(causal: bool) -> None:
    enc = TransformerXLRelative(16, 4, init_std=0.5)
    attn = Attention(16, 4, 2, causal=causal, encoding=enc).double()
    x = torch.randn(2, 5, 16, dtype=F64)
    pos = torch.arange(5)
    want = txl_naive(attn, enc, x, x, pos, pos, lambda i, j: not causal or j <= i)
    torch.testing.assert_close(attn(x), want)
    # Positions that are not contiguous take the gather path: same formula.
    gaps = torch.tensor([0, 2, 3, 7, 8])
    want = txl_naive(attn, enc, x, x, gaps, gaps, lambda i, j: not causal or j <= i)
    torch.testing.assert_close(attn(x, gaps), want)
    torch.testing.assert_close(attn(x, torch.stack([gaps, gaps])), want)


def test_transformer_xl_with_memory_equals_naive_loop() -> None:
    enc = TransformerXLRelative(16, 4, init_std=0.5)
    attn = Attention(16, 4, causal=True, encoding=enc).double()
    mem, x = torch.randn(2, 3, 16, dtype=F64), torch.randn(2, 4, 16, dtype=F64)
    want = txl_naive(
        attn,
        enc,
        x,
        torch.cat((mem, x), 1),
        torch.arange(3, 7),
        torch.arange(7),
        lambda i, j: j <= i + 3,
    )
    mem = mem.requires_grad_(True)
    got = attn(x, memory=mem)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    assert mem.grad is None  # memory is detached


def test_transformer_xl_segments_equal_full_run_under_the_same_mask() -> None:
    """Two layers, three segments of 4: each segment attends to itself and the previous one."""
    layers = [
        Attention(16, 4, causal=True, encoding=TransformerXLRelative(16, 4, init_std=0.5)).double()
        for _ in range(2)
    ]
    seg, n = 4, 3
    x = torch.randn(2, seg * n, 16, dtype=F64)
    i = torch.arange(seg * n)[:, None]
    j = torch.arange(seg * n)[None, :]
    window = (j <= i) & (j >= (i // seg - 1) * seg)  # [12, 12]: own segment and the one before
    full = x
    for layer in layers:
        full = layer(full, attn_mask=window.expand(2, 1, -1, -1))
    outs, mems = [], [None, None]
    for k in range(n):
        h = x[:, k * seg : (k + 1) * seg]
        for li, layer in enumerate(layers):
            new_mem = h
            h = layer(h) if mems[li] is None else layer(h, memory=mems[li])
            mems[li] = new_mem
        outs.append(h)
    torch.testing.assert_close(torch.cat(outs, 1), full)


@pytest.mark.parametrize(("s", "t"), [(1, 5), (3, 3), (4, 9)])
def test_rel_shift_moves_distances_to_keys(s: int, t: int) -> None:
    x = torch.randn(2, s, s + t - 1, dtype=F64)  # column c: distance t - 1 - c
    out = rel_shift(x, t)
    want = torch.empty(2, s, t, dtype=F64)
    for i in range(s):
        for jj in range(t):
            dist = (t - s + i) - jj
            want[:, i, jj] = x[:, i, t - 1 - dist]
    torch.testing.assert_close(out, want)
    # Transformer-XL's causal layout (only distances >= 0) is exact on the causal part.
    causal = rel_shift(x[..., :t].contiguous(), t)
    keep = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + (t - s)
    torch.testing.assert_close(causal[:, keep], want[:, keep])


# --- DeBERTa -----------------------------------------------------------------------------------


# transformers rounds the scale sqrt(d * scale_factor) to float32 even in a float64 run (exact
# only when d * scale_factor is a perfect square): a relative error of ~1e-7 remains.
TOL = {"rtol": 1e-6, "atol": 1e-6}


def deberta_pair(share: bool, types: str, buckets: int = 8):
    cfg = DebertaV2Config(
        hidden_size=32,
        num_attention_heads=4,
        relative_attention=True,
        position_buckets=buckets,
        max_relative_positions=16,
        pos_att_type=types,
        share_att_key=share,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ref = DisentangledSelfAttention(cfg).double().eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    enc = DeBERTaRelative(
        32,
        4,
        position_buckets=buckets,
        max_relative_positions=16,
        pos_att_type=types,
        share_att_key=share,
        norm_rel_ebd=True,
    ).double()
    attn = Attention(32, 4, causal=False, qkv_bias=True, encoding=enc).double()
    state = {
        "q_proj.weight": ref.query_proj.weight,
        "q_proj.bias": ref.query_proj.bias,
        "k_proj.weight": ref.key_proj.weight,
        "k_proj.bias": ref.key_proj.bias,
        "v_proj.weight": ref.value_proj.weight,
        "v_proj.bias": ref.value_proj.bias,
        "o_proj.weight": torch.eye(32, dtype=F64),  # the reference has no output projection
        "encoding.rel_embeddings.weight": torch.randn(2 * enc.span, 32, dtype=F64),
        "encoding.norm.weight": 1 + 0.1 * torch.randn(32, dtype=F64),
        "encoding.norm.bias": 0.1 * torch.randn(32, dtype=F64),
    }
    for name in ("pos_key_proj", "pos_query_proj"):
        if hasattr(ref, name):
            for w in ("weight", "bias"):
                state[f"encoding.{name}.{w}"] = getattr(getattr(ref, name), w)
    attn.load_state_dict(state)
    # What DeBERTa's encoder hands every layer: the LayerNorm-ed relative embeddings.
    rel = F.layer_norm(
        state["encoding.rel_embeddings.weight"],
        (32,),
        state["encoding.norm.weight"],
        state["encoding.norm.bias"],
        1e-7,
    )
    return ref, attn, enc, rel


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("types", ["c2p|p2c", "c2p", "p2c"])
def test_deberta_equals_transformers(share: bool, types: str) -> None:
    ref, attn, _, rel = deberta_pair(share, types)
    x = torch.randn(2, 40, 32, dtype=F64)  # distances past max_relative_positions: log buckets
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[1, :3] = False
    want = ref(x, keep[:, None, None, :].expand(2, 1, 40, 40), rel_embeddings=rel)[0]
    torch.testing.assert_close(attn(x, attn_mask=keep), want, **TOL)


def test_deberta_without_buckets_equals_transformers() -> None:
    ref, attn, _, rel = deberta_pair(True, "c2p|p2c", buckets=-1)
    x = torch.randn(1, 24, 32, dtype=F64)  # distances past 16: clamped to the table's ends
    want = ref(x, torch.ones(1, 1, 24, 24, dtype=torch.bool), rel_embeddings=rel)[0]
    torch.testing.assert_close(attn(x), want, **TOL)


def test_deberta_query_length_differs_from_key_length() -> None:
    # c2p with s != t directly: transformers puts the s queries at positions 0..s-1.
    ref, attn, enc, rel = deberta_pair(True, "c2p")
    xq, xk = torch.randn(2, 7, 32, dtype=F64), torch.randn(2, 30, 32, dtype=F64)
    want = ref(xk, torch.ones(2, 1, 7, 30, dtype=torch.bool), query_states=xq, rel_embeddings=rel)[
        0
    ]
    q = attn._heads(xq, attn.q_proj, 4)
    k, v = attn._heads(xk, attn.k_proj, 4), attn._heads(xk, attn.v_proj, 4)
    got = enc.attend(
        q,
        k,
        v,
        positions=torch.arange(7),
        k_positions=torch.arange(30),
        scale=attn.scale,
        attention=attn,
    )
    torch.testing.assert_close(got.transpose(1, 2).reshape(2, 7, 32), want, **TOL)
    # c2p and p2c with s != t through a KV cache: transformers supports p2c only for s == t, so
    # compare the last 10 queries over all 40 keys with the rows of its full run.
    ref, attn, _, rel = deberta_pair(False, "c2p|p2c")
    x = torch.randn(2, 40, 32, dtype=F64)
    want = ref(x, torch.ones(2, 1, 40, 40, dtype=torch.bool), rel_embeddings=rel)[0][:, 30:]
    cache = KVCache()
    attn(x[:, :30], cache=cache)
    torch.testing.assert_close(attn(x[:, 30:], cache=cache), want, **TOL)


# --- all three ---------------------------------------------------------------------------------

RELATIVE = {
    "shaw": lambda: ShawRelative(4, max_distance=3, init_std=0.3),
    "transformer-xl": lambda: TransformerXLRelative(16, 4, init_std=0.3),
    "deberta": lambda: DeBERTaRelative(16, 4, position_buckets=4, max_relative_positions=8),
}


@pytest.mark.parametrize("name", list(RELATIVE))
def test_kv_cache_prefill_then_decode_equals_full_run(name: str) -> None:
    attn = Attention(16, 4, 2, causal=True, encoding=RELATIVE[name]()).double()
    x = torch.randn(2, 8, 16, dtype=F64)
    full = attn(x)
    cache = KVCache()
    got = prefill_then_decode(lambda part: attn(part, cache=cache), x, 3)
    torch.testing.assert_close(got, full)


@pytest.mark.parametrize("name", list(RELATIVE))
def test_batched_positions_and_offsets(name: str) -> None:
    attn = Attention(16, 4, causal=False, encoding=RELATIVE[name]()).double()
    x = torch.randn(2, 6, 16, dtype=F64)
    pos = torch.tensor([0, 1, 3, 4, 5, 9])
    one = attn(x, pos)
    torch.testing.assert_close(attn(x, pos + 50), one)  # depends on distances only
    both = attn(x, torch.stack([pos, pos + 50]))
    torch.testing.assert_close(both, one)


@pytest.mark.parametrize("name", list(RELATIVE))
def test_gradcheck(name: str) -> None:
    enc = RELATIVE[name]()
    attn = Attention(16, 4, 2, causal=True, encoding=enc).double()
    names = [f"encoding.{n}" for n, p in enc.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in enc.parameters())
    x = torch.randn(1, 4, 16, dtype=F64, requires_grad=True)

    def run(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return functional_call(attn, dict(zip(names, ps, strict=True)), (x,))

    assert torch.autograd.gradcheck(run, (x, *params))


def test_dropout_runs_in_training_only() -> None:
    attn = Attention(16, 4, encoding=RELATIVE["shaw"](), dropout=0.5)
    x = torch.randn(1, 6, 16)
    attn.eval()
    torch.testing.assert_close(attn(x), attn(x))
    attn.train()
    assert not torch.allclose(attn(x), attn(x))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (
            lambda: Attention(16, 4, encoding=ShawRelative(4), backend="sdpa"),
            ValueError,
            "cannot run a relative",
        ),
        (
            lambda: Attention(16, 4, encoding=ShawRelative(4), backend="flex"),
            ValueError,
            "use 'auto' or 'explicit'",
        ),
        (
            lambda: ShawRelative(4, max_distance=0),
            ValueError,
            "max_distance must be a positive integer",
        ),
        (lambda: TransformerXLRelative(15, 3), ValueError, "dim must be even"),
        (lambda: TransformerXLRelative(16, 3), ValueError, "divisible by num_heads"),
        (lambda: DeBERTaRelative(16, 4, pos_att_type="c2x"), ValueError, "pos_att_type entries"),
        (
            lambda: DeBERTaRelative(16, 4, position_buckets=256, max_relative_positions=100),
            ValueError,
            r"max_relative_positions must be an integer above position_buckets // 2 \+ 1",
        ),
        (
            lambda: ShawRelative(4).attend(
                *(torch.randn(1, 2, 3, 4) for _ in range(3)),
                positions=torch.arange(4),
                k_positions=torch.arange(3),
            ),
            ValueError,
            "positions must end in s=3",
        ),
        (
            lambda: DeBERTaRelative(16, 4).attend(
                *(torch.randn(1, 4, 3, 4) for _ in range(3)),
                positions=torch.arange(3),
                k_positions=torch.arange(3),
            ),
            ValueError,
            "needs the calling attention",
        ),
    ],
)
def test_bad_input(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call()


QKV = tuple(torch.randn(1, 4, 3, 4) for _ in range(3))


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        # Options that used to build NaN weights, or NaN outputs, or a table past memory.
        (lambda: TransformerXLRelative(16, 4, base=math.nan), ValueError, "base must be a finite"),
        (lambda: TransformerXLRelative(16, 4, base=0.5), ValueError, "base must be a finite"),
        (lambda: TransformerXLRelative(16, 4, init_std=math.inf), ValueError, "init_std must"),
        (lambda: ShawRelative(4, init_std=math.nan), ValueError, "init_std must be a finite"),
        (lambda: ShawRelative(4, max_distance=2**40), ValueError, "max_distance must be <= 65536"),
        (lambda: DeBERTaRelative(16, 4, layer_norm_eps=math.nan), ValueError, "layer_norm_eps"),
        (lambda: DeBERTaRelative(16, 4, layer_norm_eps=0.0), ValueError, "layer_norm_eps"),
        (lambda: DeBERTaRelative(16, 4, pos_dropout=1.5), ValueError, "pos_dropout must be"),
        (lambda: DeBERTaRelative(16, 4, pos_att_type=3), TypeError, "pos_att_type must be"),
        (
            lambda: DeBERTaRelative(16, 4, position_buckets=0, max_relative_positions=2**40),
            ValueError,
            "max_relative_positions must be <= 65536",
        ),
        (
            lambda: DeBERTaRelative(16, 4, position_buckets=2**20, max_relative_positions=2**21),
            ValueError,
            r"position_buckets must be an integer in \[2, 65536\]",
        ),
        # attend's inputs: said in words, not a matmul error from deep inside.
        (
            lambda: ShawRelative(4).attend(QKV[0], QKV[1].double(), QKV[2]),
            TypeError,
            "q, k and v must share a dtype",
        ),
        (
            lambda: ShawRelative(4).attend(QKV[0].long(), QKV[1], QKV[2]),
            TypeError,
            "q must be a floating-point tensor",
        ),
        (
            lambda: ShawRelative(4).attend(*QKV, mask=torch.ones(3, 4, dtype=torch.bool)),
            ValueError,
            r"mask must be \[s, t\]=\[3, 3\]",
        ),
        (
            lambda: ShawRelative(4).attend(*QKV, mask=torch.ones(3, 3)),
            TypeError,
            "mask must be a bool tensor",
        ),
        (
            lambda: TransformerXLRelative(16, 4).attend(QKV[0], QKV[1][:, :, :0], QKV[2][:, :, :0]),
            ValueError,
            "default positions put the s queries at the last s of the t keys",
        ),
    ],
)
def test_bad_options_and_inputs(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call()


@pytest.mark.parametrize("name", list(RELATIVE))
@pytest.mark.parametrize(("s", "t"), [(0, 5), (5, 0), (0, 0)])
def test_empty_queries_or_keys(name: str, s: int, t: int) -> None:
    """No queries: an empty output. No keys: the empty sum, zeros (as SDPA gives). Transformer-XL
    crashed on s = t = 0 (its rel-shift built a range of distances from t - 1 down to 1 - s)."""
    enc = RELATIVE[name]()
    attn = Attention(16, 4, causal=False, encoding=enc)
    q, k = torch.randn(2, 4, s, 4), torch.randn(2, 4, t, 4)
    kw = {"attention": attn}
    if s <= t:  # the index layout (default positions) exists
        out = enc.attend(q, k, k, **kw)
        assert out.shape == (2, 4, s, 4) and not out.abs().sum()
    out = enc.attend(q, k, k, positions=torch.arange(s) + 3, k_positions=torch.arange(t), **kw)
    assert out.shape == (2, 4, s, 4) and not out.abs().sum()
    # Through Attention: a sequence of no tokens (with and without a causal mask).
    for causal in (True, False):
        attn.causal = causal
        assert attn(torch.randn(2, 0, 16)).shape == (2, 0, 16)


@pytest.mark.parametrize("name", list(RELATIVE))
@pytest.mark.parametrize("offset", [2**31, 2**40, 2**62])
def test_far_positions_give_the_numbers_of_near_ones(name: str, offset: int) -> None:
    """The same tokens at offset 2**40 give the output at offset 0, bit for bit: every scheme
    works from j - i (Transformer-XL's angle addition measures positions from the call's first
    query, so its angles stay small), and nothing is sized by a position value."""
    attn = Attention(16, 4, causal=True, encoding=RELATIVE[name]()).eval()
    x = torch.randn(2, 6, 16)
    pos = torch.tensor([0, 1, 3, 4, 5, 9])
    with torch.no_grad():
        near = attn(x, pos)
        assert torch.equal(attn(x, pos + offset), near)
        batched = torch.stack([pos, pos + 7])  # [b, s]
        assert torch.equal(attn(x, batched + offset), attn(x, batched))


@pytest.mark.parametrize("name", list(RELATIVE))
def test_two_tokens_far_apart(name: str) -> None:
    """Positions 0 and 2**63 - 1 in one call: finite, O(s t), and the distance is clipped (Shaw,
    DeBERTa) or taken in float64 (Transformer-XL) as for any other pair (DeBERTa's table index
    wrapped around int64 when no log buckets were used)."""
    enc = RELATIVE[name]()
    attn = Attention(16, 4, causal=False, encoding=enc).double().eval()
    x = torch.randn(1, 2, 16, dtype=F64)
    pos = torch.tensor([0, 2**63 - 1])
    with torch.no_grad():
        out = attn(x, pos)
    assert torch.isfinite(out).all()
    if name == "deberta":
        nobuckets = DeBERTaRelative(16, 4, position_buckets=0, max_relative_positions=8)
        idx = nobuckets.relative_index(pos, pos)
        assert idx.tolist() == [[8, 0], [15, 8]]  # i - j < -span -> row 0, > span -> 2 span - 1


# --- Transformer-XL's two position terms -------------------------------------------------------


@pytest.mark.parametrize(("s", "t"), [(1, 1), (1, 9), (4, 4), (3, 10)])
@pytest.mark.parametrize("causal", [True, False])
def test_transformer_xl_rel_shift_equals_angle_addition(s: int, t: int, causal: bool) -> None:
    """The index layout's rel-shift and the any-positions product give the same position term
    (where the causal rel-shift is defined: on and below the causal diagonal), at any offset."""
    enc = TransformerXLRelative(16, 4, init_std=0.5).double()
    qv = torch.randn(2, 4, s, 4, dtype=F64)
    shifted = enc.rel_shift_scores(qv, t, causal)
    keep = torch.arange(t)[None, :] <= torch.arange(s)[:, None] + (t - s)  # [s, t]
    for offset in (0, 1000, 10**6):
        k = torch.arange(t) + offset
        direct = enc.position_scores(qv, k[t - s :], k)
        if causal:
            direct, want = direct.masked_fill(~keep, 0), shifted.masked_fill(~keep, 0)
        else:
            want = shifted
        torch.testing.assert_close(direct, want)


def test_transformer_xl_float32_at_large_positions() -> None:
    """float32 angle addition at positions near a million: within float32 rounding of float64."""
    enc = TransformerXLRelative(64, 4, init_std=0.5)
    qv = torch.randn(1, 4, 6, 16)
    k = torch.arange(20) + 10**6
    got = enc.position_scores(qv, k[14:], k)
    want = enc.double().position_scores(qv.double(), k[14:], k)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_transformer_xl_path_rule_follows_shapes() -> None:
    """Rel-shift for prefill and training (s = t), angle addition for one decoded token."""
    assert rel_shift_is_cheaper(b=8, h=8, s=512, t=512, d=64, dim=512, causal=True)
    assert rel_shift_is_cheaper(b=1, h=1, s=1, t=1, d=64, dim=64, causal=False)
    assert not rel_shift_is_cheaper(b=1, h=8, s=1, t=4096, d=64, dim=512, causal=True)


def test_transformer_xl_gradcheck_with_explicit_positions() -> None:
    """Gradients through the angle-addition path (explicit positions with gaps)."""
    enc = TransformerXLRelative(16, 4)
    attn = Attention(16, 4, 2, causal=True, encoding=enc).double()
    names = [f"encoding.{n}" for n, p in enc.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in enc.parameters())
    x = torch.randn(1, 4, 16, dtype=F64, requires_grad=True)
    pos = torch.tensor([0, 3, 4, 9])

    def run(x: torch.Tensor, *ps: torch.Tensor) -> torch.Tensor:
        return functional_call(attn, dict(zip(names, ps, strict=True)), (x, pos))

    assert torch.autograd.gradcheck(run, (x, *params))


@pytest.mark.parametrize("name", list(RELATIVE))
def test_index_layout_promise_is_checked_and_kept(name: str) -> None:
    enc = RELATIVE[name]()
    attn = Attention(16, 4, causal=True, encoding=enc)
    q = attn._heads(torch.randn(1, 5, 16), attn.q_proj, 4)
    kw = {"mask": None, "scale": 0.5, "attention": attn}
    shifted = torch.arange(5) + 7  # the index layout up to a shift: the same distances
    got = enc.attend(q, q, q, positions=shifted, k_positions=shifted, index_layout=True, **kw)
    torch.testing.assert_close(got, enc.attend(q, q, q, **kw))
    gaps = torch.tensor([0, 1, 2, 4, 5])
    with pytest.raises(ValueError, match="index_layout=True needs"):
        enc.attend(q, q, q, positions=gaps, k_positions=gaps, index_layout=True, **kw)


def test_attention_passes_the_index_layout_from_its_arguments() -> None:
    """Default positions (plain, cached, memory) keep the index layout; given ones do not."""
    seen = []

    class Spy(ShawRelative):
        def scores(self, q, k, call):
            seen.append(call.index_layout)
            return super().scores(q, k, call)

    attn = Attention(16, 4, encoding=Spy(4))
    x = torch.randn(1, 3, 16)
    cache = KVCache()
    attn(x, cache=cache)
    attn(x[:, :1], cache=cache)
    attn(x, memory=x)
    attn(x, torch.arange(3))
    attn(x, memory=x, memory_positions=torch.arange(3))
    given = KVCache()
    attn(x, torch.arange(3), cache=given)
    attn(x[:, :1], cache=given)  # default positions after given ones: no longer the layout
    assert seen == [True, True, True, False, False, False, False]
