"""Several studies' task rows on one screen: "which method, up to which length", one row per
(study, method), the lengths of every study side by side.

Each study is one results folder's rows (:mod:`posenc.extend.study.rows`); its scores and effective
lengths are :mod:`posenc.extend.reports.tasks`'s (RULER's average over the study's own tasks; a
length where a method has answered only some of the study's cells says how many, not a partial
average). Studies may ask different tasks and hold methods to different relative bars (90 % of
their own model's score): each study's line says which, so the columns are not read as one scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._markdown import counted
from ..measures.tasks import RELATIVE_FRACTION, intervals_by_length, scores_by_length
from .ranking import better_than, rank, ranking_line
from .tables import cost_line
from .tasks import (
    complete_rows,
    coverage,
    interval_text,
    k_text,
    length_text,
    method_lengths,
    model_name,
    reference_score,
    shortest_full,
    study_methods,
    task_rows,
)

Rows = Sequence[dict[str, Any]]


def _trained(rows: Rows) -> int:
    """The model's trained length, as its rows record it."""
    return int(rows[0]["model"]["trained_length"])


def _labels(studies: Sequence[Rows], names: Sequence[str]) -> list[str]:
    """The table's first column: model file, trained length and dtype; the folder's name after
    it where two studies would read the same (one model in two dtypes, say)."""
    plain = [f"{model_name(rows)} ({k_text(_trained(rows))}, {rows[0]['model'].get('dtype', '?')})"
             for rows in studies]  # fmt: skip
    return [f"{p} `{n}`" if plain.count(p) > 1 else p for p, n in zip(plain, names, strict=True)]


def _score_cell(rows: Rows, cover: dict[tuple[str, int], tuple[int, int]], method: str,
                n: int) -> str:  # fmt: skip
    """The score in % at ``n`` and its 95 % interval (``62.5 [48–75]``,
    :func:`~posenc.extend.measures.tasks.intervals_by_length`: samples that share a context one
    cluster), the score bold at the trained length; ``k of N cells`` (no score) where the method
    has answered only some of the study's cells there."""
    if (method, n) not in cover:
        return ""
    done, total = cover[(method, n)]
    if done < total:
        text = f"{done} of {total} cells"
        return f"**{text}**" if n == _trained(rows) else text
    mine = [r for r in rows if r["method"] == method and int(r["length"]) == n]
    score = f"{100 * scores_by_length(mine)[n]:.1f}"
    low, high = intervals_by_length(mine)[n]
    score = f"**{score}**" if n == _trained(rows) else score
    return f"{score} {interval_text(low, high)}"


def summary_table(
    studies: Sequence[Rows], names: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per (study, method) with its score (%) at every length any study
    ran and both effective lengths (the relative one blank where the reference score is 0: every
    length would pass it)."""
    studies = [task_rows(rows) for rows in studies]
    if not all(studies):
        raise ValueError("every study needs task rows: run each with --tasks first")
    lengths = sorted({int(r["length"]) for rows in studies for r in rows})
    header = ["model (trained, dtype)", "method", *(k_text(n) for n in lengths),
              "effective (85.6%)", "effective (rel.)"]  # fmt: skip
    body = []
    for label, rows in zip(_labels(studies, names), studies, strict=True):
        cover, eff = coverage(rows), method_lengths(rows)
        zero = reference_score(complete_rows(rows)) == 0
        for method in study_methods(rows):
            mark, shortest = eff.get(method), shortest_full(rows, method)
            body.append([
                label, method, *(_score_cell(rows, cover, method, n) for n in lengths),
                length_text(mark["absolute"], shortest) if mark else "",
                "n/a" if zero else length_text(mark["relative"], shortest) if mark else "",
            ])  # fmt: skip
    return header, body


def _full_lengths(rows: Rows) -> list[int]:
    """The lengths every method of the study has answered in full."""
    cover, methods = coverage(rows), study_methods(rows)
    every = sorted({int(r["length"]) for r in rows})
    return [n for n in every if all(cover.get((m, n), (0, 1))[0] == cover.get((m, n), (0, 1))[1]
                                    for m in methods)]  # fmt: skip


def _highest(rows: Rows, trained: int) -> str:
    """Which method scores highest (as shown, to 0.1) at the longest length answered in full."""
    full = _full_lengths(rows)
    if not full:
        return "no length answered in full yet"
    n = full[-1]
    scores = {m: round(100 * scores_by_length([r for r in rows if r["method"] == m])[n], 1)
              for m in study_methods(rows)}  # fmt: skip
    best = max(scores.values())
    top = [m for m, s in scores.items() if s == best]
    where = "the trained length" if n == trained else f"{n / trained:g}x the trained length"
    out = f"highest at {k_text(n)} ({where}): {', '.join(top)} ({best:.1f} %"
    beaten = sorted({b for m in top for b in better_than(rank(rows), m, n)})
    out += (f"; better by the paired test than {', '.join(beaten)})" if beaten
            else "; not distinguishable from the others by the paired test)")  # fmt: skip
    return out + (f", the model as trained {scores['none']:.1f} %" if "none" in scores else "")


def _missing(rows: Rows) -> int:
    """Cells not yet answered at the lengths the study has begun (a length no method has begun
    is not counted: the rows do not know it)."""
    cover = coverage(rows)
    cells = next(iter(cover.values()))[1]  # the study's (task, depth) cells, at every length
    expected = len(study_methods(rows)) * len({int(r["length"]) for r in rows}) * cells
    return expected - sum(done for done, _ in cover.values())


def _bar(rows: Rows) -> str:
    """The relative threshold the study's methods are held to, and whose score it is 90 % of."""
    full = complete_rows(rows)
    reference = reference_score(full)
    if reference is None:
        return ("relative bar: 90 % of each method's own score at its shortest length (`none` has "
                "no length answered in full)")  # fmt: skip
    shortest = min(int(r["length"]) for r in full if r["method"] == "none")
    if reference == 0:
        return f"no relative bar: the model as trained scores 0 at {k_text(shortest)}"
    return (f"relative bar {100 * RELATIVE_FRACTION * reference:.1f} % (90 % of the model's "
            f"{100 * reference:.1f} % as trained at {k_text(shortest)})")  # fmt: skip


def _set_for(rows: Rows, trained: int) -> str:
    """``; scalings at factor 4 (set for 32k) at every length``: the methods are set once for
    the study's longest length, which is why a scaling can cost at the short ones."""
    factors = {float(f) for r in rows if isinstance(scaling := (r.get("settings") or {})
               .get("scaling"), dict) and isinstance(f := scaling.get("factor"), int | float)}  # fmt: skip
    if len(factors) != 1:
        return ""
    factor = factors.pop()
    target = round(factor * trained)  # a factor given as an option need not be the study's
    longest = max(int(r["length"]) for r in rows)
    where = f" (set for {k_text(target)}, the longest length)" if target == longest else ""
    return f"; scalings at factor {factor:g}{where} at every length"


def study_line(rows: Rows, name: str) -> str:
    """One line per study: its folder, model, tasks and samples; the relative bar; the method
    highest at its longest length answered in full; what is missing; what the rows cost."""
    rows = task_rows(rows)
    trained = _trained(rows)
    tasks = ", ".join(dict.fromkeys(str(r["task"]) for r in rows))
    out = (f"`{name}`: {model_name(rows)}, trained at {k_text(trained)}; tasks {tasks}, "
           f"{rows[0]['n']} samples per cell{_set_for(rows, trained)}; {_bar(rows)}; "
           f"{_highest(rows, trained)}")  # fmt: skip
    missing = _missing(rows)
    if missing:
        out += f"; {counted(missing, 'cell')} of the lengths begun not yet answered"
    return out + f"; {ranking_line(rows)}; {cost_line(rows)}."


def short_table(studies: Sequence[Rows], names: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """The front page's form of :func:`summary_table`: the model named once per study (its
    first row), the relative effective length only, and ``n``, the samples per cell, so that a
    reader weighs the scores (the intervals and the paired tests are the full block's)."""
    header, body = summary_table(studies, names)
    rows = [task_rows(r) for r in studies]
    samples = {label: str(r[0]["n"]) for label, r in zip(_labels(rows, names), rows, strict=True)}
    out, seen = [], set()
    for line in body:
        label = line[0]
        out.append(["" if label in seen else label, *line[1:-2], line[-1], samples[label]])
        seen.add(label)
    return ["model (trained, dtype)", *header[1:-2], "effective", "n"], out


def summary_markdown(studies: Sequence[Rows], names: Sequence[str], short: bool = False) -> str:
    """The block: how the table was made, the table, then one line per study; ``short``: the
    table of :func:`short_table` alone, for a front page that links the full block."""
    from ..._markdown import markdown_table

    if short:
        return markdown_table(*short_table(studies, names))
    lines = [
        "RULER-style tasks answered by each model with each method (`posenc extend --tasks`): the "
        "score at a length is each task's mean over its samples, then the mean over the study's "
        "tasks, in %, then its 95 % interval (Wilson's at the effective sample size: each "
        "sample weighing what it weighs in that mean, each task a stratum, the questions asked "
        "of one prefilled context one cluster, a task of fewer than five contexts taken as if "
        "each context's questions were answered alike; rounded outward); **bold**: the trained "
        "length; `k of N cells`: a length a method has "
        "answered only in part (no score yet). Effective length: the longest length up to which "
        "the score stays at or above RULER's 85.6 %, or the study's relative bar (90 % of the "
        "model's own score as trained at the study's shortest length); (again at ...): longer "
        "lengths above the bar again after the first one below it. The studies' tasks and "
        "bars differ (their lines say how), so compare methods within a study; which method is "
        "better than which is each study line's paired sign test (Holm-corrected), not the "
        "table's difference of means.",
        "",
        markdown_table(*summary_table(studies, names)),
        "",
        *(f"- {study_line(rows, name)}" for rows, name in zip(studies, names, strict=True)),
    ]
    return "\n".join(lines)
