"""apply_posenc on three families of transformers 5.25 it refused before (docs/model.md's
coverage table), each on the tiny random model of :mod:`posenc.testing.coverage`:

* Ergo: its rotary class takes float64 angles of float32 frequencies
  (``position.double() * inv_freq.double()``); :class:`~posenc.hf.HFRotaryEmbedding` computes
  its tables so, and each planted fault (float32 angles; float64 frequencies) is caught at the
  far positions where they differ.
* Qwen4-exp: its ``apply_rotary_pos_emb(q, k=None, cos=None, sin=None)`` rotates q and k, or q
  alone (its indexer's queries, and its pooled keys ``[n, 1, d]``); its rotary class is
  Qwen3.5's interleaved M-RoPE.
* Inkling2: its text decoder has no RoPE at all (a learned relative position bias), so it is
  refused saying so, and ``rope_from_hf`` builds none.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from posenc.hf import HFRotaryEmbedding, apply_posenc, mrope_read, remove_posenc, rope_from_hf
from posenc.hf import one_tensor as hf_one_tensor
from posenc.hf import patch as hf_patch
from posenc.hf import rotary as hf_rotary
from posenc.testing import coverage as C

CHECKS = ("none", "linear", "yarn", "llama3")
SCALED = [None, *C.SCALINGS.values()]
IDS = ["none", *C.SCALINGS]
# Far positions: Ergo's float32-rounded frequencies against float64 ones move an angle by
# position * f * 6e-8 (a relative angle by distance * f * 6e-8), float32 angles by their ulp.
FAR = torch.tensor([[0, 1, 63, 255, 1000, 100_000, 1_000_000, 4_000_000]])
# A prefill whose second half jumps 4e6 positions: Ergo's sliding layers (window 8) then see
# keys 4e6 positions away, where a frequency fault is no longer a common phase.
JUMP = torch.cat([torch.arange(12), torch.arange(12) + 4_000_000])[None]


@pytest.fixture(scope="module")
def models() -> Iterator[dict[str, Any]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' fallback kernels say so on build
        yield {f: C.tiny_model(f) for f in ("ergo", "qwen4_exp_text", "inkling2_text")}


def _verdict(model: Any, family: str, check: str) -> str:
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(1))
    stock = C.prefill_and_decode(model, ids)
    if check == "none":
        apply_posenc(model)
        want = stock
    else:
        scaling = C.SCALINGS[check]
        apply_posenc(model, scaling=scaling)
        want = C.prefill_and_decode(C.scaled_reference(model, scaling), ids)
    try:
        return C._compare(C.prefill_and_decode(model, ids), want)
    finally:
        remove_posenc(model)


# --- Ergo ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS)
def test_ergo_prefill_and_decode_equal_transformers(models: dict[str, Any], check: str) -> None:
    assert _verdict(models["ergo"], "ergo", check) == "exact"


def _table_error(stock: Any, ours: HFRotaryEmbedding) -> float:
    """Largest |cos/sin difference| over Ergo's RoPE layer types at :data:`FAR`."""
    x, worst = torch.zeros(1), 0.0
    for layer_type in stock.rope_type:  # the types with RoPE (its full layers have none)
        for a, b in zip(stock(x, FAR, layer_type), ours(x, FAR, layer_type), strict=True):
            worst = max(worst, float((a - b).abs().max()))
    return worst


def _ergo_tables(model: Any, scaling: dict[str, Any] | None) -> tuple[Any, HFRotaryEmbedding]:
    reference = model if scaling is None else C.scaled_reference(model, scaling)
    return reference.model.rotary_emb, HFRotaryEmbedding(
        model.config, scaling, table_layout="repeat"
    )


def _float64_frequencies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted fault: posenc's modules built in float64, frequencies included."""
    build = hf_rotary.rope_module
    monkeypatch.setattr(
        hf_rotary, "rope_module", lambda kw, *a, **k: build(kw, angle_dtype=torch.float64)
    )


@pytest.mark.parametrize("scaling", SCALED, ids=IDS)
def test_ergo_tables_are_float64_angles_of_float32_frequencies(
    models: dict[str, Any], scaling: dict[str, Any] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    stock, ours = _ergo_tables(models["ergo"], scaling)
    assert ours.float64_angles and _table_error(stock, ours) <= 1e-6
    ours.float64_angles = False  # float32 angles, posenc's cached tables
    assert _table_error(stock, ours) > 1e-3
    _float64_frequencies(monkeypatch)
    assert _table_error(stock, _ergo_tables(models["ergo"], scaling)[1]) > 1e-3


def _jump_error(model: Any, scaling: dict[str, Any]) -> float:
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = C.scaled_reference(model, scaling)(ids, position_ids=JUMP).logits
        apply_posenc(model, scaling=scaling)
        try:
            got = model(ids, position_ids=JUMP).logits
        finally:
            remove_posenc(model)
    return float((got - want).abs().max())


def test_ergo_logits_at_far_positions_catch_each_planted_fault(
    models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model's logits (tolerance :data:`~posenc.testing.coverage.TOL`) over keys 4e6
    positions back: exact, and each fault moves them past the tolerance (by ~3e-3)."""
    model, yarn = models["ergo"], C.SCALINGS["yarn"]
    assert _jump_error(model, yarn) <= C.TOL
    with monkeypatch.context() as m:
        m.setattr(hf_rotary, "FLOAT64_ANGLE_MODEL_TYPES", frozenset())
        assert _jump_error(model, yarn) > 10 * C.TOL
    _float64_frequencies(monkeypatch)
    assert _jump_error(model, yarn) > 10 * C.TOL


def test_ergo_rope_from_hf_still_refuses_one_angle_dtype(models: dict[str, Any]) -> None:
    """rope_from_hf's module has one angle_dtype for frequencies and angles: Ergo's stays a
    one-line refusal naming the drop-in that reproduces it."""
    with pytest.raises(ValueError, match=r"float64 angles of float32 frequencies.*HFRotary"):
        rope_from_hf(models["ergo"].config)


# --- Qwen4-exp -------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS)
def test_qwen4_exp_prefill_and_decode_equal_transformers(
    models: dict[str, Any], check: str
) -> None:
    assert _verdict(models["qwen4_exp_text"], "qwen4_exp_text", check) == "exact"


def _qwen4_stand_in() -> tuple[Any, Any]:
    from transformers.models.qwen4_exp import modeling_qwen4_exp as modeling

    (rotation,) = hf_patch._modeling("qwen4_exp_text")[1].values()
    assert rotation.optional_k and rotation.partial
    stock = modeling.apply_rotary_pos_emb
    return stock, hf_patch.fused_rotation(rotation, stock, "torch")


def test_qwen4_exp_stand_in_takes_both_call_forms() -> None:
    """Each form its attention and indexer call, with the stock function's result: a pair with
    k, one tensor without (partial tables: channels past them pass)."""
    stock, ours = _qwen4_stand_in()
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    angle = torch.randn(2, 5, 6)
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((q, k, cos, sin), {}),
        ((q,), {"k": k, "cos": cos, "sin": sin}),
        ((q,), {"cos": cos, "sin": sin}),
        ((q.transpose(1, 2),), {"cos": cos, "sin": sin, "unsqueeze_dim": 2}),
        ((q[:, :1].reshape(-1, 1, 16),), {"cos": cos.reshape(-1, 12), "sin": sin.reshape(-1, 12)}),
    ]
    for args, kw in calls:
        want, got = stock(*args, **kw), ours(*args, **kw)
        assert type(got) is type(want), (len(args), sorted(kw))
        pairs = zip(want, got, strict=True) if isinstance(want, tuple) else [(want, got)]
        for w, g in pairs:
            assert g.shape == w.shape and torch.allclose(g, w, atol=1e-6), (len(args), sorted(kw))


def test_qwen4_exp_indexer_queries_go_through_posenc(
    models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The indexer's one-tensor call reaches posenc's kernel (not the stock function)."""
    seen: list[tuple[int, ...]] = []
    rotate = hf_one_tensor.apply_rotary_emb

    def spy(x: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        seen.append(tuple(x.shape))
        return rotate(x, *a, **k)

    monkeypatch.setattr(hf_one_tensor, "apply_rotary_emb", spy)
    model = apply_posenc(models["qwen4_exp_text"])
    try:
        with torch.no_grad():
            model(torch.randint(3, 128, (1, 9)))
    finally:
        remove_posenc(model)
    config: Any = model.config
    assert (1, 9, config.indexer_n_heads, config.indexer_head_dim) in seen


def _mrope_error(model: Any, scaling: dict[str, Any]) -> float:
    """posenc's rotary against transformers' built with ``scaling``, on distinct temporal,
    height and width positions ``[3, b, s]``."""
    stock = C.scaled_reference(model, scaling).model.rotary_emb
    ours = HFRotaryEmbedding(model.config, scaling)
    positions = torch.randint(0, 200, (3, 2, 7), generator=torch.Generator().manual_seed(2))
    x = torch.zeros(1)
    return max(
        float((a - b).abs().max())
        for a, b in zip(stock(x, positions), ours(x, positions), strict=True)
    )


def test_qwen4_exp_scaled_mrope_with_3d_positions(
    models: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its rotary class is Qwen3.5's interleaved M-RoPE; the same sections laid out
    contiguously (Qwen2-VL's) are caught."""
    model, yarn = models["qwen4_exp_text"], C.SCALINGS["yarn"]
    assert _mrope_error(model, yarn) <= 1e-6
    monkeypatch.setattr(mrope_read, "INTERLEAVED_MROPE_MODEL_TYPES", frozenset())
    assert _mrope_error(model, yarn) > 0.1


def test_qwen4_exp_default_sections_cover_fewer_pairs_than_rotated() -> None:
    """Its default config rotates 128 pairs with sections [11, 11, 10]: transformers'
    recomposition leaves every pair past them temporal, and posenc's temporal section takes the
    rest (hf.mrope_read.temporal_rest); with distinct axes the rotation is transformers'."""
    from transformers import CONFIG_MAPPING
    from transformers.models.qwen4_exp import modeling_qwen4_exp as M

    config = CONFIG_MAPPING["qwen4_exp_text"]()
    rope = rope_from_hf(config)
    assert list(rope.mrope_section) == [107, 11, 10]
    t = torch.arange(40)
    positions = torch.stack([t, 2 * t + 3, t % 7])[:, None, :]  # [3, 1, 40]: three axes apart
    q, k = torch.randn(1, 2, 40, 256), torch.randn(1, 1, 40, 256)
    cos, sin = M.Qwen4ExpTextRotaryEmbedding(config)(q, positions)
    want = M.apply_rotary_pos_emb(q, k, cos, sin)
    for got, ref in zip(rope(q, k, positions), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


# --- Inkling2 --------------------------------------------------------------------------------------


def test_inkling2_text_is_refused_as_having_no_rope(models: dict[str, Any]) -> None:
    model = models["inkling2_text"]
    with pytest.raises(ValueError, match=r"'inkling2_text' \(it has no RoPE: a relative position"):
        apply_posenc(model)
    with pytest.raises(ValueError, match="has no rotary position encoding"):
        rope_from_hf(model.config)
