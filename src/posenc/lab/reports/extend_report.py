"""The table of ``posenc lab extend``: zero-shot vs fine-tuned loss per extension method, and the
fine-tune steps each needs to come within the tolerance of a model trained at the target length
from scratch. Read from the results store (rows of kind ``extend`` / ``extend-reference``,
:mod:`posenc.lab.extension.extend`); means over seeds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..._markdown import markdown_table, replace_block
from ...runs.identity import stable_hash
from ...runs.store import RESULTS_FILE
from ...runs.term_table import print_table
from .results import extend_rows
from .rows import EXTEND, REFERENCE

__all__ = [
    "README_MARKERS", "REPORT_DIR", "ExtendLine", "describe_extend", "extend_data",
    "extend_lines", "extend_markdown", "extend_rows", "extend_table", "print_extend_table",
    "reference_for", "steps_to_reference", "write_extend_readme", "write_extend_report",
]  # fmt: skip

REPORT_DIR = "report"
README_MARKERS = ("<!-- lab:extend -->", "<!-- /lab:extend -->")


def _bits(row: dict[str, Any], n: int) -> float | None:
    r = row["eval"]["variants"]["base"]["results"].get(str(n))
    b = r.get("bits") if r else None
    return float(b) if b is not None and math.isfinite(b) else None


def _key_accuracy(row: dict[str, Any], n: int) -> float | None:
    heat = row["eval"]["variants"]["base"].get("passkey")
    if not heat or n not in heat["lengths"]:
        return None
    acc = heat["acc"][heat["lengths"].index(n)]  # [depths]
    return None if any(a is None for a in acc) else statistics.fmean(acc)


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals and len(vals) == len(values) else None


@dataclass
class ExtendLine:
    """One method (or the reference): rows by step, over seeds."""

    label: str
    kind: str
    encoding_name: str
    steps: int
    target_len: int
    by_step: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def seeds(self) -> set[int]:
        """The seeds whose run is finished (its last step is stored): the only ones averaged,
        so every column of a line is over the same seeds (an interrupted seed waits)."""
        return {int(r["seed"]) for r in self.by_step.get(self.steps, [])}

    def bits(self, step: int, n: int) -> float | None:
        """Mean bits at length ``n`` after ``step`` steps over :attr:`seeds` (None if a
        finished seed lacks that row, or none is finished)."""
        seeds = self.seeds
        rows = [r for r in self.by_step.get(step, []) if int(r["seed"]) in seeds]
        if not rows or len(rows) != len(seeds):
            return None
        return _mean([_bits(r, n) for r in rows])

    def key_accuracy(self, step: int, n: int) -> float | None:
        """Passkey grids: per-digit accuracy at length ``n`` after ``step`` steps, averaged
        over the heatmap's depths and :attr:`seeds` (None without a heatmap there)."""
        seeds = self.seeds
        rows = [r for r in self.by_step.get(step, []) if int(r["seed"]) in seeds]
        values = [_key_accuracy(r, n) for r in rows]
        if not rows or len(rows) != len(seeds):
            return None
        return _mean(values)

    def curve(self) -> list[tuple[int, float]]:
        """``(step, mean bits at the target length)`` for every evaluated step, in order."""
        return self._at_target(self.bits)

    def key_curve(self) -> list[tuple[int, float]]:
        """Passkey grids: ``(step, key accuracy at the target length)`` for every evaluated
        step, in order; empty without heatmaps."""
        return self._at_target(self.key_accuracy)

    def _at_target(self, metric: Callable[[int, int], float | None]) -> list[tuple[int, float]]:
        out = []
        for step in sorted(self.by_step):
            v = metric(step, self.target_len)
            if v is not None:
                out.append((step, v))
        return out


def extend_lines(rows: list[dict[str, Any]]) -> list[ExtendLine]:
    """One line per method (or reference) and configuration, its seeds together.

    Keyed by what was run (the model and training configuration), not only the label: rows of
    an older configuration left in the store by a rerun after a change stay a line of their own
    instead of being averaged with the new ones."""
    lines: dict[tuple[str, str, str], ExtendLine] = {}
    for r in rows:
        ident = r["identity"]
        key = (r["kind"], r["label"], stable_hash({"m": ident["model"], "t": ident["train"]}))
        line = lines.setdefault(
            key,
            ExtendLine(
                r["label"], r["kind"], r["encoding_name"], int(r["steps"]), int(r["target_len"])
            ),
        )
        line.by_step.setdefault(int(r["step"]), []).append(r)
    return list(lines.values())


def reference_for(line: ExtendLine, lines: list[ExtendLine]) -> ExtendLine | None:
    """The from-scratch model a method is measured against: the same encoding's if trained,
    else any; the newest such line (rows are in the order written)."""
    refs = [x for x in lines if x.kind == REFERENCE]
    same = [x for x in refs if x.encoding_name == line.encoding_name]
    pick = same or refs
    return pick[-1] if pick else None


def steps_to_reference(line: ExtendLine, ref: ExtendLine | None, tolerance: float = 0.02) -> str:
    """The first evaluated fine-tune step at which the loss at the target length is within
    ``tolerance`` of the reference's (``"0"``: already zero-shot), ``"> N"`` if none is."""
    if ref is None:
        return "n/a"
    ref_bits = ref.bits(ref.steps, ref.target_len)
    if ref_bits is None:
        return "n/a"
    for step, b in line.curve():
        if b <= ref_bits + tolerance:
            return str(step)
    return f"> {line.steps}"


def extend_table(
    rows: list[dict[str, Any]], tolerance: float = 0.02
) -> tuple[list[str], list[list[str]]]:
    """Header and body: per method, zero-shot and fine-tuned bits at every eval length, and
    the steps to come within ``tolerance`` of the from-scratch model at the target length."""
    lines = extend_lines(rows)
    if not lines:
        return [], []
    lengths = sorted({int(n) for r in rows for n in r["eval"]["lengths"]})
    L = int(rows[0]["train_len"])
    target = lines[0].target_len
    steps = lines[0].steps

    def name(n: int) -> str:
        return f"{n / L:g}L"

    header = ["extension"]
    header += [f"0-shot {name(n)}" for n in lengths]
    header += [f"{steps} steps {name(n)}" for n in lengths]
    # The two columns against the from-scratch model, when one was trained.
    scratch = any(x.kind == REFERENCE for x in lines)
    if scratch:
        header += [f"{steps} steps − scratch @{name(target)}"]
        header += [f"steps to scratch+{tolerance:g} @{name(target)}"]
    # A passkey grid: the key's accuracy at the target length, zero-shot and fine-tuned.
    passkey = any(r["eval"]["variants"]["base"].get("passkey") for r in rows)
    if passkey:
        header += [f"key acc 0-shot @{name(target)}", f"key acc {steps} steps @{name(target)}"]
    body = []
    for line in lines:
        if line.kind == REFERENCE:
            continue
        ref = reference_for(line, lines)
        cells = [line.label]
        cells += [_fmt(line.bits(0, n)) for n in lengths]
        cells += [_fmt(line.bits(line.steps, n)) for n in lengths]
        if scratch:
            cells += [_gap(line, ref), steps_to_reference(line, ref, tolerance)]
        if passkey:
            cells += [_fmt_acc(line.key_accuracy(s, line.target_len)) for s in (0, line.steps)]
        body.append(cells)
    for line in lines:
        if line.kind == REFERENCE:
            batch = line.by_step[line.steps][0]["identity"]["train"]["batch_size"]
            what = f"{line.steps} steps x {batch} x {line.target_len}"
            cells = [f"{line.label} ({what})"] + [""] * len(lengths)
            cells += [_fmt(line.bits(line.steps, n)) for n in lengths] + ["—", "—"]
            if passkey:
                cells += ["", _fmt_acc(line.key_accuracy(line.steps, line.target_len))]
            body.append(cells)
    return header, body


def _gap(line: ExtendLine, ref: ExtendLine | None) -> str:
    """Bits above the reference at the target length after the last fine-tune step."""
    if ref is None:
        return "n/a"
    got = line.bits(line.steps, line.target_len)
    bar = ref.bits(ref.steps, ref.target_len)
    return f"{got - bar:+.3f}" if got is not None and bar is not None else "n/a"


def _fmt_acc(a: float | None) -> str:
    return f"{a:.2f}" if a is not None else "n/a"


def _fmt(b: float | None) -> str:
    return f"{b:.3f}" if b is not None else "n/a"


def describe_extend(rows: list[dict[str, Any]]) -> str:
    """One line on what the table is: lengths, steps, learning rate, seeds."""
    if not rows:
        return ""
    r = rows[0]
    tune = next((x for x in rows if x["kind"] == EXTEND), r)
    lr = tune["identity"]["train"]["lr"]
    seeds = sorted({int(x["seed"]) for x in rows})
    unit = r["eval"]["unit"]
    text = (
        f"Trained at L={r['train_len']}, fine-tuned at {r['target_len']} for {tune['steps']} "
        f"steps of {tune['tokens_per_step']:,} tokens (constant lr {lr:g}); test bits per "
        f"{unit}, mean over {len(seeds)} seed(s)."
    )
    if any(x["kind"] == REFERENCE for x in rows):
        text += (
            " Scratch: a model of the same shape trained at the target length from scratch "
            "with the grid's steps and tokens per step (the grid's token budget in longer "
            "sequences); the two scratch columns are the loss above it at the target length "
            "after the fine-tune, and the first evaluated fine-tune step at which the loss "
            "there is within the tolerance of it."
        )
    if any(x["eval"]["variants"]["base"].get("passkey") for x in rows):
        text += " Key acc: passkey accuracy per digit, the mean over the key's depths."
    return text


def extend_markdown(rows: list[dict[str, Any]]) -> str:
    header, body = extend_table(rows)
    return describe_extend(rows) + "\n\n" + markdown_table(header, body)


def print_extend_table(rows: list[dict[str, Any]], console: Any = None) -> None:
    """Print the table with rich, every number in full (:mod:`posenc.runs.term_table`)."""
    header, body = extend_table(rows)
    print_table(
        header, body, title="posenc lab extend", caption=describe_extend(rows), console=console
    )


def write_extend_readme(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Replace the text between the README's extend markers with the table."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    replace_block(path, *README_MARKERS, extend_markdown(rows))
    return path


def extend_data(rows: list[dict[str, Any]], tolerance: float = 0.02) -> dict[str, Any]:
    """What :func:`posenc.plots.extend.draw_extend` draws: the lines of its panels, means over
    seeds (NaN where a length did not apply)."""
    lines = extend_lines(rows)
    lengths = sorted({int(n) for r in rows for n in r["eval"]["lengths"]})
    out: dict[str, Any] = {
        "lengths": lengths,
        "train_len": int(rows[0]["train_len"]),
        "target_len": lines[0].target_len if lines else None,
        "unit": rows[0]["eval"]["unit"],
        "tolerance": tolerance,
        "methods": [],
        "reference": None,
    }

    def nan(b: float | None) -> float:
        return math.nan if b is None else b

    for line in lines:
        by_length = [nan(line.bits(line.steps, n)) for n in lengths]
        if line.kind == REFERENCE:
            # The newest reference (a store may keep an older configuration's too).
            target = nan(line.bits(line.steps, line.target_len))
            out["reference"] = {"label": line.label, "target_bits": target, "bits": by_length}
            continue
        curve, key_curve = line.curve(), line.key_curve()
        out["methods"].append(
            {
                "label": line.label,
                "steps": [s for s, _ in curve],
                "curve": [b for _, b in curve],
                "zero_shot": [nan(line.bits(0, n)) for n in lengths],
                "tuned": by_length,
                "key_steps": [s for s, _ in key_curve],
                "key_curve": [a for _, a in key_curve],
            }
        )
    return out


def write_extend_report(
    out: str | Path, rows: list[dict[str, Any]], plots: bool = True
) -> dict[str, Path]:
    """``extend.md`` and (with matplotlib) ``extend.png`` under ``<out>/report``."""
    if not rows:
        raise ValueError(f"no extend results in {Path(out) / RESULTS_FILE}")
    folder = Path(out) / REPORT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = {"extend table": folder / "extend.md"}
    written["extend table"].write_text(extend_markdown(rows) + "\n")
    if plots:
        from ...plots.common import plots_ready, save_figure
        from ...plots.extend import draw_extend

        if not plots_ready("extend.png"):  # said on one line; the table only
            return written
        written["extend plot"] = save_figure(draw_extend(extend_data(rows)), folder / "extend.png")
    return written
