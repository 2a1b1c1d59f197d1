"""The FlexAttention path equals the SDPA path for every bias; backend choice; block-mask cache.

Most checks run FlexAttention eagerly (``compile_flex=False``: same ``score_mod`` and block mask,
no kernel compile). The compiled kernel is checked once per scheme (a few seconds each on CPU).
On CPU PyTorch has no FlexAttention backward; the backward comparison runs on CUDA only.
"""

import warnings

import pytest
import torch

from posenc import Attention, KVCache, ModelConfig, TransformerLM
from posenc.attention import BlockMaskCache, flex_available
from posenc.attention import policy as attention_policy
from posenc.bias import FIRE, KERPLE, ALiBi, Sandwich, T5RelativeBias

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BIASES = {
    "alibi": lambda c: ALiBi(4, causal=c),
    "t5": lambda c: T5RelativeBias(4, num_buckets=8, max_distance=12, bidirectional=not c),
    "kerple-log": lambda c: KERPLE(4, "log"),
    "kerple-power": lambda c: KERPLE(4, "power"),
    "fire": lambda c: FIRE(4, mlp_width=6, init_threshold=10.0),
    "sandwich": lambda c: Sandwich(4, d_prime=16, cache_len=16),  # t > 16: a table per call
}


def pair(enc, causal: bool, compile_flex: bool = False, hk: int = 2):
    """The same weights behind backend='sdpa' and backend='flex'."""
    sdpa = Attention(32, 4, hk, causal=causal, encoding=enc, backend="sdpa")
    flex = Attention(
        32, 4, hk, causal=causal, encoding=enc, backend="flex", compile_flex=compile_flex
    )
    flex.load_state_dict(sdpa.state_dict())
    return sdpa, flex


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(BIASES))
def test_flex_equals_sdpa(name: str, causal: bool) -> None:
    sdpa, flex = pair(BIASES[name](causal), causal)
    x = torch.randn(2, 40, 32)
    positions = torch.randint(0, 90, (2, 40)).sort(dim=1).values  # [b, s], gaps, repeats
    pad = torch.ones(2, 40, dtype=torch.bool)
    pad[0, :6] = False  # left padding: under a causal mask rows 0-5 of batch 0 see no key
    full = torch.rand(2, 4, 40, 40) > 0.3  # a per-head mask
    with torch.no_grad():
        for kw in ({}, {"positions": positions}, {"attn_mask": pad}, {"attn_mask": full}):
            torch.testing.assert_close(flex(x, **kw), sdpa(x, **kw), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(BIASES))
def test_flex_with_kv_cache_offset_equals_sdpa(name: str) -> None:
    """A second chunk (s = 8 queries over t = 32 keys): block mask and positions offset."""
    sdpa, flex = pair(BIASES[name](True), True)
    x = torch.randn(1, 32, 32)
    c1, c2 = KVCache(), KVCache()
    with torch.no_grad():
        sdpa(x[:, :24], cache=c1)
        flex(x[:, :24], cache=c2)
        torch.testing.assert_close(
            flex(x[:, 24:], cache=c2), sdpa(x[:, 24:], cache=c1), rtol=1e-5, atol=1e-5
        )


def test_flex_never_materializes_the_bias() -> None:
    enc = ALiBi(4)
    _, flex = pair(enc, True)

    def refuse(*args, **kwargs):
        raise AssertionError("the flex path must not build an [h, s, t] bias")

    enc.bias = refuse  # type: ignore[method-assign]
    with torch.no_grad():
        flex(torch.randn(1, 16, 32))


@pytest.mark.slow
@pytest.mark.skipif(
    not flex_available("cpu"),
    reason="compiled FlexAttention on CPU needs torch>=2.6 and a C++ compiler",
)
# KERPLE's score_mod is pointwise arithmetic like ALiBi's; its compile is left out to save time.
@pytest.mark.parametrize("name", ["alibi", "t5", "fire", "sandwich"])
def test_compiled_flex_equals_sdpa(name: str) -> None:
    sdpa, flex = pair(BIASES[name](True), True, compile_flex=True)
    x = torch.randn(1, 64, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(flex(x), sdpa(x), rtol=1e-5, atol=1e-5)
        if name == "alibi":  # data-dependent block mask and shifted positions, same kernel shape
            pad = torch.ones(1, 64, dtype=torch.bool)
            pad[0, :5] = False
            pos = torch.arange(100, 164)
            torch.testing.assert_close(
                flex(x, pos, attn_mask=pad), sdpa(x, pos, attn_mask=pad), rtol=1e-5, atol=1e-5
            )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention backward needs CUDA")
@pytest.mark.parametrize("name", ["alibi", "t5", "kerple-log", "fire", "sandwich"])
def test_flex_backward_equals_sdpa_on_cuda(name: str) -> None:
    sdpa, flex = pair(BIASES[name](True).cuda(), True, compile_flex=True)
    sdpa, flex = sdpa.cuda(), flex.cuda()
    x = torch.randn(2, 256, 32, device="cuda", requires_grad=True)
    out_s = sdpa(x)
    grads_s = torch.autograd.grad(out_s.square().sum(), [x, *sdpa.parameters()], allow_unused=True)
    out_f = flex(x)
    grads_f = torch.autograd.grad(out_f.square().sum(), [x, *flex.parameters()], allow_unused=True)
    torch.testing.assert_close(out_f, out_s, rtol=1e-4, atol=1e-4)
    for gf, gs in zip(grads_f, grads_s, strict=True):
        if gs is not None:
            torch.testing.assert_close(gf, gs, rtol=1e-3, atol=1e-3)


# --- backend choice ----------------------------------------------------------------------------


def _qkv(s: int, dtype=torch.float32, grad: bool = False):
    q = torch.randn(1, 4, s, 8, dtype=dtype, requires_grad=grad)
    k = torch.randn(1, 2, s, 8, dtype=dtype)
    return q, k, k


def test_auto_choice_rules(monkeypatch) -> None:
    monkeypatch.setattr(attention_policy, "FLEX_MIN_SCORES", 64 * 64)
    bias = Attention(32, 4, 2, encoding=ALiBi(4))
    with torch.no_grad():
        expect_flex = "flex" if flex_available("cpu") else "sdpa"
        assert bias.choose_backend(*_qkv(64)) == expect_flex
        assert bias.choose_backend(*_qkv(32)) == "sdpa"  # small: a materialized bias is cheap
        assert bias.choose_backend(*_qkv(64, torch.float64)) == "sdpa"  # no f64 flex kernel on CPU
    # Training on CPU: FlexAttention has no backward there.
    assert bias.choose_backend(*_qkv(64, grad=True)) == "sdpa"
    learnable = Attention(32, 4, 2, encoding=KERPLE(4))
    assert learnable.choose_backend(*_qkv(64)) == "sdpa"  # r1, r2 need gradients
    with torch.no_grad():
        dropout = Attention(32, 4, 2, encoding=ALiBi(4), dropout=0.1)
        assert dropout.choose_backend(*_qkv(64)) == "sdpa"  # training mode, dropout on
        assert dropout.eval().choose_backend(*_qkv(64)) == expect_flex
        assert Attention(32, 4, 2).choose_backend(*_qkv(64)) == "sdpa"  # SDPA is already fused
        forced = Attention(32, 4, 2, encoding=ALiBi(4), backend="explicit")
        assert forced.choose_backend(*_qkv(64)) == "explicit"
        # Sandwich's score_mod is one gather in the index layout, d' multiply-adds otherwise.
        sandwich = Attention(32, 4, 2, encoding=Sandwich(4, d_prime=16))
        assert sandwich.choose_backend(*_qkv(64)) == expect_flex
        assert sandwich.choose_backend(*_qkv(64), index_layout=False) == "sdpa"
        assert bias.choose_backend(*_qkv(64), index_layout=False) == expect_flex


def test_forced_flex_refuses_what_it_cannot_do() -> None:
    flex = Attention(32, 4, encoding=ALiBi(4), backend="flex", compile_flex=False)
    with pytest.raises(RuntimeError, match="cannot backpropagate on CPU"):
        flex(torch.randn(1, 8, 32))  # parameters require grad
    with pytest.raises(ValueError, match="no attention dropout"), torch.no_grad():
        Attention(32, 4, encoding=ALiBi(4), backend="flex", dropout=0.1)(torch.randn(1, 8, 32))
    with pytest.raises(ValueError, match="backend must be one of"):
        Attention(32, 4, backend="fast")


# --- block masks -------------------------------------------------------------------------------


def test_block_mask_cache_keys_and_eviction() -> None:
    cache = BlockMaskCache(maxsize=2)
    a = cache.causal(16, 16, torch.device("cpu"))
    assert cache.causal(16, 16, torch.device("cpu")) is a
    b = cache.causal(8, 16, torch.device("cpu"))  # a different offset is a different mask
    assert b is not a and len(cache) == 2
    cache.causal(16, 16, torch.device("cpu"))  # a is now the most recent
    cache.causal(4, 4, torch.device("cpu"))  # evicts b
    assert len(cache) == 2 and cache.causal(16, 16, torch.device("cpu")) is a
    assert cache.causal(8, 16, torch.device("cpu")) is not b
    with pytest.raises(ValueError, match="maxsize must be a positive integer"):
        BlockMaskCache(0)


def test_one_block_mask_serves_every_layer(monkeypatch) -> None:
    built = []
    import posenc.attention.masks as attention_module

    real = attention_module.causal_block_mask
    monkeypatch.setattr(
        attention_module, "causal_block_mask", lambda *a, **k: built.append(a[:2]) or real(*a, **k)
    )
    model = TransformerLM(ModelConfig(encoding="alibi", num_layers=3, dim=32, num_heads=4)).eval()
    cache = BlockMaskCache()
    for block in model.blocks:
        block.attn.backend, block.attn.compile_flex, block.attn.block_mask_cache = (
            "flex",
            False,
            cache,
        )
    tokens = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        flex_logits = model(tokens)
        model(tokens)
    assert built == [(24, 24)] and len(cache) == 1
    for block in model.blocks:
        block.attn.backend = "sdpa"
    with torch.no_grad():
        torch.testing.assert_close(flex_logits, model(tokens), rtol=1e-5, atol=1e-5)
