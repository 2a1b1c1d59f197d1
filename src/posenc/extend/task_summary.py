"""Several studies' task rows on one screen: "which method, up to which length", one row per
(model, method), the lengths of every study side by side.

Each study is one results folder's rows (:mod:`posenc.extend.rows`); its scores and effective
lengths are :mod:`posenc.extend.task_report`'s (RULER's average over tasks; a length where a
method has answered only some of the study's cells shows how many, not a partial average).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .report import cost_line
from .task_report import _length_text, _methods, _model_name, coverage, method_lengths, task_rows
from .tasks import scores_by_length

Rows = Sequence[dict[str, Any]]


def _k(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _trained(rows: Rows) -> int:
    return int(rows[0]["model"]["trained_length"])


def _cell(scores: dict[int, float], cover: dict[tuple[str, int], tuple[int, int]], method: str,
          n: int, trained: int) -> str:  # fmt: skip
    """The score in % at ``n``; bold at the trained length; ``k/N cells`` where only some are in."""
    if (method, n) not in cover:
        return ""
    done, total = cover[(method, n)]
    if done < total:
        return f"({done}/{total} cells)"
    text = f"{100 * scores[n]:.1f}"
    return f"**{text}**" if n == trained else text


def summary_table(studies: Sequence[Rows]) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per (model, method) with its score (%) at every length any study
    ran, both effective lengths, the trained length's cell in bold."""
    studies = [task_rows(rows) for rows in studies]
    if not all(studies):
        raise ValueError("every study needs task rows: run each with --tasks first")
    lengths = sorted({int(r["length"]) for rows in studies for r in rows})
    header = ["model (trained)", "method", *(_k(n) for n in lengths), "effective (rel.)",
              "effective (85.6%)"]  # fmt: skip
    body = []
    for rows in studies:
        cover, eff, trained = coverage(rows), method_lengths(rows), _trained(rows)
        model = f"{_model_name(rows)} ({_k(trained)})"
        for method in _methods(rows):
            scores = scores_by_length([r for r in rows if r["method"] == method])
            mark = eff.get(method)
            body.append([
                model, method, *(_cell(scores, cover, method, n, trained) for n in lengths),
                _length_text(mark["relative"]) if mark else "",
                _length_text(mark["absolute"]) if mark else "",
            ])  # fmt: skip
    return header, body


def _complete_scores(rows: Rows) -> tuple[int, dict[str, float]] | None:
    """The longest length every method has answered in full, and each method's score there."""
    cover = coverage(rows)
    methods = _methods(rows)
    full = [n for n in sorted({int(r["length"]) for r in rows})
            if all(cover.get((m, n), (0, 1))[0] == cover.get((m, n), (0, 1))[1]
                   for m in methods)]  # fmt: skip
    if not full:
        return None
    n = full[-1]
    return n, {m: scores_by_length([r for r in rows if r["method"] == m])[n] for m in methods}


def study_line(rows: Rows) -> str:
    """One sentence per study: the method highest at its longest length answered in full, the
    model as trained there, what is still missing, and what the rows cost."""
    rows = task_rows(rows)
    trained = _trained(rows)
    out = f"{_model_name(rows)}, trained at {_k(trained)}"
    longest = _complete_scores(rows)
    if longest:
        n, scores = longest
        best = max(scores.values())
        tops = ", ".join(m for m, s in scores.items() if s == best)
        out += f": at {_k(n)} ({n / trained:g}x the trained length) the highest is {tops} "
        out += f"({100 * best:.1f} %)"
        if "none" in scores:
            out += f", the model as trained {100 * scores['none']:.1f} %"
    cover = coverage(rows)
    cells = next(iter(cover.values()))[1]  # the study's (task, depth) cells, at every length
    expected = len(_methods(rows)) * len({int(r["length"]) for r in rows}) * cells
    missing = expected - sum(done for done, _ in cover.values())
    if missing:
        out += f"; {missing} cell{'' if missing == 1 else 's'} not yet answered"
    return out + f"; {cost_line(rows)}."


def summary_markdown(studies: Sequence[Rows]) -> str:
    """The block: how the table was made, the table, then one line per study."""
    from .._markdown import markdown_table

    table = markdown_table(*summary_table(studies))
    lines = [
        "RULER-style tasks answered by each model with each method (`posenc extend --tasks`): the "
        "score at a length is each task's mean over its samples, then the mean over tasks, in %; "
        "**bold**: the trained length. Effective length: the longest length up to which the score "
        "stays at or above 90 % of the model's own score as trained at its shortest length "
        "(rel.), or RULER's 85.6 %.",
        "",
        table,
        "",
        *(f"- {study_line(rows)}" for rows in studies),
    ]
    return "\n".join(lines)
