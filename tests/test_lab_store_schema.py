"""A store that holds a row of a future results schema: ``posenc lab`` refuses it in the one
line ``posenc lab report`` gives, before anything is read or trained (it used to train every
cell and then end in the report's traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc.cli import app
from posenc.runs.store import RESULTS_FILE

TINY = ["-e", "none", "-L", "16", "--dim", "32", "--layers", "1", "--heads", "2", "--steps", "2",
        "--batch-size", "2", "--eval-tokens", "64", "--eval-lens", "1x", "--threads", "1",
        "-q", "--no-plots"]  # fmt: skip


@pytest.fixture
def future_store(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    row = {"schema": 99, "encoding": "rope", "seed": 0, "config_hash": "c", "group": "g"}
    (out / RESULTS_FILE).write_text(json.dumps(row) + "\n")
    return out


def _error_line(output: str) -> str:
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


def test_lab_refuses_a_future_schema_row_before_training(
    future_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_corpus
) -> None:
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    corpus = write_corpus(tmp_path, limit=2)
    before = (future_store / RESULTS_FILE).read_bytes()
    runner = CliRunner()
    run = runner.invoke(app, ["lab", *TINY, "--text", str(corpus), "--out", str(future_store)])
    assert run.exit_code == 2, run.output
    line = _error_line(run.output)
    assert "schema 99" in line and "new --out" in line
    assert not (future_store / "ckpt").exists()  # nothing trained
    assert (future_store / RESULTS_FILE).read_bytes() == before
    report = runner.invoke(app, ["lab", "report", "--out", str(future_store), "--no-plots"])
    assert report.exit_code == 2, report.output
    assert _error_line(report.output) == line  # the report's own words
