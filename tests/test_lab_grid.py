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

from _cli_here import posenc_here
from _net import sockets_allowed
from _tiny import tiny_lab_config
from posenc.cli import app
from posenc.lab.cells import presets as P
from posenc.lab.grid.experiment import RunOptions, check_config, resolve_encodings, run_grid
from posenc.lab.reports import report as R
from posenc.runs.store import RESULTS_FILE, ResultStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch, write_corpus):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path)


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


def test_every_preset_scales_the_sinusoidal_models_embeddings():
    """The lab's sinusoidal cell multiplies token embeddings by sqrt(dim) before adding the table
    (Vaswani et al.; fairseq): checked on the model the default grid builds against the paper's
    formula in float64, and in every preset's configuration."""
    import math

    import torch

    from posenc.model import TransformerLM

    for name in P.PRESETS:
        assert P.model_config(P.preset(name), "sinusoidal", 256).encoding_kwargs == {
            "scale_input": True
        }, name
    cfg = P.model_config(P.preset("cpu-small"), "sinusoidal", 256)
    model = TransformerLM(cfg)
    d, s = cfg.dim, 10
    x = torch.randn(2, s, d)
    pos = torch.arange(s, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    table = torch.zeros(s, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(pos * w), torch.cos(pos * w)
    want = x.double() * math.sqrt(d) + table
    torch.testing.assert_close(model.absolute(x).double(), want, rtol=1e-5, atol=1e-5)
    # The label's own option still wins: the unscaled model is one flag away.
    off = P.model_config(P.preset("cpu-small"), "sinusoidal:scale_input=false", 256)
    assert off.encoding_kwargs == {"scale_input": False}


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
    from posenc.lab.cli import Overrides, build_config

    assert not build_config("gpu-small", Overrides(compile_model=False)).compile
    assert build_config("cpu-small", Overrides(compile_model=True)).compile
    assert build_config("gpu-small").compile


# --- grid ----------------------------------------------------------------------------------


def test_grid_runs_skips_finished_cells_and_reports(corpus_dir, tmp_path):
    cfg = tiny_lab_config(corpus_dir)
    out = tmp_path / "out"
    first = run_grid(cfg, RunOptions(out=out, quiet=True))
    assert first.trained == ["none (seed 0)", "learned (seed 0)"] and not first.failed
    rows = ResultStore(out / RESULTS_FILE).rows()
    assert [r["encoding"] for r in rows] == ["none", "learned"]
    r0 = rows[0]
    for n in (16, 32):  # the stored number is the naive one, recomputed here from the weights
        want, count = naive_bits(out, cfg, r0, n)
        got = r0["eval"]["variants"]["base"]["results"][str(n)]
        assert got["tokens"] == count and got["bits"] == pytest.approx(want, rel=1e-6, abs=0)
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
    assert set(written) == {"table", "csv", "plot"} and written["plot"].name == "lab.png"
    assert all(p.exists() and p.stat().st_size > 0 for p in written.values())
    table = written["table"].read_text()
    assert (
        "| none | " in table and "learned +interp" in table and "×NoPE" in table and "1.00" in table
    )
    csv_lines = written["csv"].read_text().splitlines()
    assert len(csv_lines) == 1 + 2 * 2 + 2  # none, learned, learned+interp at 2 lengths
    assert len(R.groups(out)) == 2


def naive_bits(out, cfg, row, n):
    """Test bits per byte of a stored cell at eval length ``n``, the naive way: the trained
    weights from its final.pt, the test split's bytes read directly, non-overlapping windows of
    ``n`` from its start, and sum of -log2 p(next byte) over every scored byte / the bytes."""
    import math

    import torch

    from posenc.lab.training.data import load_data
    from posenc.model import ModelConfig, TransformerLM

    ckpt = torch.load(next(out.glob(f"ckpt/{row['encoding']}-s0-*/final.pt")), weights_only=True)
    model = TransformerLM(ModelConfig(**ckpt["identity"]["model"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    test = load_data(cfg.data).split("test")
    total = min(cfg.eval.tokens, len(test) - 1) // n * n  # whole windows of the scored stretch
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, total, n):
            window = torch.tensor(test[start : start + n + 1].tolist())
            logp = torch.log_softmax(model(window[None, :-1]).double()[0], dim=-1)  # [n, 256]
            for i in range(n):
                nll -= float(logp[i, window[i + 1]]) / math.log(2)
                count += 1
    return nll / count, count


def test_a_failing_cell_does_not_stop_the_grid(corpus_dir, tmp_path):
    cfg = tiny_lab_config(corpus_dir, encodings=("sinusoidal:layout=nope", "none"))
    summary = run_grid(cfg, RunOptions(out=tmp_path / "o", quiet=True))
    assert summary.trained == ["none (seed 0)"]
    assert "layout" in summary.failed["sinusoidal:layout=nope (seed 0)"]


def test_task_grid(corpus_dir, tmp_path):
    cfg = tiny_lab_config(corpus_dir, encodings=("none",))
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
             "1x,2x", "--ckpt-every", "20", "--threads", "1", "-q", "--no-plots",
             "--jobs", "1"]  # fmt: skip
# --jobs 1: one cell at a time, so the kill lands after the first row and inside the second
# cell; killing and resuming a grid on worker processes is tests/test_lab_jobs.py's.


def _lab_here(corpus_dir, out, *extra, code=0):
    """The command of :func:`_lab`, in this process (it only reads and writes the folder)."""
    return posenc_here("lab", *KILL_ARGS, "--text", str(corpus_dir), "--out", str(out), *extra,
                       code=code)  # fmt: skip


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
def reference_run(tmp_path_factory, write_corpus):
    tmp = tmp_path_factory.mktemp("ref")
    mp = pytest.MonkeyPatch()
    mp.setenv("POSENC_CACHE", str(tmp / "cache"))
    d = write_corpus(tmp)
    _lab_here(d, tmp / "out")
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

    assert "--resume" in _lab_here(corpus_dir, out, code=2)  # never a silent restart

    _lab_here(corpus_dir, out, "--resume")
    rows = store.rows()
    assert [r["encoding"] for r in rows] == ["none", "sinusoidal"]
    assert len(store.path.read_text().splitlines()) == 2  # nothing duplicated
    assert rows[0] == before[0]  # the finished cell was not recomputed
    assert rows[1]["runtime"]["resumed_from"] == step
    for got, want in zip(rows, ref_rows, strict=True):
        assert got["config_hash"] == want["config_hash"]
        assert _metrics(got) == _metrics(want)  # bit for bit


# --- one run per folder --------------------------------------------------------------------


def test_folder_lock_refuses_a_second_holder_and_takes_over_a_stale_one(tmp_path):
    import json

    from posenc.runs import lock

    with lock.folder_lock(tmp_path, command="posenc lab") as stale:
        assert stale is None
        holder = json.loads((tmp_path / lock.LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        # A second open of the file is a second holder, even in this process (flock).
        with pytest.raises(
            lock.FolderLocked, match=f"in use by another posenc lab run.*pid {os.getpid()}"
        ):
            lock.acquire(tmp_path, command="posenc lab")
    assert (tmp_path / lock.LOCK_FILE).read_text() == ""  # a clean exit leaves no holder
    # What a killed run leaves: its description, no flock. Taken over, and said so.
    dead = {"pid": 999999, "host": socket.gethostname(), "command": "posenc lab"}
    (tmp_path / lock.LOCK_FILE).write_text(json.dumps(dead))
    with lock.folder_lock(tmp_path, command="posenc lab") as stale:
        assert stale == dead
    # A holder on another host cannot be checked from here: refused, naming the file.
    (tmp_path / lock.LOCK_FILE).write_text(json.dumps({**dead, "host": "elsewhere"}))
    with pytest.raises(lock.FolderLocked, match=r"another host.*delete .*lab\.lock"):
        lock.acquire(tmp_path, command="posenc lab")


# A process that takes the folder lock, says so, and holds it until killed.
_HOLD = """
import sys, time
from pathlib import Path
from posenc.runs import lock
held, stale = lock.acquire(Path(sys.argv[1]), command="posenc lab")
print("held", flush=True)
time.sleep(600)
"""


def test_folder_lock_conflicts_across_threads_and_processes_and_a_dead_holder_is_taken_over(
    tmp_path,
):
    """The lock is the operating system's (filelock): another thread of this process and
    another process are refused, naming the holder; the system frees it when its holder is
    killed, and the next acquisition takes the dead holder's description over as stale."""
    import threading

    from posenc.runs import lock

    said: list[str] = []

    def other() -> None:
        try:
            lock.release(lock.acquire(tmp_path, command="posenc lab")[0])
        except lock.FolderLocked as e:
            said.append(str(e))

    with lock.folder_lock(tmp_path, command="posenc lab"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert len(said) == 1 and f"in use by another posenc lab run (pid {os.getpid()}" in said[0]
    # Held by another process: refused here, in this thread, naming it.
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(lock.FolderLocked, match=f"in use by another.*pid {holder.pid} "):
            lock.acquire(tmp_path, command="posenc lab")
    finally:
        holder.kill()
        holder.wait()
    with lock.folder_lock(
        tmp_path, command="posenc lab"
    ) as stale:  # killed: the lock is free, its note stale
        assert stale is not None and stale["pid"] == holder.pid
    assert (tmp_path / lock.LOCK_FILE).read_text() == ""


def test_folder_lock_needs_no_fcntl(tmp_path, monkeypatch):
    """Windows has no ``fcntl``: the lock module, loaded where ``import fcntl`` fails, still
    refuses a second holder (before filelock it locked nothing there)."""
    import importlib.util

    from posenc.runs import lock as installed

    monkeypatch.setitem(sys.modules, "fcntl", None)  # import fcntl -> ImportError
    spec = importlib.util.spec_from_file_location("_lock_without_fcntl", installed.__file__)
    assert spec is not None and spec.loader is not None
    lock = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, lock)
    spec.loader.exec_module(lock)
    with (
        lock.folder_lock(tmp_path, command="posenc lab"),
        pytest.raises(lock.FolderLocked, match="in use by another"),
    ):
        lock.acquire(tmp_path, command="posenc lab")


LOCK_ARGS = ["-e", "none", "-L", "16", "--dim", "32", "--layers", "1", "--heads", "2",
             "--steps", "2000", "--batch-size", "4", "--eval-tokens", "256", "--eval-lens",
             "1x,2x", "--ckpt-every", "50", "--threads", "1", "--no-plots"]  # fmt: skip


@pytest.mark.slow
def test_a_second_process_on_a_live_run_is_refused_and_a_killed_run_is_taken_over(
    corpus_dir, tmp_path
):
    """Two real processes on one folder: the second (with --resume, which before the lock
    took the live run's checkpoint for an interrupted one and trained the same cell) is refused
    naming the first; once the first is killed, a resume takes its stale lock over and
    finishes the cell from its last checkpoint."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base = [sys.executable, "-m", "posenc", "lab", *LOCK_ARGS, "--text", str(corpus_dir),
            "--out", str(out)]  # fmt: skip
    first = subprocess.Popen(
        [*base, "-q"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and first.poll() is None:
            if list(out.glob("ckpt/none-*/last.pt")):
                break  # the first run holds the lock and is training
            time.sleep(0.02)
        assert first.poll() is None, first.communicate()[0].decode()
        t0 = time.perf_counter()
        said = posenc_here(*base[3:], "-q", "--resume", code=2)  # a second process: this one
        refused_after = time.perf_counter() - t0
        alive = first.poll() is None
    finally:
        first.kill()
        first.wait()
    assert alive, "the first run finished before the second was refused: the test raced"
    assert "in use by another posenc lab run" in said and f"pid {first.pid}" in said, said
    assert "interrupted" not in said
    assert not (out / RESULTS_FILE).exists()
    step = int(
        __import__("torch").load(next(out.glob("ckpt/none-*/last.pt")), weights_only=True)["step"]
    )
    assert 0 < step < 2000
    said = posenc_here(*base[3:], "--resume")
    assert "took over the lock of a run that is no longer running" in said
    assert f"pid {first.pid}" in said
    rows = ResultStore(out / RESULTS_FILE).rows()
    assert [r["encoding"] for r in rows] == ["none"]
    assert rows[0]["runtime"]["resumed_from"] == step
    assert (out / "lab.lock").read_text() == ""
    print(f"second process refused in {refused_after:.1f} s; resumed at step {step}")


# --- torchrun ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not sockets_allowed(), reason="this sandbox forbids local TCP sockets (gloo)")
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
    posenc_here("lab", *common, "--threads", "1", "--out", str(out1))

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


@pytest.mark.parametrize(("rank0", "failed", "code"), [(False, {}, 0), (True, {}, 0),
                                                    (True, {"rope": "boom"}, 1)])  # fmt: skip
def test_a_torchrun_rank_ends_without_interpreter_shutdown(
    corpus_dir, tmp_path, monkeypatch, rank0, failed, code
):
    """Under torchrun every rank leaves through ``_exit_process`` with the run's exit code (no
    interpreter shutdown for DDP's still-running gloo threads to crash), rank 0 after its
    report."""
    from types import SimpleNamespace

    from posenc.lab import cli as lab_cli
    from posenc.lab.grid import experiment

    class Exited(Exception):
        pass

    def exit_process(c):
        raise Exited(c)

    summary = SimpleNamespace(group="g", failed=failed)
    reported = []
    monkeypatch.setattr(experiment, "run_grid", lambda cfg, opts: summary)
    monkeypatch.setattr(lab_cli, "_in_process_group", lambda: True)
    monkeypatch.setattr(lab_cli, "_leave_process_group", lambda: rank0)
    monkeypatch.setattr(
        "posenc.lab.reports.report.load_rows", lambda out, group: reported.append(group) or []
    )
    monkeypatch.setattr(lab_cli, "_exit_process", exit_process)
    args = ["lab", "-e", "none", "--text", str(corpus_dir), "-q", "--out", str(tmp_path / "o")]
    r = CliRunner().invoke(app, args)
    assert isinstance(r.exception, Exited) and r.exception.args == (code,), r.output
    assert reported == (["g"] if rank0 else [])  # only rank 0 reports
    if failed:
        assert "failed cells: rope: boom" in r.output


def test_resume_with_changed_options_names_the_difference(corpus_dir, tmp_path, monkeypatch):
    from posenc.lab.grid import cell_work
    from posenc.lab.training.train import CheckpointError, Interrupted

    real = cell_work.train_model

    def interrupted_after_one_step(*args, stop, **kwargs):
        stop.signum = signal.SIGTERM
        return real(*args, stop=stop, **kwargs)

    cfg = tiny_lab_config(corpus_dir, encodings=("none",))
    opts = RunOptions(out=tmp_path / "o", quiet=True)
    monkeypatch.setattr(cell_work, "train_model", interrupted_after_one_step)
    with pytest.raises(Interrupted, match="step 1"):
        run_grid(cfg, opts)
    monkeypatch.setattr(cell_work, "train_model", real)
    changed = replace(cfg, train=replace(cfg.train, steps=8))
    with pytest.raises(CheckpointError, match=r"another configuration.*train\.steps: 6 -> 8"):
        run_grid(changed, replace(opts, resume=True))
    # The original options resume it; --restart trains the new configuration from step 0.
    assert run_grid(cfg, replace(opts, resume=True)).rows[0]["runtime"]["resumed_from"] == 1
    assert run_grid(changed, replace(opts, restart=True)).trained == ["none (seed 0)"]
