"""The task study's figures (``posenc extend --tasks``): the needle-in-a-haystack heatmap (depth x
length, one panel per method, one colour bar) and each task's score against length with the
trained length marked.

Pure renderers of plain data (:func:`posenc.extend.reports.tasks.needle_data` and
:func:`~posenc.extend.reports.tasks.task_curves`).
"""

from __future__ import annotations

import math
from typing import Any

from .common import add_caption, blank_figure


def _k(n: int) -> str:
    """A length as people label it: ``4096`` -> ``4k``, ``1500`` -> ``1500``."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def draw_needle_heatmap(data: dict[str, Any]) -> Any:
    """``data``: ``{"model", "trained", "tasks": [names], "scores": {method: {(depth, length):
    mean score}}}`` -> a Figure: one panel per method, depth (rows, 0 % on top) by length
    (columns), green where the needle is found, red where not, each cell's score written."""
    methods = [m for m in data["scores"] if data["scores"][m]]
    if not methods:
        raise ValueError("no needle cells to draw: the study has no needle task (niah_*) yet")
    depths = sorted({d for m in methods for d, _ in data["scores"][m]})
    lengths = sorted({n for m in methods for _, n in data["scores"][m]})
    cols = min(3, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig = blank_figure(
        1.2 + cols * (0.9 + 0.55 * len(lengths)), 1.3 + rows * (0.6 + 0.35 * len(depths))
    )
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for i, ax in enumerate(axes.flat):
        if i >= len(methods):
            ax.axis("off")
            continue
        method = methods[i]
        grid = [[data["scores"][method].get((d, n), math.nan) for n in lengths] for d in depths]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
        for y, row in enumerate(grid):
            for x, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(x, y, f"{100 * v:.0f}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [_k(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=7)
        trained = [x for x, n in enumerate(lengths) if n > data["trained"]]
        if trained:  # the columns past the trained length
            ax.axvline(trained[0] - 0.5, color="k", lw=1.2, ls="--")
        ax.set_title(method, fontsize=9)
        if i % cols == 0:
            ax.set_ylabel("needle depth", fontsize=8)
        if i // cols == rows - 1:
            ax.set_xlabel("context length (tokens)", fontsize=8)
    assert image is not None  # methods is not empty
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="score")
    fig.suptitle(f"{data['model']}: needle retrieval ({', '.join(data['tasks'])})", fontsize=10)
    add_caption(
        fig,
        f"Mean score over the samples of each depth and length; the dashed line marks the "
        f"trained length ({_k(data['trained'])}).",
    )
    return fig


def draw_task_scores(data: dict[str, Any]) -> Any:
    """``data``: ``{"model", "trained", "scores": {task: {method: {length: score}}},
    "average": {method: {length: score}}}`` -> a Figure: one panel per task and one for the
    average over tasks (RULER's score), score against length, one line per method, the trained
    length and RULER's 85.6 % marked."""
    panels = [("average over tasks", data["average"]), *data["scores"].items()]
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = blank_figure(3.0 * cols, 2.4 * rows + 0.8)
    axes = fig.subplots(rows, cols, squeeze=False)
    methods = list(data["average"])
    for i, ax in enumerate(axes.flat):
        if i >= len(panels):
            ax.axis("off")
            continue
        title, by_method = panels[i]
        for j, method in enumerate(methods):
            points = sorted(by_method.get(method, {}).items())
            if points:
                ax.plot([n for n, _ in points], [100 * v for _, v in points], marker="o", ms=3,
                        color=f"C{j % 10}", label=method)  # fmt: skip
        ax.axvline(data["trained"], color="0.4", lw=1, ls=":")
        ax.axhline(85.6, color="0.6", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ticks = sorted({n for m in by_method.values() for n in m})
        ax.set_xticks(ticks, [_k(n) for n in ticks], fontsize=7)
        ax.minorticks_off()
        ax.set_ylim(-3, 103)
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{data['model']}: task score (%) against context length", fontsize=10)
    add_caption(
        fig,
        "Dotted: the trained length; dashed: RULER's 85.6 % threshold. The first panel is "
        "RULER's score (each task's mean, then the mean over tasks).",
    )
    return fig
