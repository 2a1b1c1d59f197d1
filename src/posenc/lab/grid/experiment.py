"""Running a grid: every ``(encoding, seed)`` cell of a :class:`LabConfig`, skipping finished
ones, training (or resuming) the rest, evaluating them, and appending one row each to the
results store.

Layout of an output folder (``--out``, default ``runs/lab``)::

    lab.lock                          who holds the folder while a run is going (posenc.runs.lock)
    .lab.lock                         the operating-system lock that run holds
    results.jsonl                     one row per finished cell (posenc.runs.store)
    ckpt/<encoding>-s<seed>-<hash>/   last.pt while training, final.pt once trained,
                                      metrics.jsonl (and with --report-to tensorboard an
                                      event file) of its steps (posenc.runs.metrics)
    report/                           table.md, results.csv, lab.png (posenc.lab.reports.report)

Under ``torchrun`` every rank walks the same grid; rank 0 decides what is finished, writes the
checkpoints and the store, and the others follow (training with DDP, evaluation sharded).

Otherwise on the CPU the cells run on ``RunOptions.jobs`` worker processes (default one per core,
:func:`~posenc.lab.grid.run.resolve_jobs`; :mod:`posenc.lab.grid.jobs`), each writing its cell's
checkpoints; this process alone decides what is finished and appends the rows, in the order a
serial run would, so ``results.jsonl`` and every number in it read the same. ``--force`` labels
train again from step 0, their new row read in place of the stored one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from ...runs.lock import describe
from ..cells.cell import check_label, resolve_encodings, resolve_labels
from ..cells.config import LabConfig
from ..cells.labels import Label
from ..cells.options import resolve_options
from ..cells.presets import GPU_PRESETS
from ..training.data import LabData, corpus_note, load_data
from ..training.dist import Dist, init_distributed
from ..training.schedule import compiles
from ..training.train import Interrupted
from .cell_work import GridCells, GridPlan, GridSummary, check_resumable
from .run import RunOptions, cell_dir, check_run, make_log, open_run, resolve_jobs
from .run import versions as versions
from .workers import run_parallel

__all__ = [
    "GridSummary", "RunOptions", "cell_dir", "check_config", "check_label", "check_resumable",
    "resolve_encodings", "run_grid", "versions",
]  # fmt: skip


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


def run_grid(
    cfg: LabConfig,
    opts: RunOptions | None = None,
    *,
    dist: Dist | None = None,
    data: LabData | None = None,
    print_fn: Callable[[str], None] | None = None,
) -> GridSummary:
    """Run every unfinished cell of ``cfg`` and return what happened.

    The output folder is locked for the run (:mod:`posenc.runs.lock`): a second run on it raises
    :class:`~posenc.runs.lock.FolderLocked`; a lock left by a killed run is taken over. Raises
    :class:`ResumeRequired` / :class:`CheckpointError` (the user must choose), and
    :class:`Interrupted` after a signal (a checkpoint was written; ``--resume`` continues).
    A cell that fails otherwise (an encoding that cannot be built at this shape, a diverged
    loss) is reported in ``failed`` and the grid goes on, in a single process.
    """
    opts = opts or RunOptions()
    t_start = time.perf_counter()
    dist = dist or init_distributed(opts.device)
    jobs, threads = resolve_jobs(opts, cfg.threads, dist.device)
    if opts.threads is not None or cfg.threads is not None:
        torch.set_num_threads(threads)
    log = make_log(dist, opts.quiet, print_fn)
    lengths = check_config(cfg)
    check_run(opts)
    labels = resolve_labels(cfg.encodings)
    for label in labels:  # lab options against this grid (ranges, tables, layers)
        resolve_options(cfg, label)
    forced = forced_labels(opts.force, labels)
    with open_run(opts, dist, log) as run:
        if run.stale is not None:
            log(f"took over the lock of a run that is no longer running ({describe(run.stale)})")
        given = data
        if data is None:
            data = _load_data(cfg, dist, run.progress)
        grid = GridCells(cfg, data, lengths, run)
        summary = GridSummary(grid.group, stale_lock=describe(run.stale) if run.stale else None)
        _log_start(cfg, labels, grid, log)
        _run_cells(grid, labels, summary, GridPlan(jobs, threads, forced, given))
    summary.wall_seconds = time.perf_counter() - t_start
    log(
        f"grid done in {summary.wall_seconds:.1f} s: {len(summary.trained)} cell(s) run, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed"
    )
    return summary


def forced_labels(force: tuple[str, ...], labels: list[Label]) -> frozenset[str]:
    """The labels ``--force`` names (``all``: every one), checked against the grid's: a label
    that is not one of its cells is a ValueError listing them, before anything trains."""
    spelled = [label.text for label in labels]
    if tuple(force) == ("all",):
        return frozenset(spelled)
    unknown = [f for f in force if f not in spelled]
    if unknown:
        raise ValueError(
            f"--force {','.join(unknown)}: not a cell of this grid; its labels are "
            f"{', '.join(spelled)} (or all)"
        )
    return frozenset(force)


def _load_data(cfg: LabConfig, dist: Dist, progress: Any = None) -> LabData:
    """Rank 0 builds the corpus cache first; the others then find it. ``progress`` shows it
    as a set-up task (building a corpus cache takes minutes on a slow disk)."""
    task = None if progress is None else progress.add_task("set-up: data", total=None, stats="")
    data = load_data(cfg.data) if dist.main else None
    dist.barrier()
    data = data if data is not None else load_data(cfg.data)
    if task is not None:
        progress.update(task, visible=False)
    return data


def _log_start(
    cfg: LabConfig, labels: list[Label], grid: GridCells, log: Callable[[str], None]
) -> None:
    dist, data = grid.ctx.dist, grid.data
    log(
        f"lab: {len(labels)} encodings x {len(cfg.seeds)} seed(s), train length "
        f"{cfg.train_len}, eval lengths {grid.lengths}, data {data.name} ({data.fingerprint}), "
        f"group {grid.group}, {dist.world} process(es) on {dist.device}, "
        f"{torch.get_num_threads()} thread(s)"
        + (", training compiled" if compiles(cfg.compile, dist.device) else "")
    )
    note = corpus_note(cfg.data, data, cfg.eval.tokens)
    if note is not None:
        log(note)
    if cfg.preset in GPU_PRESETS and dist.device.type != "cuda":
        # gpu-small's 4.9M tokens take hours per encoding on a CPU core, gpu's 330M days.
        tokens = cfg.train.steps * cfg.train.batch_size * cfg.train_len
        log(
            f"warning: the {cfg.preset} preset is sized for a GPU and is running on the CPU "
            f"({tokens:,} training tokens per encoding)"
        )


def _run_cells(grid: GridCells, labels: list[Label], summary: GridSummary, plan: GridPlan) -> None:
    """Every cell in order (seeds outer), each finished, skipped or failed: in this process,
    or on ``plan.jobs`` worker processes (:mod:`posenc.lab.grid.jobs`) when there are cells
    enough and every encoding can be built in a fresh process."""
    ctx = grid.ctx
    grid_task = None
    if ctx.progress is not None:
        cells = len(grid.cfg.seeds) * len(labels)
        grid_task = ctx.progress.add_task("grid (cells)", total=cells, stats="")

    def advance() -> None:
        if grid_task is not None:
            ctx.progress.advance(grid_task)

    todo = []
    for seed in grid.cfg.seeds:
        for label in labels:
            cell = grid.cell(label, seed)
            if grid.finished(cell, plan.forced):
                summary.skipped.append(cell.title)
                advance()
            else:
                todo.append(cell)
    jobs = min(plan.jobs, len(todo))
    if jobs > 1 and grid.portable(todo):
        run_parallel(grid, todo, summary, replace(plan, jobs=jobs), advance)
    else:
        for cell in todo:
            if ctx.stop.signum is not None:  # a signal that arrived outside training
                raise Interrupted(ctx.stop.signum)
            grid.one(cell, summary, cell.encoding in plan.forced)
            advance()
    if ctx.stop.signum is not None:
        raise Interrupted(ctx.stop.signum)
