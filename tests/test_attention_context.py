"""Position work once per forward: one validation of the positions per public call, each
encoding's per-forward product (cos/sin, bias) made once per distinct encoding; the family hook
resolved when the layer is built; attention probabilities from the explicit path."""

from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch

from posenc import Attention, ModelConfig, TransformerLM, _checks
from posenc.attention import KVCache, explicit_path
from posenc.bias import ALiBi, T5RelativeBias
from posenc.bias.common import PositionBias
from posenc.relative import ShawRelative
from posenc.rotary import QueryTemperature, RotaryEmbedding

POSITION_NAMES = ("positions", "k_positions", "memory_positions")


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts ``check_positions`` calls by the ``name`` they check, wherever posenc bound it."""
    original = _checks.check_positions
    seen: Counter = Counter()

    def counting(positions, name="positions", *args, **kwargs):
        seen[name] += 1
        return original(positions, name, *args, **kwargs)

    for module_name, module in list(sys.modules.items()):
        if (
            module_name.startswith("posenc")
            and getattr(module, "check_positions", None) is original
        ):
            monkeypatch.setattr(module, "check_positions", counting)
    return seen


def _position_checks(seen: Counter) -> int:
    return sum(seen[n] for n in POSITION_NAMES)


def _model(encoding: str, num_layers: int = 4) -> TransformerLM:
    cfg = ModelConfig(encoding=encoding, num_layers=num_layers, dim=32, num_heads=4, max_len=32)
    return TransformerLM(cfg).eval()


@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5"])
def test_one_forward_of_four_layers_validates_its_positions_once(
    encoding: str, checks: Counter
) -> None:
    model = _model(encoding)
    tokens = torch.randint(0, 256, (2, 16))
    positions = torch.arange(3, 19)
    with torch.no_grad():
        model(tokens)  # RoPE builds its cached cos/sin table (and checks its own arange) once
        checks.clear()
        model(tokens, positions)
    # A bias module without ``materialized`` (the bias of checked positions) validates the pair
    # again in its public ``bias``: once per forward, whatever the depth.
    again = 0 if encoding == "rope" or hasattr(PositionBias, "materialized") else 2
    assert _position_checks(checks) == 1 + again, dict(checks)
    checks.clear()
    with torch.no_grad():
        model(tokens)  # default positions: built, never checked
    assert _position_checks(checks) == 0, dict(checks)


@pytest.mark.parametrize(
    "encoding",
    ["shaw", "deberta", "transformer-xl", "cope", "llama4_temperature", "llama4_scaling"],
)
def test_relative_and_tempered_forwards_validate_their_positions_once(
    encoding: str, checks: Counter
) -> None:
    """The relative schemes and the query temperature read the context's checked positions
    through unchecked cores: one validation per forward, not one per layer."""
    if encoding.startswith("llama4"):  # a tempered RoPE model (Llama-4's or Ministral-3's kind)
        temperature = QueryTemperature(encoding, beta=0.1, length=8)
        cfg = ModelConfig(
            encoding="rope", num_layers=4, dim=32, num_heads=4, max_len=32, temperature=temperature
        )
        model = TransformerLM(cfg).eval()
    else:
        model = _model(encoding)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        model(tokens)
        checks.clear()
        model(tokens, torch.arange(3, 19))
    assert _position_checks(checks) == 1, dict(checks)


def test_attention_alone_validates_once_per_call(checks: Counter) -> None:
    attn = Attention(32, 4, encoding=RotaryEmbedding(8))
    x = torch.randn(1, 5, 32)
    attn(x)  # the cached cos/sin table is built (from its own checked arange) once
    checks.clear()
    attn(x, torch.arange(5))
    assert _position_checks(checks) == 1
    checks.clear()
    attn(x, torch.arange(5), memory=x, memory_positions=torch.arange(5))
    assert checks["positions"] == checks["memory_positions"] == 1
    assert _position_checks(checks) == 2


def _count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, method: str) -> list[int]:
    calls: list[int] = []
    original = getattr(cls, method)

    def counting(self, *args, **kwargs):
        calls.append(id(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, counting)
    return calls


@pytest.mark.parametrize(
    ("encoding", "cls", "method"),
    [
        ("rope", RotaryEmbedding, "tables"),
        ("alibi", ALiBi, "materialized" if hasattr(ALiBi, "materialized") else "bias"),
        (
            "t5",
            T5RelativeBias,
            "materialized" if hasattr(T5RelativeBias, "materialized") else "bias",
        ),
    ],
)
def test_the_per_forward_product_is_made_once_per_shared_encoding(
    encoding: str, cls: type, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_calls(monkeypatch, cls, method)  # before the hooks bind the method
    model = _model(encoding)
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        model(tokens)
    assert len(calls) == 1  # one shared module, four layers
    with torch.no_grad():
        model(tokens)
    assert len(calls) == 2  # a new forward, a new product (positions may differ)


def test_per_layer_encodings_make_one_product_each(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model("shaw", num_layers=3)  # one ShawRelative per layer
    calls = _count_calls(monkeypatch, ShawRelative, "scores")
    with torch.no_grad():
        model(torch.randint(0, 256, (1, 8)))
    assert len(set(calls)) == len(calls) == 3


def test_decoding_with_a_cache_makes_one_product_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_calls(
        monkeypatch, ALiBi, "materialized" if hasattr(ALiBi, "materialized") else "bias"
    )
    model = _model("alibi")
    tokens = torch.randint(0, 256, (1, 9))
    caches = model.new_caches()
    with torch.no_grad():
        model(tokens[:, :8], caches=caches)
        step = model(tokens[:, 8:], caches=caches)
        full = model(tokens)
    assert len(calls) == 3
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_the_hook_is_resolved_when_the_encoding_is_set() -> None:
    attn = Attention(32, 4)
    assert attn.family == "none"
    attn.encoding = ALiBi(4)
    assert attn.family == "bias" and type(attn._hook).__name__ == "BiasHook"
    with pytest.raises(ValueError, match="absolute encoding"):
        attn.encoding = _model("sinusoidal").absolute


def _naive_probs(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    b, s, _ = x.shape
    q = attn.q_proj(x).view(b, s, 4, 8).transpose(1, 2)
    k = attn.k_proj(x).view(b, s, 4, 8).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) * attn.scale  # [b, h, s, s]
    if isinstance(attn.encoding, ALiBi):
        i = torch.arange(s, dtype=torch.float64)
        slopes = attn.encoding.slopes().double()
        scores = scores - slopes[:, None, None] * (i[:, None] - i[None, :])
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)


@pytest.mark.parametrize("encoding", [None, "alibi"])
def test_attention_probs_are_the_softmax_of_the_scores(encoding: str | None) -> None:
    enc = ALiBi(4) if encoding else None
    attn = Attention(32, 4, encoding=enc).double()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    probs = attn.attention_probs(x)
    torch.testing.assert_close(probs, _naive_probs(attn, x))
    assert torch.all(probs.triu(1) == 0)


def test_explicit_path_returns_the_probabilities_it_used() -> None:
    q, k, v = (torch.randn(1, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    out, probs = explicit_path(q, k, v, scale=0.3, mask=keep, return_probs=True)
    torch.testing.assert_close(out, probs @ v)
    want = torch.softmax((q @ k.transpose(-1, -2) * 0.3).masked_fill(~keep, float("-inf")), -1)
    torch.testing.assert_close(probs, want)
    alone = explicit_path(q, k, v, scale=0.3, mask=keep)
    assert torch.equal(alone, out)


def test_relative_probs_leave_out_the_value_term() -> None:
    """Shaw's value term adds to ``probs @ v``; the probabilities are the softmax alone."""
    attn = Attention(32, 4, encoding=ShawRelative(8, max_distance=2)).double()
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    probs = attn.attention_probs(x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 4, 5, dtype=torch.float64))
    assert torch.all(probs.triu(1) == 0)


def test_context_and_positions_are_exclusive() -> None:
    attn = Attention(32, 4)
    x = torch.randn(1, 3, 32)
    ctx = attn.context(x)
    with pytest.raises(ValueError, match="not both"):
        attn(x, torch.arange(3), context=ctx)
    assert torch.equal(attn(x, context=ctx), attn(x))
    cache = KVCache()
    attn(x, cache=cache)
    assert attn.context(x[:, :1], cache=cache).positions.tolist() == [3]
