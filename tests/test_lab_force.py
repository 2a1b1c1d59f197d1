"""posenc lab --force: the named cells train again from step 0 (their finished weights and
stored row ignored), the new row is the one read back and reported, and a label that is not
one of the grid's is refused before anything trains."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from posenc.cli import app
from posenc.lab.cells import presets as P
from posenc.lab.grid.experiment import RunOptions, run_grid
from posenc.lab.reports import report as R
from posenc.runs.store import RESULTS_FILE, ResultStore


@pytest.fixture
def cfg(tmp_path, monkeypatch, write_corpus) -> P.LabConfig:
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return replace(
        P.LabConfig(),
        preset="test",
        encodings=("none", "rope"),
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=4, batch_size=4, warmup_steps=1),
        data=P.DataConfig(source="text", path=str(write_corpus(tmp_path, limit=4))),
        eval=P.EvalConfig(lengths=("1x",), tokens=64, batch_tokens=64, curve_points=4),
        ckpt_every=2,
    )


def test_forced_cells_train_again_and_their_new_row_is_the_one_read(cfg, tmp_path):
    out = tmp_path / "out"
    first = run_grid(cfg, RunOptions(out=out, jobs=1, quiet=True))
    assert first.trained == ["none (seed 0)", "rope (seed 0)"]
    final = next(out.glob("ckpt/rope-*/final.pt"))
    mtime = final.stat().st_mtime_ns

    again = run_grid(cfg, RunOptions(out=out, jobs=1, quiet=True, force=("rope",)))
    assert again.trained == ["rope (seed 0)"] and again.skipped == ["none (seed 0)"]
    new = again.rows[0]
    assert not new["runtime"]["reused_weights"] and new["runtime"]["resumed_from"] is None
    assert final.stat().st_mtime_ns != mtime  # trained and written again, from step 0
    assert new["train"]["loss_curve_bits"] == first.rows[1]["train"]["loss_curve_bits"]

    store = ResultStore(out / RESULTS_FILE)
    assert len(store.path.read_text().splitlines()) == 3  # appended, nothing rewritten
    rows = store.rows()
    assert [r["encoding"] for r in rows] == ["none", "rope"]  # in the first row's place
    assert rows[1]["runtime"]["cell_seconds"] == new["runtime"]["cell_seconds"]  # the new one
    reported = R.load_rows(out)
    assert [r["encoding"] for r in reported] == ["none", "rope"]  # one row per cell, not two
    assert reported[1]["finished_at"] == new["finished_at"]
    assert run_grid(cfg, RunOptions(out=out, jobs=1, quiet=True)).trained == []  # all stored


def test_force_all_reruns_every_cell_on_worker_processes(cfg, tmp_path):
    out = tmp_path / "out"
    run_grid(cfg, RunOptions(out=out, jobs=1, quiet=True))
    again = run_grid(cfg, RunOptions(out=out, jobs=2, threads=1, quiet=True, force=("all",)))
    assert again.trained == ["none (seed 0)", "rope (seed 0)"] and not again.skipped
    assert not any(r["runtime"]["reused_weights"] for r in again.rows)
    lines = (out / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 4 and len(ResultStore(out / RESULTS_FILE).rows()) == 2


def test_a_label_not_in_the_grid_is_refused_before_anything_trains(cfg, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"--force alibi: not a cell of this grid.*none, rope"):
        run_grid(cfg, RunOptions(out=out, quiet=True, force=("rope", "alibi")))
    assert not out.exists()
    args = ["lab", "-e", "none,rope:base=500", "--text", cfg.data.path or "", "-L", "16",
            "--dim", "32", "--layers", "1", "--heads", "2", "--steps", "2", "--batch-size", "2",
            "--eval-tokens", "64", "--eval-lens", "1x", "--out", str(out), "--no-plots",
            "--force", "rope"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "none, rope:base=500" in lines[0], res.output
    assert not (out / "ckpt").exists() and not (out / RESULTS_FILE).exists()  # nothing trained
