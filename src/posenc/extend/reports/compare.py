"""Two runs' answers to the same task cells, side by side: does a change that should not decide
the answers (the dtype, a quantization, the device, a posenc version) change them?

The task rows (:mod:`posenc.extend.study.rows`, kind ``task``) of two study folders are paired by
cell, ``(method, task, length, depth)``, and within a cell sample by sample: both runs must have
answered the same prompts (the rows' sample digests), else the comparison is refused, as
:func:`posenc.extend.measures.tasks.paired_difference` refuses it between methods. Cells only one run
has are left out and counted. One line per method, and one for every method together:

* ``same answer``: the share of paired samples whose generated text is the same string;
* ``same score``: the share whose score is the same (an answer may differ after the reference);
* each run's score over the paired cells: RULER's at each length (each task's mean, then the
  mean over tasks), then the mean over the lengths paired (and over methods for ``all``);
* the difference of those two scores, second run minus first;
* the samples whose score went up and down, and the exact two-sided sign test of those counts
  (:func:`posenc._stats.sign_test_p`; McNemar's exact test where scores are 0 or 1). Samples of
  one prompt answered under several methods are not independent, so ``all``'s test is a guide.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._stats import sign_test_p
from ..measures.tasks import scores_by_length
from .tasks import model_name

Row = dict[str, Any]
Pair = tuple[Row, Row]


def _key(r: Row) -> tuple[str, str, int, float | None]:
    return str(r["method"]), str(r["task"]), int(r["length"]), r["depth"]


def _cell_text(key: tuple[str, str, int, float | None]) -> str:
    method, task, length, depth = key
    return f"{task} at {length} (depth {depth}, {method})"


def _by_key(rows: Sequence[Row], name: str) -> dict[tuple[str, str, int, float | None], Row]:
    """``name``'s task rows by cell; ValueError for a run with none, or with one cell twice (two
    studies of other settings in one folder: which one to pair is not for us to guess)."""
    out: dict[tuple[str, str, int, float | None], Row] = {}
    for r in rows:
        if r["kind"] != "task":
            continue
        key = _key(r)
        if key in out:
            raise ValueError(f"{name} holds {_cell_text(key)} twice (another --samples, seed or "
                             "target length in the same folder): give one study per folder")  # fmt: skip
        if not len(r["scores"]) == len(r["outputs"]) == len(r["digests"]):
            raise ValueError(f"{name}'s row of {_cell_text(key)} is damaged: its scores, "
                             "outputs and digests differ in number")  # fmt: skip
        out[key] = r
    if not out:
        raise ValueError(f"{name} holds no task rows (a study run without --tasks): nothing "
                         "to pair")  # fmt: skip
    return out


def paired_cells(first: Sequence[Row], second: Sequence[Row],
                 names: tuple[str, str] = ("first", "second")) -> tuple[list[Pair], int]:  # fmt: skip
    """The task cells both runs answered, as ``(first's row, second's row)`` in ``first``'s
    order, and how many task cells only one of them has. ValueError where a paired cell's two
    rows answered a different number of prompts or different prompts."""
    mine, theirs = _by_key(first, names[0]), _by_key(second, names[1])
    pairs = []
    for key, a in mine.items():
        b = theirs.get(key)
        if b is None:
            continue
        if len(a["digests"]) != len(b["digests"]):
            raise ValueError(
                f"{_cell_text(key)} has {len(a['digests'])} samples in {names[0]} and "
                f"{len(b['digests'])} in {names[1]}: run both with the same --samples"
            )
        if list(a["digests"]) != list(b["digests"]):
            models = [model_name([r]) for r in (a, b)]
            why = (f"the runs are of different models, {models[0]} and {models[1]}, whose "
                   "tokenizers build other prompts" if models[0] != models[1] else
                   "another --task-seed, tokenizer or task generator")  # fmt: skip
            raise ValueError(
                f"{_cell_text(key)} answered different prompts in {names[0]} and {names[1]} "
                f"({why}): a paired comparison needs the same ones"
            )
        pairs.append((a, b))
    return pairs, len(mine.keys() ^ theirs.keys())


def _score(cells: Sequence[Row]) -> float:
    """RULER's score per length, then the mean over lengths, for one method's cells."""
    by = scores_by_length(cells)
    return sum(by.values()) / len(by)


def _line(label: str, pairs: Sequence[Pair]) -> list[str]:
    """One row of :func:`compare_table` over ``pairs`` (one method's, or every method's)."""
    samples = [(x, y, p, q) for a, b in pairs for x, y, p, q in
               zip(a["outputs"], b["outputs"], a["scores"], b["scores"], strict=True)]  # fmt: skip
    n = len(samples)
    methods = list(dict.fromkeys(a["method"] for a, _ in pairs))
    scores = [
        [_score([p[side] for p in pairs if p[0]["method"] == m]) for m in methods]
        for side in (0, 1)
    ]
    first, second = (sum(s) / len(s) for s in scores)  # the mean over methods
    up = sum(float(q) > float(p) for _, _, p, q in samples)
    down = sum(float(q) < float(p) for _, _, p, q in samples)
    p_value = sign_test_p(up, down)
    return [label, str(len(pairs)), str(n),
            f"{100 * sum(x == y for x, y, _, _ in samples) / n:.0f}",
            f"{100 * sum(float(p) == float(q) for _, _, p, q in samples) / n:.0f}",
            f"{100 * first:.1f}", f"{100 * second:.1f}", f"{100 * (second - first):+.1f}",
            f"{up} / {down}", "–" if p_value is None else f"{p_value:.2g}"]  # fmt: skip


def compare_table(first: Sequence[Row], second: Sequence[Row],
                  names: tuple[str, str] = ("first", "second")) -> tuple[list[str], list[list[str]]]:  # fmt: skip
    """``(header, rows)``: one row per method both runs answered, then ``all`` where there are
    several (see the module docstring); scores in %. ValueError where the runs share no task
    cell, or as :func:`paired_cells`."""
    pairs, _ = paired_cells(first, second, names)
    if not pairs:
        raise ValueError(f"{names[0]} and {names[1]} have no task cell in common (same method, "
                         "task, length and depth): nothing to compare")  # fmt: skip
    methods = list(dict.fromkeys(a["method"] for a, _ in pairs))
    rows = [_line(m, [p for p in pairs if p[0]["method"] == m]) for m in methods]
    if len(methods) > 1:
        rows.append(_line("all", pairs))
    header = ["method", "cells", "samples", "same answer %", "same score %",
              f"score {names[0]}", f"score {names[1]}", "difference", "score up / down",
              "sign test p"]  # fmt: skip
    return header, rows


def _differences(pairs: Sequence[Pair]) -> list[str]:
    """Where the paired rows differ in what was run: model identity, method settings, versions
    (over every pair: a study run in pieces may hold rows of several versions)."""
    from ...runs.identity import config_diff

    found: dict[str, None] = {}
    for a, b in pairs:
        for field in ("model", "settings", "versions"):
            for d in config_diff(a.get(field), b.get(field), f"{field}."):
                found.setdefault(d if field != "settings" else f"{a['method']}: {d}")
    return list(found)


def compare_markdown(first: Sequence[Row], second: Sequence[Row],
                     names: tuple[str, str] = ("first", "second")) -> str:  # fmt: skip
    """:func:`compare_table` as Markdown, after a line saying what was paired, at which lengths,
    and in what the two runs differ (their rows' model identity, settings and versions)."""
    from ..._markdown import markdown_table

    pairs, unpaired = paired_cells(first, second, names)
    header, rows = compare_table(first, second, names)
    lengths = sorted({int(a["length"]) for a, _ in pairs})
    at = ", ".join(f"{n // 1024}k" if n % 1024 == 0 else str(n) for n in lengths)
    differ = "; ".join(_differences(pairs)) or "nothing recorded"
    intro = (
        f"The task cells both runs answered ({len(pairs)}, at {at}; {unpaired} only one has), "
        f"paired sample by sample on the same prompts. `{names[1]}` differs from `{names[0]}` "
        f"in: {differ}. Scores in %: RULER's at each length (each task's mean, then the mean "
        f"over tasks), then the mean over those lengths (and over methods for `all`); the "
        f"difference is `{names[1]}` minus `{names[0]}`:"
    )
    return intro + "\n\n" + markdown_table(header, rows)
