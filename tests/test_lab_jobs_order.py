"""``posenc lab --jobs``: the pool hands out tasks in the order given, and a grid gives its cells
heaviest first (:func:`posenc.lab.grid.estimate.handout_order`; the rows are stored in grid order
whatever the workers do). Recorded in the parent: the starts the workers report, and the order a
grid gives the pool. On Linux the workers come from a forkserver; elsewhere, or where it cannot
start, they are spawned."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from posenc.lab.cells import presets as P
from posenc.lab.grid import experiment as E
from posenc.lab.grid import workers
from posenc.lab.grid.jobs import Event, run_pool
from posenc.lab.training.train import StopFlag


def started_recorder(*, stop: Any, emit: Any) -> Any:
    """A worker's task runner (importable by name, as a worker needs) that reports each task's
    start."""

    def run(index: int, task: Any) -> Any:
        emit("start", task)
        time.sleep(0.05)  # long enough that a second worker would be handed the next task
        return task

    return run


def test_one_worker_runs_the_tasks_in_the_order_given() -> None:
    started: list[int] = []

    def on_event(event: Event) -> None:
        if event.kind == "start":
            started.append(event.value)

    tasks = [(i, i) for i in range(5)]
    run_pool(started_recorder, (), tasks, jobs=1, threads=1, stop=StopFlag(), on_event=on_event)
    assert started == [0, 1, 2, 3, 4]


def process_reporter(*, stop: Any, emit: Any) -> Any:
    """A worker's task runner that answers where it runs: its parent as multiprocessing and
    as the kernel see it, its start method and an environment variable."""

    def run(index: int, task: Any) -> Any:
        parent = mp.parent_process()
        return {
            "parent": parent.pid if parent else None,
            "ppid": os.getppid(),
            "method": mp.get_start_method(),
            "env": os.environ.get("POSENC_TEST_POOL_ENV"),
        }

    return run


def _where(jobs: int) -> list[dict[str, Any]]:
    done: list[dict[str, Any]] = []

    def on_event(event: Event) -> None:
        if event.kind == "done":
            done.append(event.value)

    tasks = [(i, i) for i in range(2)]
    run_pool(process_reporter, (), tasks, jobs=jobs, threads=1, stop=StopFlag(), on_event=on_event)
    return done


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver on Linux only")
def test_workers_fork_from_one_server_and_take_the_environment_of_each_pool(monkeypatch) -> None:
    """On Linux the workers come from multiprocessing's forkserver (forked from a process that
    imported torch once, not each a fresh interpreter), which outlives a pool: a second pool's
    workers come from the same server, yet see the environment as it is when their pool starts,
    not as it was when the server started. Their parent, for multiprocessing (whose sentinel
    they watch to end with it), is this process."""
    monkeypatch.setenv("POSENC_TEST_POOL_ENV", "first")
    first = _where(jobs=2)
    monkeypatch.setenv("POSENC_TEST_POOL_ENV", "second")
    second = _where(jobs=1)
    assert [w["env"] for w in first] == ["first", "first"]
    assert [w["env"] for w in second] == ["second", "second"]
    servers = {w["ppid"] for w in first + second}
    assert len(servers) == 1 and os.getpid() not in servers, servers  # one forkserver, reused
    assert {w["parent"] for w in first + second} == {os.getpid()}
    assert {w["method"] for w in first + second} == {"forkserver"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver on Linux only")
def test_a_forkserver_that_cannot_start_leaves_the_workers_spawned(monkeypatch) -> None:
    """Where the server cannot start (its Unix socket refused, as in some sandboxes), the
    workers are spawned: the grid runs, only slower to start."""
    from multiprocessing import forkserver

    def refused() -> None:
        raise PermissionError(1, "Operation not permitted (socket)")

    monkeypatch.setattr(forkserver, "ensure_running", refused)
    where = _where(jobs=1)
    assert [w["method"] for w in where] == ["spawn", "spawn"]
    assert {w["ppid"] for w in where} == {os.getpid()}


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch, write_corpus):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path, limit=4)


def _three_cells(corpus_dir: Path) -> P.LabConfig:
    """NoPE, RoPE and ALiBi, tiny: one eval length, no rescaling."""
    return replace(
        P.LabConfig(), preset="test", encodings=("none", "rope", "alibi"), train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=4, batch_size=2, warmup_steps=1),
        data=P.DataConfig(source="text", path=str(corpus_dir)),
        eval=P.EvalConfig(lengths=("1x",), tokens=64, batch_tokens=64, rope_scalings=()),
    )  # fmt: skip


def test_a_grid_hands_its_heaviest_cells_first(
    corpus_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """Three cells on two workers: the pool is given ALiBi first (its bias scores make its
    training step the heaviest), then NoPE and RoPE in grid order (equal: one eval length, no
    rescaling), and hands them out in that order (the first test). Which cell reports first is
    the workers' race (a 4-step cell ends in a fraction of a second, and a forked worker starts
    in milliseconds), so the order is read where it is decided. The rows stay in grid order."""
    cfg = _three_cells(corpus_dir)
    given: list[list[int]] = []
    real = workers.run_pool

    def recording(setup: Any, setup_args: Any, tasks: list[tuple[int, Any]], **kw: Any) -> None:
        given.append([index for index, _ in tasks])
        real(setup, setup_args, tasks, **kw)

    monkeypatch.setattr(workers, "run_pool", recording)
    summary = E.run_grid(cfg, E.RunOptions(out=tmp_path / "out", jobs=2, threads=1, quiet=True))
    assert summary.trained == ["none (seed 0)", "rope (seed 0)", "alibi (seed 0)"]
    assert given == [[2, 0, 1]]


def test_heaviest_first_with_grid_order_among_equals() -> None:
    from posenc.lab.grid.estimate import handout_order

    weights = [(1, 5), (3, 0), (1, 9), (3, 0), (2, 0), (1, 5)]
    assert handout_order(weights) == [1, 3, 4, 2, 0, 5]
    assert handout_order([]) == []


def test_the_default_grid_starts_deberta_and_ends_on_light_cells() -> None:
    # Measured on the default grid (cpu-small, 500 steps, 2 workers): DeBERTa's cell took 128 s
    # and the others 46-72 s; handed out last it ran alone for a minute.
    from posenc.lab.grid.estimate import handout_order, handout_weight
    from posenc.lab.grid.preflight import cell_models

    cfg = P.PRESETS["cpu-small"]
    models = cell_models(cfg)
    labels = list(models)
    order = [labels[i] for i in handout_order([handout_weight(cfg, m) for m in models.values()])]
    assert order[0] == "deberta"
    assert set(order[:3]) == {"deberta", "shaw", "transformer-xl"}
    # among the cheapest steps, RoPE (four rescalings at three lengths) first
    assert order.index("rope") < min(order.index(e) for e in ("none", "sinusoidal", "xpos"))
    assert sorted(order) == sorted(labels)


def test_rows_behind_a_running_cell_are_kept_when_the_pool_fails(
    corpus_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    """ALiBi (handed out first) finishes while NoPE, first in grid order, has not: its row waits
    for NoPE's. A pool that then fails still leaves ALiBi's row in the store."""
    from posenc.runs.store import RESULTS_FILE, ResultStore

    cfg = _three_cells(corpus_dir)

    def failing_pool(setup: Any, setup_args: Any, tasks: Any, *, stop: Any, on_event: Any,
                     **kw: Any) -> None:  # fmt: skip
        run = setup(*setup_args, stop=stop, emit=lambda kind, value: None)  # in this process
        index, task = tasks[0]
        on_event(Event("done", index, run(index, task)))
        raise RuntimeError("the pool broke")

    monkeypatch.setattr(workers, "run_pool", failing_pool)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="the pool broke"):
        E.run_grid(cfg, E.RunOptions(out=out, jobs=2, threads=1, quiet=True))
    assert [r["encoding"] for r in ResultStore(out / RESULTS_FILE).rows()] == ["alibi"]
