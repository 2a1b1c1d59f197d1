"""A grid's cells on worker processes (:mod:`posenc.lab.grid.jobs`): each worker builds the
grid's context once and runs cells as they are handed out, heaviest first; this process alone
stores the rows, in the order a serial run would, so ``results.jsonl`` reads the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..._malloc import retain_freed_memory
from ...runs.checkpoint import CheckpointError
from ...runs.progress import ProgressRelay, RemoteProgress
from ..cells.cell import Cell
from ..cells.config import LabConfig
from ..cells.labels import parse_label
from ..training.data import LabData, load_data
from ..training.dist import Dist, resolve_device
from ..training.train import (
    Interrupted,
    ResumeRequired,
    StopFlag,
)
from .cell_work import GridCells, GridPlan, GridSummary, is_disk_error, run_cell
from .estimate import handout_order, handout_weight
from .jobs import Event, import_encodings, run_pool
from .run import RunContext, RunOptions


def run_parallel(
    grid: GridCells,
    cells: list[Cell],
    summary: GridSummary,
    plan: GridPlan,
    advance: Callable[[], None],
) -> None:
    """``cells`` on ``plan.jobs`` worker processes; this process alone stores the rows, in the
    cells' order (on a stop, the finished ones at the end). Raises what stopped the grid: a
    worker's :class:`Interrupted` (a signal), a choice the user must make or a full disk."""
    ctx = grid.ctx
    for cell in cells:
        grid.prepare(cell, cell.encoding in plan.forced)
    outcomes = _Outcomes(grid, cells, summary, plan.forced, advance, ProgressRelay(ctx.progress))
    data = plan.data  # None: each worker loads (and finds cached) the grid's data itself
    ctx.log(f"{len(cells)} cell(s) on {plan.jobs} worker processes of {plan.threads} thread(s)")
    # The heaviest cells first; the rows are still stored in the cells' order.
    order = handout_order([handout_weight(grid.cfg, c.model) for c in cells])
    try:
        run_pool(
            _cell_runner,
            (grid.cfg, data, grid.lengths, ctx.opts, grid.modules),
            [(i, (cells[i].encoding, cells[i].seed)) for i in order],
            jobs=plan.jobs,
            threads=plan.threads,
            stop=ctx.stop,
            on_event=outcomes.on_event,
        )
    finally:  # rows that finished after a cell still running: kept whatever stopped the pool
        outcomes.flush(in_order=False)
    if outcomes.fatal is not None:
        raise _fatal(outcomes.fatal)
    signum = ctx.stop.signum or outcomes.signum
    if signum is not None:
        stopped = Interrupted(signum)
        steps = sorted(s for s in outcomes.steps if s is not None)
        if steps:  # the cells that were training wrote a checkpoint, as a single process does
            stopped.args = (f"stopped by signal {signum}: {len(steps)} cell(s) at steps "
                            f"{', '.join(map(str, steps))} (checkpoints written)",)  # fmt: skip
        raise stopped


@dataclass
class _Outcomes:
    """What the workers reported, stored in the cells' order as it arrives."""

    grid: GridCells
    cells: list[Cell]
    summary: GridSummary
    forced: frozenset[str]
    advance: Callable[[], None]
    bars: ProgressRelay
    done: dict[int, tuple[str, Any]] = field(default_factory=dict)
    next: int = 0  # the first cell not stored (or passed over) yet
    fatal: tuple[Any, ...] | None = None
    signum: int | None = None
    steps: list[int | None] = field(default_factory=list)  # where interrupted cells stopped

    def on_event(self, event: Event) -> bool:
        """One worker report; True stops handing out cells (a signal, a fatal error)."""
        if event.kind == "log":
            self.grid.ctx.log(str(event.value))
            return False
        if event.kind == "bar":
            self.bars.handle(event.index, event.value)
            return False
        self.bars.close(event.index)
        self.advance()
        outcome = event.value
        if event.kind == "crash":
            stopped = self.grid.ctx.stop.signum
            outcome = ("interrupted", (stopped, None)) if stopped else ("failed", event.value)
        kind, value = outcome
        if kind == "failed":
            self.grid.failed(self.cells[event.index], self.summary, value)
        elif kind == "interrupted":
            self.signum = self.signum or value[0]
            self.steps.append(value[1])
        elif kind == "fatal":
            self.fatal = self.fatal or value
        self.done[event.index] = outcome
        self.flush(in_order=True)
        return kind in ("interrupted", "fatal")

    def flush(self, in_order: bool) -> None:
        """Store the rows reported so far: up to the first cell still running (``in_order``),
        or every one (the grid stops: cells that did not finish leave a gap)."""
        while self.next < len(self.cells) and (self.next in self.done or not in_order):
            outcome = self.done.pop(self.next, None)
            cell = self.cells[self.next]
            self.next += 1
            if outcome is not None and outcome[0] == "row":
                self.grid.store(cell, outcome[1], self.summary, cell.encoding in self.forced)


def _fatal(value: tuple[Any, ...]) -> Exception:
    """The exception a worker's fatal outcome stands for, rebuilt in this process."""
    kind, *args = value
    if kind == "OSError":
        return OSError(*args)
    return {"ResumeRequired": ResumeRequired, "CheckpointError": CheckpointError}[kind](*args)


def _cell_runner(
    cfg: LabConfig,
    data: LabData | None,
    lengths: list[int],
    opts: RunOptions,
    modules: list[str],
    *,
    stop: StopFlag,
    emit: Callable[[str, Any], None],
) -> Callable[[int, tuple[str, int]], tuple[str, Any]]:
    """In a worker process: the grid's context, and ``run(index, (label, seed))`` training and
    evaluating one cell, returning ``(kind, value)``: ``row``, ``failed`` (why), ``interrupted``
    (signal, step) or ``fatal`` (the exception's type and arguments)."""
    retain_freed_memory()  # the parent checked POSENC_MALLOC
    import_encodings(modules)
    if data is None:
        data = load_data(cfg.data)
    dist = Dist(device=resolve_device(opts.device))
    ctx = RunContext(opts, dist, stop, RemoteProgress(emit), lambda msg: emit("log", msg))
    grid = GridCells(cfg, data, lengths, ctx)

    def run(index: int, task: tuple[str, int]) -> tuple[str, Any]:
        if stop.signum is not None:  # signalled before this cell started: it is not begun
            return "interrupted", (stop.signum, None)
        cell = grid.cell(parse_label(task[0]), task[1])
        try:
            return "row", run_cell(grid, cell)
        except Interrupted as e:
            return "interrupted", (e.signum, e.step)
        except (ResumeRequired, CheckpointError) as e:
            return "fatal", (type(e).__name__, str(e))
        except Exception as e:
            if is_disk_error(e):
                assert isinstance(e, OSError)
                return "fatal", ("OSError", e.errno, e.strerror, e.filename)
            return "failed", f"{type(e).__name__}: {e}"

    return run
