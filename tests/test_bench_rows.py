"""Bench rows (``posenc.bench.rows``) and the blocks rendered from them (``posenc.bench.render``):
the JSON round trip, every committed rows file against its block of ``benchmarks/RESULTS.md``,
and a bench run whose block is its rows' rendering."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc.bench import render
from posenc.bench.rows import SCHEMA, BenchRows, load_all, rows_path
from posenc.cli import app

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
runner = CliRunner()


def _block(text: str, name: str) -> str:
    m = re.search(
        rf"<!-- bench:{re.escape(name)} -->\n(.*?)\n<!-- /bench:{re.escape(name)} -->", text, re.S
    )
    assert m is not None, f"no block {name}"
    return m.group(1)


def test_an_infinite_figure_is_written_null_as_nan_is() -> None:
    """A ratio over a zero time is +Infinity: strict JSON (null, read back as NaN by
    ``number``), where the write used to raise."""
    from posenc.bench.rows import number

    doc = BenchRows("rope", "rope-cpu", rows=[{"speedup": math.inf, "x": (1.0, -math.inf)}])
    text = doc.to_json()

    def strict(name: str) -> None:
        raise AssertionError(f"bare {name}")

    back = json.loads(text, parse_constant=strict)["rows"][0]
    assert back == {"speedup": None, "x": [1.0, None]}
    assert math.isnan(number(back["speedup"]))


def test_rows_round_trip_and_refuse_other_schemas(tmp_path: Path) -> None:
    doc = BenchRows("rope", "rope-cpu", {"torch": "2"}, "cmd", {"device": "cpu"},
                    [{"median_ms": float("nan"), "x": [1.5, float("nan")]}])  # fmt: skip
    text = doc.to_json()
    assert "NaN" not in text and json.loads(text)["rows"][0]["median_ms"] is None
    back = BenchRows.load(doc.save(tmp_path / "rows" / "rope-cpu.json"))
    assert back.rows[0]["median_ms"] is None and back.device == "cpu" and back.env == doc.env
    assert rows_path(tmp_path / "RESULTS.md", "bias-cuda") == tmp_path / "rows" / "bias-cuda.json"
    assert list(load_all(tmp_path / "rows")) == ["rope-cpu"] and load_all(tmp_path / "x") == {}
    with pytest.raises(ValueError, match=f"schema must be {SCHEMA}, got 0"):
        BenchRows.from_json(json.dumps({**json.loads(text), "schema": 0}))
    with pytest.raises(ValueError, match="lack rows"):
        BenchRows.from_json(json.dumps({"schema": SCHEMA, "bench": "rope", "block": "x"}))
    with pytest.raises(ValueError, match="no renderer for bench 'nope'"):
        render.render(BenchRows("nope", "x"))


def test_committed_rows_render_their_blocks_byte_for_byte() -> None:
    """Each block of RESULTS.md that has a rows file is that file's rendering (the others,
    recorded before the benches wrote rows, stay as they were measured)."""
    docs = load_all(ROOT / "benchmarks" / "rows")
    assert "hf-model-cpu" in docs
    text = RESULTS.read_text()
    for name, doc in docs.items():
        assert render.render(doc).rstrip() == _block(text, name).rstrip(), name
    rows = docs["hf-model-cpu"].rows
    assert len(rows) == 6
    for row in rows:  # the speedup is the paired median, inside its quartiles
        assert row["speedup_q1"] <= row["speedup"] == row["speedup_median"] <= row["speedup_q3"]


def test_a_bench_run_writes_rows_and_the_block_rendered_from_them(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    out.write_text("# results\n\nanalysis stays\n")
    args = ["bench", "rope", "--shapes", "1x2/1x8x16,1x2/1x1x16", "--dtypes", "float32",
            "--repeats", "2", "--skip", "hf-compile,rotary-embedding-torch",
            "--results", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = BenchRows.load(tmp_path / "rows" / "rope-cpu.json")
    assert doc.bench == "rope" and doc.settings["backward"] is False and doc.command
    impls = {r["impl"]: r for r in doc.rows if r["shape"] == "1x2/1x8x16"}
    assert impls["posenc"]["status"] == "ok" and impls["posenc"]["median_ms"] > 0
    assert impls["liger"]["status"] == "not run" and impls["liger"]["note"] == "GPU only"
    text = out.read_text()
    assert "analysis stays" in text
    assert _block(text, "rope-cpu").rstrip() == render.render(doc).rstrip()
    assert "- target [1, 2/1, 1, 16] float32: decode >=2x hf-module" in text
    # Re-rendering from the rows file (after a format change, say) reproduces the block.
    out.write_text(text.replace("| posenc |", "| edited |"))
    res = runner.invoke(app, ["bench", "render", "--results", str(out)])
    assert res.exit_code == 0 and "rope-cpu" in res.output, res.output
    assert out.read_text() == text
    # --json puts the rows elsewhere and writes no block.
    res = runner.invoke(app, [*args[:-2], "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0 and BenchRows.load(tmp_path / "r.json").block == "rope-cpu"
