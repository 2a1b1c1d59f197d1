"""Per-step metrics a user's tools read (posenc.runs.metrics): metrics.jsonl beside each cell,
strict JSON, flushed as it goes, a resume without duplicated steps, and the TensorBoard event
file read back with TensorBoard's own reader."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from _tiny import tiny_lab_config
from posenc.lab.grid.experiment import RunOptions, run_grid
from posenc.lab.training import train as T
from posenc.runs.metrics import METRICS_FILE, MetricsLog, check_report_to, read_metrics
from test_lab_train import STEPS, _train, corpus  # noqa: F401  (the fixture)


def strict_lines(path):
    """Each line parsed as strict JSON: NaN/Infinity, which jq and JavaScript refuse, raise."""

    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def lr_formula(step, cfg):
    """The schedule written out independently: linear warmup, then cosine to the floor."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * (1 + math.cos(math.pi * t)) / 2


def test_each_step_is_a_line_that_matches_the_trained_statistics(corpus, tmp_path):  # noqa: F811
    result = _train(corpus, tmp_path / "c", metrics=MetricsLog(tmp_path / "c"))
    lines = strict_lines(tmp_path / "c" / METRICS_FILE)
    assert [r["step"] for r in lines] == list(range(1, STEPS.steps + 1))
    curve = result.stats["loss_curve_bits"]
    assert [[r["step"], r["loss_bits"]] for r in lines] == curve
    for r in lines:
        assert r["loss_bits"] == pytest.approx(r["loss"] / math.log(2), rel=1e-15)
        assert r["lr"] == pytest.approx(lr_formula(r["step"] - 1, STEPS), rel=1e-12)
        assert r["tokens"] == r["step"] * STEPS.batch_size * 16
    elapsed = [r["elapsed_s"] for r in lines]
    assert elapsed == sorted(elapsed) and elapsed[-1] == pytest.approx(
        result.stats["train_seconds"], rel=1e-9
    )


def test_a_resumed_run_drops_the_lines_past_its_checkpoint(corpus, tmp_path):  # noqa: F811
    ref = tmp_path / "ref"
    _train(corpus, ref, metrics=MetricsLog(ref))
    stop = T.StopFlag()

    def progress(done, bits, tps):
        if done == 7:
            stop.signum = 15

    run = tmp_path / "run"
    with pytest.raises(T.Interrupted):
        _train(corpus, run, ckpt_every=5, progress=progress, stop=stop, metrics=MetricsLog(run))
    # what a run killed after its checkpoint at step 7 had also logged: steps 8 and 9 and a
    # torn line; the resume redoes them from the checkpoint
    with open(run / METRICS_FILE, "a") as f:
        f.write('{"step": 8, "loss": 1.0}\n{"step": 9, "loss": 1.0}\n{"step": 1')
    assert [r["step"] for r in read_metrics(run / METRICS_FILE)] == [*range(1, 8), 8, 9]
    _train(corpus, run, ckpt_every=5, resume=True, metrics=MetricsLog(run))
    got, want = strict_lines(run / METRICS_FILE), strict_lines(ref / METRICS_FILE)
    assert [r["step"] for r in got] == list(range(1, STEPS.steps + 1))
    drop = ("elapsed_s",)  # wall time differs; every number of the training is bit for bit
    assert [{k: v for k, v in r.items() if k not in drop} for r in got] == [
        {k: v for k, v in r.items() if k not in drop} for r in want
    ]


def test_a_non_finite_loss_is_null_and_the_diverging_step_is_logged(corpus, tmp_path):  # noqa: F811
    log = MetricsLog(tmp_path)
    log.open(0)
    log.log(1, float("nan"), 1e-3, 64, 0.1)
    log.log(2, float("inf"), 1e-3, 128, 0.2)
    log.close()
    lines = strict_lines(tmp_path / METRICS_FILE)
    assert [(r["loss"], r["loss_bits"]) for r in lines] == [(None, None), (None, None)]
    huge = replace(STEPS, lr=1e30, grad_clip=0.0)  # diverges within a few steps
    with pytest.raises(FloatingPointError) as info:
        T.train_model(T.ModelConfig(**{**_tiny(), "encoding": "none"}), huge, corpus, seed=0,
                      identity={}, ckpt_dir=None, metrics=MetricsLog(tmp_path / "d"))  # fmt: skip
    lines = strict_lines(tmp_path / "d" / METRICS_FILE)
    assert lines[-1]["loss"] is None and f"at step {lines[-1]['step'] - 1}" in str(info.value)


def _tiny():
    from test_lab_train import TINY

    return TINY.to_dict()


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch, write_corpus):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path)


def tiny_grid(corpus_dir):
    return tiny_lab_config(corpus_dir, encodings=("none",))


def test_a_grid_cell_writes_its_metrics_beside_its_checkpoints(corpus_dir, tmp_path):
    out = tmp_path / "out"
    summary = run_grid(tiny_grid(corpus_dir), RunOptions(out=out, quiet=True, jobs=1))
    (row,) = summary.rows
    (path,) = out.glob(f"ckpt/none-s0-{row['train_hash']}/{METRICS_FILE}")
    lines = strict_lines(path)
    assert [[r["step"], r["loss_bits"]] for r in lines] == row["train"]["loss_curve_bits"]


def test_tensorboard_event_file_holds_the_rows_curve(corpus_dir, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    opts = RunOptions(out=out, quiet=True, jobs=1, report_to="tensorboard")
    (row,) = run_grid(tiny_grid(corpus_dir), opts).rows
    (folder,) = out.glob(f"ckpt/none-s0-{row['train_hash']}")
    assert list(folder.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(folder))
    events.Reload()
    lines = strict_lines(folder / METRICS_FILE)
    for key in ("loss", "loss_bits", "lr", "tokens", "elapsed_s"):
        got = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
        # TensorBoard stores float32
        assert got == [(r["step"], float(np.float32(r[key]))) for r in lines], key
    curve = [(e.step, e.value) for e in events.Scalars("train/loss_bits")]
    assert curve == [(s, float(np.float32(b))) for s, b in row["train"]["loss_curve_bits"]]


def test_report_to_is_checked_and_a_missing_tensorboard_is_one_line(monkeypatch):
    assert check_report_to("none") == "none"
    with pytest.raises(ValueError, match="--report-to must be one of none, tensorboard"):
        check_report_to("wandb")
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)
    with pytest.raises(ValueError, match=r"pip install -e '\.\[tensorboard\]' in the posenc clone"):
        check_report_to("tensorboard")


def test_cli_refuses_an_unknown_report_to_in_one_line():
    from typer.testing import CliRunner

    from posenc.cli import app

    res = CliRunner().invoke(app, ["lab", "--report-to", "wandb", "--dry-run"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert "--report-to must be one of none, tensorboard, got 'wandb'" in res.output
