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
import json
import math
import platform
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import registry
from .data import LabData, load_data
from .evaluate import evaluate_model
from .lock import FolderLocked, describe
from .lock import acquire as acquire_lock
from .lock import release as release_lock
from .presets import (
    DEFAULT_ENCODINGS,
    GPU_PRESETS,
    LAB_OPTIONS,
    LENGTH_ENCODINGS,
    LabConfig,
    LabOptions,
    cell_identity,
    check_lab_options,
    eval_identity,
    group_identity,
    lab_options,
    model_config,
    parse_encoding,
    split_options,
    stable_hash,
    train_identity,
)
from .progress import progress_bars, step_task
from .store import RESULTS_FILE, ResultStore
from .train import (
    FINAL,
    LAST,
    CheckpointError,
    Dist,
    Interrupted,
    ResumeRequired,
    StopFlag,
    compiles,
    config_diff,
    init_distributed,
    load_checkpoint_identity,
    train_model,
)


@dataclass
class RunOptions:
    """How (not what) to run: none of these enter a cell's hash."""

    out: Path = Path("runs/lab")
    resume: bool = False
    restart: bool = False
    threads: int | None = None  # None: the preset's (LabConfig.threads)
    device: str = "auto"
    quiet: bool = False


@dataclass
class GridSummary:
    group: str
    trained: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    wall_seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    stale_lock: str | None = None  # the killed run whose lock this one took over, if any


def resolve_encodings(encodings: tuple[str, ...] | list[str]) -> list[str]:
    """Expand ``default``/``all``/``length`` and check every label against the registry.

    ``default`` is :data:`DEFAULT_ENCODINGS` that are registered; ``all`` every registered name;
    ``length`` the length-generalization set :data:`LENGTH_ENCODINGS` (training-time length
    methods and Llama-4's options). A label's options are the encoding's registry options and
    the lab options :data:`LAB_OPTIONS`, which every encoding takes. Unknown names, unknown
    options and bad lab option values fail here, before anything trains.
    """
    out: list[str] = []
    for label in encodings:
        label = label.strip()
        if label == "default":
            registered = set(registry.names())
            expanded = [n for n in DEFAULT_ENCODINGS if n in registered]
        elif label == "all":
            expanded = registry.names()
        elif label == "length":
            expanded = [_check_label(e) for e in LENGTH_ENCODINGS]
        else:
            expanded = [_check_label(label)]
        out.extend(e for e in expanded if e not in out)
    if not out:
        raise ValueError("no encodings to run")
    return out


def _check_label(label: str) -> str:
    """``label`` if its name is registered and its options are the encoding's or the lab's."""
    name, kwargs = parse_encoding(label)
    registry.entry(name)  # raises ValueError naming the registered encodings
    own = registry.options(name)
    enc, lab = split_options(kwargs)
    unknown = sorted(set(enc) - set(own))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for encoding {name!r}; allowed: "
            f"{sorted(own) or 'none'}, and the lab's {list(LAB_OPTIONS)}"
        )
    check_lab_options(name, lab)
    return label


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


def versions() -> dict[str, str]:
    import numpy

    from .. import __version__

    return {
        "posenc": __version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def cell_dir(out: Path, encoding: str, seed: int, train_hash: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", encoding)
    return out / "ckpt" / f"{safe}-s{seed}-{train_hash}"


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


def _jsonable(obj: Any) -> Any:
    """Tuples to lists, so an identity compares equal after a JSON or checkpoint round trip."""
    return json.loads(json.dumps(obj, default=str))


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
    say = print_fn if print_fn is not None else (print if dist.main and not opts.quiet else None)

    def log(msg: str) -> None:
        if say is not None and dist.main:
            say(msg)

    lengths = check_config(cfg)
    encodings = resolve_encodings(cfg.encodings)
    for enc in encodings:  # lab options against this grid (ranges, tables, layers)
        lab_options(cfg, enc)
    with _grid_lock(opts.out, dist) as stale:
        if stale is not None:
            log(f"took over the lock of a run that is no longer running ({describe(stale)})")
        if data is None:
            data = _load_data(cfg, dist)
        group = stable_hash(group_identity(cfg, data.fingerprint))
        summary = GridSummary(group=group, stale_lock=describe(stale) if stale else None)
        _log_start(cfg, encodings, lengths, data, group, dist, log)
        stop = StopFlag()
        restore = stop.install() if not dist.enabled else (lambda: None)
        try:
            with progress_bars(dist.main and not opts.quiet) as progress:
                grid = _Grid(cfg, opts, data, lengths, group, dist, stop, progress, log)
                grid.run(encodings, summary)
        finally:
            restore()
    summary.wall_seconds = time.perf_counter() - t_start
    log(
        f"grid done in {summary.wall_seconds:.1f} s: {len(summary.trained)} cell(s) run, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed"
    )
    return summary


@contextmanager
def _grid_lock(out: Path, dist: Dist) -> Iterator[dict[str, Any] | None]:
    """The output folder's lock, taken by rank 0; every rank raises if it is held elsewhere."""
    fd, stale, error = None, None, None
    if dist.main:
        try:
            fd, stale = acquire_lock(out)
        except FolderLocked as e:
            error = str(e)
    error = dist.broadcast(error)
    if error is not None:
        raise FolderLocked(error)
    try:
        yield stale
    finally:
        if fd is not None:
            release_lock(fd)


def _load_data(cfg: LabConfig, dist: Dist) -> LabData:
    """Rank 0 builds the corpus cache first; the others then find it."""
    data = load_data(cfg.data) if dist.main else None
    dist.barrier()
    return data if data is not None else load_data(cfg.data)


def _log_start(
    cfg: LabConfig,
    encodings: list[str],
    lengths: list[int],
    data: LabData,
    group: str,
    dist: Dist,
    log: Callable[[str], None],
) -> None:
    log(
        f"lab: {len(encodings)} encodings x {len(cfg.seeds)} seed(s), train length "
        f"{cfg.train_len}, eval lengths {lengths}, data {data.name} ({data.fingerprint}), "
        f"group {group}, {dist.world} process(es) on {dist.device}, "
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


@dataclass(frozen=True)
class _Cell:
    """One ``(encoding, seed)`` of the grid and its identities."""

    encoding: str
    seed: int
    train_id: dict[str, Any]
    train_hash: str
    config_hash: str

    @property
    def label(self) -> str:
        return f"{self.encoding} (seed {self.seed})"


@dataclass
class _Grid:
    """What every cell of one :func:`run_grid` call shares."""

    cfg: LabConfig
    opts: RunOptions
    data: LabData
    lengths: list[int]
    group: str
    dist: Dist
    stop: StopFlag
    progress: Any  # a rich Progress, or None
    log: Callable[[str], None]

    def run(self, encodings: list[str], summary: GridSummary) -> None:
        """Every cell in order (seeds outer), each finished, skipped or failed."""
        grid_task = None
        if self.progress is not None:
            cells = len(self.cfg.seeds) * len(encodings)
            grid_task = self.progress.add_task("grid (cells)", total=cells, stats="")
        for seed in self.cfg.seeds:
            for enc in encodings:
                if self.stop.signum is not None:  # a signal that arrived outside training
                    raise Interrupted(self.stop.signum)
                self.one(self.cell(enc, seed), summary)
                if grid_task is not None:
                    self.progress.advance(grid_task)
        if self.stop.signum is not None:
            raise Interrupted(self.stop.signum)

    def cell(self, enc: str, seed: int) -> _Cell:
        data = self.data
        train_id = _jsonable(train_identity(self.cfg, enc, seed, data.vocab_size, data.fingerprint))
        config_hash = stable_hash(cell_identity(train_id, _jsonable(eval_identity(self.cfg))))
        return _Cell(enc, seed, train_id, stable_hash(train_id), config_hash)

    def one(self, cell: _Cell, summary: GridSummary) -> None:
        """Skip ``cell`` if its row is stored, else run it and store the row (rank 0)."""
        dist, store = self.dist, ResultStore(self.opts.out / RESULTS_FILE)
        key = (cell.encoding, cell.seed, cell.config_hash)
        if dist.broadcast(store.has(*key) if dist.main else None):
            summary.skipped.append(cell.label)
            self.log(f"skip {cell.label}: finished already ({cell.config_hash})")
            return
        try:
            row = _run_cell(self, cell)
        except (ResumeRequired, CheckpointError, Interrupted, KeyboardInterrupt):
            raise
        except Exception as e:
            if dist.enabled:
                raise
            summary.failed[cell.label] = f"{type(e).__name__}: {e}"
            self.log(f"FAILED {cell.label}: {type(e).__name__}: {e}")
            return
        if dist.main:
            store.append(row)
        dist.barrier()
        summary.trained.append(cell.label)
        summary.rows.append(row)


def _run_cell(grid: _Grid, cell: _Cell) -> dict[str, Any]:
    """Train (or resume, or reuse) and evaluate one cell; its result row."""
    t0 = time.perf_counter()
    cfg, opts, dist = grid.cfg, grid.opts, grid.dist
    mcfg = model_config(cfg, cell.encoding, grid.data.vocab_size)
    options = lab_options(cfg, cell.encoding)
    on_step, finish = step_task(grid.progress, f"{cell.encoding} s{cell.seed}", cfg.train.steps)
    ckpt_dir = cell_dir(opts.out, cell.encoding, cell.seed, cell.train_hash)
    if opts.resume:
        check_resumable(ckpt_dir, cell.train_id)
    result = train_model(
        mcfg,
        cfg.train,
        grid.data,
        seed=cell.seed,
        identity=cell.train_id,
        ckpt_dir=ckpt_dir,
        ckpt_every=cfg.ckpt_every,
        resume=opts.resume,
        restart=opts.restart,
        dist=dist,
        progress=on_step,
        stop=grid.stop,
        compile_model=cfg.compile,
        positions=options.positions,
    )
    finish()
    stats = result.stats
    how = (
        "reused trained weights"
        if result.reused
        else (f"resumed at step {result.resumed_from}" if result.resumed_from else "trained")
    )
    grid.log(
        f"{cell.label}: {how}; {stats['params']:,} params, train loss "
        f"{stats['final_loss_bits']:.3f} bits, {stats['tokens_per_s']:,.0f} tok/s"
    )
    t_eval = time.perf_counter()
    evaluation = evaluate_model(
        result.model, grid.data, cfg.train_len, grid.lengths, cfg.eval, dist, log=grid.log
    )
    runtime = {
        "world_size": dist.world,
        "device": str(dist.device),
        "threads": torch.get_num_threads(),
        "compiled": compiles(cfg.compile, dist.device) and not result.reused,
        "resumed_from": result.resumed_from,
        "reused_weights": result.reused,
        "eval_seconds": time.perf_counter() - t_eval,
        "cell_seconds": time.perf_counter() - t0,
    }
    return _row(grid, cell, mcfg.encoding_kwargs, options, stats, evaluation, runtime)


def _row(
    grid: _Grid,
    cell: _Cell,
    encoding_kwargs: dict[str, Any],
    options: LabOptions,
    stats: dict[str, Any],
    evaluation: dict[str, Any],
    runtime: dict[str, Any],
) -> dict[str, Any]:
    """The result row the store keeps for one finished cell.

    ``encoding`` is the label (``rope:positions=pose``), ``encoding_kwargs`` the encoding's own
    options; ``lab_options`` the lab options that are set, resolved (``{}`` for a plain label),
    and ``length_method`` the training positions (``"arange"``, ``"randomized"``, ``"pose"``),
    so a report can group by them."""
    cfg, data = grid.cfg, grid.data
    name, _ = parse_encoding(cell.encoding)
    return {
        "schema": cell.train_id["schema"],
        "encoding": cell.encoding,
        "encoding_name": name,
        "encoding_kwargs": encoding_kwargs,
        "lab_options": options.row(),
        "length_method": options.positions.method if options.positions else "arange",
        "family": registry.entry(name).family,
        "seed": cell.seed,
        "config_hash": cell.config_hash,
        "train_hash": cell.train_hash,
        "group": grid.group,
        "preset": cfg.preset,
        "train_len": cfg.train_len,
        "data": {"name": data.name, "fingerprint": data.fingerprint, "unit": data.unit},
        "identity": cell_identity(cell.train_id, _jsonable(eval_identity(cfg))),
        "params": stats["params"],
        "train": {k: v for k, v in stats.items() if k != "config"},
        "eval": evaluation,
        "runtime": runtime,
        "versions": versions(),
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
