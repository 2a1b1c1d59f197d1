"""The Attention module without an encoding: a naive loop, GQA, masks, KV cache and memory."""

import math

import pytest
import torch

from _decode import prefill_then_decode
from posenc import Attention, KVCache


def naive_attention(attn: Attention, x: torch.Tensor, causal: bool, keep=None) -> torch.Tensor:
    """softmax(q.k / sqrt(d) + mask) v, one head and one query at a time, float64."""
    b, s, _ = x.shape
    h, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, s, h, d)
    k = attn.k_proj(x).view(b, s, hk, d)
    v = attn.v_proj(x).view(b, s, hk, d)
    out = torch.zeros(b, s, h, d, dtype=x.dtype)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            for i in range(s):
                scores = []
                for j in range(s):
                    allowed = (not causal or j <= i) and (keep is None or bool(keep[bi, j]))
                    scores.append(
                        q[bi, i, hi] @ k[bi, j, kv] / math.sqrt(d) if allowed else -math.inf
                    )
                p = torch.softmax(
                    torch.stack([torch.as_tensor(sc, dtype=x.dtype) for sc in scores]), 0
                )
                out[bi, i, hi] = sum(p[j] * v[bi, j, kv] for j in range(s))
    return attn.o_proj(out.reshape(b, s, h * d))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("h", "hk"), [(4, 4), (4, 2), (4, 1)])
def test_attention_equals_naive_loop(causal: bool, h: int, hk: int) -> None:
    attn = Attention(32, h, hk, causal=causal).double()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x), naive_attention(attn, x, causal))


def test_key_padding_mask_and_fully_masked_rows_stay_finite() -> None:
    attn = Attention(16, 2, causal=True).double()
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    keep = torch.tensor([[False, False, True, True], [True, True, True, True]])
    out = attn(x, attn_mask=keep)
    assert torch.isfinite(out).all()
    want = naive_attention(attn, x, True, keep)
    torch.testing.assert_close(out[0, 2:], want[0, 2:])
    torch.testing.assert_close(out[1], want[1])


def test_kv_cache_decode_equals_full_run() -> None:
    attn = Attention(16, 4, 2, causal=True).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    full = attn(x)
    cache = KVCache()
    got = prefill_then_decode(lambda part: attn(part, cache=cache), x, 4)
    torch.testing.assert_close(got, full)
    assert cache.length == 7 and torch.equal(cache.positions, torch.arange(7))


def test_memory_is_prepended_and_detached() -> None:
    attn = Attention(16, 2, causal=True).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    full = attn(x)
    mem = x[:, :2].clone().requires_grad_(True)
    out = attn(x[:, 2:], memory=mem)
    torch.testing.assert_close(out, full[:, 2:])
    out.sum().backward()
    assert mem.grad is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"dim": 30, "num_heads": 4}, "divisible by num_heads"),
        ({"dim": 32, "num_heads": 4, "num_kv_heads": 3}, "multiple of num_kv_heads"),
        ({"dim": 32, "num_heads": 0}, "num_heads must be a positive integer"),
        ({"dim": 32, "num_heads": 4, "num_kv_heads": 0}, "num_kv_heads must be a positive"),
        ({"dim": 32, "num_heads": 4, "dropout": 1.0}, r"dropout must be in \[0, 1\)"),
        ({"dim": 32, "num_heads": 4, "dropout": -0.1}, r"dropout must be in \[0, 1\)"),
    ],
)
def test_bad_construction(kwargs, words) -> None:
    with pytest.raises(ValueError, match=words):
        Attention(**kwargs)


def test_encoding_without_a_family_is_refused() -> None:
    with pytest.raises(TypeError, match="encoding must be a posenc encoding with a 'family'"):
        Attention(32, 4, encoding=torch.nn.Linear(2, 2))


def test_bad_forward_input() -> None:
    attn = Attention(16, 2)
    with pytest.raises(ValueError, match=r"x must be \[batch, seq, 16\]"):
        attn(torch.randn(1, 3, 8))
    with pytest.raises(ValueError, match=r"positions must be \[3\] or \[1, 3\]"):
        attn(torch.randn(1, 3, 16), torch.arange(4))
    with pytest.raises(TypeError, match="integer dtype"):
        attn(torch.randn(1, 3, 16), torch.arange(3.0))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        attn(torch.randn(1, 3, 16), attn_mask=torch.ones(1, 3))
    mem = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match=r"memory_positions must be \[2\] or \[1, 2\]"):
        attn(torch.randn(1, 3, 16), memory=mem, memory_positions=torch.arange(3))
    with pytest.raises(TypeError, match="memory_positions must have an integer dtype"):
        attn(torch.randn(1, 3, 16), memory=mem, memory_positions=torch.arange(2.0))
    with pytest.raises(ValueError, match="memory_positions must be non-negative"):
        attn(torch.randn(1, 3, 16), memory=mem, memory_positions=torch.tensor([-2, -1]))


@pytest.mark.parametrize(("s", "t"), [(1, 1), (5, 5), (300, 300), (129, 257), (64, 700), (1, 1000)])
def test_causal_block_mask_equals_create_block_mask(s: int, t: int) -> None:
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    from posenc.attention import causal_block_mask

    offset = t - s
    ref = flex.create_block_mask(lambda b, h, q, k: k <= q + offset, None, None, s, t, device="cpu")
    mine = causal_block_mask(s, t, torch.device("cpu"))
    assert torch.equal(mine.to_dense(), ref.to_dense())
    assert torch.equal(mine.full_kv_num_blocks, ref.full_kv_num_blocks)


def test_plain_causal_attention_builds_no_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc.attention.module as attention_module

    attn = Attention(16, 2, causal=True).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    want = naive_attention(attn, x, True)

    def no_mask(*args, **kwargs):
        raise AssertionError("an [s, t] mask was built for plain causal attention")

    monkeypatch.setattr(attention_module, "build_mask", no_mask)
    torch.testing.assert_close(attn(x), want)
