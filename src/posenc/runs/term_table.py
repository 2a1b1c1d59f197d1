"""A table on the terminal that never cuts a number: the lab's tables (``posenc lab report``,
``posenc lab extend``) printed with rich.

rich fits a table to the console by shrinking its columns, and a cell that no longer fits is cut
(``3.4…``): at 80 columns, and in a log or a pipe, where rich assumes 80. Here every column is
at least as wide as its longest cell; headers wrap at their words instead. A table too wide for
the terminal is split into several, each repeating the first (label) column; a terminal too
narrow for even one value beside its label gets one ``label: header = value`` line per cell.
When the output is not a terminal (a log, a pipe, a capture) the table is printed whole, at its
natural width, however wide that is, and its title and caption one line each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["column_groups", "print_table"]

#: Padding each column takes (one space either side, rich's default) and what the table's
#: edges and the rules between columns take.
_PAD = 2


def _table_width(widths: Sequence[int]) -> int:
    """The printed width of a table whose columns' contents are ``widths`` wide."""
    return sum(w + _PAD for w in widths) + len(widths) + 1


def _cell_width(text: str, markup: bool) -> int:
    from rich.text import Text

    rendered = Text.from_markup(text) if markup else Text(text)
    return max((Text(line).cell_len for line in rendered.plain.splitlines()), default=0)


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def column_groups(widths: Sequence[int], available: int) -> list[list[int]] | None:
    """Columns ``1..n-1`` in order, grouped so that each group beside column 0 fits in
    ``available`` characters (``widths``: the columns' contents); None when one column beside
    column 0 does not fit."""
    groups: list[list[int]] = []
    current: list[int] = []
    for i in range(1, len(widths)):
        if _table_width([widths[0], *(widths[j] for j in [*current, i])]) <= available:
            current.append(i)
            continue
        if not current:
            return None
        groups.append(current)
        current = [i]
        if _table_width([widths[0], widths[i]]) > available:
            return None
    if current:
        groups.append(current)
    return groups


def _widths(
    header: Sequence[str], body: Sequence[Sequence[str]], markup: bool, available: int | None
) -> list[int]:
    """Each column's width: its longest cell (never less), and its header's longest word; the
    whole header where the table is not squeezed (``available`` None). The label column (0)
    takes at most a third of ``available`` when its labels wrap (never less than a word)."""
    out = []
    for i, h in enumerate(header):
        cells = max((_cell_width(row[i], markup) for row in body), default=0)
        head = len(h) if available is None else _longest_word(h)
        if i == 0 and available is not None:
            words = max([_longest_word(h)] + [_longest_word(row[0]) for row in body])
            cells = max(words, min(cells, available // 3))
        out.append(max(cells, head, 1))
    return out


def _records(
    console: Any, header: Sequence[str], body: Sequence[Sequence[str]], markup: bool
) -> None:
    """The narrowest form: one line per value, ``label: header = value``."""
    for row in body:
        for h, cell in zip(header[1:], row[1:], strict=True):
            console.print(f"{row[0]}: {h} = {cell}", markup=markup, soft_wrap=True, highlight=False)


def print_table(
    header: Sequence[str],
    body: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    caption: str | None = None,
    console: Any = None,
    markup: bool = False,
    box: Any = None,
) -> None:
    """Print ``header`` and ``body`` (column 0 the label, left-aligned; the others right-aligned)
    to ``console`` (default: stdout) without cutting any cell (module docstring), ``title``
    above and ``caption`` below (wrapped at the terminal's width; one line each in a log).
    ``markup``: the cells hold rich markup (bold)."""
    from rich import box as boxes
    from rich.console import Console

    console = console if console is not None else Console()
    box = box if box is not None else boxes.HEAVY_HEAD
    log = not console.is_terminal  # a log or a pipe: the whole table, however wide
    widths = _widths(header, body, markup, None if log else console.width)
    # In a log the table is printed at its own width, on the caller's console (a recording
    # console keeps what it printed).
    if log:
        saved, console.width = console.width, _table_width(widths)
        try:
            _print_groups(console, header, body, widths, [list(range(1, len(header)))],
                          title=title, caption=caption, markup=markup, box=box, log=True)  # fmt: skip
        finally:
            console.width = saved
        return
    groups = column_groups(widths, console.width)
    _print_groups(console, header, body, widths, groups, title=title, caption=caption,
                  markup=markup, box=box, log=False)  # fmt: skip


def _print_groups(
    console: Any,
    header: Sequence[str],
    body: Sequence[Sequence[str]],
    widths: list[int],
    groups: list[list[int]] | None,
    *,
    title: str | None,
    caption: str | None,
    markup: bool,
    box: Any,
    log: bool,
) -> None:
    """The title, one table per group of columns (each beside the label column; one line per
    value when ``groups`` is None), and the caption."""
    from rich.table import Table

    if title:
        console.print(title, markup=False, soft_wrap=log, style="italic", highlight=False)
    if groups is None:
        _records(console, header, body, markup)
    for group in groups or ():
        cols = [0, *group]
        table = Table(box=box)
        for i in cols:
            table.add_column(header[i], justify="left" if i == 0 else "right", width=widths[i])
        for row in body:
            table.add_row(*(row[i] for i in cols))
        console.print(table, markup=markup)
    if caption:
        console.print(caption, markup=False, soft_wrap=log, style="dim", highlight=False)
