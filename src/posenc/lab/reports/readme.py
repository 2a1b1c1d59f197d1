"""The lab's tables in a Markdown page: the blocks ``posenc lab report --readme PAGE`` rewrites in
place (the full table, the README's headline, the length and passkey tables), checked before
anything is computed so a page that cannot take its table is refused in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..._markdown import block_problem, markdown_table, replace_block
from .report import paired_markdown, table_cells
from .results import question_of_rows, question_rows

#: The lines around the full lab table (``posenc lab report --readme docs/lab-results.md``).
README_START, README_END = "<!-- lab:table -->", "<!-- /lab:table -->"
#: The README's headline: the same grid's means alone, the paired differences on the page.
HEADLINE_BLOCK = ("<!-- lab:headline -->", "<!-- /lab:headline -->")

#: The README block each question's table goes into (``extend``'s: posenc.lab.reports.extend_report).
README_BLOCKS = {
    "extrapolation": (README_START, README_END),
    "length": ("<!-- lab:length -->", "<!-- /lab:length -->"),
    "passkey": ("<!-- lab:passkey -->", "<!-- /lab:passkey -->"),
}


def readme_problem(path: str | Path, question: str | None = None) -> str | None:
    """Why ``--readme path`` cannot take a table, checked before anything is computed; None if
    it can. The file must exist, be writable, and hold one well-formed block: ``question``'s
    (:data:`README_BLOCKS`, or ``"extend"``'s), or, with no question, every block whose markers
    it holds well-formed and at least one of them (:func:`posenc._markdown.block_problem`)."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        return f"{path} {what}; --readme takes a Markdown file with the table's block in it"
    if not os.access(path, os.W_OK):
        return f"{path} is not writable; --readme rewrites its table's block in place"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"{path} cannot be read as UTF-8 text ({e})"
    try:
        blocks = _blocks(text, question)
    except ValueError as e:
        return str(e)
    present = {q: m for q, m in blocks.items() if question or any(x in text for x in m)}
    for start, end in present.values():
        problem = block_problem(text, start, end)
        if problem is not None:
            return f"{path} {problem}; nothing was written"
    if not present:
        pairs = "; ".join(f"{start} ... {end}" for start, end in blocks.values())
        return f"{path} has no block of the lab's ({pairs}); put one where the table goes"
    return None


def _blocks(text: str, question: str | None) -> dict[str, tuple[str, str]]:
    """The blocks ``--readme`` checks in ``text``: all of them with no question; the question's
    (for extrapolation, the full table and the headline, those it holds, else the full one)."""
    from .extend_report import README_MARKERS

    known = {**README_BLOCKS, "extend": README_MARKERS}
    if question is None:
        return {**known, "headline": HEADLINE_BLOCK}
    if question not in known:
        raise ValueError(f"unknown question {question!r}; choose one of {', '.join(known)}")
    if question != "extrapolation":
        return {question: known[question]}
    held = {q: m for q, m in ((question, known[question]), ("headline", HEADLINE_BLOCK))
            if any(x in text for x in m)}  # fmt: skip
    return held or {question: known[question]}


def check_readme(path: str | Path | None, question: str | None = None) -> None:
    """ValueError with :func:`readme_problem`'s line unless ``path`` (``--readme``; None: no
    file asked for) can take the table: called before the rows are read."""
    problem = None if path is None else readme_problem(path, question)
    if problem is not None:
        raise ValueError(problem)


def readme_table(rows: list[dict[str, Any]], reference: str | None = None) -> str:
    """The full lab table: :func:`headline_table`, then, after a blank line, the paired
    differences from ``reference`` (:func:`paired_markdown`)."""
    paired = paired_markdown(rows, reference)
    return headline_table(rows) + ("\n" + paired if paired else "")


def headline_table(rows: list[dict[str, Any]]) -> str:
    """The means: every column of :func:`table_cells` but ``params`` and ``seeds`` (the text
    above the table gives the model and the seeds); the README's :data:`HEADLINE_BLOCK`."""
    header, body = table_cells(rows)
    return markdown_table(header[:-2], [cells[:-2] for cells in body]) + "\n"


def write_readme_table(
    path: str | Path,
    rows: list[dict[str, Any]],
    question: str | None = None,
    reference: str | None = None,
) -> Path:
    """Write the rows' table between the lines of their question's block in ``path``
    (:data:`README_BLOCKS`; for extrapolation also, or instead, :func:`headline_table` in the
    :data:`HEADLINE_BLOCK` it holds), leaving the rest of the file as it was; returns the path.

    ``question``: the table to write (default: the one the rows answer as a whole,
    :func:`question_of_rows`), from the rows that answer it (:func:`question_rows`).
    Extrapolation and length: :func:`readme_table`; passkey: accuracy by length and where
    each encoding loses the key (:func:`posenc.plots.passkey.passkey_table`); ``reference``: the
    line the extrapolation and length tables' paired differences are from (default RoPE,
    :func:`paired_markdown`). Raises ValueError (:func:`readme_problem`), the file left as it
    was, unless it holds that block."""
    path = Path(path)
    question = question or question_of_rows(rows)
    problem = readme_problem(path, question)
    if problem is not None:
        raise ValueError(problem)
    rows = question_rows(rows, question)
    if not rows:
        raise ValueError(f"no {question} results in these rows")
    if question == "passkey":
        from ...plots.passkey import passkey_table

        header, body, note = passkey_table(rows)
        text = note + "\n\n" + markdown_table(header, body) + "\n"
        replace_block(path, *README_BLOCKS[question], text)
        return path
    for name, markers in _blocks(path.read_text(encoding="utf-8"), question).items():
        table = headline_table(rows) if name == "headline" else readme_table(rows, reference)
        replace_block(path, *markers, table)
    return path
