"""TransformerLM over every registered encoding, the registry, and the order demo."""

import pytest
import torch
from typer.testing import CliRunner

from _decode import prefill_then_decode
from posenc import ModelConfig, TransformerLM, build, names
from posenc.cli import app
from posenc.demo import order_sensitivity, token_permutation
from posenc.registry import options

ALL = names()


@pytest.mark.parametrize("encoding", ALL)
def test_order_blindness(encoding: str) -> None:
    # A shuffle that is not a reversal: a distance-symmetric bias (bidirectional ALiBi) is blind
    # to reversal, which keeps every |i - j|, but not to other reorderings.
    a, b = ["A", "B", "C", "D", "E"], ["B", "D", "A", "E", "C"]
    r = order_sensitivity(encoding, a, b)
    if encoding == "none":
        assert r.max_diff < 1e-12 and r.blind
    else:
        assert r.max_diff > 1e-6 and not r.blind, f"{encoding} did not tell the orderings apart"


def test_nope_is_exactly_a_permutation_on_the_default_examples() -> None:
    for a, b in (("我 喜欢 学习 AI", "AI 学习 喜欢 我"), ("A B C D", "D C B A")):
        assert order_sensitivity("none", a.split(), b.split()).blind


def test_token_permutation_rejects_bad_orderings() -> None:
    assert token_permutation(["a", "b", "c"], ["c", "a", "b"]) == [1, 2, 0]
    with pytest.raises(ValueError, match="distinct"):
        token_permutation(["a", "a"], ["a", "a"])
    with pytest.raises(ValueError, match="same tokens"):
        token_permutation(["a", "b"], ["a", "c"])


@pytest.mark.parametrize("encoding", ALL)
def test_model_trains_and_decodes_with_cache(encoding: str) -> None:
    cfg = ModelConfig(
        vocab_size=11, dim=32, num_layers=2, num_heads=4, max_len=16, encoding=encoding
    )
    model = TransformerLM(cfg).double()
    tokens = torch.randint(0, 11, (2, 9))
    logits = model(tokens)
    assert logits.shape == (2, 9, 11)
    logits.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    caches = model.new_caches()
    with torch.no_grad():
        got = prefill_then_decode(lambda part: model(part, caches=caches), tokens, 5)
    torch.testing.assert_close(got, logits.detach())


def test_registry_errors_name_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown encoding 'nope' .*; registered: none"):
        build("nope", dim=8)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['bse'\] for encoding 'sinusoidal'"):
        build("sinusoidal", dim=8, bse=3.0)
    assert options("sinusoidal") == {"base": 10000.0, "layout": "interleaved", "scale_input": False}


def test_cli_demo_order_and_help() -> None:
    runner = CliRunner()
    res = runner.invoke(
        app, ["demo", "order", "--a", "x y z", "--b", "z x y", "--encodings", "none,sinusoidal"]
    )
    assert res.exit_code == 0, res.output
    assert "order-blind" in res.output and "tells them apart" in res.output
    for args in (["--help"], ["demo", "--help"], ["demo", "order", "--help"], ["list", "--help"]):
        assert runner.invoke(app, args).exit_code == 0
    bad = runner.invoke(app, ["demo", "order", "--a", "x y"])
    assert bad.exit_code != 0


def test_model_checks_tokens_and_caches() -> None:
    model = TransformerLM(ModelConfig(vocab_size=11, dim=32, num_layers=2, num_heads=4))
    with pytest.raises(TypeError, match="tokens must be int64"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match=r"one KVCache per layer \(2\), got 1"):
        model(torch.zeros(1, 3, dtype=torch.long), caches=model.new_caches()[:1])
