"""``posenc bench``: help on every command, and a tiny run that writes its results block."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc.bench.harness import parse_shapes, write_section
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
    a, b, c = parse_shapes("llama")
    assert c.d == 64
    assert (a.b, a.h, a.hk, a.s, a.d) == (1, 32, 32, 2048, 128)
    assert (b.h, b.hk) == (32, 8) and b.label == "[4, 32/8, 4096, 128]"
    path = tmp_path / "R.md"
    write_section(path, "x", "one")
    write_section(path, "y", "two")
    write_section(path, "x", "three")
    text = path.read_text()
    assert "three" in text and "two" in text and "one" not in text
