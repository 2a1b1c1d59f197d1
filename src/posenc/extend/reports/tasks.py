"""A study's task rows as tables, effective lengths and figure data: "which method, up to which
length", read from the rows (:mod:`posenc.extend.study.rows`, kind ``task``) and nothing else.

The score at a length is RULER's: each task's mean over its samples (every depth pooled), then
the mean over tasks, each task weighing the same (:func:`posenc.extend.measures.tasks.scores_by_length`).
Two effective lengths per method (:mod:`posenc.extend.measures.tasks.effective`): against RULER's 85.6 %
and against 90 % of the model's own score as trained (``none``) at the shortest length, or of
the method's own where the study has no ``none``.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..measures.tasks import (
    RELATIVE_FRACTION,
    EffectiveLength,
    effective_lengths,
    scores_by_length,
    summarize,
)
from ..methods.names import IDENTITY_NOTE


def task_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == "task"]


def study_methods(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows' methods, in the order the study ran them."""
    return list(dict.fromkeys(r["method"] for r in rows))


def _cell(r: dict[str, Any]) -> tuple[str, float | None]:
    return str(r["task"]), r["depth"]


def coverage(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], tuple[int, int]]:
    """(method, length) -> (cells done, cells the study has): a study run in pieces has lengths
    where a method has answered only some of its (task, depth) cells so far."""
    tasks = task_rows(rows)
    every = {_cell(r) for r in tasks}
    done: dict[tuple[str, int], set[tuple[str, float | None]]] = defaultdict(set)
    for r in tasks:
        done[(r["method"], int(r["length"]))].add(_cell(r))
    return {key: (len(cells), len(every)) for key, cells in done.items()}


def complete_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The task rows of the (method, length) pairs with every cell of the study answered: an
    average over the tasks done so far is no RULER score, so effective lengths read only these."""
    cover = coverage(rows)
    return [r for r in task_rows(rows)
            if len(set(cover[(r["method"], int(r["length"]))])) == 1]  # fmt: skip


def reference_score(rows: Sequence[dict[str, Any]]) -> float | None:
    """The model as trained at the shortest length (``none``'s score there), or None."""
    mine = [r for r in rows if r["method"] == "none"]
    scores = scores_by_length(mine)
    return scores[min(scores)] if scores else None


def method_lengths(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, EffectiveLength]]:
    """Method -> ``{"absolute": ..., "relative": ...}`` effective lengths from its task rows at
    the lengths where it has answered every cell (:func:`complete_rows`)."""
    tasks = complete_rows(rows)
    reference = reference_score(tasks)
    return {
        m: effective_lengths([r for r in tasks if r["method"] == m], RELATIVE_FRACTION, reference)
        for m in study_methods(tasks)
    }


def _score_text(scores: dict[int, float], cover: dict[tuple[str, int], tuple[int, int]],
                method: str, n: int) -> str:  # fmt: skip
    """A score in %, with ``(k/N cells)`` where the method has answered only some so far."""
    if n not in scores:
        return ""
    done, total = cover[(method, n)]
    return f"{100 * scores[n]:.1f}" + (f" ({done}/{total} cells)" if done < total else "")


def interval_text(low: float, high: float) -> str:
    """A 95 % interval in whole percent, rounded outward (``[30–96]`` for 0.3006-0.9544) so that
    the printed interval never claims more than the computed one (a hair of float error, 1e-9,
    not rounded out: 0.07 prints 7)."""
    return f"[{math.floor(100 * low + 1e-9):.0f}–{math.ceil(100 * high - 1e-9):.0f}]"


def k_text(n: int) -> str:
    """A length as the tables write it: ``8192`` -> ``8k``, ``1000`` -> ``1000``."""
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def length_text(e: EffectiveLength, shortest: int | None) -> str:
    """An effective length as a table cell: ``4k``, ``≥ 32k`` (every length passed), ``< 2k``
    (below the threshold at ``shortest``, the shortest length the method answered in full);
    ``< 8k (again at 16k, 32k)``: longer lengths at or above it again after the first failure,
    which the rule does not count but a reader must not miss."""
    if e.how == "no length answered in full yet" or shortest is None:
        return ""
    text = f"< {k_text(shortest)}" if e.length is None else k_text(e.length)
    if e.censored:
        text = "≥ " + text
    if e.passes_after:
        text += f" (again at {', '.join(k_text(n) for n in e.passes_after)})"
    return text


def shortest_full(rows: Sequence[dict[str, Any]], method: str) -> int | None:
    """The shortest length ``method`` has answered in full (:func:`complete_rows`), or None."""
    lengths = [int(r["length"]) for r in complete_rows(rows) if r["method"] == method]
    return min(lengths) if lengths else None


def task_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per method; its score (%) at each task length, both effective
    lengths and the median seconds per sample."""
    tasks = task_rows(rows)
    lengths = sorted({int(r["length"]) for r in tasks})
    trained = tasks[0].get("model", {}).get("trained_length") if tasks else None
    header = ["method", *(f"score@{k_text(n)}" + (" (trained)" if n == trained else "")
                          for n in lengths), "effective (85.6%)", "effective (rel.)",
              "s / sample"]  # fmt: skip
    eff, cover = method_lengths(tasks), coverage(tasks)
    none = EffectiveLength(None, 0.0, "", None, False, (), "no length answered in full yet")
    body = []
    for method in study_methods(tasks):
        mine = [r for r in tasks if r["method"] == method]
        scores = scores_by_length(mine)
        per_sample = [r["seconds"] / r["n"] for r in mine]
        mark = eff.get(method, {"absolute": none, "relative": none})
        shortest = shortest_full(tasks, method)
        same = all(r.get("identical_to_none") for r in mine)  # its factor is 1 at every length
        body.append([
            method + (IDENTITY_NOTE if same else ""),
            *(_score_text(scores, cover, method, n) for n in lengths),
            length_text(mark["absolute"], shortest), length_text(mark["relative"], shortest),
            f"{statistics.median(per_sample):.1f}",
        ])  # fmt: skip
    return header, body


def per_task_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per (task, method), the task's score (%) at each length with its
    Wilson 95 % interval over the pooled samples (``62 [41–79]``); samples asked of one shared
    context (a row's ``contexts``) one cluster of the cluster-aware interval
    (:func:`posenc._stats.cluster_wilson_interval`)."""
    tasks = task_rows(rows)
    lengths = sorted({int(r["length"]) for r in tasks})
    pooled: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    clusters: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    for r in tasks:
        key = (r["task"], r["method"], int(r["length"]))
        pooled[key].extend(r["scores"])
        clusters[key].extend(r.get("contexts") or r["digests"])
    body = []
    for task in dict.fromkeys(r["task"] for r in tasks):
        for method in study_methods(tasks):
            cells = []
            for n in lengths:
                got = pooled.get((task, method, n))
                shared = clusters[(task, method, n)]
                s = (summarize(got, contexts=shared if len(set(shared)) < len(shared) else None)
                     if got else None)  # fmt: skip
                cells.append(f"{100 * s.mean:.0f} {interval_text(s.low, s.high)}" if s else "")
            if any(cells):
                body.append([task, method, *cells])
    return ["task", "method", *(str(n) for n in lengths)], body


def effective_notes(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One sentence per method: how each effective length was found."""
    return [f"{m}: {e['absolute'].how}; {e['relative'].how}"
            for m, e in method_lengths(rows).items()]  # fmt: skip


def needle_data(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What :func:`posenc.plots.needle.draw_needle_heatmap` draws: per method, the mean score
    of the needle tasks (RULER's ``niah`` family) asked at every depth any of them was (else
    the one asked at the most), at each (depth, length), and ``trained``; ``tasks`` names
    those drawn."""
    from ..measures.tasks import TASKS

    needles = [r for r in task_rows(rows) if r["depth"] is not None
               and r["task"] in TASKS and TASKS[r["task"]].family == "niah"]  # fmt: skip
    # Only the needle tasks asked at every depth of the grid: one asked at 50 % alone (a study's
    # distractor-key needle) would pull that row alone down (or up) and read as a depth effect.
    depths: dict[str, set[float]] = defaultdict(set)
    for r in needles:
        depths[r["task"]].add(float(r["depth"]))
    grid = set().union(*depths.values())
    keep = {t for t, d in depths.items() if d == grid}
    if not keep and depths:  # no task covers every depth: the one of the most, named alone
        keep = {max(depths, key=lambda t: len(depths[t]))}
    tasks = [r for r in needles if r["task"] in keep]
    cells: dict[str, dict[tuple[float, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in tasks:
        cells[r["method"]][(float(r["depth"]), int(r["length"]))].extend(r["scores"])
    return {
        "model": model_name(rows),
        "trained": rows[0]["model"]["trained_length"] if rows else 0,
        "tasks": sorted({r["task"] for r in tasks}),
        "scores": {m: {k: statistics.fmean(v) for k, v in by_cell.items()}
                   for m, by_cell in cells.items()},
    }  # fmt: skip


def task_curves(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What :func:`posenc.plots.needle.draw_task_scores` draws: per task, per method, the
    mean score at each length (depths pooled), the average over tasks where every cell is
    answered (:func:`complete_rows`), and the trained length."""
    pooled: dict[str, dict[str, dict[int, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for r in task_rows(rows):
        pooled[r["task"]][r["method"]][int(r["length"])].extend(r["scores"])
    return {
        "model": model_name(rows),
        "trained": rows[0]["model"]["trained_length"] if rows else 0,
        "scores": {t: {m: {n: statistics.fmean(v) for n, v in sorted(by.items())}
                       for m, by in methods.items()} for t, methods in pooled.items()},
        "average": {m: scores_by_length([r for r in complete_rows(rows) if r["method"] == m])
                    for m in study_methods(task_rows(rows))},  # only the lengths answered in full
    }  # fmt: skip


def model_name(rows: Sequence[dict[str, Any]]) -> str:
    """The model the rows were measured on: its source's last part, else its GGUF's name."""
    model = (rows[0].get("model") or {}) if rows else {}
    return str(model.get("source", "")).rsplit("/", 1)[-1] or str(model.get("gguf") or "")


def _task_with_depths(tasks: Sequence[dict[str, Any]], task: str) -> str:
    """``niah_single_2 at depths 10%, 50%, 90%`` (the name in backticks): each task with the depths it was asked at
    (a study may ask the needle at three depths and the other tasks at one)."""
    depths = sorted({r["depth"] for r in tasks if r["task"] == task and r["depth"] is not None})
    at = f" at depth{'s' if len(depths) > 1 else ''} {', '.join(f'{d:.0%}' for d in depths)}"
    return f"`{task}`" + (at if depths else "")


def task_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The task section of a study's Markdown block (lines): the average table with effective
    lengths, how each was found, then every task's scores with their intervals."""
    from ..._markdown import markdown_table

    tasks = task_rows(rows)
    if not tasks:
        return []
    first = tasks[0]
    names = ", ".join(_task_with_depths(tasks, t) for t in dict.fromkeys(r["task"] for r in tasks))
    out = [
        "",
        f"RULER-style tasks ({names}; {first['n']} samples per cell, seed {first['task_seed']}"
        + "; greedy answers through the KV cache, scored as RULER scores them). Score: each "
        "task's mean, then the mean over tasks, in %; effective length: the longest length up "
        "to which the score stays at or above RULER's 85.6 % (absolute) or 90 % of the model's "
        "own score as trained at the shortest length (rel.); (again at ...): longer lengths "
        "above the bar again after the first one below it:",
        "",
        markdown_table(*task_table(tasks)),
        "",
        *(f"- {line}" for line in effective_notes(tasks)),
        "",
        "Per task, % with the Wilson 95 % interval over its samples (rounded outward; the "
        "questions of one prefilled context one cluster, a task of fewer than five contexts "
        "taken as if each context's questions were answered alike):",
        "",
        markdown_table(*per_task_table(tasks)),
    ]
    return out
