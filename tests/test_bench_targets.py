"""``posenc.bench.targets``: every benchmark target judged from rows (the CPU blocks and
``make gpu-check`` share these rules). The rows here are written by hand, in the format the
benches write (:meth:`RopeCase.as_rows`, :meth:`BiasRow.as_row`), with figures chosen on each
side of each bound."""

from __future__ import annotations

import math

import pytest

from posenc.bench import targets
from posenc.bench.bias.rows import BiasRow, Measurement
from posenc.bench.harness import parse_shapes
from posenc.bench.rope import RopeCase
from posenc.bench.rows import BenchRows


def _case(shape: str, dtype: str, ms: dict[str, float], backward: bool = False) -> RopeCase:
    (s,) = parse_shapes(shape)
    case = RopeCase(s, dtype, backward=backward, bytes_moved=1000)
    case.medians.update(ms)
    case.firsts.update({k: 1.0 for k in ms})
    case.samples.update({k: 3 for k in ms})
    return case


def _rope_doc(cases: list[RopeCase], device: str, backward: bool = False) -> BenchRows:
    rows = [r for c in cases for r in c.as_rows()]
    settings = {"device": device, "backward": backward}
    doc = BenchRows("rope", f"rope-{device}", {}, "posenc bench rope", settings, rows)
    return BenchRows.from_json(doc.to_json())  # judged as read back from the file


def _results(found: list[targets.Target]) -> dict[tuple[str, str], str]:
    return {(t.name, t.case): t.result for t in found}


def test_gpu_rope_targets_from_rows() -> None:
    seven, eight, small = "1x32x2048x128", "4x32/8x4096x128", "4x8x4096x64"
    fast = {"copy": 1.0, "posenc": 1.1, "liger": 1.5, "hf-compile": 1.3}
    slow = {"copy": 1.0, "posenc": 1.6, "hf-compile": 1.3}
    backward = [
        _case(seven, "bfloat16", fast, True),
        _case(eight, "bfloat16", slow, True),
        _case(small, "bfloat16", slow, True),  # not a target shape
    ]
    decode = _case("8x32/8x1x128", "bfloat16", {"copy": 0.001, "posenc": 0.01, "hf-eager": 0.05})
    prefill = _case(eight, "bfloat16", fast)  # a forward prefill case: no GPU target
    got = _results(targets.rope(_rope_doc(backward, "cuda", True)))
    got |= _results(targets.rope(_rope_doc([prefill, decode], "cuda")))
    s7, s8 = "[1, 32, 2048, 128] bfloat16", "[4, 32/8, 4096, 128] bfloat16"
    assert got[("fwd+bwd >= 85% of copy bandwidth", s7)] == "met"  # 1.0 / 1.1 = 0.91
    assert got[("fwd+bwd >= 85% of copy bandwidth", s8)] == "MISSED"  # 1.0 / 1.6 = 0.63
    assert got[("fwd+bwd faster than liger", s7)] == "met"
    assert got[("fwd+bwd faster than liger", s8)] == "not measured"
    assert got[("fwd+bwd faster than hf-compile", s7)] == "met"
    assert got[("fwd+bwd faster than hf-compile", s8)] == "MISSED"
    assert got[("decode faster than hf-eager", "[8, 32/8, 1, 128] bfloat16")] == "met"
    module = ("decode step faster than transformers' (module rows)", "[8, 32/8, 1, 128] bfloat16")
    assert got[module] == "not measured"
    assert not any("[4, 8, 4096, 64]" in case for _, case in got)
    assert sum(name.startswith("decode") for name, _ in got) == 2 and len(got) == 8
    why = {t.name: t.why for t in targets.rope(_rope_doc(backward[1:2], "cuda", True))}
    assert why["fwd+bwd faster than liger"] == "not measured (liger did not run)"
    # The dry run judges the GPU rules on CPU rows of any prefill shape.
    tiny = _rope_doc([_case("1x4/2x16x32", "float32", fast, True)], "cpu", True)
    assert targets.rope(tiny) == []  # CPU rules: no backward target
    assert len(targets.judge(tiny, gpu=True, all_shapes=True)) == 3


def test_cpu_rope_targets_follow_the_bounds() -> None:
    ms = {"copy": 1.0, "fresh": 2.0, "posenc": 2.3, "posenc-inplace": 1.5, "hf-eager": 9.3,
          "hf-compile": 2.8}  # fmt: skip
    f32 = {t.name: t.result for t in targets.rope_cpu(_case("1x32x2048x128", "float32", ms))}
    assert f32 == {">=1.2x hf-compile": "met", "in-place >=0.6 copy": "met",
                   "<=1.2x fresh": "met"}  # fmt: skip
    bf16 = {t.name: t.result for t in targets.rope_cpu(_case("1x32x2048x128", "bfloat16", ms))}
    assert bf16[">=4x hf-eager"] == "met" and "<=1.2x fresh" not in bf16  # 9.3 / 2.3 = 4.04
    slower = targets.rope_cpu(_case("1x32x2048x128", "bfloat16", {**ms, "hf-eager": 9.1}))
    assert [t.result for t in slower if t.name == ">=4x hf-eager"] == ["MISSED"]  # 3.96
    decode = _case("1x32/8x1x128", "float32", {"posenc-module": 1.0, "hf-module": 1.9})
    (t,) = targets.rope_cpu(decode)
    assert (t.name, t.result, t.text) == (
        "decode >=2x hf-module", "MISSED", "decode >=2x hf-module MISSED"
    )  # fmt: skip
    (absent,) = targets.rope_cpu(_case("1x32/8x1x128", "float32", {"posenc": 1.0}))
    assert absent.result == "not measured" and absent.text == "decode >=2x hf-module: not measured"
    assert targets.rope_cpu(_case("1x32x2048x128", "float32", ms, backward=True)) == []


def _bias(s: int, device: str, mat: float | None, flex: float | None, causal: float = 1.0) -> dict:
    def m(ms: float | None) -> Measurement:
        return Measurement("ok", ms, 1.0, 0, 3) if ms is not None else Measurement("skipped")

    mode = "inference" if device == "cpu" else "forward+backward"
    row = BiasRow("alibi", s, "bfloat16", device, mode, 8, 64, 1, m(mat), m(flex), m(causal))
    return BiasRow.from_row(
        BenchRows.from_json(_bias_doc([row.as_row()]).to_json()).rows[0]
    ).as_row()


def _bias_doc(rows: list[dict]) -> BenchRows:
    return BenchRows("bias", "bias-cuda", {}, "", {"device": "cuda"}, rows)


def test_bias_targets_from_rows() -> None:
    cases = {
        (2048, "cpu", 3.0, 2.0): ("flex >=1.5x materialized", "met"),
        (2048, "cpu", 2.9, 2.0): ("flex >=1.5x materialized", "MISSED"),
        (2048, "cpu", None, 2.0): ("flex >=1.5x materialized", "not measured"),
        (8192, "cuda", 5.0, 1.2): ("flex <=1.25x causal at 8k", "met"),
        (8192, "cuda", 5.0, 1.3): ("flex <=1.25x causal at 8k", "MISSED"),
        (8192, "cuda", 5.0, None): ("flex <=1.25x causal at 8k", "not measured"),
        (65536, "cuda", None, 9.0): ("flex runs at 64k, materialized cannot", "met"),
        (65536, "cuda", 9.0, 9.0): ("flex runs at 64k, materialized cannot", "MISSED"),
    }
    for (s, dev, mat, flex), want in cases.items():
        t = targets.bias_row(_bias(s, dev, mat, flex))
        assert t is not None and (t.name, t.result) == want, (s, dev, mat, flex, t)
    assert targets.bias_row(_bias(1024, "cpu", 3.0, 1.0)) is None  # below TARGET_MIN_S
    assert targets.bias_row(_bias(4096, "cuda", 3.0, 1.0)) is None
    skipped = targets.bias_row(_bias(2048, "cpu", None, 2.0))
    assert skipped is not None and skipped.text.endswith(": - (materialized skipped; flex ran)")
    rows = [
        _bias(2048, "cpu", 3.0, 2.0),
        _bias(4096, "cpu", 2.0, 2.0),
        _bias(8192, "cpu", None, 1.0),
    ]
    line = targets.bias_cpu_summary(rows)
    assert line is not None and "met in 1 of 2 rows" in line
    assert "missed: alibi s=4096 bfloat16 (1.00x)" in line and "1 more rows" in line
    assert len(targets.judge(_bias_doc(rows))) == 3


def _lab_row(enc: str, bits: dict[int, float]) -> dict:
    results = {str(n): {"bits": b, "acc": None} for n, b in bits.items()}
    return {
        "encoding": enc, "seed": 0, "params": 1, "train_len": min(bits),
        "train": {"tokens_per_s": 1.0, "final_loss_bits": 1.0},
        "eval": {"lengths": sorted(bits), "variants": {"base": {"label": "base", "results": results}}},
    }  # fmt: skip


@pytest.mark.parametrize("alibi_rise", [0.0, 0.5])
def test_lab_ordering_follows_the_published_clauses(alibi_rise: float) -> None:
    lens = (512, 1024, 2048, 4096)
    table = {  # degradation past L: sinusoidal > rope > t5 > alibi (flat)
        "sinusoidal": (3.0, 3.9, 4.5, 5.0),
        "rope": (2.9, 3.0, 3.3, 3.6),
        "t5": (3.0, 2.98, 3.05, 3.1),
        "alibi": (3.0, 2.97, 2.96, 2.96 + alibi_rise),
    }
    rows = [_lab_row(e, dict(zip(lens, v, strict=True))) for e, v in table.items()]
    got = {t.name: t for t in targets.lab_ordering(rows)}
    assert got["sinusoidal breaks hardest past L"].result == "met"
    assert got["RoPE degrades"].result == "met"
    flat = "met" if alibi_rise == 0 else "MISSED"
    assert got["ALiBi stays flat"].result == flat
    assert got["T5 between ALiBi and RoPE"].result == flat
    if alibi_rise:
        assert got["ALiBi stays flat"].measured == "largest rise over L +0.460 bits"
    assert all(t.case == "512 -> 4096" for t in got.values())
    assert targets.lab_ordering([]) == []
    assert math.isclose(targets.FLAT_BITS, 0.03)
