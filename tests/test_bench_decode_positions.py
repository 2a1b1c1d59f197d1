"""``posenc bench decode-positions``: a tiny run writes its rows and block; targets read rows."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from posenc.bench import decode_positions
from posenc.bench.rows import BenchRows
from posenc.cli import app

runner = CliRunner()


def test_a_tiny_run_writes_every_call_at_every_position(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    out.write_text("# results\n")
    args = ["bench", "decode-positions", "--shapes", "1x4/2x1x16", "--dtypes", "float32",
            "--positions", "5,5000", "--repeats", "2", "--results", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "<!-- bench:decode-positions-cpu -->" in text
    doc = BenchRows.load(tmp_path / "rows" / "decode-positions-cpu.json")
    got = {(r["position"], r["call"]) for r in doc.rows}
    assert got == {(p, c) for p in (5, 5000) for c in decode_positions.CALLS}
    assert all(r["us"] > 0 and r["first_ms"] >= 0 for r in doc.rows)
    first = [r for r in doc.rows if r["position"] == 5]
    assert all(r["over_first"] == 1.0 for r in first)  # each call against its first position
    for call in decode_positions.CALLS:
        assert f"| 1x4/2x1x16 | f32 | 5,000 | {call} |" in text


def test_bad_positions_and_prefill_shapes_are_refused() -> None:
    for extra, message in (
        (["--positions", "a,b"], "positions must be comma-separated integers"),
        (["--positions", "-1"], "positions must be non-negative"),
        (["--shapes", "1x4x8x16"], "shapes need S = 1"),
    ):
        res = runner.invoke(app, ["bench", "decode-positions", *extra])
        assert res.exit_code != 0 and message in res.output, res.output


def test_the_no_cliff_target_reads_the_ratio_to_the_first_position() -> None:
    row = {"call": "RotaryEmbedding", "over_first": 1.1}
    assert decode_positions.target_text(row) == "ok"
    assert decode_positions.target_text({**row, "over_first": 6.0}) == "MISSED"
    assert decode_positions.target_text({**row, "call": "hf-step"}) == ""
    assert decode_positions.target_text({**row, "call": "hf-apply"}) == ""
