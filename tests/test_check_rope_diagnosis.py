"""check_rope names the likely cause of a failure from the error's pattern.

Each planted fault is an implementation written out here (the rotation formula in float64,
``naive_rope``) or transformers' own rotary class with one setting changed; the cause must be
named, with the implied value (base, factor, offset) equal to the planted one, and a correct
implementation must get no cause.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.testing import RopeReport, check_rope
from test_check_rope_faults import PLAIN, SMALL, naive_rope

LINEAR_4 = {**PLAIN, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
LLAMA_31 = json.loads(
    (Path(__file__).parent / "data" / "hf_configs" / "llama-3.1-8b-instruct.json").read_text()
)  # meta-llama/Llama-3.1-8B-Instruct's config.json: llama3 scaling, rope_theta 500000


def linear_rope(factor: float) -> Any:
    """The naive rope with positions divided by ``factor`` (position interpolation)."""

    def impl(q, k, position_ids, layer_type):
        d = q.shape[-1]
        inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d) / factor
        angles = position_ids.double()[..., None] * inv_freq  # [b, s, d/2]
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        n = d // 2

        def rotate(x):
            a, b = x.double()[..., :n], x.double()[..., n:]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), -1).to(x.dtype)

        return rotate(q), rotate(k)

    return impl


def shifted_rope(delta: int) -> Any:
    good = naive_rope()
    return lambda q, k, position_ids, lt: good(q, k, position_ids + delta, lt)


def _cause(report: RopeReport) -> tuple[str, float | None]:
    assert not report.ok, report
    assert report.diagnosis is not None, report
    line = str(report).splitlines()[1]
    assert line == str(report.diagnosis) and line.startswith("likely cause: "), report
    return report.diagnosis.cause, report.diagnosis.value


@pytest.mark.parametrize(
    ("impl", "config", "cause", "value"),
    [
        pytest.param(naive_rope(base=500000.0), PLAIN, "base", 500000.0, id="base-500000-for-1e4"),
        pytest.param(naive_rope(base=1000.0), PLAIN, "base", 1000.0, id="base-1000-for-1e4"),
        pytest.param(naive_rope(layout="interleaved"), PLAIN, "pairing", None, id="pairing"),
        pytest.param(linear_rope(2.0), LINEAR_4, "scaling factor", 2.0, id="linear-2-for-4"),
        pytest.param(linear_rope(1.0), LINEAR_4, "scaling factor", 1.0, id="linear-dropped"),
        pytest.param(shifted_rope(1), PLAIN, "positions", 1.0, id="positions+1"),
        pytest.param(shifted_rope(-1), PLAIN, "positions", -1.0, id="positions-1"),
        pytest.param(naive_rope(shift=5e-5), PLAIN, "positions", 5e-5, id="positions+5e-5"),
        pytest.param(naive_rope(base=500000.0), LLAMA_31, "scaling band", None, id="llama3-band"),
        pytest.param(naive_rope(gain=1 + 2e-5), PLAIN, "attention factor", 1 + 2e-5, id="gain"),
    ],
)
def test_each_planted_cause_is_named(impl: Any, config: Any, cause: str, value: Any) -> None:
    got, implied = _cause(check_rope(impl, config, **SMALL))
    assert got == cause
    if value is not None:
        assert implied == pytest.approx(value, rel=1e-2), implied  # float32 outputs


def test_wrong_base_and_swapped_pairing_read_differently() -> None:
    """The new user's pair: same probe, same first position, close errors; now told apart."""
    base = check_rope(naive_rope(base=500000.0), PLAIN, **SMALL)
    pairing = check_rope(naive_rope(layout="interleaved"), PLAIN, **SMALL)
    assert base.failures[0].probe == pairing.failures[0].probe == "first_64"
    assert "implied rope_theta 500000" in str(base).splitlines()[1], base
    assert (
        "pairs interleaved (x[2i], x[2i+1]) where the config pairs half-split"
        in str(pairing).splitlines()[1]
    ), pairing


@pytest.mark.parametrize(
    ("impl", "config"),
    [(naive_rope(), PLAIN), (linear_rope(4.0), LINEAR_4)],
    ids=["plain", "linear-4"],
)
def test_a_correct_implementation_gets_no_cause(impl: Any, config: Any) -> None:
    report = check_rope(impl, config, **SMALL)
    assert report.ok and report.diagnosis is None, report
    assert "likely cause" not in str(report)


def test_no_cause_for_a_call_that_raises() -> None:
    def raises(q, k, position_ids, layer_type):
        raise RuntimeError("no kernel for this shape")

    report = check_rope(raises, PLAIN, **SMALL)
    assert not report.ok and report.diagnosis is None, report


def test_transformers_with_another_theta_is_named_base() -> None:
    """transformers' LlamaRotaryEmbedding built with rope_theta 500000, checked against a config
    saying 10000: the implied base is the one transformers was given."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    wrong = transformers.LlamaConfig(**{**PLAIN, "rope_theta": 500000.0})
    rotary = modeling_llama.LlamaRotaryEmbedding(wrong)

    def impl(q, k, position_ids, layer_type):
        cos, sin = rotary(q, position_ids)
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)

    cause, implied = _cause(check_rope(impl, PLAIN, **SMALL))
    assert cause == "base" and implied == pytest.approx(500000.0, rel=1e-3)
