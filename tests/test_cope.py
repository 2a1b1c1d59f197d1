"""CoPE (Golovneva et al. 2024) against the paper's formulas evaluated one (query, key) pair at a
time in float64: gates, the causal sum of gates, the vector interpolation of the embeddings
(not the scalar logits the module interpolates), softmax; plus caches, GQA, gradients, errors."""

import math

import pytest
import torch

from _decode import prefill_then_decode
from posenc import Attention, KVCache
from posenc.relative.cope import CoPE

F64 = torch.float64


def embed(e: torch.Tensor, p: float) -> torch.Tensor:
    """Section 3: ``e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]``."""
    lo, hi = math.floor(p), math.ceil(p)
    return (p - lo) * e[hi] + (1 - p + lo) * e[lo]


def naive_cope(q, k, v, e, npos_max, scale, visible):
    """``q [s, d]``, ``k, v [t, d]`` of one head -> ``[s, d]``; ``visible(i, j)``: key j is kept."""
    s, t = q.shape[0], k.shape[0]
    out = torch.zeros(s, v.shape[1], dtype=F64)
    for i in range(s):
        logits = []
        for j in range(t):
            if not visible(i, j):
                logits.append(torch.tensor(-math.inf, dtype=F64))
                continue
            # p_ij = sum over the kept keys k >= j of sigmoid(q_i . k_k)
            p = sum(
                float(torch.sigmoid(q[i] @ k[m] * scale).detach())
                for m in range(j, t)
                if visible(i, m)
            )
            p = min(p, npos_max - 1)
            logits.append(q[i] @ (k[j] + embed(e, p)) * scale)
        a = torch.softmax(torch.stack(logits), 0)
        out[i] = sum(a[j] * v[j] for j in range(t))
    return out


def heads(attn: Attention, x: torch.Tensor):
    b, s, _ = x.shape
    h, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, s, h, d).transpose(1, 2)  # [b, h, s, d]
    k = attn.k_proj(x).view(b, s, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
    v = attn.v_proj(x).view(b, s, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("npos_max", [3, 16])  # 3: the clamp acts; 16: it never does
def test_attention_with_cope_equals_naive_loop(causal: bool, npos_max: int) -> None:
    enc = CoPE(4, 4, npos_max=npos_max, init_std=0.7)
    attn = Attention(16, 4, 2, causal=causal, encoding=enc).double()
    x = torch.randn(2, 7, 16, dtype=F64) * 2
    q, k, v = heads(attn, x)
    out = torch.zeros(2, 4, 7, 4, dtype=F64)
    for bi in range(2):
        for hi in range(4):
            out[bi, hi] = naive_cope(
                q[bi, hi], k[bi, hi], v[bi, hi], enc.pos_emb, npos_max, 0.5,
                lambda i, j: not causal or j <= i,
            )  # fmt: skip
    want = attn.o_proj(out.transpose(1, 2).reshape(2, 7, 16))
    torch.testing.assert_close(attn(x), want)


def test_attend_with_padding_mask_equals_naive_loop() -> None:
    enc = CoPE(3, 2, npos_max=8, init_std=0.5).double()
    q, k, v = (torch.randn(1, 2, n, 3, dtype=F64) for n in (4, 6, 6))
    keep = torch.tensor([True, False, True, True, False, True])
    out = enc.attend(q, k, v, mask=keep.expand(4, 6), scale=0.3)
    for hi in range(2):
        want = naive_cope(q[0, hi], k[0, hi], v[0, hi], enc.pos_emb, 8, 0.3, lambda i, j: keep[j])
        torch.testing.assert_close(out[0, hi], want)


def test_positions_count_gates() -> None:
    """Keys whose gate is ~1 (huge q.k) count 1 each, ~0 count nothing: p_ij is a count."""
    from posenc.relative.cope import cope_positions

    logits = torch.tensor([[[[50.0, -50.0, 50.0, 50.0]]]])  # one query over 4 keys
    pos = cope_positions(logits, None, npos_max=10)
    torch.testing.assert_close(pos, torch.tensor([[[[3.0, 2.0, 2.0, 1.0]]]]))
    torch.testing.assert_close(cope_positions(logits, None, npos_max=3).max(), torch.tensor(2.0))


def test_cached_decoding_equals_full_forward() -> None:
    attn = Attention(16, 4, encoding=CoPE(4, 4, npos_max=12, init_std=0.3)).eval()
    x = torch.randn(2, 9, 16)
    full = attn(x)
    cache = KVCache()
    got = prefill_then_decode(lambda part: attn(part, cache=cache), x, 5)
    torch.testing.assert_close(got, full, atol=1e-6, rtol=1e-5)


def test_gradcheck_float64() -> None:
    enc = CoPE(3, 2, npos_max=4, init_std=0.5).double()
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=F64, requires_grad=True) for _ in range(3))
    keep = torch.ones(4, 4, dtype=torch.bool).tril()

    e = enc.pos_emb.detach().clone().requires_grad_(True)
    del enc.pos_emb  # the table becomes an input, so gradcheck checks its gradient too

    def f(q, k, v, e):
        enc.pos_emb = e
        return enc.attend(q, k, v, mask=keep)

    assert torch.autograd.gradcheck(f, (q, k, v, e))


def test_zero_table_is_nope_and_bf16_runs() -> None:
    enc = CoPE(8, 2)
    assert enc.pos_emb.abs().sum() == 0  # the authors' init: CoPE starts as NoPE
    with_cope = Attention(16, 2, encoding=enc)
    nope = Attention(16, 2)
    nope.load_state_dict({k: v for k, v in with_cope.state_dict().items() if "pos_emb" not in k})
    x = torch.randn(1, 5, 16)
    torch.testing.assert_close(with_cope(x), nope(x))
    assert with_cope.to(torch.bfloat16)(x.bfloat16()).dtype == torch.bfloat16


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="npos_max"):
        CoPE(4, 2, npos_max=0)
    with pytest.raises(ValueError, match="num_heads"):
        CoPE(4, 0)
    with pytest.raises(ValueError, match="init_std"):
        CoPE(4, 2, init_std=-1.0)
    enc = CoPE(4, 2)
    q = torch.randn(1, 3, 5, 4)
    with pytest.raises(ValueError, match="2 heads of head_dim 4"):
        enc.attend(q, q, q)
