"""Progress bars for long silent work: a lab grid's cells and steps, a figure's tiny model.

A thin layer over :mod:`rich.progress` (imported only when a bar is shown): :func:`progress_bars`
opens the display, :func:`step_task` adds one training run's bar and returns the
:data:`posenc.lab.train.ProgressFn` the training loop calls after each step. A grid's worker
processes draw into a :class:`RemoteProgress`, whose calls the parent's :class:`ProgressRelay`
replays on its display.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def progress_bars(enabled: bool, *, transient: bool = False, stderr: bool = False) -> Iterator[Any]:
    """A rich ``Progress`` (description, bar, steps, stats, elapsed, ETA), or None when disabled.

    ``transient``: the bars disappear once done (a figure's tiny model); ``stderr``: drawn there,
    so a command's own output on stdout stays clean.
    """
    if not enabled:
        yield None
        return
    from rich.console import Console
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
    console = Console(stderr=True) if stderr else None
    with Progress(*columns, transient=transient, console=console) as progress:
        yield progress


def step_task(
    progress: Any, description: str, total: int
) -> tuple[Callable[[int, float, float], None] | None, Callable[[], None]]:
    """One training run's bar: ``(on_step, finish)``. ``on_step(done, bits, tokens_per_s)`` is
    the training loop's progress callback (None without a display); ``finish()`` completes and
    hides the bar."""
    if progress is None:
        return None, lambda: None
    task = progress.add_task(description, total=total, stats="")

    def on_step(done: int, bits: float, tps: float) -> None:
        progress.update(task, completed=done, stats=f"{bits:.3f} bits {tps:>7,.0f} tok/s")

    def finish() -> None:
        progress.update(task, completed=total, visible=False)

    return on_step, finish


class RemoteProgress:
    """What a worker process (:mod:`posenc.lab.jobs`) draws into instead of a rich
    ``Progress``: the ``add_task``/``update``/``advance`` calls :func:`step_task` makes, sent
    to the parent as ``emit("bar", (task, changes))``, at most every ``every`` seconds for a
    bar's plain updates; the parent draws them with :class:`ProgressRelay`."""

    def __init__(self, emit: Callable[[str, Any], None], every: float = 0.25) -> None:
        self.emit, self.every = emit, every
        self._tasks = 0
        self._sent: dict[int, float] = {}

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        self._tasks += 1
        self.emit("bar", (self._tasks, {"description": description, "total": total, **fields}))
        return self._tasks

    def update(self, task: int, **changes: Any) -> None:
        now = time.monotonic()
        if "visible" not in changes and now - self._sent.get(task, 0.0) < self.every:
            return
        self._sent[task] = now
        self.emit("bar", (task, changes))

    def advance(self, task: int, advance: float = 1) -> None:
        self.emit("bar", (task, {"advance": advance}))


class ProgressRelay:
    """The parent's side of :class:`RemoteProgress`: each worker's bars drawn in ``progress``
    (None: nothing drawn), keyed by the task (grid cell) they belong to."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self._bars: dict[tuple[int, int], Any] = {}

    def handle(self, owner: int, message: tuple[int, dict[str, Any]]) -> None:
        if self.progress is None:
            return
        task, changes = message
        key = (owner, task)
        if key not in self._bars:
            self._bars[key] = self.progress.add_task(**changes)
            return
        changes = dict(changes)
        if "advance" in changes:
            self.progress.advance(self._bars[key], changes.pop("advance"))
        if changes:
            self.progress.update(self._bars[key], **changes)

    def close(self, owner: int) -> None:
        """Hide the bars of ``owner`` (its cell has reported)."""
        for key in [k for k in self._bars if k[0] == owner]:
            if self.progress is not None:
                self.progress.update(self._bars.pop(key), visible=False)
