"""The figures of ``posenc extend report``: perplexity and passkeys by length (``--figure``),
the needle heatmap (``--heatmap``) and each task's score against length (``--task-figure``).

Every path and the rows each figure needs are checked before the report prints anything, so a
wrong suffix or a figure the study cannot draw is one error line, not a table and then an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figure_paths(rows: list[dict[str, Any]], figure: str | None, heatmap: str | None,
                 task_figure: str | None) -> dict[str, Path]:  # fmt: skip
    """``report``'s figure paths, each checked (and the rows it draws) before anything prints."""
    from ...plots.common import check_figure_path

    paths = {k: check_figure_path(p) for k, p in
             (("figure", figure), ("heatmap", heatmap), ("tasks", task_figure)) if p}  # fmt: skip
    kinds = {r["kind"] for r in rows}
    if "figure" in paths and "ppl" not in kinds:
        instead = "; draw its tasks with --heatmap or --task-figure" if "task" in kinds else ""
        raise ValueError("--figure draws perplexity by length, and the study has no perplexity "
                         f"rows (run it with --documents 1 or more){instead}")  # fmt: skip
    if ("heatmap" in paths or "tasks" in paths) and "task" not in kinds:
        raise ValueError("the study has no task rows: run it with --tasks first")
    if "heatmap" in paths:
        from .tasks import needle_data

        if not needle_data(rows)["scores"]:
            raise ValueError("--heatmap draws the needle tasks (niah_*) by depth, and the study "
                             "has none; draw its tasks with --task-figure")  # fmt: skip
    return paths


def draw_figures(rows: list[dict[str, Any]], paths: dict[str, Path]) -> list[Path]:
    """``report``'s figures drawn at ``paths`` (:func:`figure_paths`); the paths written."""
    from ...plots.common import save_figure

    if "figure" in paths:
        from ...plots.real_model import draw_real_study
        from .tables import figure_data

        save_figure(draw_real_study(figure_data(rows)), paths["figure"])
    if "heatmap" in paths:
        from ...plots.needle import draw_needle_heatmap
        from .tasks import needle_data

        save_figure(draw_needle_heatmap(needle_data(rows)), paths["heatmap"])
    if "tasks" in paths:
        from ...plots.needle import draw_task_scores
        from .tasks import task_curves

        save_figure(draw_task_scores(task_curves(rows)), paths["tasks"])
    return list(paths.values())
