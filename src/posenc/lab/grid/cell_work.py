"""One grid cell's work, in this process or in a worker: what the cells of one
:func:`~posenc.lab.grid.experiment.run_grid` call share (:class:`GridCells`: the grid, its data,
group and eval identity), the skip test, training (or resuming, or reusing) a cell's weights,
evaluating them, and the result row the store keeps.
"""

from __future__ import annotations

import datetime as _dt
import errno
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ... import registry
from ..._malloc import malloc_state
from ...runs.checkpoint import FINAL, LAST, CheckpointError, load_checkpoint_identity
from ...runs.identity import config_diff, jsonable, stable_hash
from ...runs.metrics import MetricsLog, logged_steps
from ...runs.progress import step_task
from ..cells.cell import Cell, resolve_cell
from ..cells.config import LabConfig
from ..cells.identity import eval_identity, group_identity
from ..cells.labels import Label
from ..evaluation.evaluate import evaluate_model
from ..reports.rows import GridRow, GridRuntime, runtime_dict
from ..training.data import LabData
from ..training.schedule import compiles
from ..training.train import Interrupted, ResumeRequired, TrainResult, train_model
from .jobs import encoding_modules
from .run import RunContext, cell_dir, versions


@dataclass
class GridSummary:
    group: str
    trained: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    wall_seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    stale_lock: str | None = None  # the killed run whose lock this one took over, if any


#: A write failing with one of these stops the grid (the CLI says which, in one line).
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@dataclass(frozen=True)
class GridPlan:
    """How a grid's cells run: ``jobs`` worker processes of ``threads`` threads (1: in this
    process), the labels rerun though finished, and the data the caller gave (None: loaded)."""

    jobs: int = 1
    threads: int = 1
    forced: frozenset[str] = frozenset()
    data: LabData | None = None


def check_resumable(ckpt_dir: Path, identity: dict[str, Any]) -> None:
    """With ``--resume``: refuse to start a cell from step 0 while an interrupted run of the same
    encoding and seed under *another* configuration exists (the options changed between the
    run and the resume), naming what differs."""
    if (ckpt_dir / LAST).exists() or (ckpt_dir / FINAL).exists():
        return
    prefix = ckpt_dir.name.rsplit("-", 1)[0]  # <encoding>-s<seed>
    for other in sorted(ckpt_dir.parent.glob(f"{prefix}-*/{LAST}")):
        if other.parent.name.rsplit("-", 1)[0] != prefix:
            continue
        stored = load_checkpoint_identity(other)
        diff = ", ".join(config_diff(stored, identity)[:6])
        raise CheckpointError(
            f"--resume: the interrupted run in {other.parent} has another configuration "
            f"(differs in: {diff}); rerun with the options it was started with, or pass "
            "--restart to train this configuration from step 0"
        )


class GridCells:
    """What every cell of one :func:`run_grid` call shares: the grid, its data, its group and
    eval identity (computed once), and the run's context."""

    def __init__(self, cfg: LabConfig, data: LabData, lengths: list[int], ctx: RunContext):
        self.cfg, self.data, self.lengths, self.ctx = cfg, data, lengths, ctx
        self.group = stable_hash(group_identity(cfg, data.fingerprint))
        self.eval_id = jsonable(eval_identity(cfg))
        self.modules: list[str] = []  # what a worker imports to build the grid's encodings

    def cell(self, label: Label, seed: int) -> Cell:
        data = self.data
        return resolve_cell(self.cfg, label, seed, data.vocab_size, data.fingerprint, self.eval_id)

    def finished(self, cell: Cell, forced: frozenset[str]) -> bool:
        """Whether ``cell``'s row is stored (and it is not to be rerun): it is skipped."""
        dist, store = self.ctx.dist, self.ctx.store
        key = (cell.encoding, cell.seed, cell.config_hash)
        if cell.encoding in forced or not dist.broadcast(store.has(*key) if dist.main else None):
            return False
        self.ctx.log(f"skip {cell.title}: finished already ({cell.config_hash})")
        return True

    def portable(self, cells: list[Cell]) -> bool:
        """Whether a worker process can build every encoding of ``cells``: each is registered
        by a module it can import by name (a module loaded from a file path, or ``__main__``,
        it cannot). Says why not, in the log."""
        self.modules, why = encoding_modules({c.label.name for c in cells})
        if why:
            self.ctx.log(f"running the cells one at a time in this process: {why}")
        return not why

    def prepare(self, cell: Cell, forced: bool) -> None:
        """Before training a forced cell: drop its checkpoints, so it trains from step 0."""
        if forced:
            ckpt_dir = cell_dir(self.ctx.opts.out, cell.encoding, cell.seed, cell.train_hash)
            if self.ctx.dist.main:
                for name in (FINAL, LAST):
                    (ckpt_dir / name).unlink(missing_ok=True)
            self.ctx.dist.barrier()

    def one(self, cell: Cell, summary: GridSummary, forced: bool = False) -> None:
        """Run ``cell`` and store its row (rank 0); ``forced``: from step 0, the row replacing a
        stored one."""
        dist = self.ctx.dist
        try:
            self.prepare(cell, forced)
            row = run_cell(self, cell)
        except (ResumeRequired, CheckpointError, Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:
            if dist.enabled or is_disk_error(e):
                raise  # a full or read-only disk fails every later cell too: stop, one line
            self.failed(cell, summary, f"{type(e).__name__}: {e}")
            return
        self.store(cell, row, summary, forced)
        dist.barrier()

    def failed(self, cell: Cell, summary: GridSummary, why: str) -> None:
        summary.failed[cell.title] = why
        self.ctx.log(f"FAILED {cell.title}: {why}")

    def store(self, cell: Cell, row: dict[str, Any], summary: GridSummary, forced: bool) -> None:
        """Append ``row`` to the store (rank 0; ``forced``: in place of a stored row)."""
        if self.ctx.dist.main:
            self.ctx.store.append(row, replace=forced)
        summary.trained.append(cell.title)
        summary.rows.append(row)


def is_disk_error(e: BaseException) -> bool:
    """A write that failed for want of space or write access: it stops the grid."""
    return isinstance(e, OSError) and e.errno in _DISK_ERRNOS


def train_cell(grid: GridCells, cell: Cell) -> TrainResult:
    """Train (or resume, or reuse) one cell's weights."""
    cfg, ctx = grid.cfg, grid.ctx
    opts = ctx.opts
    on_step, finish = step_task(ctx.progress, f"{cell.encoding} s{cell.seed}", cfg.train.steps)
    ckpt_dir = cell_dir(opts.out, cell.encoding, cell.seed, cell.train_hash)
    if opts.resume:
        check_resumable(ckpt_dir, cell.train_id)
    result = train_model(
        cell.model,
        cfg.train,
        grid.data,
        seed=cell.seed,
        identity=cell.train_id,
        ckpt_dir=ckpt_dir,
        ckpt_every=cfg.ckpt_every,
        resume=opts.resume,
        restart=opts.restart,
        dist=ctx.dist,
        progress=on_step,
        stop=ctx.stop,
        compile_model=cfg.compile,
        positions=cell.positions,
        metrics=MetricsLog(ckpt_dir, logged_steps(cfg.train.steps), opts.report_to),
    )
    finish()
    return result


def run_cell(grid: GridCells, cell: Cell) -> dict[str, Any]:
    """Train (or resume, or reuse) and evaluate one cell; its result row."""
    t0 = time.perf_counter()
    cfg, dist = grid.cfg, grid.ctx.dist
    result = train_cell(grid, cell)
    stats = result.stats
    how = (
        "reused trained weights"
        if result.reused
        else (f"resumed at step {result.resumed_from}" if result.resumed_from else "trained")
    )
    grid.ctx.log(
        f"{cell.title}: {how}; {stats['params']:,} params, train loss "
        f"{stats['final_loss_bits']:.3f} bits, {stats['tokens_per_s']:,.0f} tok/s"
    )
    t_eval = time.perf_counter()

    def cell_log(msg: str) -> None:  # each eval line names its cell: workers interleave them
        grid.ctx.log(f"  {cell.title}: {msg.strip()}")

    evaluation = evaluate_model(
        result.model, grid.data, cfg.train_len, grid.lengths, cfg.eval, dist, log=cell_log
    )
    runtime = GridRuntime(
        world_size=dist.world,
        device=str(dist.device),
        threads=torch.get_num_threads(),
        compiled=compiles(cfg.compile, dist.device) and not result.reused,
        resumed_from=result.resumed_from,
        reused_weights=result.reused,
        eval_seconds=time.perf_counter() - t_eval,
        cell_seconds=time.perf_counter() - t0,
        malloc=malloc_state(),
    )
    return _row(grid, cell, stats, evaluation, runtime)


def _row(
    grid: GridCells,
    cell: Cell,
    stats: dict[str, Any],
    evaluation: dict[str, Any],
    runtime: GridRuntime,
) -> dict[str, Any]:
    """The result row the store keeps for one finished cell (:class:`~posenc.lab.reports.rows.GridRow`)."""
    data, positions = grid.data, cell.positions
    return GridRow(
        schema=cell.train_id["schema"],
        encoding=cell.encoding,
        encoding_name=cell.label.name,
        encoding_kwargs=cell.model.encoding_kwargs,
        lab_options=cell.options.row(),
        length_method=positions.method if positions else "arange",
        family=registry.entry(cell.label.name).family,
        seed=cell.seed,
        config_hash=cell.config_hash,
        train_hash=cell.train_hash,
        group=grid.group,
        preset=grid.cfg.preset,
        train_len=grid.cfg.train_len,
        data={"name": data.name, "fingerprint": data.fingerprint, "unit": data.unit},
        identity=cell.identity,
        params=stats["params"],
        train={k: v for k, v in stats.items() if k != "config"},
        eval=evaluation,
        runtime=runtime_dict(runtime),
        versions=versions(),
        finished_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    ).to_dict()
