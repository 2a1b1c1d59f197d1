"""Paired differences against a reference line of the lab's table (default RoPE).

Cells of one grid that share a seed share its data order, so what the seed alone decides
(which batches came first, which test windows were hard for every model) cancels in the
difference of two cells of that seed. For each line of the table and each eval length: the
mean over the shared seeds of ``line's bits - reference's bits`` (same seed, same length), the
half-width of its 95% interval (Student t on the per-seed differences, ``n - 1`` degrees of
freedom, :func:`posenc.lab.stats.paired_mean_ci`), and whether the interval excludes 0: the
line is *resolved* worse (it excludes 0 from above) or better (from below) than the reference.

Pure: it reads table lines (:class:`posenc.lab.report.TableRow`, or anything with their
``label``, ``seeds`` and ``bits``) and returns numbers and strings; :mod:`posenc.lab.report`
puts them in the terminal table, ``table.md``, ``results.csv`` and the README block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .._markdown import markdown_table
from .stats import CI_LEVEL, paired_mean_ci

__all__ = [
    "DEFAULT_REFERENCE", "PAIRED_COLUMNS", "RESOLVED_MARK", "PairedDiff", "find_reference",
    "fmt_diff", "paired_cells", "paired_columns", "paired_diff", "paired_legend", "paired_note",
    "paired_section", "print_paired", "seed_bits",
]  # fmt: skip

#: The line every other line is compared with, unless ``--reference`` names another.
DEFAULT_REFERENCE = "rope"

#: After a resolved difference in the terminal's compact cells (the Markdown writes the word).
RESOLVED_MARK = "*"


#: ``results.csv``'s columns for a line's paired difference at one length, repeated on each of
#: its seeds' lines: the reference's label, the mean difference and its 95% interval's ends,
#: :attr:`PairedDiff.resolved` and the number of seeds shared (empty where not available).
PAIRED_COLUMNS = (
    "reference", "bits_diff_mean", "bits_diff_ci95_low", "bits_diff_ci95_high",
    "diff_resolved", "diff_n_seeds",
)  # fmt: skip


class Line(Protocol):
    """What this module reads of a table line (:class:`posenc.lab.report.TableRow`)."""

    encoding: str
    variant: str
    label: str
    seeds: list[int]
    bits: dict[int, list[float | None]]


@dataclass(frozen=True)
class PairedDiff:
    """A line's difference from the reference at one eval length, over ``pairs`` shared seeds.

    ``mean`` None: not available (no shared seed, or a shared seed without a finite value on
    either side, the table's ``n/a``); ``half`` None: one pair, no spread to estimate."""

    mean: float | None
    half: float | None
    pairs: int

    @property
    def low(self) -> float | None:
        return None if self.mean is None or self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.mean is None or self.half is None else self.mean + self.half

    @property
    def resolved(self) -> str:
        """``"worse"`` (the interval lies above 0: more bits than the reference), ``"better"``
        (below 0), ``"no"`` (it holds 0), ``""`` (no interval: under two pairs or n/a)."""
        low, high = self.low, self.high
        if low is None or high is None:
            return ""
        return "worse" if low > 0 else "better" if high < 0 else "no"


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
    return PairedDiff(mean, half, len(shared))


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
    table's order; a cell per eval length (:func:`fmt_diff`), then ``seeds``: how many seeds
    the line shares with the reference (the ``n`` of its intervals)."""
    header = [f"vs {reference.label}", *length_names, "seeds"]
    body = []
    for line in lines:
        if line is reference:
            continue
        diffs = [paired_diff(line, reference, n) for n in lengths]
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


def paired_legend(reference: str, unit: str, compact: bool = False) -> str:
    """What the paired table's cells mean."""
    mark = f"{RESOLVED_MARK} marks" if compact else "worse or better marks"
    return (
        f"Paired differences from {reference}: for each seed, a line's bits per {unit} minus "
        f"{reference}'s at the same eval length (the seeds share data order), mean over the "
        f"seeds both ran ± half-width of its {CI_LEVEL:.0%} interval (Student t, seeds − 1 "
        f"degrees of freedom); negative is fewer bits than {reference}. {mark} a difference "
        "whose interval excludes 0 (resolved); an unmarked one is not shown to differ."
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
    return paired_legend(reference.label, unit) + "\n\n" + markdown_table(header, body) + "\n"


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
    columns, and never a number cut where more do not (:func:`posenc.lab.term_table.print_table`);
    or the note that one seed is not enough."""
    from rich import box
    from rich.markup import escape

    from .term_table import print_table

    note = paired_note(reference)
    if note is not None:
        console.print(escape(note))
        return
    header, body = paired_cells(lines, reference, lengths, length_names, compact=True)
    others = [line for line in lines if line is not reference]
    styled = []
    for line, cells in zip(others, body, strict=True):
        row = [escape(cells[0])]
        for n, cell in zip(lengths, cells[1:-1], strict=True):
            style = _RICH_STYLE.get(paired_diff(line, reference, n).resolved)
            row.append(f"[{style}]{escape(cell)}[/{style}]" if style else escape(cell))
        styled.append(row)
    print_table(
        [escape(h) for h in header[:-1]],
        styled,
        title=f"difference from {reference.label} in bits per {unit}, paired by seed",
        caption=paired_legend(reference.label, unit, compact=True),
        console=console,
        markup=True,
        box=box.SIMPLE_HEAD,
    )


def paired_columns(
    lines: Sequence[Line], reference: Line, lengths: Sequence[int]
) -> dict[tuple[str, str, int], dict[str, Any]]:
    """``(encoding, variant, eval length) -> {column: value}`` for :data:`PAIRED_COLUMNS`: the
    reference's label on every line, its own lines' differences empty."""
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for line in lines:
        for n in lengths:
            d = paired_diff(line, reference, n)
            none = line is reference or d.mean is None
            values = (
                ["", "", "", "", ""]
                if none
                else [d.mean, _blank(d.low), _blank(d.high), d.resolved, d.pairs]
            )
            out[(line.encoding, line.variant, n)] = dict(
                zip(PAIRED_COLUMNS, [reference.label, *values], strict=True)
            )
    return out


def _blank(x: float | None) -> float | str:
    return "" if x is None else x
