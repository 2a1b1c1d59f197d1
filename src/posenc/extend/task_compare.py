"""Two runs' answers to the same task cells, side by side: does a change that should not decide
the answers (the dtype, a quantization, the device, a posenc version) change them?

The task rows (:mod:`posenc.extend.rows`, kind ``task``) of two study folders are paired by
cell, ``(method, task, length, depth)``, and within a cell sample by sample: both runs must have
answered the same prompts (the rows' sample digests), else the comparison is refused, as
:func:`posenc.extend.tasks.paired_difference` refuses it between methods. Cells only one run
has are left out and counted. Per length, and over all of them:

* ``same answer``: the share of paired samples whose generated text is the same string;
* ``same score``: the share whose score is the same (an answer may differ after the reference);
* each run's score over the paired cells, RULER's (each task's mean, then the mean over tasks);
* the paired difference, second run minus first, sample by sample (every task pooled), with its
  Student t interval (:func:`posenc._stats.paired_mean_ci`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._stats import paired_mean_ci
from .tasks import scores_by_length

Row = dict[str, Any]


def _key(r: Row) -> tuple[str, str, int, float | None]:
    return str(r["method"]), str(r["task"]), int(r["length"]), r["depth"]


def paired_cells(first: Sequence[Row], second: Sequence[Row]) -> tuple[list[tuple[Row, Row]], int]:
    """The task cells both runs answered, as ``(first's row, second's row)`` in ``first``'s
    order, and how many task cells only one of them has. ValueError where a paired cell's two
    rows answered different prompts (another seed, tokenizer or task generator)."""
    mine = {_key(r): r for r in first if r["kind"] == "task"}
    theirs = {_key(r): r for r in second if r["kind"] == "task"}
    pairs = []
    for key, a in mine.items():
        b = theirs.get(key)
        if b is None:
            continue
        if list(a["digests"]) != list(b["digests"]):
            method, task, length, depth = key
            raise ValueError(
                f"{task} at {length} (depth {depth}, {method}) answered different prompts in the "
                "two runs (another seed, tokenizer or task generator): a paired comparison needs "
                "the same ones"
            )
        pairs.append((a, b))
    return pairs, len(mine.keys() ^ theirs.keys())


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _line(label: str, pairs: Sequence[tuple[Row, Row]]) -> list[str]:
    """One row of :func:`compare_table` over ``pairs`` (all of one length, or every length)."""
    a_scores = [float(s) for a, _ in pairs for s in a["scores"]]
    b_scores = [float(s) for _, b in pairs for s in b["scores"]]
    same_out = [x == y for a, b in pairs for x, y in zip(a["outputs"], b["outputs"], strict=True)]
    n = len(a_scores)
    mean, half = paired_mean_ci(b_scores, a_scores)

    def ruler(side: int) -> float:  # per length, then the mean over lengths
        by = scores_by_length([p[side] for p in pairs])
        return sum(by.values()) / len(by)

    diff = f"{100 * mean:+.1f}" + (f" ± {100 * half:.1f}" if half is not None else "")
    same_score = sum(x == y for x, y in zip(a_scores, b_scores, strict=True)) / n
    return [label, str(len(pairs)), str(n), _pct(sum(same_out) / n), _pct(same_score),
            f"{100 * ruler(0):.1f}", f"{100 * ruler(1):.1f}", diff]  # fmt: skip


def compare_table(first: Sequence[Row], second: Sequence[Row],
                  names: tuple[str, str] = ("first", "second")) -> tuple[list[str], list[list[str]]]:  # fmt: skip
    """``(header, rows)``: one row per length both runs answered, then ``all`` (see the module
    docstring); scores in %. ValueError where the runs share no task cell."""
    pairs, _ = paired_cells(first, second)
    if not pairs:
        raise ValueError("the two runs have no task cell in common (same method, task, length, "
                         "depth): nothing to compare")  # fmt: skip
    lengths = sorted({int(a["length"]) for a, _ in pairs})
    rows = [_line(f"{n // 1024}k" if n % 1024 == 0 else str(n),
                  [p for p in pairs if int(p[0]["length"]) == n]) for n in lengths]  # fmt: skip
    if len(lengths) > 1:
        rows.append(_line("all", pairs))
    header = ["length", "cells", "samples", "same answer %", "same score %",
              f"score {names[0]}", f"score {names[1]}", f"{names[1]} − {names[0]} (95 % CI)"]  # fmt: skip
    return header, rows


def compare_markdown(first: Sequence[Row], second: Sequence[Row],
                     names: tuple[str, str] = ("first", "second")) -> str:  # fmt: skip
    """:func:`compare_table` as Markdown, after a line saying what was paired and in what the two
    runs differ (their rows' model identity and versions)."""
    from .._markdown import markdown_table
    from ..runs.identity import config_diff

    pairs, unpaired = paired_cells(first, second)
    header, rows = compare_table(first, second, names)
    a, b = pairs[0]
    diff = config_diff(a["model"], b["model"], "model.") + config_diff(
        a.get("versions"), b.get("versions"), "versions."
    )
    differ = "; ".join(diff) if diff else "nothing recorded"
    intro = (
        f"The task cells both runs answered ({len(pairs)}; {unpaired} only one has), paired "
        f"sample by sample on the same prompts. `{names[1]}` differs from `{names[0]}` in: "
        f"{differ}. Scores in % (RULER's: each task's mean, then the mean over tasks; `all`: the "
        f"mean over lengths); the difference is over samples, every task pooled:"
    )
    return intro + "\n\n" + markdown_table(header, rows)
