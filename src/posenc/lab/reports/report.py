"""Reports from the results store: the table (terminal, Markdown, and the README's block), a
CSV of every number, and the lab figure (:func:`posenc.plots.lab.draw_lab`, the same figure as
``posenc plot lab``).

One table shows one *group*: cells that share everything but encoding and seed
(:func:`posenc.lab.cells.presets.group_identity`). By default the group of the latest row.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._markdown import markdown_table
from ...runs.store import RESULTS_FILE
from .paired import PAIRED_COLUMNS, find_reference, paired_columns, paired_section, print_paired
from .results import (
    QUESTIONS,
    grid_store_rows,
    groups,
    load_rows,
    newest_group,
    question_of,
    question_of_rows,
    question_rows,
)
from .stats import CI_LEVEL, intervals_overlap, mean_ci

__all__ = [
    "CI_LEVEL", "QUESTIONS", "REPORT_DIR", "SPEED_LEGEND", "TIE_MARK", "TableRow",
    "check_reference", "ci_legend", "describe", "fmt_bits", "grid_store_rows", "groups",
    "length_names", "lengths_of", "line_speed", "load_rows", "markdown_bold", "newest_group",
    "noise_marks", "nope_throughput", "paired_markdown", "print_table", "question_of",
    "question_of_rows", "question_rows", "results_markdown", "speed_basis", "table_cells",
    "table_rows", "write_csv", "write_report",
]  # fmt: skip

REPORT_DIR = "report"


@dataclass
class TableRow:
    """One line of the table: an encoding (or one of its inference-time variants)."""

    encoding: str
    variant: str  # "base", "interp", "linear", ...
    label: str
    bits: dict[int, list[float | None]] = field(default_factory=dict)  # length -> per seed
    acc: dict[int, list[float | None]] = field(default_factory=dict)  # length -> per seed
    seeds: list[int] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)
    tokens_per_s_fast: list[float] = field(default_factory=list)
    tokens_per_cpu_s: list[float] = field(default_factory=list)  # rows that recorded CPU time
    params: int | None = None
    train_bits: list[float] = field(default_factory=list)


def table_rows(rows: list[dict[str, Any]]) -> list[TableRow]:
    """Fold result rows (one per cell) into table lines (one per encoding x variant)."""
    lines: dict[tuple[str, str], TableRow] = {}
    for r in rows:
        ev = r["eval"]
        for vname, v in ev["variants"].items():
            key = (r["encoding"], vname)
            label = r["encoding"] if vname == "base" else f"{r['encoding']} +{v['label']}"
            line = lines.setdefault(key, TableRow(r["encoding"], vname, label))
            line.seeds.append(int(r["seed"]))
            for n, res in v["results"].items():
                line.bits.setdefault(int(n), []).append(res["bits"])
                line.acc.setdefault(int(n), []).append(res.get("acc"))
            if vname == "base":
                line.tokens_per_s.append(float(r["train"]["tokens_per_s"]))
                train = r["train"]
                line.tokens_per_s_fast.append(
                    float(train.get("tokens_per_s_fast", train["tokens_per_s"]))
                )
                if isinstance(train.get("tokens_per_cpu_s"), (int, float)):
                    line.tokens_per_cpu_s.append(float(train["tokens_per_cpu_s"]))
                line.params = int(r["params"])
                line.train_bits.append(float(r["train"]["final_loss_bits"]))
    return list(lines.values())


def lengths_of(rows: list[dict[str, Any]]) -> list[int]:
    return sorted({int(n) for r in rows for n in r["eval"]["lengths"]})


def length_names(train_len: int, lengths: list[int]) -> list[str]:
    """The tables' length columns: ``64 (L)``, ``128 (2L)``, ..."""
    return [f"{n}" + (" (L)" if n == train_len else f" ({n / train_len:g}L)") for n in lengths]


#: Appended to a base cell whose interval overlaps the best one's at that length.
TIE_MARK = "≈"


def _mean_ci(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean over seeds and the half-width of its 95% interval (:func:`posenc.lab.reports.stats.mean_ci`);
    ``(None, None)`` if any seed has no finite value (a mean over the seeds that happened to
    work would not be the same quantity as its neighbours'), half-width None for one seed."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals or len(vals) < len(values):
        return None, None
    return mean_ci(vals, CI_LEVEL)


def fmt_bits(values: list[float | None]) -> str:
    """``3.012 ± 0.021`` (mean ± 95% half-width over seeds), ``3.012`` for one seed, ``n/a``."""
    mean, half = _mean_ci(values)
    if mean is None:
        return "n/a"
    return f"{mean:.3f}" + (f" ± {half:.3f}" if half is not None else "")


def noise_marks(lines: list[TableRow], lengths: list[int]) -> dict[tuple[int, int], str]:
    """Which cells are the best or within noise of it: ``(line index, length) -> "best" |
    "tie"``.

    At each length only base lines compete (a variant is the same model evaluated differently,
    not a rival). The best is the lowest mean; it is marked only if it has an interval (two or
    more seeds), and a tie is another base line whose interval overlaps the best's
    (:func:`posenc.lab.reports.stats.intervals_overlap`). One seed: no interval, nothing marked.
    """
    marks: dict[tuple[int, int], str] = {}
    for n in lengths:
        stats = [
            (i, *_mean_ci(line.bits.get(n, [None])))
            for i, line in enumerate(lines)
            if line.variant == "base"
        ]
        known = [(i, m, h) for i, m, h in stats if m is not None]
        if not known:
            continue
        best, best_mean, best_half = min(known, key=lambda s: s[1])
        if best_half is None:  # a lower mean with no interval: nothing can be called a tie
            continue
        marks[(best, n)] = "best"
        for i, mean, half in known:
            if i == best or half is None:  # a line without an interval cannot be placed
                continue
            if intervals_overlap((mean, half), (best_mean, best_half)):
                marks[(i, n)] = "tie"
    return marks


def markdown_bold(text: str) -> str:
    """How the table's best cell is emphasized in Markdown (the default of :func:`table_cells`)."""
    return f"**{text}**"


def _rich_bold(text: str) -> str:
    return f"[bold]{text}[/bold]"


def ci_legend(rows: list[dict[str, Any]]) -> str:
    """The sentence that says what ``±``, bold and ``≈`` mean; empty when no line has two
    seeds (the cells are then single runs and nothing is marked)."""
    if not any(len(set(line.seeds)) > 1 for line in table_rows(rows)):
        return ""
    return (
        f"Cells: mean over seeds ± half-width of its {CI_LEVEL:.0%} confidence interval "
        "(Student t, seeds − 1 degrees of freedom). Within noise: at each length, bold is the "
        f"lowest base encoding and {TIE_MARK} marks each other base encoding whose interval "
        "overlaps the bold one's (not shown to differ from it); variant lines (+...) are "
        "not marked. "
    )


def speed_basis(lines: list[TableRow]) -> str:
    """What ``×NoPE`` compares: ``"cpu"`` (throughput per second of CPU time, which other load
    on the machine does not inflate) when every base line holds it for each of its seeds, else
    ``"wall"`` (fast-decile wall-clock throughput: rows from before CPU time was recorded, or
    trained on CUDA, where the host's CPU time is not the work)."""
    base = [line for line in lines if line.variant == "base"]
    cpu = all(len(line.tokens_per_cpu_s) == len(line.tokens_per_s) for line in base)
    return "cpu" if base and cpu else "wall"


def line_speed(line: TableRow, basis: str) -> float | None:
    """A base line's training throughput on ``basis`` (:func:`speed_basis`), mean over seeds."""
    values = line.tokens_per_cpu_s if basis == "cpu" else line.tokens_per_s_fast
    return statistics.fmean(values) if values else None


def nope_throughput(lines: list[TableRow], basis: str | None = None) -> float | None:
    """NoPE's training throughput on ``basis`` (default :func:`speed_basis` of ``lines``): the
    ``×NoPE`` ratio's denominator, if NoPE ran."""
    basis = basis or speed_basis(lines)
    for line in lines:
        if line.encoding == "none" and line.variant == "base":
            return line_speed(line, basis)
    return None


#: What the caption says ``×NoPE`` is, by :func:`speed_basis`.
SPEED_LEGEND = {
    "cpu": "×NoPE: training throughput per second of the process's CPU time (median step) "
    "relative to NoPE's; CPU time does not count the waits for a core that other load on the "
    "machine causes, so cells trained apart or side by side compare on their own work. ",
    "wall": "×NoPE: ratio of fast-decile wall-clock step throughput to NoPE's, each cell timed "
    "while it trained (these rows hold no CPU time): it moves with other load on the machine. ",
}


def table_cells(
    rows: list[dict[str, Any]], bold: Callable[[str], str] = markdown_bold
) -> tuple[list[str], list[list[str]]]:
    """Header and body of the results table as strings.

    Columns: the encoding (or ``encoding +variant``), test bits per byte (or token) at each eval
    length (:func:`fmt_bits`: ``mean ± 95% half-width`` over seeds, the mean alone for one seed,
    ``n/a`` where a length does not apply; the best base cell passed through ``bold`` and ties
    with it suffixed ``≈``, :func:`noise_marks`), ``train tok/s`` (mean training throughput,
    tokens per second), ``×NoPE`` (throughput relative to NoPE's, per CPU second where the rows
    hold it, :func:`speed_basis`), ``params`` and
    ``seeds`` (how many seeds the means are over). Variant lines leave the last four empty.
    """
    lines = table_rows(rows)
    lengths = lengths_of(rows)
    train_len = rows[0]["train_len"] if rows else 0
    basis = speed_basis(lines)
    nope = nope_throughput(lines, basis)
    unit = rows[0]["eval"]["unit"] if rows else "byte"
    header = ["encoding", *length_names(train_len, lengths)]
    header += ["train tok/s", "×NoPE", "params", "seeds"]
    marks = noise_marks(lines, lengths)
    body = []
    for k, line in enumerate(lines):
        cells = [line.label] + [fmt_bits(line.bits.get(n, [None])) for n in lengths]
        for i, n in enumerate(lengths, 1):
            mark = marks.get((k, n))
            cells[i] = bold(cells[i]) if mark == "best" else cells[i]
            cells[i] += f" {TIE_MARK}" if mark == "tie" else ""
        if unit == "token":  # synthetic tasks: answer accuracy is the number people read
            for i, n in enumerate(lengths, 1):
                acc, _ = _mean_ci(line.acc.get(n, [None]))
                if acc is not None:
                    cells[i] += f" ({acc:.0%})"
        cells += ["", "", "", ""]
        if line.variant == "base":
            tps = statistics.fmean(line.tokens_per_s) if line.tokens_per_s else None
            fast = line_speed(line, basis)
            cells[-4:] = [
                f"{tps:,.0f}" if tps else "",
                f"{fast / nope:.2f}" if fast and nope else "",
                f"{line.params:,}" if line.params else "",
                str(len(set(line.seeds))),
            ]
        body.append(cells)
    return header, body


def describe(rows: list[dict[str, Any]]) -> str:
    """One paragraph: what the table measured, where, how long."""
    if not rows:
        return "no results"
    r0 = rows[0]
    model = r0["identity"]["train"]["model"]
    train = r0["identity"]["train"]["train"]
    wall = sum(r["runtime"]["cell_seconds"] for r in rows)
    threads = sorted({r["runtime"]["threads"] for r in rows})
    devices = sorted({r["runtime"]["device"] for r in rows})
    worlds = sorted({r["runtime"]["world_size"] for r in rows})
    mode = r0["eval"]["mode"]
    base = r0["eval"]["variants"]["base"]["results"]
    scored = max((res["tokens"] for res in base.values()), default=0)
    # A test split shorter than --eval-tokens caps it (more lost than a window's rounding).
    budget = r0["identity"].get("eval", {}).get("tokens")
    longest = max(r0["eval"]["lengths"], default=0)
    capped = isinstance(budget, int) and scored + longest <= budget
    cap = f" (the whole test split: --eval-tokens {budget} is capped to it)" if capped else ""
    options = sorted(
        {f"{r['encoding']} {r['encoding_kwargs']}" for r in rows if r["encoding_kwargs"]}
    )
    return (
        ci_legend(rows)
        + "train tok/s: mean training throughput in tokens per second (wall clock); "
        + SPEED_LEGEND[speed_basis(table_rows(rows))]
        + (f"encoding options: {'; '.join(options)}. " if options else "")
        + f"group {r0['group']} (preset {r0['preset']}): data {r0['data']['name']} "
        f"({r0['data']['fingerprint']}), model dim {model['dim']} x {model['num_layers']} layers "
        f"x {model['num_heads']} heads, train length {r0['train_len']}, {train['steps']} steps x "
        f"{train['batch_size']} sequences, eval on {mode} windows, {scored} test tokens per "
        f"length{cap}; {len(rows)} cells, {wall:.0f} s of cell time; device {', '.join(devices)}, "
        f"threads {threads}, processes {worlds}; torch {r0['versions']['torch']}"
    )


def print_table(
    rows: list[dict[str, Any]], console: Any = None, reference: str | None = None
) -> None:
    """Print the table with rich, and under it the paired differences from ``reference``
    (default RoPE, :func:`paired_markdown`'s table in compact cells)."""
    from rich.console import Console

    from ...runs.term_table import print_table as print_cells

    if console is None:
        console = Console()
        if not console.is_terminal:  # a log file or pipe: do not squeeze the table into 80 columns
            console = Console(width=200)
    header, body = table_cells(rows, bold=_rich_bold)
    from rich import box

    keep = len(header) - 2  # params and seeds go to the Markdown table and the caption
    unit = rows[0]["eval"]["unit"]
    title = f"train short, test long: test bits per {unit} at each eval length" + (
        " (answer accuracy)" if unit == "token" else ""
    )
    # Every number in full: split to fit a terminal, whole in a log (posenc.runs.term_table).
    cells = [c[:keep] for c in body]
    print_cells(header[:keep], cells, title=title, caption=describe(rows), console=console,
                markup=True, box=box.SIMPLE_HEAD)  # fmt: skip
    _print_paired(rows, console, reference)


@dataclass
class _Paired:
    """What the paired differences of a table are computed from (:mod:`posenc.lab.reports.paired`)."""

    lines: list[TableRow]
    reference: TableRow
    lengths: list[int]
    names: list[str]
    unit: str


def _paired(rows: list[dict[str, Any]], reference: str | None) -> _Paired | None:
    """The table's lines and its reference line (:func:`~posenc.lab.reports.paired.find_reference`);
    None when there is no default reference line. ValueError for a ``reference`` not there."""
    lines = table_rows(rows)
    ref = find_reference(lines, reference)
    if ref is None or not rows:
        return None
    lengths = lengths_of(rows)
    names = length_names(rows[0]["train_len"], lengths)
    return _Paired(lines, ref, lengths, names, rows[0]["eval"]["unit"])


def _print_paired(rows: list[dict[str, Any]], console: Any, reference: str | None) -> None:
    p = _paired(rows, reference)
    if p is not None:
        print_paired(console, p.lines, p.reference, p.lengths, p.names, p.unit)


def paired_markdown(rows: list[dict[str, Any]], reference: str | None = None) -> str:
    """The paired differences from ``reference`` (a line's label; default
    :data:`~posenc.lab.reports.paired.DEFAULT_REFERENCE`) in Markdown: their legend and table
    (:func:`posenc.lab.reports.paired.paired_section`), the note that they need two seeds when the
    reference has one, or "" when there is no default reference line. ValueError naming the
    lines when a ``reference`` given is not one of them."""
    p = _paired(rows, reference)
    if p is None:
        return ""
    return paired_section(p.lines, p.reference, p.lengths, p.names, p.unit)


def check_reference(rows: list[dict[str, Any]], reference: str | None) -> None:
    """ValueError naming the table's lines unless ``reference`` (``--reference``; None: the
    default, which may be absent) is one of them: checked before anything is printed."""
    find_reference(table_rows(rows), reference)


def results_markdown(rows: list[dict[str, Any]], reference: str | None = None) -> str:
    """The table in Markdown (bits per byte or token at each eval length), with its caption,
    then the paired differences from ``reference`` (:func:`paired_markdown`)."""
    header, body = table_cells(rows)
    header[0] = f"encoding (bits/{rows[0]['eval']['unit']})"
    paired = paired_markdown(rows, reference)
    text = markdown_table(header, body) + "\n\n" + describe(rows) + "\n"
    return text + ("\n" + paired if paired else "")


def _seed_stats(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    """``(encoding, variant, eval length) -> {"bits_mean", "bits_ci95_half", "n_seeds"}``: the
    numbers of the table's cell (the same seeds, the same :func:`_mean_ci`), for the CSV; an
    empty string where the table shows ``n/a`` or has no interval."""
    out = {}
    for line in table_rows(rows):
        for n, values in line.bits.items():
            mean, half = _mean_ci(values)
            out[(line.encoding, line.variant, n)] = {
                "bits_mean": "" if mean is None else mean,
                "bits_ci95_half": "" if half is None else half,
                "n_seeds": len(values),
            }
    return out


def write_csv(rows: list[dict[str, Any]], path: Path, reference: str | None = None) -> None:
    """Long format: one line per (cell, variant, eval length).

    Three columns repeat the table's cell on each of its seeds' lines: ``bits_mean`` and
    ``bits_ci95_half`` (mean over seeds and the half-width of its 95% interval, empty for one
    seed) and ``n_seeds`` (how many seeds they are over); the last ones, the line's paired
    difference from ``reference`` at that length (:data:`~posenc.lab.reports.paired.PAIRED_COLUMNS`,
    empty without a reference line).
    """
    fields = [
        "group", "config_hash", "encoding", "variant", "seed", "train_len", "eval_len",
        "bits", "acc", "tokens", "note", "train_tokens_per_s", "train_tokens_per_s_fast",
        "train_seconds",
        "train_loss_bits", "params", "threads", "world_size", "device",
        "bits_mean", "bits_ci95_half", "n_seeds", *PAIRED_COLUMNS,
    ]  # fmt: skip
    stats = _seed_stats(rows)
    p = _paired(rows, reference)
    paired = {} if p is None else paired_columns(p.lines, p.reference, p.lengths)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            for vname, v in r["eval"]["variants"].items():
                for n, res in v["results"].items():
                    w.writerow(
                        {
                            "group": r["group"],
                            "config_hash": r["config_hash"],
                            "encoding": r["encoding"],
                            "variant": vname,
                            "seed": r["seed"],
                            "train_len": r["train_len"],
                            "eval_len": n,
                            "bits": res["bits"],
                            "acc": res["acc"],
                            "tokens": res["tokens"],
                            "note": res.get("note") or "",
                            "train_tokens_per_s": r["train"]["tokens_per_s"],
                            "train_tokens_per_s_fast": r["train"].get("tokens_per_s_fast"),
                            "train_seconds": r["train"]["train_seconds"],
                            "train_loss_bits": r["train"]["final_loss_bits"],
                            "params": r["params"],
                            "threads": r["runtime"]["threads"],
                            "world_size": r["runtime"]["world_size"],
                            "device": r["runtime"]["device"],
                            **stats[(r["encoding"], vname, int(n))],
                            **paired.get((r["encoding"], vname, int(n)), {}),
                        }
                    )


def write_report(
    out: str | Path,
    rows: list[dict[str, Any]] | None = None,
    group: str | None = None,
    plots: bool = True,
    reference: str | None = None,
) -> dict[str, Path]:
    """Write ``table.md``, ``results.csv`` and (if matplotlib is installed) ``lab.png``, the
    figure ``posenc plot lab`` draws, under ``<out>/report``; returns what was written, by
    name. ``reference``: the line the paired differences are from (default RoPE)."""
    out = Path(out)
    rows = load_rows(out, group) if rows is None else rows
    if not rows:
        raise ValueError(f"no results in {out / RESULTS_FILE}; run `posenc lab` first")
    folder = out / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = {"table": folder / "table.md", "csv": folder / "results.csv"}
    written["table"].write_text(results_markdown(rows, reference))
    write_csv(rows, written["csv"], reference)
    if plots:
        from ...plots.common import plots_ready, save_figure
        from ...plots.lab import draw_lab, lab_data

        if not plots_ready("the report's figures"):  # said on one line; table and CSV only
            return written
        written["plot"] = save_figure(draw_lab(lab_data(rows=rows)), folder / "lab.png")
        if question_of_rows(rows) == "passkey":
            from ...plots.passkey import write_passkey_figures

            written.update(write_passkey_figures(rows, folder))
    return written
