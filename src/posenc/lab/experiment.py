"""Running a grid: every ``(encoding, seed)`` cell of a :class:`LabConfig`, skipping finished
ones, training (or resuming) the rest, evaluating them, and appending one row each to the
results store.

Layout of an output folder (``--out``, default ``runs/lab``)::

    lab.lock                          who holds the folder while a run is going (posenc.lab.lock)
    .lab.lock                         the operating-system lock that run holds
    results.jsonl                     one row per finished cell (posenc.lab.store)
    ckpt/<encoding>-s<seed>-<hash>/   last.pt while training, final.pt once trained,
                                      metrics.jsonl (and with --report-to tensorboard an
                                      event file) of its steps (posenc.lab.metrics)
    report/                           table.md, results.csv, lab.png (posenc.lab.report)

Under ``torchrun`` every rank walks the same grid; rank 0 decides what is finished, writes the
checkpoints and the store, and the others follow (training with DDP, evaluation sharded).

Otherwise on the CPU the cells run on ``RunOptions.jobs`` worker processes (default one per core,
:func:`~posenc.lab.run.resolve_jobs`; :mod:`posenc.lab.jobs`), each writing its cell's
checkpoints; this process alone decides what is finished and appends the rows, in the order a
serial run would, so ``results.jsonl`` and every number in it read the same. ``--force`` labels
train again from step 0, their new row read in place of the stored one.
"""

from __future__ import annotations

import datetime as _dt
import errno
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .. import registry
from .._malloc import malloc_state, retain_freed_memory
from .cell import Cell, check_label, resolve_cell, resolve_encodings, resolve_labels
from .checkpoint import FINAL, LAST, CheckpointError, config_diff, load_checkpoint_identity
from .config import LabConfig
from .data import LabData, corpus_note, load_data
from .dist import Dist, init_distributed, resolve_device
from .estimate import handout_order, handout_weight
from .evaluate import evaluate_model
from .identity import eval_identity, group_identity, jsonable, stable_hash
from .jobs import Event, encoding_modules, import_encodings, run_pool
from .labels import Label, parse_label
from .lock import describe
from .metrics import MetricsLog, logged_steps
from .options import resolve_options
from .presets import GPU_PRESETS
from .progress import ProgressRelay, RemoteProgress, step_task
from .rows import GridRow, GridRuntime, runtime_dict
from .run import RunContext, RunOptions, cell_dir, check_run, make_log, open_run, resolve_jobs
from .run import versions as versions
from .train import Interrupted, ResumeRequired, StopFlag, TrainResult, compiles, train_model

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
        grid = _Grid(cfg, data, lengths, run)
        summary = GridSummary(grid.group, stale_lock=describe(run.stale) if run.stale else None)
        _log_start(cfg, labels, grid, log)
        grid.run(labels, summary, _Plan(jobs, threads, forced, given))
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


@dataclass(frozen=True)
class _Plan:
    """How a grid's cells run: ``jobs`` worker processes of ``threads`` threads (1: in this
    process), the labels rerun though finished, and the data the caller gave (None: loaded)."""

    jobs: int = 1
    threads: int = 1
    forced: frozenset[str] = frozenset()
    data: LabData | None = None


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


class _Grid:
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

    def run(self, labels: list[Label], summary: GridSummary, plan: _Plan) -> None:
        """Every cell in order (seeds outer), each finished, skipped or failed: in this process,
        or on ``plan.jobs`` worker processes (:mod:`posenc.lab.jobs`) when there are cells
        enough and every encoding can be built in a fresh process."""
        ctx = self.ctx
        grid_task = None
        if ctx.progress is not None:
            cells = len(self.cfg.seeds) * len(labels)
            grid_task = ctx.progress.add_task("grid (cells)", total=cells, stats="")

        def advance() -> None:
            if grid_task is not None:
                ctx.progress.advance(grid_task)

        todo = []
        for seed in self.cfg.seeds:
            for label in labels:
                cell = self.cell(label, seed)
                if self.finished(cell, plan.forced):
                    summary.skipped.append(cell.title)
                    advance()
                else:
                    todo.append(cell)
        jobs = min(plan.jobs, len(todo))
        if jobs > 1 and self.portable(todo):
            _run_parallel(self, todo, summary, replace(plan, jobs=jobs), advance)
        else:
            for cell in todo:
                if ctx.stop.signum is not None:  # a signal that arrived outside training
                    raise Interrupted(ctx.stop.signum)
                self.one(cell, summary, cell.encoding in plan.forced)
                advance()
        if ctx.stop.signum is not None:
            raise Interrupted(ctx.stop.signum)

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
            row = _run_cell(self, cell)
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


# --- cells on worker processes (posenc.lab.jobs) ---------------------------------------------


def _run_parallel(
    grid: _Grid, cells: list[Cell], summary: GridSummary, plan: _Plan, advance: Callable[[], None]
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

    grid: _Grid
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
    grid = _Grid(cfg, data, lengths, ctx)

    def run(index: int, task: tuple[str, int]) -> tuple[str, Any]:
        if stop.signum is not None:  # signalled before this cell started: it is not begun
            return "interrupted", (stop.signum, None)
        cell = grid.cell(parse_label(task[0]), task[1])
        try:
            return "row", _run_cell(grid, cell)
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
        metrics=MetricsLog(ckpt_dir, logged_steps(cfg.train.steps), opts.report_to),
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
