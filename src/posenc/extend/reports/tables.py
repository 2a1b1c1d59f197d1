"""A study's rows as a terminal table, a Markdown block (README's real-model section) and a
figure. Every number here is read from the rows; nothing is computed that the rows do not hold.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from ..._markdown import counted, markdown_table
from ..methods.names import IDENTITY_NOTE


def _methods(rows: Sequence[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        if r["method"] not in seen:
            seen.append(r["method"])
    return seen


def ppl_lengths(rows: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({int(n) for r in rows if r["kind"] == "ppl" for n in r["ppl"]})


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({min(values):.2f}–{max(values):.2f})"


def study_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and body: one row per method; perplexity at each length (mean over documents,
    their range in brackets when more than one), then passkey (exact retrievals, mean key
    log-probability) and the seconds per forward."""
    lengths = ppl_lengths(rows)
    passkey = [r for r in rows if r["kind"] == "passkey"]
    header = ["method", *(f"ppl@{n}" for n in lengths)]
    if passkey:
        header += ["passkey exact", "key log-prob"]
    header.append("s / forward")
    body = []
    for method in _methods(rows):
        mine = [r for r in rows if r["method"] == method]
        ppl = [r for r in mine if r["kind"] == "ppl"]
        line = [
            method
            + (IDENTITY_NOTE if mine and all(r.get("identical_to_none") for r in mine) else "")
        ]
        for n in lengths:
            vals = [
                r["ppl"][str(n)] for r in ppl if str(n) in r["ppl"] and r["ppl"][str(n)] is not None
            ]
            line.append(_spread(vals) if vals else "")
        if passkey:
            keys = [r for r in mine if r["kind"] == "passkey"]
            line += (
                [f"{sum(r['exact'] for r in keys)}/{len(keys)}",
                 f"{statistics.fmean(r['key_logprob'] for r in keys):.2f}"]
                if keys else ["", ""]
            )  # fmt: skip
        secs = [r["seconds"] for r in ppl] or [r["seconds"] for r in mine]
        line.append(f"{statistics.median(secs):.0f}")
        body.append(line)
    return header, body


def markdown_report(
    rows: Sequence[dict[str, Any]], *, command: str, wall_seconds: float | None
) -> str:
    """The generated Markdown: what was run, the table, the passkey cells, the wall time."""
    if not rows:
        raise ValueError("no study rows to report")
    model = rows[0]["model"]
    measured = [r for r in rows if r["kind"] in ("ppl", "passkey")]  # others: own tables
    header, body = study_table(measured)
    docs = sorted({r["document"] for r in rows if r["kind"] == "ppl"})
    out = [
        f"Model: `{model['source'].rsplit('/', 1)[-1]}` ({model['model_type']}, "
        f"{model['parameters'] / 1e6:.0f}M parameters, trained length {model['trained_length']}, "
        f"{model['dtype']})"
        + (
            f"; documents: {', '.join(f'`{d}`' for d in docs)}; perplexity of the last "
            f"{measured[0].get('bin_size', 1024)} tokens before each length"
            if docs
            else ""
        )
        + ". Versions: "
        + ", ".join(f"{k} {v}" for k, v in rows[0]["versions"].items())
        + ".",
        "",
        f"```bash\n{command}\n```",
        *(["", markdown_table(header, body)] if measured else []),
    ]
    keys = [r for r in rows if r["kind"] == "passkey"]
    if keys:
        out += [
            "",
            "Passkey cells (key at depth of the filler; ranks of the key's tokens, 1 = greedy):",
            "",
        ]
        out.append(markdown_table(
            ["method", "length", "depth", "key log-prob", "ranks", "exact"],
            [[r["method"], str(r["length"]), f"{r['depth']:.0%}", f"{r['key_logprob']:.2f}",
              " ".join(map(str, r["ranks"])), "yes" if r["exact"] else "no"] for r in keys],
        ))  # fmt: skip
    from .longppl import longppl_markdown
    from .tasks import task_markdown

    out += longppl_markdown(rows) + task_markdown(rows)
    out += ["", cost_line(rows, wall_seconds) + "."]
    return "\n".join(out)


def _threads(n: int) -> str:
    return counted(n, "thread")


def cost_line(rows: Sequence[dict[str, Any]], wall_seconds: float | None = None) -> str:
    """What the rows cost: their forwards' wall time, split by thread count where a study's
    pieces ran on different numbers of threads (a resumed study may), and their CPU time."""
    by_threads: dict[int, list[float]] = {}
    for r in rows:
        by_threads.setdefault(int(r["threads"]), []).append(float(r["seconds"]))
    total = sum(sum(s) for s in by_threads.values())
    cells = counted(len(rows), "cell")
    if len(by_threads) == 1:
        (threads,) = by_threads
        timing = f"{total / 60:.0f} min of forwards ({cells}, {_threads(threads)})"
    else:
        parts = ", ".join(f"{len(by_threads[t])} on {_threads(t)}: {sum(by_threads[t]) / 60:.0f} min"
                          for t in sorted(by_threads))  # fmt: skip
        timing = f"{total / 60:.0f} min of forwards ({cells}; {parts})"
    timed = [r["cpu_seconds"] for r in rows if isinstance(r.get("cpu_seconds"), (int, float))]
    if timed:  # the cells' own cost, whatever else ran on the machine (rows before it lack it)
        where = "" if len(timed) == len(rows) else f" in the {len(timed)} cells that record it"
        timing += f"; {sum(timed) / 60:.0f} min of CPU time{where}"
    if wall_seconds is not None:
        timing += f"; wall time {wall_seconds / 60:.0f} min with loading"
    return timing


def figure_data(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The plain data :func:`posenc.plots.real_model.draw_real_study` draws."""
    model = rows[0]["model"]
    ppl: dict[str, dict[int, float]] = {}
    passkey: dict[str, dict[tuple[float, int], tuple[float, float, bool]]] = {}
    for method in _methods(rows):
        mine = [r for r in rows if r["method"] == method]
        by_len: dict[int, list[float]] = {}
        for r in (r for r in mine if r["kind"] == "ppl"):
            for n, v in r["ppl"].items():
                if v is not None and math.isfinite(v):
                    by_len.setdefault(int(n), []).append(v)
        ppl[method] = {n: statistics.fmean(v) for n, v in by_len.items()}
        passkey[method] = {
            (r["depth"], r["length"]): (r["key_logprob"], statistics.fmean(r["ranks"]), r["exact"])
            for r in mine
            if r["kind"] == "passkey"
        }
    name = model["source"].rsplit("/", 1)[-1]
    return {"model": name, "trained": model["trained_length"], "ppl": ppl, "passkey": passkey}
