"""A study's LongPPL rows as a table: method x length, key-token perplexity beside the plain
perplexity of the same forward, and the key tokens counted; read from the rows
(:mod:`posenc.extend.study.rows`, kinds ``longppl`` and ``keytokens``) and nothing else.

Over several documents a cell is the mean of the documents' values (each document's LongPPL is
``exp`` of its own mean key-token loss, as the authors report one per text), the range in
brackets; the key-token count is summed over documents (every method's is the same: one
evaluator picks them).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from ..study.rows import LONGPPL


def longppl_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kind"] == LONGPPL]


def _lengths(rows: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({int(n) for r in rows for n in r["longppl"]})


def _mean_text(values: list[float]) -> str:
    if not values:
        return "–"  # no key token below this length (at most the truncated context)
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({min(values):.2f}–{max(values):.2f})"


def longppl_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per method, ``LongPPL@n`` and ``PPL@n`` (every token below
    ``n``) at each length; a last row of key tokens / tokens scored at each length."""
    mine = longppl_rows(rows)
    lengths = _lengths(mine)
    header = ["method"] + [f"{k}@{n}" for n in lengths for k in ("LongPPL", "PPL")]
    body = []
    for method in dict.fromkeys(r["method"] for r in mine):
        got = [r for r in mine if r["method"] == method]
        line = [method]
        for n in lengths:
            for field in ("longppl", "plain_ppl"):
                line.append(_mean_text([r[field][str(n)] for r in got
                                        if r[field].get(str(n)) is not None]))  # fmt: skip
        body.append(line)
    first = [r for r in mine if r["method"] == mine[0]["method"]] if mine else []
    counts = ["key tokens / tokens"]
    for n in lengths:
        key = sum(r["key_count"].get(str(n), 0) for r in first)
        counts += [str(key), str((n - 1) * len(first))]
    return header, [*body, counts]


def longppl_title(rows: Sequence[dict[str, Any]]) -> str:
    """The table's title: what a key token is here and which method found them."""
    mine = longppl_rows(rows)
    if not mine:
        return "LongPPL"
    r = mine[0]
    evaluators = ", ".join(dict.fromkeys(x["evaluator"] for x in mine))
    return (
        f"LongPPL: perplexity over the key tokens only (evaluator {evaluators}: loss < "
        f"{r['beta']:g} with the whole context and more than {r['alpha']:g} lower than with the "
        f"last {r['trunc_len']} tokens, window {r['window']}); PPL: every token below the length; "
        "–: no key token below the length"
    )


def longppl_markdown(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The LongPPL section of a study's Markdown block (lines), empty without LongPPL rows."""
    from ..._markdown import markdown_table

    if not longppl_rows(rows):
        return []
    return [
        "",
        f"{longppl_title(rows)} (Fang et al., ICLR 2025):",
        "",
        markdown_table(*longppl_table(rows)),
    ]
