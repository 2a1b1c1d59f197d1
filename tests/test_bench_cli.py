"""``posenc bench``: help on every command, and a tiny run that writes its results block."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc.bench import decode_calls
from posenc.bench.harness import parse_shapes, write_section
from posenc.bench.rows import BenchRows
from posenc.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args", [["bench", "--help"], ["bench", "rope", "--help"], ["bench", "cos-sin", "--help"]]
)
def test_help(args: list[str]) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_tiny_rope_run_writes_its_block(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    out.write_text("# results\n\nhand-written analysis stays\n")
    args = ["bench", "rope", "--shapes", "1x2/1x8x16", "--dtypes", "float32", "--repeats", "2",
            "--skip", "hf-compile,rotary-embedding-torch", "--results", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "hand-written analysis stays" in text
    assert "<!-- bench:rope-cpu -->" in text and "| posenc |" in text and "| copy |" in text
    # A second run replaces the block instead of appending another.
    assert runner.invoke(app, args).exit_code == 0
    assert out.read_text().count("<!-- bench:rope-cpu -->") == 1


def test_bad_options_are_reported() -> None:
    res = runner.invoke(app, ["bench", "rope", "--shapes", "1x2x3"])
    assert res.exit_code != 0 and "BxHxSxD" in res.output
    res = runner.invoke(app, ["bench", "rope", "--skip", "nonsense"])
    assert res.exit_code != 0 and "unknown candidate" in res.output


def test_shapes_and_sections(tmp_path: Path) -> None:
    a, b, c, d1, d8 = parse_shapes("llama")
    assert c.d == 64
    assert (d1.b, d1.h, d1.hk, d1.s, d8.b) == (1, 32, 8, 1, 8) and d1.decode and not a.decode
    assert parse_shapes("decode,1x2x3x4") == [d1, d8, parse_shapes("1x2x3x4")[0]]
    assert (a.b, a.h, a.hk, a.s, a.d) == (1, 32, 32, 2048, 128)
    assert (b.h, b.hk) == (32, 8) and b.label == "[4, 32/8, 4096, 128]"
    path = tmp_path / "R.md"
    write_section(path, "x", "one")
    write_section(path, "y", "two")
    write_section(path, "x", "three")
    text = path.read_text()
    assert "three" in text and "two" in text and "one" not in text


def test_summary_fits_80_columns_with_every_column() -> None:
    from rich.console import Console

    from posenc.bench import rope

    widest = ["12x32/8x4096x128", "bf16", "0.13", "6.39", "0.10", "12.3", "12.5", "12.6", "150",
              "0.95", "1.05"]  # fmt: skip
    header, rows = rope.drop_empty_columns(rope.SUMMARY_HEADER, [widest, widest])
    console = Console(width=80, record=True)
    console.print(rope.summary_table(header, rows))
    lines = [line.rstrip() for line in console.export_text().splitlines() if line.strip()]
    assert max(map(len, lines)) <= 80
    assert len(lines) == 1 + 1 + 2  # title, header, two rows: nothing wrapped
    assert all("…" not in line for line in lines) and widest[0] in lines[2]


def test_load_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from posenc.bench import harness

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.5, 1.0, 1.0))
    assert "load average 3.50 exceeds the 2 cores" in harness.load_warning()
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    assert harness.load_warning() == ""


def test_decode_run_reports_the_module_comparison(tmp_path: Path) -> None:
    out = tmp_path / "RESULTS.md"
    args = ["bench", "rope", "--shapes", "1x4/2x1x16", "--dtypes", "float32", "--repeats", "3",
            "--skip", "hf-compile,rotary-embedding-torch", "--results", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "| posenc-module |" in text and "| hf-module |" in text and "| fresh |" in text
    assert "- target [1, 4/2, 1, 16] float32: decode >=2x hf-module" in text
    # The decode per-call table: every public call against transformers' apply, with rows.
    assert "<!-- bench:rope-decode-cpu -->" in text
    for call in decode_calls.CALLS:
        assert f"| 1x4/2x1x16 | f32 | {call} |" in text
    doc = BenchRows.load(tmp_path / "rows" / "rope-decode-cpu.json")
    assert {r["call"] for r in doc.rows} == set(decode_calls.CALLS)
    assert all(r["us"] > 0 and r["samples"] >= 5 for r in doc.rows)


def test_decode_call_targets_name_what_was_missed() -> None:
    row = {"call": "drop-in", "us": 10.0, "x_hf": 3.0}
    assert decode_calls.target_text(row) == "ok"
    assert decode_calls.target_text({**row, "us": 25.0}) == "MISSED us"
    assert decode_calls.target_text({**row, "us": 25.0, "x_hf": 1.5}) == "MISSED us, x hf"
    # rope_qk has the tighter budget and no transformers ratio target; hf-apply has none.
    assert decode_calls.target_text({**row, "call": "rope_qk", "us": 16.0, "x_hf": 1.0}) == (
        "MISSED us"
    )
    assert decode_calls.target_text({**row, "call": "hf-apply"}) == ""
