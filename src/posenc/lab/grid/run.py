"""What a lab run holds while it goes, shared by the grid (:mod:`posenc.lab.grid.experiment`) and
``posenc lab extend`` (:mod:`posenc.lab.extension.extend`): the output folder's lock, the distributed state,
the stop signal, the progress display, the log and the results store, in one
:class:`RunContext` opened by :func:`open_run`.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._malloc import malloc_choice
from ...runs.lock import FolderLocked
from ...runs.lock import acquire as acquire_lock
from ...runs.lock import release as release_lock
from ...runs.metrics import check_report_to
from ...runs.progress import progress_bars
from ...runs.store import RESULTS_FILE, ResultStore
from ..training.dist import Dist
from ..training.train import StopFlag

logger = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How (not what) to run: none of these enter a cell's hash."""

    out: Path = Path("runs/lab")
    resume: bool = False
    restart: bool = False
    threads: int | None = None  # None: the preset's (LabConfig.threads)
    device: str = "auto"
    quiet: bool = False
    jobs: int | None = None  # cells at once in worker processes; None: one per core
    force: tuple[str, ...] = ()  # labels rerun though finished; ("all",): every cell
    report_to: str = "none"  # "tensorboard": an event file per cell beside its metrics.jsonl


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def resolve_jobs(
    opts: RunOptions, cfg_threads: int | None, device: torch.device | str
) -> tuple[int, int]:
    """``(jobs, threads per job)`` for a grid run.

    jobs: ``opts.jobs``, else one per usable core; 1 on CUDA and under ``torchrun`` (where
    ``--jobs`` above 1 is refused). threads per job: ``opts.threads``, else the preset's
    (``cfg_threads``), else the job's share of the cores. Capping jobs at the number of cells
    still to run is the grid's business."""
    jobs = opts.jobs
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ValueError(f"--jobs must be a positive integer, got {jobs!r}")
    torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if torchrun or torch.device(device).type == "cuda":
        where = "under torchrun" if torchrun else "on CUDA"
        if jobs is not None and jobs > 1:
            raise ValueError(f"--jobs {jobs}: cells run one at a time {where}; use --jobs 1")
        jobs = 1
    cores = usable_cores()
    jobs = jobs if jobs is not None else cores
    threads = opts.threads if opts.threads is not None else cfg_threads
    if threads is None:
        threads = max(1, cores // jobs)
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return jobs, threads


@dataclass
class RunContext:
    """One run in progress: its options, where it runs, what stops it, where it reports.

    ``progress``: a rich ``Progress`` or None; ``log``: rank 0's messages (a no-op elsewhere and
    when quiet); ``stale``: the killed run whose lock this one took over, if any."""

    opts: RunOptions
    dist: Dist
    stop: StopFlag
    progress: Any
    log: Callable[[str], None]
    stale: dict[str, Any] | None = None

    @property
    def store(self) -> ResultStore:
        return ResultStore(self.opts.out / RESULTS_FILE)


def check_run(opts: RunOptions) -> None:
    """What a run refuses before it starts besides its grid: ``opts.report_to`` and a bad
    ``POSENC_MALLOC`` (the worker processes read it; one line here, not one per cell)."""
    check_report_to(opts.report_to)
    malloc_choice()


def make_log(
    dist: Dist, quiet: bool, print_fn: Callable[[str], None] | None
) -> Callable[[str], None]:
    """Rank 0's log: ``print_fn``, else (unless ``quiet``) this module's logger at INFO, which
    prints where the program's logging sends it (the command line: standard output,
    :func:`posenc._logging.cli_logging`)."""
    say = print_fn if print_fn is not None else (logger.info if dist.main and not quiet else None)

    def log(msg: str) -> None:
        if say is not None and dist.main:
            say(msg)

    return log


@contextmanager
def open_run(opts: RunOptions, dist: Dist, log: Callable[[str], None]) -> Iterator[RunContext]:
    """Lock ``opts.out`` (rank 0; every rank raises :class:`FolderLocked` if it is held), catch
    SIGTERM/SIGINT into a :class:`StopFlag` (one process only: under torchrun the launcher
    stops the ranks), and show progress bars (rank 0, unless quiet) for the ``with`` body."""
    with _folder_lock(opts.out, dist) as stale:
        stop = StopFlag()
        restore = stop.install() if not dist.enabled else (lambda: None)
        try:
            with progress_bars(dist.main and not opts.quiet) as progress:
                yield RunContext(opts, dist, stop, progress, log, stale)
        finally:
            restore()


@contextmanager
def _folder_lock(out: Path, dist: Dist) -> Iterator[dict[str, Any] | None]:
    """The output folder's lock, taken by rank 0; every rank raises if it is held elsewhere."""
    held, stale, error = None, None, None
    if dist.main:
        try:
            held, stale = acquire_lock(out, command="posenc lab")
        except FolderLocked as e:
            error = str(e)
    error = dist.broadcast(error)
    if error is not None:
        raise FolderLocked(error)
    try:
        yield stale
    finally:
        if held is not None:
            release_lock(held)


def cell_dir(out: Path, encoding: str, seed: int, train_hash: str) -> Path:
    """A grid cell's checkpoint folder, ``<out>/ckpt/<label>-s<seed>-<train hash>``."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", encoding)
    return out / "ckpt" / f"{safe}-s{seed}-{train_hash}"


def versions() -> dict[str, str]:
    """The versions a result row records."""
    import numpy

    from ... import __version__

    return {
        "posenc": __version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
