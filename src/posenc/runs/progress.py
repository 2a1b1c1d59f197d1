"""Progress bars for long silent work: a lab grid's cells and steps, a figure's tiny model.

A thin layer over :mod:`rich.progress` (imported only when a bar is shown): :func:`progress_bars`
opens the display, :func:`step_task` adds one training run's bar and returns the
:data:`posenc.lab.training.train.ProgressFn` the training loop calls after each step. A grid's worker
processes draw into a :class:`RemoteProgress`, whose calls the parent's :class:`ProgressRelay`
replays on its display.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def progress_bars(enabled: bool, *, transient: bool = False, stderr: bool = False) -> Iterator[Any]:
    """A rich ``Progress`` (description, bar, steps, stats, elapsed, ETA), or None when disabled.

    ``transient``: the bars disappear once done (a figure's tiny model); ``stderr``: drawn there,
    so a command's own output on stdout stays clean. When that stream is not a terminal (a file,
    CI, ``| tee``) bars would show nothing until the end: a :class:`PlainProgress` prints plain
    lines instead.
    """
    if not enabled:
        yield None
        return
    stream = sys.stderr if stderr else sys.stdout
    if not _is_terminal(stream):
        yield PlainProgress(stream)
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


def _is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal, as rich decides it (``FORCE_COLOR``/``TTY_COMPATIBLE``
    count), so a bar is drawn exactly where rich would draw one."""
    from rich.console import Console

    return bool(Console(file=stream).is_terminal)


class PlainProgress:
    """What stands in for rich's ``Progress`` when the output is not a terminal: the same
    ``add_task``/``update``/``advance`` calls, printed as plain lines that each name their task
    (a grid cell: ``rope s0: step 120/500  3.210 bits ...``). A task prints when it starts,
    when it finishes, and in between at most every ``every`` seconds, so a log file grows at a
    bounded rate whatever the step time. ``clock``: seconds (a test's fake clock)."""

    def __init__(
        self, stream: Any, every: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stream, self.every, self.clock = stream, every, clock
        self._tasks: dict[int, dict[str, Any]] = {}

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        task = len(self._tasks) + 1
        now = self.clock()
        self._tasks[task] = {"description": description, "total": total, "completed": 0,
                             "start": now, "said": now, "done": False, **fields}  # fmt: skip
        self._say(task, "started")
        return task

    def update(self, task: int, **changes: Any) -> None:
        state = self._tasks[task]
        visible = changes.pop("visible", True)
        state.update({k: v for k, v in changes.items() if k != "advance"})
        state["completed"] += changes.get("advance", 0)
        total = state["total"]
        finished = total is not None and state["completed"] >= total
        if state["done"]:
            return
        if finished or not visible:
            state["done"] = True
            self._say(task, "done")
        elif self.clock() - state["said"] >= self.every:
            self._say(task, "")

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def _say(self, task: int, what: str) -> None:
        state = self._tasks[task]
        now = state["said"] = self.clock()
        total = state["total"]
        count = f"{state['completed']:g}/{total:g}" if total is not None else ""
        parts = [f"{state['description']}:", what, count, str(state.get("stats") or ""),
                 f"({now - state['start']:.0f} s)"]  # fmt: skip
        self.stream.write(" ".join(p for p in parts if p) + "\n")
        self.stream.flush()


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
    """What a worker process (:mod:`posenc.lab.grid.jobs`) draws into instead of a rich
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
