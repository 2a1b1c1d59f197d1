"""What the lab says while it runs: an unknown encoding's refusal (closest names, --import),
the `posenc` logger hierarchy, and plain progress lines with the cell's name when the output
is not a terminal."""

from __future__ import annotations

import difflib

import pytest
from typer.testing import CliRunner

from posenc import registry
from posenc.cli import app


@pytest.mark.parametrize("name", ["foo", "ropee", "t6"])
def test_an_unknown_encoding_suggests_the_closest_names_and_import(name, tmp_path):
    res = CliRunner().invoke(app, ["lab", "-e", f"none,{name}", "--dry-run", "-o", str(tmp_path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    closest = difflib.get_close_matches(name, registry.names(), n=3, cutoff=0.0)
    assert closest and f"did you mean {' or '.join(map(repr, closest))}?" in res.output
    assert f"unknown encoding {name!r}" in res.output and "--import MODULE" in res.output


def test_the_lab_logs_through_the_posenc_logger_hierarchy(caplog, monkeypatch):
    import logging

    from posenc.lab.grid.run import make_log
    from posenc.lab.training.dist import Dist

    monkeypatch.setattr(logging.getLogger("posenc"), "propagate", True)  # a CLI may have unset it
    with caplog.at_level(logging.INFO, logger="posenc"):
        make_log(Dist(), False, None)("lab: hello")
        make_log(Dist(), True, None)("quiet: not said")
    assert {(r.name, r.getMessage()) for r in caplog.records} == {
        ("posenc.lab.grid.run", "lab: hello")
    }
    import posenc.lab.grid.experiment  # noqa: F401  (the library adds no handler of its own)

    assert not [h for h in logging.getLogger("posenc.lab").handlers]


def test_plain_progress_names_each_task_at_a_bounded_rate(capsys):
    from posenc.runs.progress import PlainProgress, progress_bars, step_task

    with progress_bars(True) as progress:  # capsys' stdout is no terminal
        assert isinstance(progress, PlainProgress)
    now = [0.0]
    plain = PlainProgress(__import__("sys").stdout, every=10.0, clock=lambda: now[0])
    on_step, finish = step_task(plain, "rope s0", 100)
    assert on_step is not None
    for step in range(1, 101):  # a step a second for 100 s
        now[0] = float(step)
        on_step(step, 3.0, 1000.0)
    finish()
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("rope s0: ") for line in lines)
    assert lines[0].startswith("rope s0: started 0/100") and "done 100/100" in lines[-1]
    assert 9 <= len(lines) <= 12  # start, one each 10 s, done: not 100


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch, write_corpus):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path)


def test_a_run_to_a_file_prints_plain_lines_naming_the_cell(corpus_dir, tmp_path):
    args = ["lab", "-e", "none,rope", "--text", str(corpus_dir), "-L", "16", "--dim", "32",
            "--layers", "1", "--heads", "2", "--steps", "4", "--batch-size", "4",
            "--eval-tokens", "128", "--eval-lens", "1x,32", "--jobs", "1", "--threads", "1",
            "--rope-scalings", "yarn", "--no-plots", "-o", str(tmp_path / "o")]  # fmt: skip
    res = CliRunner().invoke(app, args)  # its output is no terminal
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "━" not in res.output  # no bar drawn into a file
    for cell in ("none s0", "rope s0"):
        assert any(ln.startswith(f"{cell}: started 0/4") for ln in lines), res.output
        assert any(ln.startswith(f"{cell}: done 4/4") for ln in lines), res.output
    assert any(ln.startswith("set-up: data: started") for ln in lines), res.output
    evals = [ln for ln in lines if " 16:" in ln and " 32:" in ln and "|" not in ln]
    assert len(evals) == 3 and all(
        ln.strip().startswith(("none (seed 0): base", "rope (seed 0): ")) for ln in evals
    ), evals
