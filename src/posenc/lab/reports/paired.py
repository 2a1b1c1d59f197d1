"""Paired differences against a reference line of the lab's table (default RoPE).

Cells of one grid that share a seed share its data order, so what the seed alone decides
(which batches came first, which test windows were hard for every model) cancels in the
difference of two cells of that seed. For each line of the table and each eval length: the
mean over the shared seeds of ``line's bits - reference's bits`` (same seed, same length), the
half-width of its 95% interval (Student t on the per-seed differences, ``n - 1`` degrees of
freedom, :func:`posenc.lab.reports.stats.paired_mean_ci`), the two-sided p-value of the same paired t
test (:func:`posenc.lab.reports.stats.paired_t_p`), and whether the difference is *resolved*, worse or
better than the reference, after a correction for the number of comparisons.

The correction: a table of 17 lines at four lengths makes about 65 comparisons, so at 5% each
about three would be marked by chance alone. Holm's step-down correction
(:func:`posenc.lab.reports.stats.holm`) is applied across every comparison of the table, and a
difference is resolved where its Holm-adjusted p is below 5% (``1 - CI_LEVEL``). Holm, not
Benjamini-Hochberg: each mark is read as a claim on its own (the README cites single cells),
so what must be bounded is the chance that *any* mark is false (the family-wise error rate),
not their expected share (BH's false discovery rate); and Holm holds under any dependence,
while BH needs independent or positively dependent tests, and these share the reference's
values and the seeds. The ``±`` interval stays each comparison's own (uncorrected) 95% one: its
width is the measurement; the mark is the corrected decision.

Pure: it reads table lines (:class:`posenc.lab.reports.report.TableRow`, or anything with their
``label``, ``seeds`` and ``bits``) and returns numbers and strings; :mod:`posenc.lab.reports.report`
puts them in the terminal table, ``table.md``, ``results.csv`` and the README block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from ..._markdown import markdown_table
from .stats import CI_LEVEL, holm, paired_mean_ci, paired_t_p

__all__ = [
    "DEFAULT_REFERENCE", "PAIRED_COLUMNS", "RESOLVED_MARK", "PairedDiff", "PairedTable",
    "find_reference", "fmt_diff", "paired_cells", "paired_columns", "paired_diff",
    "paired_legend", "paired_note", "paired_section", "paired_table", "print_paired",
    "seed_bits",
]  # fmt: skip

#: The line every other line is compared with, unless ``--reference`` names another.
DEFAULT_REFERENCE = "rope"

#: After a resolved difference in the terminal's compact cells (the Markdown writes the word).
RESOLVED_MARK = "*"


#: ``results.csv``'s columns for a line's paired difference at one length, repeated on each of
#: its seeds' lines: the reference's label, the mean difference and its 95% interval's ends,
#: :attr:`PairedDiff.resolved` (after Holm's correction), the number of seeds shared, the paired
#: t test's p-value and its Holm-adjusted value (empty where not available).
PAIRED_COLUMNS = (
    "reference", "bits_diff_mean", "bits_diff_ci95_low", "bits_diff_ci95_high",
    "diff_resolved", "diff_n_seeds", "diff_p", "diff_p_holm",
)  # fmt: skip

#: The level a Holm-adjusted p must be below for a difference to be resolved (5%).
ALPHA = round(1.0 - CI_LEVEL, 12)


class Line(Protocol):
    """What this module reads of a table line (:class:`posenc.lab.reports.report.TableRow`)."""

    encoding: str
    variant: str
    label: str
    seeds: list[int]
    bits: dict[int, list[float | None]]


@dataclass(frozen=True)
class PairedDiff:
    """A line's difference from the reference at one eval length, over ``pairs`` shared seeds.

    ``mean`` None: not available (no shared seed, or a shared seed without a finite value on
    either side, the table's ``n/a``); ``half`` None: one pair, no spread to estimate. ``p``:
    the paired t test's two-sided p-value (None: nothing to test, :func:`paired_t_p`);
    ``p_holm``: ``p`` adjusted by Holm across the table's comparisons (:func:`paired_table`;
    a difference on its own, from :func:`paired_diff`, is a family of one: ``p``)."""

    mean: float | None
    half: float | None
    pairs: int
    p: float | None = None
    p_holm: float | None = None

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half is None else self.mean + self.half

    @property
    def resolved(self) -> str:
        """``"worse"`` (Holm-adjusted p below :data:`ALPHA`, more bits than the reference),
        ``"better"`` (the same, fewer bits), ``"no"`` (not shown to differ, or nothing to test),
        ``""`` (no interval: under two pairs or n/a). For a family of one, worse or better is
        exactly the 95% interval excluding 0 from above or below."""
        if self.mean is None or self.half is None:
            return ""
        if self.p_holm is None or self.p_holm >= ALPHA:
            return "no"
        return "worse" if self.mean > 0 else "better"


def seed_bits(line: Line, length: int) -> dict[int, float | None]:
    """Seed -> the line's bits at ``length`` (None where not finite). A seed the line holds
    twice (two rows of one seed in a group) keeps its later row. No value for some of the
    line's seeds (a row without this length): every seed None, as the table's ``n/a``."""
    values = line.bits.get(length, [])
    if len(values) != len(line.seeds):
        return dict.fromkeys(line.seeds)
    return {
        int(s): (float(v) if v is not None and math.isfinite(v) else None)
        for s, v in zip(line.seeds, values, strict=True)
    }


def paired_diff(line: Line, reference: Line, length: int, level: float = CI_LEVEL) -> PairedDiff:
    """``line``'s bits minus ``reference``'s at ``length``, paired by seed over the seeds both
    hold (:class:`PairedDiff`); n/a if a shared seed lacks a value on either side (a mean over
    the seeds that happened to work would not be the quantity its neighbours are)."""
    mine, theirs = seed_bits(line, length), seed_bits(reference, length)
    shared = sorted(set(mine) & set(theirs))
    values = [v for s in shared if (v := mine[s]) is not None]
    refs = [v for s in shared if (v := theirs[s]) is not None]
    if not shared or len(values) < len(shared) or len(refs) < len(shared):
        return PairedDiff(None, None, len(shared))
    mean, half = paired_mean_ci(values, refs, level)
    p = paired_t_p(values, refs)
    return PairedDiff(mean, half, len(shared), p, p)


@dataclass(frozen=True)
class PairedTable:
    """Every difference of a paired table, ``(index of the line in the table, eval length) ->``
    :class:`PairedDiff` with ``p_holm`` adjusted across the table's ``comparisons`` tests (the
    differences with a p-value), the reference's own line left out."""

    diffs: dict[tuple[int, int], PairedDiff]
    comparisons: int


def paired_table(
    lines: Sequence[Line], reference: Line, lengths: Sequence[int], level: float = CI_LEVEL
) -> PairedTable:
    """Each line's :func:`paired_diff` from ``reference`` at each length, its p-value adjusted
    by Holm (:func:`posenc.lab.reports.stats.holm`) over every test of the table at once."""
    diffs = {
        (i, n): paired_diff(line, reference, n, level)
        for i, line in enumerate(lines)
        if line is not reference
        for n in lengths
    }
    tested = [key for key, d in diffs.items() if d.p is not None]
    adjusted = holm([p for key in tested if (p := diffs[key].p) is not None])
    for key, p_holm in zip(tested, adjusted, strict=True):
        diffs[key] = replace(diffs[key], p_holm=p_holm)
    return PairedTable(diffs, len(tested))


_L = TypeVar("_L", bound=Line)


def find_reference(lines: Sequence[_L], reference: str | None) -> _L | None:
    """The reference line: the one labelled ``reference`` (case-insensitive: ``rope``,
    ``rope +YaRN``); with None, :data:`DEFAULT_REFERENCE`'s line, or None when the table has
    none (a grid without RoPE has no default comparison). ValueError naming the labels
    present when a ``reference`` given is not among them."""
    wanted = (reference if reference is not None else DEFAULT_REFERENCE).strip().lower()
    for line in lines:
        if line.label.lower() == wanted:
            return line
    if reference is None:
        return None
    labels = ", ".join(line.label for line in lines)
    raise ValueError(
        f"--reference {reference!r} is not a line of this table; lines: {labels or 'none'}"
    )


def _signed(x: float) -> str:
    text = f"{x:+.3f}"
    return "0.000" if text in ("+0.000", "-0.000") else text


def fmt_diff(diff: PairedDiff, compact: bool = False) -> str:
    """``+0.213 ± 0.031 worse`` (``compact``: ``+0.213±0.031*``), ``-0.041 ± 0.020 better``,
    ``+0.010 ± 0.030`` (not resolved), ``+0.213`` (one pair), ``n/a``."""
    if diff.mean is None:
        return "n/a"
    text = _signed(diff.mean)
    if diff.half is not None:
        text += f"±{diff.half:.3f}" if compact else f" ± {diff.half:.3f}"
    if diff.resolved in ("better", "worse"):
        text += RESOLVED_MARK if compact else f" {diff.resolved}"
    return text


def paired_cells(
    lines: Sequence[Line],
    reference: Line,
    lengths: Sequence[int],
    length_names: Sequence[str],
    compact: bool = False,
) -> tuple[list[str], list[list[str]]]:
    """Header and body of the paired table: one line per table line but the reference, in the
    table's order; a cell per eval length (:func:`fmt_diff`, marked after Holm's correction
    across the table, :func:`paired_table`), then ``seeds``: how many seeds the line shares
    with the reference (the ``n`` of its intervals)."""
    table = paired_table(lines, reference, lengths)
    header = [f"vs {reference.label}", *length_names, "seeds"]
    body = []
    for i, line in enumerate(lines):
        if line is reference:
            continue
        diffs = [table.diffs[i, n] for n in lengths]
        pairs = len(set(line.seeds) & set(reference.seeds))
        body.append([line.label, *(fmt_diff(d, compact) for d in diffs), str(pairs)])
    return header, body


def paired_note(reference: Line) -> str | None:
    """The sentence that stands in for the paired table when the reference has fewer than two
    seeds (a difference of one pair has no interval to resolve anything with); None when it
    has two or more."""
    seeds = len(set(reference.seeds))
    if seeds >= 2:
        return None
    return (
        f"Paired differences against {reference.label} need at least 2 seeds; "
        f"{reference.label} has {seeds} here (run with --seeds 2 or more)."
    )


def paired_legend(reference: str, unit: str, comparisons: int, compact: bool = False) -> str:
    """What the paired table's cells mean, and the multiple-comparison rule of its marks
    (Holm across the table's ``comparisons`` tests)."""
    mark = f"{RESOLVED_MARK} marks" if compact else "worse or better marks"
    return (
        f"Paired differences from {reference}: for each seed, a line's bits per {unit} minus "
        f"{reference}'s at the same eval length (the seeds share data order), mean over the "
        f"seeds both ran ± half-width of its own {CI_LEVEL:.0%} interval (Student t, seeds − 1 "
        f"degrees of freedom, uncorrected); negative is fewer bits than {reference}. {mark} a "
        f"difference resolved by the paired t test at {ALPHA:.0%} after Holm's correction for "
        f"the table's {comparisons} comparisons (the chance of any false mark at most "
        f"{ALPHA:.0%}); an unmarked one is not shown to differ, even where its own interval "
        "excludes 0."
    )


def paired_section(
    lines: Sequence[Line],
    reference: Line,
    lengths: Sequence[int],
    length_names: Sequence[str],
    unit: str,
) -> str:
    """The paired differences in Markdown: :func:`paired_legend`, a blank line and the table
    (:func:`paired_cells`); or :func:`paired_note` when the reference has one seed."""
    note = paired_note(reference)
    if note is not None:
        return note + "\n"
    header, body = paired_cells(lines, reference, lengths, length_names)
    m = paired_table(lines, reference, lengths).comparisons
    return paired_legend(reference.label, unit, m) + "\n\n" + markdown_table(header, body) + "\n"


_RICH_STYLE = {"better": "green", "worse": "red"}


def print_paired(
    console: Any,
    lines: Sequence[Line],
    reference: Line,
    lengths: Sequence[int],
    length_names: Sequence[str],
    unit: str,
) -> None:
    """The paired table on a rich ``console``, compact (``+0.213±0.031*``: ``*`` resolved, green
    better and red worse; the seeds column left to the Markdown), so that four lengths fit 80
    columns, and never a number cut where more do not (:func:`posenc.runs.term_table.print_table`);
    or the note that one seed is not enough."""
    from rich import box
    from rich.markup import escape

    from ...runs.term_table import print_table

    note = paired_note(reference)
    if note is not None:
        console.print(escape(note))
        return
    header, body = paired_cells(lines, reference, lengths, length_names, compact=True)
    table = paired_table(lines, reference, lengths)
    others = [i for i, line in enumerate(lines) if line is not reference]
    styled = []
    for i, cells in zip(others, body, strict=True):
        row = [escape(cells[0])]
        for n, cell in zip(lengths, cells[1:-1], strict=True):
            style = _RICH_STYLE.get(table.diffs[i, n].resolved)
            row.append(f"[{style}]{escape(cell)}[/{style}]" if style else escape(cell))
        styled.append(row)
    print_table(
        [escape(h) for h in header[:-1]],
        styled,
        title=f"difference from {reference.label} in bits per {unit}, paired by seed",
        caption=paired_legend(reference.label, unit, table.comparisons, compact=True),
        console=console,
        markup=True,
        box=box.SIMPLE_HEAD,
    )


def paired_columns(
    lines: Sequence[Line], reference: Line, lengths: Sequence[int]
) -> dict[tuple[str, str, int], dict[str, Any]]:
    """``(encoding, variant, eval length) -> {column: value}`` for :data:`PAIRED_COLUMNS`: the
    reference's label on every line, its own lines' differences empty; resolved and the
    adjusted p after Holm's correction across the table (:func:`paired_table`)."""
    table = paired_table(lines, reference, lengths)
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for i, line in enumerate(lines):
        for n in lengths:
            d = table.diffs.get((i, n))
            values: list[Any] = [""] * (len(PAIRED_COLUMNS) - 1)
            if d is not None and d.mean is not None:
                values = [d.mean, _blank(d.low), _blank(d.high), d.resolved, d.pairs,
                          _blank(d.p), _blank(d.p_holm)]  # fmt: skip
            out[(line.encoding, line.variant, n)] = dict(
                zip(PAIRED_COLUMNS, [reference.label, *values], strict=True)
            )
    return out


def _blank(x: float | None) -> float | str:
    return "" if x is None else x
