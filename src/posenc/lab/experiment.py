"""Running a grid: every ``(encoding, seed)`` cell of a :class:`LabConfig`, skipping finished
ones, training (or resuming) the rest, evaluating them, and appending one row each to the
results store.

Layout of an output folder (``--out``, default ``runs/lab``)::

    lab.lock                          held while a run is going (posenc.lab.lock)
    results.jsonl                     one row per finished cell (posenc.lab.store)
    ckpt/<encoding>-s<seed>-<hash>/   last.pt while training, final.pt once trained
    report/                           table.md, results.csv, lab.png (posenc.lab.report)

Under ``torchrun`` every rank walks the same grid; rank 0 decides what is finished, writes the
checkpoints and the store, and the others follow (training with DDP, evaluation sharded).
"""

from __future__ import annotations

import datetime as _dt
import errno
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import registry
from .cell import Cell, check_label, resolve_cell, resolve_encodings, resolve_labels
from .checkpoint import FINAL, LAST, CheckpointError, config_diff, load_checkpoint_identity
from .config import LabConfig
from .data import LabData, load_data
from .dist import Dist, init_distributed
from .evaluate import evaluate_model
from .identity import eval_identity, group_identity, jsonable, stable_hash
from .labels import Label
from .lock import describe
from .options import resolve_options
from .presets import GPU_PRESETS
from .progress import step_task
from .rows import GridRow, GridRuntime, runtime_dict
from .run import RunContext, RunOptions, cell_dir, make_log, open_run, versions
from .train import Interrupted, ResumeRequired, TrainResult, compiles, train_model

__all__ = [
    "GridSummary", "RunOptions", "cell_dir", "check_config", "check_label", "check_resumable",
    "resolve_encodings", "run_grid", "versions",
]  # fmt: skip


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


def check_config(cfg: LabConfig) -> list[int]:
    """Validate the grid's numbers; returns the absolute eval lengths."""
    for name, value in (
        ("train_len", cfg.train_len),
        ("steps", cfg.train.steps),
        ("batch_size", cfg.train.batch_size),
        ("eval tokens", cfg.eval.tokens),
        ("eval batch_tokens", cfg.eval.batch_tokens),
        ("ckpt_every", cfg.ckpt_every),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if cfg.train_len < 2:
        raise ValueError(f"train_len must be at least 2, got {cfg.train_len}")
    if not cfg.seeds:
        raise ValueError("at least one seed is needed")
    if cfg.train.lr <= 0 or not math.isfinite(cfg.train.lr):
        raise ValueError(f"lr must be positive, got {cfg.train.lr}")
    lengths = cfg.eval_lengths()
    if cfg.eval.stride is not None and not 1 <= cfg.eval.stride <= min(lengths):
        raise ValueError(
            f"sliding-window stride must be in 1..{min(lengths)} (the shortest eval length), "
            f"got {cfg.eval.stride}"
        )
    if max(lengths) > cfg.eval.tokens:
        raise ValueError(
            f"eval tokens ({cfg.eval.tokens}) must cover at least one window of the longest "
            f"eval length ({max(lengths)})"
        )
    return lengths


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


def run_grid(
    cfg: LabConfig,
    opts: RunOptions | None = None,
    *,
    dist: Dist | None = None,
    data: LabData | None = None,
    print_fn: Callable[[str], None] | None = None,
) -> GridSummary:
    """Run every unfinished cell of ``cfg`` and return what happened.

    The output folder is locked for the run (:mod:`posenc.lab.lock`): a second run on it raises
    :class:`~posenc.lab.lock.FolderLocked`; a lock left by a killed run is taken over. Raises
    :class:`ResumeRequired` / :class:`CheckpointError` (the user must choose), and
    :class:`Interrupted` after a signal (a checkpoint was written; ``--resume`` continues).
    A cell that fails otherwise (an encoding that cannot be built at this shape, a diverged
    loss) is reported in ``failed`` and the grid goes on, in a single process.
    """
    opts = opts or RunOptions()
    t_start = time.perf_counter()
    threads = opts.threads if opts.threads is not None else cfg.threads
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    dist = dist or init_distributed(opts.device)
    log = make_log(dist, opts.quiet, print_fn)
    lengths = check_config(cfg)
    labels = resolve_labels(cfg.encodings)
    for label in labels:  # lab options against this grid (ranges, tables, layers)
        resolve_options(cfg, label)
    with open_run(opts, dist, log) as run:
        if run.stale is not None:
            log(f"took over the lock of a run that is no longer running ({describe(run.stale)})")
        if data is None:
            data = _load_data(cfg, dist)
        grid = _Grid(cfg, data, lengths, run)
        summary = GridSummary(grid.group, stale_lock=describe(run.stale) if run.stale else None)
        _log_start(cfg, labels, grid, log)
        grid.run(labels, summary)
    summary.wall_seconds = time.perf_counter() - t_start
    log(
        f"grid done in {summary.wall_seconds:.1f} s: {len(summary.trained)} cell(s) run, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed"
    )
    return summary


def _load_data(cfg: LabConfig, dist: Dist) -> LabData:
    """Rank 0 builds the corpus cache first; the others then find it."""
    data = load_data(cfg.data) if dist.main else None
    dist.barrier()
    return data if data is not None else load_data(cfg.data)


def _log_start(
    cfg: LabConfig, labels: list[Label], grid: _Grid, log: Callable[[str], None]
) -> None:
    dist, data = grid.ctx.dist, grid.data
    log(
        f"lab: {len(labels)} encodings x {len(cfg.seeds)} seed(s), train length "
        f"{cfg.train_len}, eval lengths {grid.lengths}, data {data.name} ({data.fingerprint}), "
        f"group {grid.group}, {dist.world} process(es) on {dist.device}, "
        f"{torch.get_num_threads()} thread(s)"
        + (", training compiled" if compiles(cfg.compile, dist.device) else "")
    )
    if cfg.preset in GPU_PRESETS and dist.device.type != "cuda":
        # gpu-small's 4.9M tokens take hours per encoding on a CPU core, gpu's 330M days.
        tokens = cfg.train.steps * cfg.train.batch_size * cfg.train_len
        log(
            f"warning: the {cfg.preset} preset is sized for a GPU and is running on the CPU "
            f"({tokens:,} training tokens per encoding)"
        )


class _Grid:
    """What every cell of one :func:`run_grid` call shares: the grid, its data, its group and
    eval identity (computed once), and the run's context."""

    def __init__(self, cfg: LabConfig, data: LabData, lengths: list[int], ctx: RunContext):
        self.cfg, self.data, self.lengths, self.ctx = cfg, data, lengths, ctx
        self.group = stable_hash(group_identity(cfg, data.fingerprint))
        self.eval_id = jsonable(eval_identity(cfg))

    def cell(self, label: Label, seed: int) -> Cell:
        data = self.data
        return resolve_cell(self.cfg, label, seed, data.vocab_size, data.fingerprint, self.eval_id)

    def run(self, labels: list[Label], summary: GridSummary) -> None:
        """Every cell in order (seeds outer), each finished, skipped or failed."""
        ctx = self.ctx
        grid_task = None
        if ctx.progress is not None:
            cells = len(self.cfg.seeds) * len(labels)
            grid_task = ctx.progress.add_task("grid (cells)", total=cells, stats="")
        for seed in self.cfg.seeds:
            for label in labels:
                if ctx.stop.signum is not None:  # a signal that arrived outside training
                    raise Interrupted(ctx.stop.signum)
                self.one(self.cell(label, seed), summary)
                if grid_task is not None:
                    ctx.progress.advance(grid_task)
        if ctx.stop.signum is not None:
            raise Interrupted(ctx.stop.signum)

    def one(self, cell: Cell, summary: GridSummary) -> None:
        """Skip ``cell`` if its row is stored, else run it and store the row (rank 0)."""
        dist, store = self.ctx.dist, self.ctx.store
        key = (cell.encoding, cell.seed, cell.config_hash)
        if dist.broadcast(store.has(*key) if dist.main else None):
            summary.skipped.append(cell.title)
            self.ctx.log(f"skip {cell.title}: finished already ({cell.config_hash})")
            return
        try:
            row = _run_cell(self, cell)
        except (ResumeRequired, CheckpointError, Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:
            if dist.enabled or (isinstance(e, OSError) and e.errno in _DISK_ERRNOS):
                raise  # a full or read-only disk fails every later cell too: stop, one line
            summary.failed[cell.title] = f"{type(e).__name__}: {e}"
            self.ctx.log(f"FAILED {cell.title}: {type(e).__name__}: {e}")
            return
        if dist.main:
            store.append(row)
        dist.barrier()
        summary.trained.append(cell.title)
        summary.rows.append(row)


def _train_cell(grid: _Grid, cell: Cell) -> TrainResult:
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
    )
    finish()
    return result


def _run_cell(grid: _Grid, cell: Cell) -> dict[str, Any]:
    """Train (or resume, or reuse) and evaluate one cell; its result row."""
    t0 = time.perf_counter()
    cfg, dist = grid.cfg, grid.ctx.dist
    result = _train_cell(grid, cell)
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
    evaluation = evaluate_model(
        result.model, grid.data, cfg.train_len, grid.lengths, cfg.eval, dist, log=grid.ctx.log
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
    )
    return _row(grid, cell, stats, evaluation, runtime)


def _row(
    grid: _Grid,
    cell: Cell,
    stats: dict[str, Any],
    evaluation: dict[str, Any],
    runtime: GridRuntime,
) -> dict[str, Any]:
    """The result row the store keeps for one finished cell (:class:`~posenc.lab.rows.GridRow`)."""
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
