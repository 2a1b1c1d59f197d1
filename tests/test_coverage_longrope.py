"""The coverage sweep's LongRoPE check (:data:`posenc.testing.coverage.FALLBACK`): the families
whose transformers config refuses linear, YaRN and Llama-3 (Phi-3, PhiMoE, Phi-4-multimodal) are
checked under the LongRoPE their checkpoints ship, and count exact only through it.

* The check runs only where the config class refuses every flat scaling, with factor lists of the
  rotary dim (and PhiMoE's mscales, which its class requires).
* It passes on posenc, and fails on planted faults in what posenc is given (factor lists
  swapped, PhiMoE's mscales swapped or dropped) and in posenc itself (PhiMoE's module reading its
  scaling as plain LongRoPE): each moves the logits 25x TOL and more.
* PhiMoE's cos/sin are transformers' own within and past the original length, and the module's
  device-side path (positions it cannot read on the host) picks the same multiplier.
* :func:`~posenc.testing.coverage.counts` takes the rule: ``none`` and every scaling the config
  takes, at least one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from posenc.hf import HFRotaryEmbedding, apply_posenc, remove_posenc
from posenc.hf.longrope_mscale import MscaleLongRoPE
from posenc.rotary import RotaryEmbedding
from posenc.testing import coverage as C

FAMILIES = ("phi3", "phimoe", "phi4_multimodal")
IDS = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, Any]]:
    import transformers

    transformers.logging.set_verbosity_error()
    yield {f: C.tiny_model(f) for f in FAMILIES}


def _patched(model: Any) -> Callable[..., torch.Tensor]:
    """The sweep's ``patched``: apply_posenc, prefill and decode, remove."""

    def run(**kw: Any) -> torch.Tensor:
        apply_posenc(model, **kw)
        try:
            return C.prefill_and_decode(model, IDS)
        finally:
            remove_posenc(model)

    return run


def _check(model: Any, given: dict[str, Any] | None = None) -> str:
    """The sweep's LongRoPE verdict, posenc given ``given`` in place of the check's scaling."""
    scaling = C.fallback_scaling(model.config)
    assert scaling is not None
    run = _patched(model)
    return C._fallback(model, IDS, scaling, lambda scaling: run(scaling=given or scaling))


def test_fallback_only_where_the_config_refuses_every_flat_scaling() -> None:
    assert C.fallback_scaling(C.tiny_config("llama")) is None  # takes linear: no fallback
    for family in FAMILIES:
        scaling = C.fallback_scaling(C.tiny_config(family))
        assert scaling is not None and scaling["rope_type"] == "longrope", family
        short, long = scaling["short_factor"], scaling["long_factor"]
        assert len(short) == len(long) == 8  # rotary dim 16 / 2
        assert len(set(short)) == len(set(long)) == 8  # not constant
        assert all(s != lg for s, lg in zip(short, long, strict=True))
        assert ("short_mscale" in scaling) == (family == "phimoe")  # only where the class asks
        assert scaling["original_max_position_embeddings"] == C.LONGROPE_ORIGINAL < IDS.shape[1]


@pytest.mark.parametrize("family", FAMILIES)
def test_longrope_is_exact_and_a_swap_of_the_factor_lists_fails(
    family: str, models: dict[str, Any]
) -> None:
    model = models[family]
    assert _check(model) == "exact"
    scaling = C.fallback_scaling(model.config)
    assert scaling is not None
    swapped = {**scaling, "short_factor": scaling["long_factor"],
               "long_factor": scaling["short_factor"]}  # fmt: skip
    assert _check(model, swapped).startswith("failed"), family
    if family != "phimoe":  # PhiMoE's transformers reads no long factors (longrope_mscale)
        no_long = {**scaling, "long_factor": scaling["short_factor"]}
        assert _check(model, no_long).startswith("failed"), family
    # the config-level length is the model's own again afterwards (Phi-3's 4096)
    assert getattr(model.config, "original_max_position_embeddings", None) in (None, 4096)


def test_phimoe_mscale_faults_fail(models: dict[str, Any], monkeypatch: Any) -> None:
    model = models["phimoe"]
    scaling = C.fallback_scaling(model.config)
    assert scaling is not None
    swapped = {**scaling, "short_mscale": scaling["long_mscale"],
               "long_mscale": scaling["short_mscale"]}  # fmt: skip
    assert _check(model, swapped).startswith("failed")
    assert _check(model, {**scaling, "short_mscale": 1.0, "long_mscale": 1.0}).startswith("failed")
    # posenc reading PhiMoE's parameters as plain LongRoPE (its factors, its attention factor)
    plain = RotaryEmbedding._compute

    def as_plain(self: Any, seq_len: Any, device: Any = None) -> Any:
        return plain(self, seq_len, device)

    monkeypatch.setattr(MscaleLongRoPE, "_compute", as_plain)
    monkeypatch.setattr(MscaleLongRoPE, "reset_parameters", RotaryEmbedding.reset_parameters)
    assert _check(model).startswith("failed")


def _phimoe_config() -> Any:
    config = C.tiny_config("phimoe")
    scaling = C.fallback_scaling(config)
    assert scaling is not None
    return C.scaled_config(config, scaling)


def test_phimoe_cos_sin_are_transformers_own_both_sides_of_the_original_length() -> None:
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    config = _phimoe_config()
    ours, theirs = HFRotaryEmbedding(config), PhimoeRotaryEmbedding(config)
    assert isinstance(ours.rope(), MscaleLongRoPE)
    x = torch.zeros(1, dtype=torch.float32)
    for length in (C.LONGROPE_ORIGINAL, C.LONGROPE_ORIGINAL + 1):  # short, then long mscale
        pos = torch.arange(length)[None]
        for got, want in zip(ours(x, pos), theirs(x, pos), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_phimoe_device_path_picks_the_hosts_multiplier() -> None:
    rope = HFRotaryEmbedding(_phimoe_config()).rope()
    assert isinstance(rope, MscaleLongRoPE)
    short, long = rope.mscales
    for length, want in ((C.LONGROPE_ORIGINAL, short), (C.LONGROPE_ORIGINAL + 1, long)):
        pos = torch.arange(length)
        inv_freq, factor = rope._traced_frequencies(pos, pos)  # as for positions on a GPU
        host_inv, host_factor = rope.frequencies(length)
        assert host_factor == want and float(factor) == pytest.approx(want)
        torch.testing.assert_close(inv_freq, host_inv, rtol=0, atol=0)


def test_phimoe_multipliers_that_differ_compile_without_a_host_read() -> None:
    """Positions a compiled graph cannot read: the multiplier is chosen on the device and
    applied unread (a bool() of it broke the graph), with the eager values."""
    rope = HFRotaryEmbedding(_phimoe_config()).rope()
    assert rope.mscales[0] != rope.mscales[1]
    compiled = torch.compile(lambda p: rope.cos_sin(p), backend="eager", fullgraph=True)
    for length in (C.LONGROPE_ORIGINAL, C.LONGROPE_ORIGINAL + 1):
        pos = torch.arange(length)
        for got, want in zip(compiled(pos), rope.cos_sin(pos), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_counts_take_longrope_in_place_of_the_flat_scalings() -> None:
    refused = {k: "refused: transformers' Phi3Config refuses these" for k in C.SCALINGS}
    flat = C.Outcome(
        "llama", ["llama"], checks={"none": "exact", **dict.fromkeys(C.SCALINGS, "exact")}
    )
    phi3 = C.Outcome("phi3", ["phi3"], checks={"none": "exact", **refused, "longrope": "exact"})
    wrong = C.Outcome(
        "phimoe", ["phimoe"], checks={"none": "exact", **refused, "longrope": "failed: 1e-3"}
    )
    unscaled = C.Outcome("x", ["x"], checks={"none": "exact", **refused})  # no scaling checked
    hidden = C.Outcome(  # a flat scaling's failure is a bug, whatever the fallback says
        "phi4", ["phi4"], checks={"none": "exact", **refused, "yarn": "failed: crash",
                                  "longrope": "exact"}
    )  # fmt: skip
    assert C.required_checks(phi3) == ("none", "longrope")
    assert C.counts([flat, phi3, wrong, unscaled, hidden])["exact"] == 2
    header = C.render([flat, phi3]).splitlines()[1]
    assert "2 exact under `none` and every scaling their transformers config takes" in header
    assert "longrope for the families whose config takes only it" in header
