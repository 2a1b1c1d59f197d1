"""posenc.lab grids: the results store, skip-finished, reports, the CLI, kill-and-resume in a
subprocess, and DDP under torchrun."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc.cli import app
from posenc.lab import presets as P
from posenc.lab import report as R
from posenc.lab.experiment import RunOptions, check_config, resolve_encodings, run_grid
from posenc.lab.store import RESULTS_FILE, ResultStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "corpus"
    d.mkdir()
    src = Path(P.__file__).parent
    for f in sorted(src.glob("*.py")):  # real text: this package's own source
        (d / f.name).write_bytes(f.read_bytes())
    return d


def tiny_config(corpus_dir, encodings=("none", "learned"), **kw) -> P.LabConfig:
    return replace(
        P.LabConfig(),
        preset="test",
        encodings=tuple(encodings),
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=6, batch_size=4, warmup_steps=2),
        data=P.DataConfig(source="text", path=str(corpus_dir)),
        eval=P.EvalConfig(lengths=("1x", "2x"), tokens=256, batch_tokens=128, curve_points=8),
        ckpt_every=2,
        **kw,
    )


# --- store ---------------------------------------------------------------------------------


def test_store_appends_once_per_key_and_survives_a_torn_line(tmp_path):
    store = ResultStore(tmp_path / RESULTS_FILE)
    row = {"encoding": "none", "seed": 0, "config_hash": "abc", "x": 1}
    assert store.append(row) and not store.append({**row, "x": 2})
    with open(store.path, "a") as f:
        f.write('{"encoding": "rope", "seed": 0, "conf')  # a writer killed mid-row
    with pytest.warns(UserWarning, match="torn"):
        assert [r["x"] for r in store.rows()] == [1]
    with pytest.warns(UserWarning, match="torn"):
        assert store.append({"encoding": "rope", "seed": 0, "config_hash": "abc"})
    with pytest.warns(UserWarning, match="torn"):  # still skipped, and the new row is whole
        assert [r["encoding"] for r in store.rows()] == ["none", "rope"]


# --- configuration -------------------------------------------------------------------------


def test_lengths_and_encodings_are_checked():
    assert P.resolve_lengths(("1x", "2x", 40, "64"), 16) == [16, 32, 40, 64]
    for bad in ("0x", "-3", "1.5x", "abc", 0):
        with pytest.raises(ValueError, match="eval length"):
            P.resolve_lengths((bad,), 15)
    with pytest.raises(ValueError, match="unknown encoding 'nope'"):
        resolve_encodings(["none", "nope"])
    with pytest.raises(ValueError, match="unknown option"):
        resolve_encodings(["sinusoidal:colour=1"])
    assert resolve_encodings(["none", "sinusoidal:base=500"]) == ["none", "sinusoidal:base=500"]
    assert P.parse_encoding("rope:base=500:layout=interleaved") == (
        "rope",
        {"base": 500, "layout": "interleaved"},
    )
    assert resolve_encodings(["default"])[:3] == ["none", "sinusoidal", "learned"]
    with pytest.raises(ValueError, match="stride"):
        check_config(replace(P.LabConfig(), eval=P.EvalConfig(stride=1000)))
    with pytest.raises(ValueError, match="steps must be a positive"):
        check_config(replace(P.LabConfig(), train=P.TrainConfig(steps=0)))


def test_presets_are_sized_as_documented():
    from posenc.model import TransformerLM

    gpu = P.preset("gpu")
    params = 14 * 12 * gpu.model.dim**2  # attention 4 d^2 + MLP 8 d^2 per block
    assert 95e6 < params < 105e6 and gpu.train_len == 512 and max(gpu.eval_lengths()) >= 4096
    small = P.preset("cpu-small")
    n = TransformerLM(P.model_config(small, "none", 256)).num_params()
    assert n < 1e6 and len(small.encodings) >= 8
    with pytest.raises(ValueError, match="unknown preset"):
        P.preset("tpu")


def test_compile_changes_no_hash_and_gpu_small_compiles():
    """``compile`` says how a cell trains, not what it is: like ``threads``, it is in no hash, so a
    finished cell is found again (and its checkpoint reused) whichever way it was trained."""
    base = P.preset("gpu-small")
    assert base.compile and not P.preset("cpu-small").compile and not P.LabConfig().compile

    def hashes(c: P.LabConfig) -> list[str]:
        train = P.train_identity(c, "rope", 0, 256, "fp")
        cell = P.cell_identity(train, P.eval_identity(c))
        return [P.stable_hash(x) for x in (train, cell, P.group_identity(c, "fp"))]

    for cfg in (base, P.preset("cpu-small")):
        assert hashes(replace(cfg, compile=True)) == hashes(replace(cfg, compile=False))
    # The CLI flag overrides the preset either way.
    from posenc.lab.cli import build_config

    assert not build_config("gpu-small", None, None, None, 1, 0, compile_model=False).compile
    assert build_config("cpu-small", None, None, None, 1, 0, compile_model=True).compile
    assert build_config("gpu-small", None, None, None, 1, 0).compile


# --- grid ----------------------------------------------------------------------------------


def test_grid_runs_skips_finished_cells_and_reports(corpus_dir, tmp_path):
    cfg = tiny_config(corpus_dir)
    out = tmp_path / "out"
    first = run_grid(cfg, RunOptions(out=out, quiet=True))
    assert first.trained == ["none (seed 0)", "learned (seed 0)"] and not first.failed
    rows = ResultStore(out / RESULTS_FILE).rows()
    assert [r["encoding"] for r in rows] == ["none", "learned"]
    r0 = rows[0]
    assert r0["eval"]["variants"]["base"]["results"]["32"]["bits"] < 8
    assert r0["train"]["tokens_per_s"] > 0 and r0["versions"]["torch"]
    assert rows[1]["eval"]["variants"]["base"]["results"]["32"]["bits"] is None  # learned past L

    second = run_grid(cfg, RunOptions(out=out, quiet=True))
    assert second.trained == [] and len(second.skipped) == 2
    assert not any(r["runtime"]["compiled"] for r in rows)  # on the CPU, never
    # compile is in no hash: the cells trained eagerly are the compiled configuration's too.
    compiled = run_grid(replace(cfg, compile=True), RunOptions(out=out, quiet=True))
    assert compiled.trained == [] and len(compiled.skipped) == 2
    # A new eval length is a new cell, but the trained weights are reused.
    longer = replace(cfg, eval=replace(cfg.eval, lengths=("1x", "2x", "4x")))
    third = run_grid(longer, RunOptions(out=out, quiet=True))
    assert len(third.trained) == 2
    assert all(r["runtime"]["reused_weights"] for r in third.rows)
    assert (
        third.rows[0]["eval"]["variants"]["base"]["results"]["16"]["bits"]
        == r0["eval"]["variants"]["base"]["results"]["16"]["bits"]
    )

    written = R.write_report(out, group=first.group)
    assert {"table", "csv", "lengths_plot", "positions_plot"} <= set(written)
    assert all(p.exists() and p.stat().st_size > 0 for p in written.values())
    table = written["table"].read_text()
    assert (
        "| none | " in table and "learned +interp" in table and "×NoPE" in table and "1.00" in table
    )
    csv_lines = written["csv"].read_text().splitlines()
    assert len(csv_lines) == 1 + 2 * 2 + 2  # none, learned, learned+interp at 2 lengths
    assert len(R.groups(out)) == 2


def test_a_failing_cell_does_not_stop_the_grid(corpus_dir, tmp_path):
    cfg = tiny_config(corpus_dir, encodings=("sinusoidal:layout=nope", "none"))
    summary = run_grid(cfg, RunOptions(out=tmp_path / "o", quiet=True))
    assert summary.trained == ["none (seed 0)"]
    assert "layout" in summary.failed["sinusoidal:layout=nope (seed 0)"]


def test_task_grid(corpus_dir, tmp_path):
    cfg = tiny_config(corpus_dir, encodings=("none",))
    cfg = replace(cfg, data=P.DataConfig(source="task", task="copy"))
    summary = run_grid(cfg, RunOptions(out=tmp_path / "o", quiet=True))
    row = summary.rows[0]
    assert row["eval"]["unit"] == "token"
    assert 0 <= row["eval"]["variants"]["base"]["results"]["32"]["acc"] <= 1
    _, body = R.table_cells(summary.rows)
    assert body[0][0] == "none" and body[0][1].endswith("%)")  # bits (answer accuracy)


def test_cli_runs_and_reports(corpus_dir, tmp_path):
    out = tmp_path / "cli"
    args = ["lab", "-e", "none", "--text", str(corpus_dir), "-L", "16", "--dim", "32", "--layers",
            "1", "--heads", "2", "--steps", "4", "--batch-size", "4", "--eval-tokens", "128",
            "--eval-lens", "1x,32", "--out", str(out), "--no-plots"]  # fmt: skip
    runner = CliRunner()
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "train short, test long" in res.output and (out / RESULTS_FILE).exists()
    res = runner.invoke(app, ["lab", "report", "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    assert "none" in res.output and (out / "report" / "results.csv").exists()
    res = runner.invoke(app, [*args[:-3], "--eval-lens", "0x", "--out", str(out)])
    assert res.exit_code == 2 and "eval length" in res.output
    res = runner.invoke(app, ["lab", "report", "--out", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no results" in res.output


# --- kill and resume -----------------------------------------------------------------------

KILL_ARGS = ["-e", "none,sinusoidal", "-L", "16", "--dim", "32", "--layers", "1", "--heads", "2",
             "--steps", "300", "--batch-size", "4", "--eval-tokens", "256", "--eval-lens",
             "1x,2x", "--ckpt-every", "20", "--threads", "1", "-q", "--no-plots"]  # fmt: skip


def _lab(corpus_dir, out, *extra, wait=True):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "posenc", "lab", *KILL_ARGS, "--text", str(corpus_dir),
           "--out", str(out), *extra]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if wait:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output.decode()
    return proc


def _metrics(row):
    return (
        row["train"]["final_loss_bits"],
        row["train"]["loss_curve_bits"],
        {
            v: {n: r["bits"] for n, r in x["results"].items()}
            for v, x in row["eval"]["variants"].items()
        },
    )


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    mp = pytest.MonkeyPatch()
    mp.setenv("POSENC_CACHE", str(tmp / "cache"))
    d = tmp / "corpus"
    d.mkdir()
    for f in sorted(Path(P.__file__).parent.glob("*.py")):
        (d / f.name).write_bytes(f.read_bytes())
    _lab(d, tmp / "out")
    yield d, ResultStore(tmp / "out" / RESULTS_FILE).rows()
    mp.undo()


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig", [signal.SIGKILL], ids=["SIGKILL"]
)  # SIGTERM's graceful stop: test_lab_train
def test_killed_grid_resumes_to_the_uninterrupted_result(reference_run, tmp_path, sig):
    corpus_dir, ref_rows = reference_run
    out = tmp_path / "out"
    proc = _lab(corpus_dir, out, wait=False)
    store = ResultStore(out / RESULTS_FILE)
    deadline = time.time() + 180
    # Kill once the first cell is stored and the second has a checkpoint.
    while time.time() < deadline and proc.poll() is None:
        ckpts = list((out / "ckpt").glob("sinusoidal-*/last.pt")) if (out / "ckpt").exists() else []
        if ckpts and store.path.exists() and len(store.rows()) == 1:
            proc.send_signal(sig)
            break
        time.sleep(0.01)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == -sig if sig == signal.SIGKILL else proc.returncode == 128 + sig, (
        output.decode()
    )
    if sig == signal.SIGTERM:
        assert b"--resume" in output
    before = store.rows()
    assert [r["encoding"] for r in before] == ["none"]
    step = int(__import__("torch").load(next((out / "ckpt").glob("sinusoidal-*/last.pt")),
                                        weights_only=True)["step"])  # fmt: skip
    assert 0 < step < 300

    res = _lab(corpus_dir, out, wait=False)
    output, _ = res.communicate(timeout=60)
    assert res.returncode == 2 and b"--resume" in output  # never a silent restart

    _lab(corpus_dir, out, "--resume")
    rows = store.rows()
    assert [r["encoding"] for r in rows] == ["none", "sinusoidal"]
    assert len(store.path.read_text().splitlines()) == 2  # nothing duplicated
    assert rows[0] == before[0]  # the finished cell was not recomputed
    assert rows[1]["runtime"]["resumed_from"] == step
    for got, want in zip(rows, ref_rows, strict=True):
        assert got["config_hash"] == want["config_hash"]
        assert _metrics(got) == _metrics(want)  # bit for bit


# --- torchrun ------------------------------------------------------------------------------


def _sockets_allowed() -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)
        return True
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _sockets_allowed(), reason="this sandbox forbids local TCP sockets (gloo)")
def test_torchrun_two_processes_gloo(corpus_dir, tmp_path):
    out1, out2 = tmp_path / "one", tmp_path / "two"
    common = ["-e", "none,learned", "--text", str(corpus_dir), "-L", "16", "--dim", "32",
              "--layers", "1", "--heads", "2", "--steps", "8", "--batch-size", "4",
              "--eval-tokens", "256", "--eval-lens", "1x,2x", "-q", "--no-plots"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "posenc", "lab", *common, "--out", str(out2)]  # fmt: skip
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=240)
    assert res.returncode == 0, (res.stdout + res.stderr).decode()[-3000:]
    single = [sys.executable, "-m", "posenc", "lab", *common, "--threads", "1", "--out", str(out1)]
    res1 = subprocess.run(single, cwd=ROOT, env=env, capture_output=True, timeout=240)
    assert res1.returncode == 0, (res1.stdout + res1.stderr).decode()[-3000:]

    ddp = ResultStore(out2 / RESULTS_FILE).rows()
    one = ResultStore(out1 / RESULTS_FILE).rows()
    assert [r["encoding"] for r in ddp] == ["none", "learned"]
    assert len((out2 / RESULTS_FILE).read_text().splitlines()) == 2  # rank 0 wrote, once
    assert all(r["runtime"]["world_size"] == 2 for r in ddp)
    for a, b in zip(ddp, one, strict=True):
        assert a["config_hash"] == b["config_hash"]  # same cell, same results format
        # The same global batch, gradients averaged over ranks: the same run up to float sums.
        assert a["train"]["final_loss_bits"] == pytest.approx(
            b["train"]["final_loss_bits"], abs=1e-4
        )
        ra, rb = a["eval"]["variants"]["base"]["results"], b["eval"]["variants"]["base"]["results"]
        assert ra["16"]["tokens"] == rb["16"]["tokens"]  # sharded eval covers every window
        assert ra["16"]["bits"] == pytest.approx(rb["16"]["bits"], abs=1e-4)
    assert json.loads(json.dumps(ddp[0]))  # plain JSON


def test_resume_with_changed_options_names_the_difference(corpus_dir, tmp_path, monkeypatch):
    from posenc.lab import experiment
    from posenc.lab.train import CheckpointError, Interrupted

    real = experiment.train_model

    def interrupted_after_one_step(*args, stop, **kwargs):
        stop.signum = signal.SIGTERM
        return real(*args, stop=stop, **kwargs)

    cfg = tiny_config(corpus_dir, encodings=("none",))
    opts = RunOptions(out=tmp_path / "o", quiet=True)
    monkeypatch.setattr(experiment, "train_model", interrupted_after_one_step)
    with pytest.raises(Interrupted, match="step 1"):
        run_grid(cfg, opts)
    monkeypatch.setattr(experiment, "train_model", real)
    changed = replace(cfg, train=replace(cfg.train, steps=8))
    with pytest.raises(CheckpointError, match=r"another configuration.*train\.steps: 6 -> 8"):
        run_grid(changed, replace(opts, resume=True))
    # The original options resume it; --restart trains the new configuration from step 0.
    assert run_grid(cfg, replace(opts, resume=True)).rows[0]["runtime"]["resumed_from"] == 1
    assert run_grid(changed, replace(opts, restart=True)).trained == ["none (seed 0)"]
