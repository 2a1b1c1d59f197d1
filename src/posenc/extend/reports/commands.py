"""What ``posenc extend report``, ``compare`` and ``summary`` print or write: tables on the
terminal, Markdown, or a README block between ``<!-- extend:BLOCK -->`` markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def print_tables(rows: list[dict[str, Any]], title: str | None = None) -> None:
    """The study's table (perplexity, passkey), the LongPPL table where it has LongPPL rows, and,
    where it has task rows, the task table with the effective lengths: which method, up to which
    length."""
    from ...runs.term_table import print_table
    from .longppl import longppl_rows, longppl_table, longppl_title
    from .tables import study_table
    from .tasks import effective_notes, task_rows, task_table

    measured = [r for r in rows if r["kind"] in ("ppl", "passkey")]
    if measured:
        print_table(*study_table(measured), title=title)
    if longppl_rows(rows):
        print_table(*longppl_table(rows), title=longppl_title(rows))
    if task_rows(rows):
        print_table(*task_table(rows), title="tasks: score (%) by length, effective lengths")
        for line in effective_notes(rows):
            typer.echo(line)


def check_readme(readme: str | None, block: str) -> None:
    """``--readme``/``--block`` of ``report``, ``compare`` and ``summary``, checked first."""
    if not readme:
        return
    if not Path(readme).is_file():
        raise ValueError(
            f"--readme {readme}: no such file; give a Markdown file that holds the "
            f"<!-- extend:{block} --> and <!-- /extend:{block} --> lines"
        )
    if not block.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--block must be a name of letters and digits, got {block!r}")


def _write_block(readme: str, block: str, text: str) -> None:
    """``text`` between the ``<!-- extend:BLOCK -->`` marker lines of ``readme``."""
    from ..._markdown import replace_block

    replace_block(Path(readme), f"<!-- extend:{block} -->", f"<!-- /extend:{block} -->",
                  text + "\n")  # fmt: skip


def echo_or_write(text: str, readme: str | None, block: str, what: str) -> None:
    """A command's Markdown: printed, or written into ``readme``'s block (and said so)."""
    if not readme:
        typer.echo(text)
        return
    _write_block(readme, block, text)
    typer.echo(f"wrote the {what} block of {readme}")


def report(run: str, *, markdown: bool, figure: str | None, readme: str | None, block: str,
           heatmap: str | None, task_figure: str | None, command: str,
           wall_minutes: float | None) -> None:  # fmt: skip
    """``posenc extend report``: a study's table (or Markdown), its figures, or its README
    block; paths and blocks checked before anything prints."""
    from ..study.run import study_rows
    from .figures import draw_figures, figure_paths
    from .tables import markdown_report

    check_readme(readme, block)  # before the rows are read
    rows = study_rows(run)
    if not rows:
        raise ValueError(f"{run!r} holds no study rows yet")
    paths = figure_paths(rows, figure, heatmap, task_figure)  # before the table prints
    wall = None if wall_minutes is None else 60 * wall_minutes
    text = markdown_report(
        rows, command=command or f"posenc extend ... --out {run}", wall_seconds=wall
    )
    if readme:
        _write_block(readme, block, text)
        typer.echo(f"wrote the study block of {readme}")
    elif markdown:
        typer.echo(text)
    else:
        print_tables(rows)
    for path in draw_figures(rows, paths):
        typer.echo(f"figure: {path}")


def compare(first: str, second: str, *, readme: str | None, block: str) -> None:
    """``posenc extend compare``: two runs' answers to the same task cells, paired."""
    from ..study.run import check_run_folder, study_rows
    from .compare import compare_markdown

    for run in (first, second):
        check_run_folder(run)
    if Path(first).resolve() == Path(second).resolve():
        raise ValueError(f"{first} was given twice: compare two runs' folders")
    check_readme(readme, block)
    names = (Path(first).resolve().name, Path(second).resolve().name)
    if names[0] == names[1]:  # runs/a/out against runs/b/out: the paths as given
        names = (first, second)
    echo_or_write(compare_markdown(study_rows(first), study_rows(second), names), readme,
                   block, "comparison")  # fmt: skip


def summary(runs: list[str], *, readme: str | None, block: str, short: bool = False) -> None:
    """``posenc extend summary``: several studies' task scores on one screen (``short``: the
    table alone, with the relative effective length and the samples per cell)."""
    from ..study.run import check_run_folder, study_rows
    from .summary import summary_markdown

    for run in runs:
        check_run_folder(run)
    if len({Path(run).resolve() for run in runs}) < len(runs):
        raise ValueError(f"a folder was given twice ({' '.join(runs)}): give each study once")
    check_readme(readme, block)
    studies = [study_rows(run) for run in runs]
    for run, rows in zip(runs, studies, strict=True):
        if not any(r["kind"] == "task" for r in rows):
            raise ValueError(f"{run} has no task rows: run its study with --tasks first")
    names = [Path(run).resolve().name for run in runs]
    if len(set(names)) < len(names):  # runs/a/out and runs/b/out: the paths as given
        names = list(runs)
    text = summary_markdown(studies, names, short=short)
    echo_or_write(text, readme, block, "summary")
