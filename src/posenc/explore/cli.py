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
    from .page import write_explorer

    path = write_explorer(out)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, works offline)")
    if open_page:
        webbrowser.open(path.resolve().as_uri())
    return path
