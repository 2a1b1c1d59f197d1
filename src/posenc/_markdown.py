"""Markdown helpers shared by the benchmark results (``posenc bench``) and the lab's report:
one table formatter, and one way of rewriting a generated block between marker lines."""

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


def replace_block(path: Path, start: str, end: str, text: str) -> None:
    """Rewrite the lines between the marker lines ``start`` and ``end`` of ``path`` with
    ``text``, keeping everything else byte for byte.

    Raises ValueError naming the file when a marker is missing (or they are out of order):
    where a generated block goes in a hand-written file is the author's choice, never guessed.
    """
    old = path.read_text(encoding="utf-8")
    i, j = old.find(start + "\n"), old.find("\n" + end)
    if i < 0 or j < i:
        raise ValueError(
            f"{path} has no {start} ... {end} block; put those two lines where the generated "
            "text goes"
        )
    head, tail = old[: i + len(start) + 1], old[j:]
    path.write_text(head + text.rstrip("\n") + tail, encoding="utf-8")
