"""The Self-Extend / DCA bench (:mod:`posenc.bench.extend_attention`): a run on a tiny model
writes rows whose block renders from them, fused and explicit agreeing; nothing here is timed."""

from __future__ import annotations

import math

import pytest

transformers = pytest.importorskip("transformers")

from _tiny import tiny_lm  # noqa: E402
from posenc.bench import extend_attention as bench  # noqa: E402
from posenc.bench import render  # noqa: E402
from posenc.bench.rows import BenchRows  # noqa: E402


def test_a_run_writes_rows_that_render_and_round_trip() -> None:
    extensions = [
        {"method": "self_extend", "group_size": 3, "neighbor_window": 8},
        {"method": "dual_chunk", "chunk_size": 12, "local_size": 3},
    ]
    cases = [("prefill", 40, 1, True), ("decode", 30, 2, True), ("prefill", 20, 1, False)]
    rows = bench.run(tiny_lm(), extensions, cases)
    assert [(r.method, r.phase, r.tokens) for r in rows][:3] == [
        ("self_extend", "prefill", 40), ("dual_chunk", "prefill", 40),
        ("self_extend", "decode", 30),
    ]  # fmt: skip
    assert rows[0].stock_ms == rows[1].stock_ms  # one stock forward per case, for every method
    for r in rows:
        assert r.stock_ms > 0 and r.fused_ms > 0
        if r.tokens == 20:  # explicit not run: no figure, no difference
            assert math.isnan(r.explicit_ms) and math.isnan(r.max_abs_diff)
        else:
            assert r.max_abs_diff <= 1e-5
    doc = bench.extend_doc(rows, {"date": "today"}, "python benchmarks/extend_attention.py")
    again = BenchRows.from_json(doc.to_json())
    for back, row in zip(bench.rows_of(again), rows, strict=True):
        assert repr(back) == repr(row)  # every figure back as written (NaN as NaN)
    text = render.render(again)
    assert text == render.render(doc)
    assert "| prefill | 20 | self_extend | group_size=3,neighbor_window=8 |" in text
    assert again.rows[0]["fused_x_stock"] == rows[0].fused_ms / rows[0].stock_ms
