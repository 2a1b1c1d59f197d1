"""posenc.lab evaluation: bits per byte against a naive computation, per-position curves,
learned tables past their length, inference-time RoPE rescaling."""

from __future__ import annotations

import math

import pytest
import torch

from posenc import registry
from posenc.lab.cells.presets import DataConfig, EvalConfig
from posenc.lab.evaluation import evaluate as E
from posenc.lab.training import data as D
from posenc.model import ModelConfig, TransformerLM


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "c"
    d.mkdir()
    for i in range(6):
        (d / f"m{i}.py").write_bytes(bytes((i * 7 + j * 13) % 251 + 1 for j in range(1500)))
    return D.load_data(DataConfig(source="text", path=str(d), test_frac=0.3))


def tiny(encoding: str, **kw) -> TransformerLM:
    torch.manual_seed(0)
    cfg = ModelConfig(dim=32, num_layers=2, num_heads=2, max_len=16, encoding=encoding, **kw)
    return TransformerLM(cfg).eval()


def naive(model, corpus, n, tokens, stride=None):
    """Mean -log2 p(target) over scored targets, one window and one target at a time, float64."""
    total, count = 0.0, 0
    per_pos = [[0.0, 0] for _ in range(n)]
    with torch.no_grad():
        for x, y in corpus.eval_windows(n, tokens, stride):
            logp = torch.log_softmax(model(x).double(), dim=-1)[0]  # [s, vocab]
            for i in range(n):
                t = int(y[0, i])
                if t != D.IGNORE:
                    nll = -float(logp[i, t]) / math.log(2)
                    total, count = total + nll, count + 1
                    per_pos[i][0] += nll
                    per_pos[i][1] += 1
    return total / count, count, [s / c for s, c in per_pos]


@pytest.mark.parametrize("encoding", ["none", "learned", "alibi"])
@pytest.mark.parametrize("stride", [None, 6])
def test_bits_per_byte_equals_naive_cross_entropy(corpus, encoding, stride):
    if encoding not in registry.names():
        pytest.skip(f"{encoding} is not registered")
    model = tiny(encoding)
    cfg = EvalConfig(tokens=160, batch_tokens=40, stride=stride, curve_points=16)
    got = E.score(model, corpus, 16, cfg)
    want, count, per_pos = naive(model, corpus, 16, 160, stride)
    assert got["tokens"] == count
    assert got["bits"] == pytest.approx(want, rel=1e-5)
    if stride is None:
        assert got["curve"]["pos"] == list(range(16))
        assert got["curve"]["bits"] == pytest.approx(per_pos, rel=1e-5)
    else:
        assert got["curve"] is None


def test_curve_bins_are_log_spaced_means():
    s = torch.arange(1.0, 9.0) * math.log(2)  # positions 0..7 with mean losses 1..8 bits
    c = torch.ones(8)
    assert E.bin_curve(s, c, 8)["bits"] == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8])
    out = E.bin_curve(s, c, 3)  # edges 0, 1, 3, 8
    assert out["pos"] == [0, 1, 3] and out["end"] == [1, 3, 8]
    assert out["bits"] == pytest.approx([1.0, 2.5, 6.0])
    wide = E.bin_curve(torch.ones(4096), torch.ones(4096), 64)
    assert len(wide["pos"]) <= 64 and wide["pos"][:4] == [0, 1, 2, 3] and wide["end"][-1] == 4096


def test_learned_table_past_its_length_is_not_applicable_or_interpolated(corpus):
    model = tiny("learned")
    cfg = EvalConfig(tokens=128, batch_tokens=64)
    out = E.evaluate_model(model, corpus, 16, [16, 32], cfg)
    base = out["variants"]["base"]["results"]
    assert base["16"]["bits"] is not None
    assert base["32"]["bits"] is None and "16 positions" in base["32"]["note"]
    interp = out["variants"]["interp"]["results"]
    assert interp["16"]["bits"] == base["16"]["bits"]
    assert interp["32"]["bits"] is not None and math.isfinite(interp["32"]["bits"])
    assert model.absolute.max_positions == 16  # the interpolated copy was swapped back out
    off = E.evaluate_model(
        model, corpus, 16, [16, 32], EvalConfig(tokens=128, learned_interp=False)
    )
    assert set(off["variants"]) == {"base"}


def test_rope_scaling_dicts():
    assert E.rope_scaling("linear", 256, 64) == {"rope_type": "linear", "factor": 4.0}
    assert E.rope_scaling("yarn", 128, 64) == {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 64,
    }


class FakeRotary(torch.nn.Module):
    """Identity rotary encoding that records how it was rescaled."""

    family = "rotary"

    def __init__(self, scaling=None, log=None):
        super().__init__()
        self.scaling, self.log = scaling, log if log is not None else []

    def forward(self, q, k, positions, k_positions=None):
        if self.scaling is not None:  # a visible change: shrink queries by the factor
            q = q / self.scaling["factor"]
        return q, k

    def with_scaling(self, scaling):
        self.log.append(scaling)
        return FakeRotary(scaling, self.log)


def test_rope_variants_swap_a_shared_encoding_and_restore_it(corpus):
    model = tiny("none")
    fake = FakeRotary()
    for b in model.blocks:
        b.attn.encoding, b.attn.family = fake, "rotary"
    cfg = EvalConfig(tokens=128, batch_tokens=64, rope_scalings=("linear", "yarn"))

    seen = []
    real_score = E.score

    def spy(m, *a, **k):
        encs = {id(b.attn.encoding) for b in m.blocks}
        seen.append(encs)
        return real_score(m, *a, **k)

    E.score = spy
    try:
        out = E.evaluate_model(model, corpus, 16, [16, 32, 64], cfg)
    finally:
        E.score = real_score
    assert all(len(s) == 1 for s in seen)  # still one module shared by every layer
    assert all(b.attn.encoding is fake for b in model.blocks)  # restored
    assert {"rope_type": "linear", "factor": 4.0} in fake.log
    assert {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16} in fake.log
    base, lin = out["variants"]["base"]["results"], out["variants"]["linear"]["results"]
    assert lin["16"]["bits"] == base["16"]["bits"] and "same as base" in lin["16"]["note"]
    assert lin["32"]["bits"] != base["32"]["bits"]
    assert out["variants"]["linear"]["label"] == "PI"


def test_rotary_without_with_scaling_is_skipped_with_a_reason(corpus):
    model = tiny("none")

    class Plain(torch.nn.Module):
        family = "rotary"

        def forward(self, q, k, positions, k_positions=None):
            return q, k

    enc = Plain()
    for b in model.blocks:
        b.attn.encoding, b.attn.family = enc, "rotary"
    out = E.evaluate_model(model, corpus, 16, [16, 32], EvalConfig(tokens=64))
    assert set(out["variants"]) == {"base"}
    assert "no with_scaling" in out["skipped"]["linear"]


@pytest.mark.skipif("rope" not in registry.names(), reason="rope is not registered")
def test_real_rope_model_gets_every_scaling(corpus):
    model = tiny("rope")
    out = E.evaluate_model(model, corpus, 16, [16, 64], EvalConfig(tokens=128))
    assert set(out["variants"]) == {"base", "linear", "ntk", "dynamic", "yarn"}
    bits = {v: r["results"]["64"]["bits"] for v, r in out["variants"].items()}
    assert len(set(bits.values())) == 5  # five different models at 4L
    at_l = {r["results"]["16"]["bits"] for r in out["variants"].values()}
    assert len(at_l) == 1  # factor 1 is the model as trained
    assert model.blocks[0].attn.encoding.scaling is None  # restored
