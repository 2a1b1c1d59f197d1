"""TransformerLM's Llama-4 options: NoPE layers every n-th layer (against transformers'
Llama4TextConfig.no_rope_layers) and the query temperature (against the formula in a float64 loop
and transformers' Llama4TextAttention), with the defaults leaving the model unchanged."""

import json
import math

import pytest
import torch
from transformers import Llama4TextConfig
from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

from _decode import prefill_then_decode
from posenc import ModelConfig, TransformerLM
from posenc.model import TemperedAttention, nope_layers
from posenc.rotary.temperature import QueryTemperature

F64 = torch.float64


@pytest.mark.parametrize("interval", [1, 2, 3, 4, 5])
def test_nope_layers_match_transformers_llama4(interval: int) -> None:
    for n in range(1, 10):
        ref = Llama4TextConfig(num_hidden_layers=n, no_rope_layer_interval=interval)
        want = tuple(i for i, uses_rope in enumerate(ref.no_rope_layers) if not uses_rope)
        assert nope_layers(n, interval) == want
    assert nope_layers(8, None) == ()


@pytest.mark.parametrize("interval", [1, 2, 3, 4, 6])
def test_model_layers_without_encoding_are_every_nth(interval: int) -> None:
    """Llama-4's rule in a loop: 0-based layer i is NoPE iff (i + 1) % n == 0."""
    model = TransformerLM(cfg(encoding="rope", nope_every=interval, num_layers=6))
    for i, block in enumerate(model.blocks):
        assert (block.attn.encoding is None) == ((i + 1) % interval == 0), (interval, i)


@pytest.mark.parametrize(("beta", "length"), [(0.1, 8192), (0.5, 3), (0.1, 64), (0.7, 1)])
def test_temperature_scales_equal_the_formulas_in_float64(beta: float, length: int) -> None:
    """Both scales at every position of a range crossing several steps (and far ones), against
    Llama-4's log1p(floor((p + 1) / floor_scale)) * attn_scale + 1 and Ministral-3's
    1 + beta * log(1 + floor(p / L)) evaluated in float64 (math), to float32's precision."""
    pos = [*range(0, 4 * length + 3), 10**6, 2**31 - 1, 3 * 10**9]
    got4 = QueryTemperature("llama4_temperature", beta, length).scale(torch.tensor(pos))
    got3 = QueryTemperature("llama4_scaling", beta, length).scale(torch.tensor(pos))
    want4 = [math.log1p(math.floor((p + 1) / length)) * beta + 1 for p in pos]
    want3 = [1 + beta * math.log(1 + math.floor(p / length)) for p in pos]
    assert got4.dtype == got3.dtype == torch.float32
    torch.testing.assert_close(got4.double(), torch.tensor(want4, dtype=F64), rtol=2e-6, atol=0)
    torch.testing.assert_close(got3.double(), torch.tensor(want3, dtype=F64), rtol=2e-6, atol=0)
    ones = [p for p, w in zip(pos, want4, strict=True) if w == 1]
    assert ones == list(range(length - 1))  # Llama-4: 1 up to position L - 2, then steps up


def cfg(**kw) -> ModelConfig:
    base = {"vocab_size": 11, "dim": 16, "num_layers": 4, "num_heads": 4, "max_len": 32}
    return ModelConfig(**{**base, **kw})


@pytest.mark.parametrize("encoding", ["rope", "alibi", "shaw"])  # shared and per-layer
def test_right_layers_get_no_position(encoding: str) -> None:
    """Layer by layer: a NoPE layer's output ignores the positions, every other layer's does not."""
    model = TransformerLM(cfg(encoding=encoding, nope_every=2, num_layers=5)).double()
    x = torch.randn(2, 7, 16, dtype=F64)
    a = torch.arange(7)
    b = torch.tensor([0, 1, 3, 4, 9, 10, 20])  # not a shift of a: every scheme sees it
    for i, block in enumerate(model.blocks):
        nope = (i + 1) % 2 == 0  # 1-based every 2nd layer: 1 and 3
        assert (block.attn.encoding is None) == nope, i
        same = torch.allclose(block.attn(x, a), block.attn(x, b), atol=1e-12, rtol=0)
        assert same == nope, f"layer {i}"


def test_all_nope_model_ignores_positions_and_builds_no_shared_encoding() -> None:
    model = TransformerLM(cfg(encoding="t5", nope_every=1)).double()
    assert not any(".encoding." in n for n, _ in model.named_parameters())
    tokens = torch.randint(0, 11, (2, 6))
    far = torch.tensor([[0, 5, 6, 7, 40, 41], [2, 3, 4, 5, 6, 7]])
    torch.testing.assert_close(model(tokens), model(tokens, far))


def naive_tempered(attn, x, where, beta, length, kind):
    """Causal attention of one layer without position encoding, each query scaled by the formula
    at ``where[b][i]``, one (batch, head, query) at a time in float64."""
    bsz, s, _ = x.shape
    h, hk, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(bsz, s, h, d)
    k = attn.k_proj(x).view(bsz, s, hk, d).repeat_interleave(h // hk, 2)
    v = attn.v_proj(x).view(bsz, s, hk, d).repeat_interleave(h // hk, 2)
    out = torch.zeros(bsz, s, h, d, dtype=F64)
    for bi in range(bsz):
        for i in range(s):
            p = int(where[bi][i])
            if kind == "llama4_temperature":  # Llama4TextAttention
                tau = math.log1p(math.floor((p + 1) / length)) * beta + 1
            else:  # Ministral-3
                tau = 1 + beta * math.log(1 + math.floor(p / length))
            for hi in range(h):
                scores = torch.stack(
                    [tau * q[bi, i, hi] @ k[bi, j, hi] / d**0.5 for j in range(i + 1)]
                )
                a = torch.softmax(scores, 0)
                out[bi, i, hi] = sum(a[j] * v[bi, j, hi] for j in range(i + 1))
    return attn.o_proj(out.reshape(bsz, s, h * d))


def test_llama4_temperature_on_nope_layers_matches_formula() -> None:
    temp = QueryTemperature("llama4_temperature", 0.5, 3, layers=nope_layers(4, 2))
    model = TransformerLM(cfg(num_kv_heads=2, nope_every=2, temperature=temp)).double()
    tempered = [i for i, blk in enumerate(model.blocks) if isinstance(blk.attn, TemperedAttention)]
    assert tempered == [1, 3]
    x = torch.randn(2, 10, 16, dtype=F64)
    attn = model.blocks[1].attn
    index = [list(range(10))] * 2  # Llama-4: the index in the KV cache, not position_ids
    want = naive_tempered(attn, x, index, 0.5, 3, "llama4_temperature")
    torch.testing.assert_close(attn(x), want)
    torch.testing.assert_close(attn(x, torch.arange(10) + 100), want)


def test_ministral_scaling_uses_position_ids() -> None:
    temp = QueryTemperature("llama4_scaling", 0.7, 2)  # every layer
    model = TransformerLM(cfg(encoding="none", temperature=temp)).double()
    assert all(isinstance(blk.attn, TemperedAttention) for blk in model.blocks)
    x = torch.randn(2, 6, 16, dtype=F64)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [3, 4, 9, 10, 11, 12]])
    attn = model.blocks[0].attn
    want = naive_tempered(attn, x, pos.tolist(), 0.7, 2, "llama4_scaling")
    torch.testing.assert_close(attn(x, pos), want)


def test_temperature_matches_transformers_llama4_attention() -> None:
    ref_cfg = Llama4TextConfig(
        hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        num_hidden_layers=4, no_rope_layer_interval=2, attn_temperature_tuning=True,
        floor_scale=3, attn_scale=0.5, use_qk_norm=False, attention_bias=False,
    )  # fmt: skip
    ref_cfg._attn_implementation = "eager"
    ref = Llama4TextAttention(ref_cfg, 1).double()  # layer 1: a NoPE layer
    assert not ref.use_rope
    temp = QueryTemperature("llama4_temperature", 0.5, 3, layers=(1, 3))
    model = TransformerLM(cfg(num_kv_heads=2, nope_every=2, temperature=temp)).double()
    ours = model.blocks[1].attn
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 11, 16, dtype=F64)
    causal = torch.full((11, 11), -math.inf, dtype=F64).triu(1)[None, None]
    want, _ = ref(x, position_embeddings=None, attention_mask=causal)
    torch.testing.assert_close(ours(x), want)


def test_cached_decoding_equals_full_forward() -> None:
    temp = QueryTemperature("llama4_temperature", 0.3, 2, layers=nope_layers(4, 2))
    model = TransformerLM(cfg(nope_every=2, temperature=temp)).double().eval()
    tokens = torch.randint(0, 11, (2, 9))
    full = model(tokens)
    caches = model.new_caches()
    got = prefill_then_decode(lambda part: model(part, caches=caches), tokens, 4)
    torch.testing.assert_close(got, full)


def test_defaults_leave_config_identity_unchanged_and_options_round_trip() -> None:
    assert cfg().to_dict()["nope_every"] is None and cfg().to_dict()["temperature"] is None
    temp = QueryTemperature("llama4_temperature", 0.1, 8, layers=(3,))
    c = cfg(nope_every=4, temperature=temp)
    back = ModelConfig(**json.loads(json.dumps(c.to_dict())))
    assert back == c and back.temperature == temp
    TransformerLM(back)


def test_errors_name_the_option() -> None:
    with pytest.raises(ValueError, match="nope_every"):
        cfg(nope_every=0)
    with pytest.raises(ValueError, match=r"nope_every .* absolute"):
        TransformerLM(cfg(encoding="sinusoidal", nope_every=2))
    with pytest.raises(ValueError, match=r"temperature.layers .* \[0, 4\), got \[4\]"):
        cfg(temperature=QueryTemperature("llama4_temperature", 0.1, 8, layers=(1, 4)))
    with pytest.raises(TypeError, match="temperature must be a QueryTemperature"):
        cfg(temperature=0.1)
