"""Markdown helpers shared by the benchmark results (``posenc bench``) and the lab's report:
one table formatter, one way of rewriting a generated block between marker lines, and a count
with its noun in the right number."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A pipe table: ``| a | b |`` lines under a ``|---|---|`` rule. An empty cell is written
    ``| |`` (one space), as GitHub and a hand-typed table write it."""

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    out = [line(header), "|" + "|".join("---" for _ in header) + "|"]
    out += [line(r) for r in rows]
    return "\n".join(out)


def block_problem(text: str, start: str, end: str) -> str | None:
    """What keeps ``text`` from holding exactly one well-formed block: the marker line ``start``
    once, then the marker line ``end`` once, each a line of its own. None if it does; else the
    problem, naming the lines, worded to follow the file's name (``has no ... block``)."""
    lines = text.split("\n")
    where = {
        marker: [i + 1 for i, line in enumerate(lines) if marker in line] for marker in (start, end)
    }
    for marker, found in where.items():
        if len(found) > 1:
            at = ", ".join(str(n) for n in found)
            return f"has {marker} on {len(found)} lines ({at}); keep one {start} ... {end} pair"
        if found and lines[found[0] - 1].strip() != marker:
            return f"has {marker} on line {found[0]} with other text; a marker is a line of its own"
    (opened, closed) = (where[start], where[end])
    if not opened and not closed:
        return f"has no {start} ... {end} block; put those two lines where the generated text goes"
    if not closed:
        return f"has {start} on line {opened[0]} and no {end} after it"
    if not opened:
        return f"has {end} on line {closed[0]} and no {start} before it"
    if closed[0] < opened[0]:
        return f"has {end} on line {closed[0]}, before {start} on line {opened[0]}"
    return None


def replace_block(path: Path, start: str, end: str, text: str) -> None:
    """Rewrite the lines between the marker lines ``start`` and ``end`` of ``path`` with
    ``text``, keeping everything else byte for byte.

    Raises ValueError naming the file, and leaves it as it was, unless it holds exactly one
    well-formed pair of marker lines (:func:`block_problem`): where a generated block goes in a
    hand-written file is the author's choice, never guessed.
    """
    old = path.read_text(encoding="utf-8")
    problem = block_problem(old, start, end)
    if problem is not None:
        raise ValueError(f"{path} {problem}; nothing was written")
    lines = old.split("\n")
    i = next(n for n, line in enumerate(lines) if line.strip() == start)
    j = next(n for n, line in enumerate(lines) if line.strip() == end)
    new = lines[: i + 1] + text.rstrip("\n").split("\n") + lines[j:]
    path.write_text("\n".join(new), encoding="utf-8")


def counted(n: int, one: str, many: str | None = None) -> str:
    """``1 cell``, ``2 cells``: a count with its noun in the right number."""
    return f"{n} {one if n == 1 else many or one + 's'}"
