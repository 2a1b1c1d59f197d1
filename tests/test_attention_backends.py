"""Attention's explicit path equals SDPA for every family; registry entries of the bias and
relative families build, run forward and backward in the model, and honour ``causal``."""

import pytest
import torch

from posenc import Attention, ModelConfig, TransformerLM, registry
from posenc.bias import FIRE, KERPLE, ALiBi, Sandwich, T5RelativeBias

F64 = torch.float64

ENCODINGS = {
    "none": lambda c: None,
    "alibi": lambda c: ALiBi(4, causal=c),
    "t5": lambda c: T5RelativeBias(4, num_buckets=8, max_distance=12, bidirectional=not c),
    "kerple": lambda c: KERPLE(4, "power"),
    "fire": lambda c: FIRE(4, mlp_width=6, init_threshold=5.0),
    "sandwich": lambda c: Sandwich(4, d_prime=16),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(ENCODINGS))
def test_explicit_equals_sdpa(name: str, causal: bool) -> None:
    enc = ENCODINGS[name](causal)
    sdpa = Attention(32, 4, 2, causal=causal, encoding=enc, backend="sdpa").double()
    explicit = Attention(32, 4, 2, causal=causal, encoding=enc, backend="explicit").double()
    explicit.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 10, 32, dtype=F64)
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[1, :4] = False
    for kw in ({}, {"positions": torch.arange(5, 15)}, {"attn_mask": pad}):
        torch.testing.assert_close(explicit(x, **kw), sdpa(x, **kw))


BIAS_AND_RELATIVE = [
    "alibi",
    "t5",
    "kerple",
    "fire",
    "sandwich",
    "shaw",
    "transformer-xl",
    "deberta",
]


def test_registry_has_the_bias_and_relative_entries() -> None:
    assert set(registry.names("bias")) >= {"alibi", "t5", "kerple", "fire", "sandwich"}
    assert set(registry.names("relative")) >= {"shaw", "transformer-xl", "deberta"}
    assert registry.entry("kerple").shared is False and registry.entry("shaw").shared is False
    assert registry.entry("alibi").shared and registry.entry("t5").shared
    assert registry.options("kerple")["variant"] == "log"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", BIAS_AND_RELATIVE)
def test_model_forward_and_backward(name: str, causal: bool) -> None:
    cfg = ModelConfig(
        encoding=name, causal=causal, dim=32, num_heads=4, num_kv_heads=2, num_layers=2
    )
    model = TransformerLM(cfg)
    tokens = torch.randint(0, 256, (2, 12))
    logits = model(tokens)
    assert logits.shape == (2, 12, 256) and torch.isfinite(logits).all()
    logits.logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, missing
    encs = [block.attn.encoding for block in model.blocks]
    assert (encs[0] is encs[1]) == registry.entry(name).shared


def test_builders_honour_causal() -> None:
    assert registry.build("alibi", dim=32, num_heads=4, causal=True).causal
    assert not registry.build("alibi", dim=32, num_heads=4, causal=False).causal
    assert registry.build("t5", dim=32, num_heads=4, causal=False).bidirectional
    assert not registry.build("t5", dim=32, num_heads=4, causal=True).bidirectional
    assert registry.build("t5", dim=32, num_heads=4, causal=True, bidirectional=True).bidirectional
    assert registry.build("kerple", dim=32, num_heads=4, variant="power").variant == "power"
    with pytest.raises(ValueError, match="variant must be one of"):
        registry.build("kerple", dim=32, num_heads=4, variant="cubic")
