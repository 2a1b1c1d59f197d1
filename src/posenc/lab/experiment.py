"""Running a grid: every ``(encoding, seed)`` cell of a :class:`LabConfig`, skipping finished
ones, training (or resuming) the rest, evaluating them, and appending one row each to the
results store.

Layout of an output folder (``--out``, default ``runs/lab``)::

    results.jsonl                     one row per finished cell (posenc.lab.store)
    ckpt/<encoding>-s<seed>-<hash>/   last.pt while training, final.pt once trained
    report/                           table.md, results.csv, *.png (posenc.lab.report)

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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .. import registry
from .data import LabData, load_data
from .evaluate import evaluate_model
from .presets import (
    DEFAULT_ENCODINGS,
    GPU_PRESETS,
    LabConfig,
    cell_identity,
    eval_identity,
    group_identity,
    model_config,
    parse_encoding,
    stable_hash,
    train_identity,
)
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
    report: bool = True


@dataclass
class GridSummary:
    group: str
    trained: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    wall_seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)


def resolve_encodings(encodings: tuple[str, ...] | list[str]) -> list[str]:
    """Expand ``default``/``all`` and check every label against the registry.

    ``default`` is :data:`DEFAULT_ENCODINGS` that are registered; ``all`` every registered name.
    Unknown names and unknown options fail here, before anything trains.
    """
    out: list[str] = []
    for label in encodings:
        label = label.strip()
        if label == "default":
            registered = set(registry.names())
            expanded = [n for n in DEFAULT_ENCODINGS if n in registered]
        elif label == "all":
            expanded = registry.names()
        else:
            name, kwargs = parse_encoding(label)
            registry.entry(name)  # raises ValueError naming the registered encodings
            unknown = sorted(set(kwargs) - set(registry.options(name)))
            if unknown:
                raise ValueError(
                    f"unknown option(s) {unknown} for encoding {name!r}; allowed: "
                    f"{sorted(registry.options(name)) or 'none'}"
                )
            expanded = [label]
        out.extend(e for e in expanded if e not in out)
    if not out:
        raise ValueError("no encodings to run")
    return out


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

    Raises :class:`ResumeRequired` / :class:`CheckpointError` (the user must choose), and
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
    if data is None:
        # Rank 0 builds the corpus cache first; the others then find it.
        if dist.main:
            data = load_data(cfg.data)
        dist.barrier()
        if data is None:
            data = load_data(cfg.data)
    group = stable_hash(group_identity(cfg, data.fingerprint))
    store = ResultStore(opts.out / RESULTS_FILE)
    summary = GridSummary(group=group)
    eval_id = eval_identity(cfg)
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
    stop = StopFlag()
    restore = stop.install() if not dist.enabled else (lambda: None)
    try:
        with _progress(dist.main and not opts.quiet) as progress:
            grid_task = None
            if progress is not None:
                cells = len(cfg.seeds) * len(encodings)
                grid_task = progress.add_task("grid (cells)", total=cells, stats="")
            for seed in cfg.seeds:
                for enc in encodings:
                    if stop.signum is not None:  # a signal that arrived outside training
                        raise Interrupted(stop.signum)
                    label = f"{enc} (seed {seed})"
                    train_id = _jsonable(
                        train_identity(cfg, enc, seed, data.vocab_size, data.fingerprint)
                    )
                    train_hash = stable_hash(train_id)
                    config_hash = stable_hash(cell_identity(train_id, _jsonable(eval_id)))
                    done = dist.broadcast(store.has(enc, seed, config_hash) if dist.main else None)
                    if done:
                        summary.skipped.append(label)
                        log(f"skip {label}: finished already ({config_hash})")
                        if grid_task is not None:
                            progress.advance(grid_task)
                        continue
                    try:
                        row = _run_cell(
                            cfg, enc, seed, data, lengths, train_id, train_hash, config_hash,
                            group, opts, dist, stop, progress, log,
                        )  # fmt: skip
                    except (ResumeRequired, CheckpointError, Interrupted, KeyboardInterrupt):
                        raise
                    except Exception as e:
                        if dist.enabled:
                            raise
                        summary.failed[label] = f"{type(e).__name__}: {e}"
                        log(f"FAILED {label}: {type(e).__name__}: {e}")
                        if grid_task is not None:
                            progress.advance(grid_task)
                        continue
                    if dist.main:
                        store.append(row)
                    dist.barrier()
                    summary.trained.append(label)
                    summary.rows.append(row)
                    if grid_task is not None:
                        progress.advance(grid_task)
            if stop.signum is not None:
                raise Interrupted(stop.signum)
    finally:
        restore()
    summary.wall_seconds = time.perf_counter() - t_start
    log(
        f"grid done in {summary.wall_seconds:.1f} s: {len(summary.trained)} cell(s) run, "
        f"{len(summary.skipped)} skipped, {len(summary.failed)} failed"
    )
    return summary


def _run_cell(
    cfg: LabConfig,
    enc: str,
    seed: int,
    data: LabData,
    lengths: list[int],
    train_id: dict[str, Any],
    train_hash: str,
    config_hash: str,
    group: str,
    opts: RunOptions,
    dist: Dist,
    stop: StopFlag,
    progress: Any,
    log: Callable[[str], None],
) -> dict[str, Any]:
    t0 = time.perf_counter()
    mcfg = model_config(cfg, enc, data.vocab_size)
    task_id = None
    on_step = None
    if progress is not None:
        task_id = progress.add_task(f"{enc} s{seed}", total=cfg.train.steps, stats="")

        def on_step(done: int, bits: float, tps: float) -> None:
            stats = f"{bits:.3f} bits {tps:>7,.0f} tok/s"
            progress.update(task_id, completed=done, stats=stats)

    ckpt_dir = cell_dir(opts.out, enc, seed, train_hash)
    if opts.resume:
        check_resumable(ckpt_dir, train_id)
    result = train_model(
        mcfg,
        cfg.train,
        data,
        seed=seed,
        identity=train_id,
        ckpt_dir=ckpt_dir,
        ckpt_every=cfg.ckpt_every,
        resume=opts.resume,
        restart=opts.restart,
        dist=dist,
        progress=on_step,
        stop=stop,
        compile_model=cfg.compile,
    )
    if progress is not None and task_id is not None:
        progress.update(task_id, completed=cfg.train.steps, visible=False)
    stats = result.stats
    how = (
        "reused trained weights"
        if result.reused
        else (f"resumed at step {result.resumed_from}" if result.resumed_from else "trained")
    )
    log(
        f"{enc} (seed {seed}): {how}; {stats['params']:,} params, train loss "
        f"{stats['final_loss_bits']:.3f} bits, {stats['tokens_per_s']:,.0f} tok/s"
    )
    t_eval = time.perf_counter()
    evaluation = evaluate_model(result.model, data, cfg.train_len, lengths, cfg.eval, dist, log=log)
    eval_seconds = time.perf_counter() - t_eval
    name, _ = parse_encoding(enc)
    return {
        "schema": train_id["schema"],
        "encoding": enc,
        "encoding_name": name,
        "encoding_kwargs": mcfg.encoding_kwargs,
        "family": registry.entry(name).family,
        "seed": seed,
        "config_hash": config_hash,
        "train_hash": train_hash,
        "group": group,
        "preset": cfg.preset,
        "train_len": cfg.train_len,
        "data": {"name": data.name, "fingerprint": data.fingerprint, "unit": data.unit},
        "identity": cell_identity(train_id, _jsonable(eval_identity(cfg))),
        "params": stats["params"],
        "train": {k: v for k, v in stats.items() if k != "config"},
        "eval": evaluation,
        "runtime": {
            "world_size": dist.world,
            "device": str(dist.device),
            "threads": torch.get_num_threads(),
            "compiled": compiles(cfg.compile, dist.device) and not result.reused,
            "resumed_from": result.resumed_from,
            "reused_weights": result.reused,
            "eval_seconds": eval_seconds,
            "cell_seconds": time.perf_counter() - t0,
        },
        "versions": versions(),
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich progress display (step, loss, tokens/s, ETA), or None when disabled."""
    if not enabled:
        with nullcontext():
            yield None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn("{task.description:<18}"),
        BarColumn(bar_width=16),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        yield progress
