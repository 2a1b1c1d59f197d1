"""``posenc explore``: write the explorer page (and open it)."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer


def explore_page(out: Path, open_page: bool = False) -> Path:
    """Write the page to ``out`` (``.html``), say where and how large, and open it if asked.
    Needs plotly (the ``explore`` extra): without it the ImportError reaches the command line,
    which names the extra."""
    if out.suffix.lower() not in (".html", ".htm"):
        raise typer.BadParameter(f"must end in .html, got {out.name!r}", param_hint="--out")
    from ..cli_errors import check_can_write, fail, os_error_message
    from .page import write_explorer

    try:  # a file where a folder goes, a read-only disk: one line before the page is built
        check_can_write(out.parent, "the folder of --out")
        if out.is_dir():
            raise ValueError(f"--out {out} is a folder; give the page's file name (.html)")
        path = write_explorer(out)
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_message(e, out))
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, works offline)")
    if open_page:
        webbrowser.open(path.resolve().as_uri())
    return path
