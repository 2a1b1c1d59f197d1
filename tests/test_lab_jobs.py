"""posenc lab --jobs: cells on worker processes give the serial run's numbers bit for bit, their
rows stored by the parent alone in the serial order; a signal to the parent stops the workers at
a checkpoint, a kill -9 of the parent leaves none running, and --resume continues to the
uninterrupted run's numbers."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from _cli_here import posenc_here
from _tiny import tiny_lab_config
from posenc.lab.grid.experiment import RunOptions, run_grid
from posenc.lab.grid.run import resolve_jobs, usable_cores
from posenc.runs.store import RESULTS_FILE, ResultStore

ROOT = Path(__file__).resolve().parents[1]

#: Row fields that are time measurements (wall clock or CPU), not results.
TIMINGS = {"seconds", "train_seconds", "tokens_per_s", "tokens_per_s_fast", "tokens_per_cpu_s",
           "step_times"}  # fmt: skip


def numbers(row: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on how the cells ran: the identities and every number of ``train``
    and ``eval`` but the wall-clock ones."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMINGS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    keys = ("encoding", "seed", "config_hash", "train_hash", "group", "params", "train", "eval")
    return strip({k: row[k] for k in keys})


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch, write_corpus):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path, limit=6)


def test_resolve_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cores = usable_cores()
    assert resolve_jobs(RunOptions(), None, "cpu") == (cores, 1)
    assert resolve_jobs(RunOptions(jobs=1), None, "cpu") == (1, cores)
    assert resolve_jobs(RunOptions(jobs=2), 1, "cpu") == (2, 1)  # the preset's threads
    assert resolve_jobs(RunOptions(jobs=2, threads=3), 1, "cpu") == (2, 3)  # --threads wins
    assert resolve_jobs(RunOptions(), None, torch.device("cuda")) == (1, cores)
    with pytest.raises(ValueError, match="one at a time on CUDA"):
        resolve_jobs(RunOptions(jobs=2), None, "cuda:0")
    with pytest.raises(ValueError, match="positive"):
        resolve_jobs(RunOptions(jobs=0), None, "cpu")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert resolve_jobs(RunOptions(jobs=1), 1, "cpu") == (1, 1)
    with pytest.raises(ValueError, match="under torchrun"):
        resolve_jobs(RunOptions(jobs=2), 1, "cpu")


def test_two_jobs_give_the_serial_run_bit_for_bit(corpus_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("POSENC_MALLOC", raising=False)  # the workers' default: keep freed memory
    cfg = tiny_lab_config(corpus_dir, ("none", "rope", "alibi"))
    said: list[str] = []
    serial = run_grid(cfg, RunOptions(out=tmp_path / "one", jobs=1, threads=1, quiet=True))
    pooled = run_grid(
        cfg, RunOptions(out=tmp_path / "two", jobs=2, threads=1), print_fn=said.append
    )
    assert any("on 2 worker processes of 1 thread" in line for line in said), said
    assert pooled.trained == serial.trained == ["none (seed 0)", "rope (seed 0)", "alibi (seed 0)"]
    one = ResultStore(tmp_path / "one" / RESULTS_FILE).rows()
    two = ResultStore(tmp_path / "two" / RESULTS_FILE).rows()
    assert [r["encoding"] for r in two] == ["none", "rope", "alibi"]  # the serial order
    assert (
        [numbers(r) for r in two] == [numbers(r) for r in one] == [numbers(r) for r in pooled.rows]
    )
    assert two[0]["train"]["loss_curve_bits"] and two[1]["eval"]["variants"]["yarn"]["results"]
    # The workers keep the memory they free (posenc._malloc), which changes no number above.
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert {r["runtime"]["malloc"] for r in two} == {"retain" if glibc else "system: not glibc"}
    again = run_grid(cfg, RunOptions(out=tmp_path / "two", jobs=2, quiet=True))
    assert again.trained == [] and len(again.skipped) == 3


# --- signals, in a subprocess -----------------------------------------------------------------

STEPS = 300
ARGS = ["-e", "none,sinusoidal", "-L", "16", "--dim", "32", "--layers", "1", "--heads", "2",
        "--steps", str(STEPS), "--batch-size", "4", "--eval-tokens", "256", "--eval-lens",
        "1x,2x", "--ckpt-every", "10", "--threads", "1", "-q", "--no-plots"]  # fmt: skip


def _lab(corpus: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "posenc", "lab", *ARGS, "--text", str(corpus), "--out",
           str(out), *extra]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def _finish(proc: subprocess.Popen[bytes]) -> str:
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output.decode()
    return output.decode()


def _children(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc): its children and theirs (the workers, and on
    Linux the forkserver they are forked from)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    below, frontier = [], {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier}
        below += sorted(frontier)
    return below


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _stop_while_training(proc: subprocess.Popen[bytes], out: Path, sig: int) -> list[int]:
    """Once both cells have a checkpoint, send ``sig`` to the parent; its workers' pids."""
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if len(list(out.glob("ckpt/*/last.pt"))) == 2:
            workers = _children(proc.pid)
            proc.send_signal(sig)
            return workers
        if list(out.glob("ckpt/*/final.pt")):
            proc.kill()
            pytest.fail("a cell finished before the other had a checkpoint")
        time.sleep(0.02)
    output = proc.communicate()[0].decode() if proc.poll() is not None else ""
    pytest.fail(f"the cells never both checkpointed: {output}")


def _gone(pids: list[int], within: float = 20.0) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def _run_here(corpus: Path, out: Path, *extra: str) -> None:
    """The same command in this process (no interpreter to start)."""
    posenc_here("lab", *ARGS, "--text", str(corpus), "--out", str(out), *extra)


def _steps(out: Path) -> list[int]:
    """The steps of the cells' resumable checkpoints (one being replaced is read again)."""
    for _ in range(50):
        try:
            return sorted(
                torch.load(p, weights_only=True)["step"] for p in out.glob("ckpt/*/last.pt")
            )
        except (OSError, RuntimeError):
            time.sleep(0.01)
    raise AssertionError(f"could not read the checkpoints under {out}")


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_signals_stop_the_workers_and_resume_gives_the_uninterrupted_run(corpus_dir, tmp_path):
    """SIGTERM to the parent: each worker stops at a checkpoint and the run says --resume. A
    resumed run killed with -9: no worker runs on. Resumed again: the uninterrupted numbers."""
    out = tmp_path / "out"
    proc = _lab(corpus_dir, out, "--jobs", "2")
    workers = _stop_while_training(proc, out, signal.SIGTERM)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "--resume" in output and "checkpoints written" in output, output
    assert len(workers) >= 2 and _gone(workers), "workers outlived a stopped parent"
    steps = _steps(out)
    assert len(steps) == 2 and all(0 < s < STEPS for s in steps), steps
    assert not (out / RESULTS_FILE).exists() or not ResultStore(out / RESULTS_FILE).rows()

    proc = _lab(corpus_dir, out, "--jobs", "2", "--resume")
    deadline = time.time() + 180
    while _steps(out) == steps and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)  # until the resumed workers train on
    workers = _children(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    assert len(workers) >= 2 and _gone(workers), "workers outlived a killed parent"

    _run_here(corpus_dir, out, "--jobs", "2", "--resume")
    _run_here(corpus_dir, tmp_path / "ref", "--jobs", "1")
    rows = ResultStore(out / RESULTS_FILE).rows()
    ref = ResultStore(tmp_path / "ref" / RESULTS_FILE).rows()
    assert [r["encoding"] for r in rows] == ["none", "sinusoidal"]
    assert all(r["runtime"]["resumed_from"] for r in rows)
    assert [numbers(r) for r in rows] == [numbers(r) for r in ref]  # bit for bit
