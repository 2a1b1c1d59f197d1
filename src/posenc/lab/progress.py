"""Progress bars for long silent work: a lab grid's cells and steps, a figure's tiny model.

A thin layer over :mod:`rich.progress` (imported only when a bar is shown): :func:`progress_bars`
opens the display, :func:`step_task` adds one training run's bar and returns the
:data:`posenc.lab.train.ProgressFn` the training loop calls after each step.
"""

from __future__ import annotations

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
