"""How the command line reports a user's mistake: one line, ``error: <what was wrong>``, exit
code 2, never a traceback (a bad option value, an unknown encoding, a missing file or package)."""

from __future__ import annotations

from typing import NoReturn

import typer

#: The extra of ``pip install 'posenc[extra]'`` that brings each optional package.
EXTRAS = {
    "matplotlib": "plots",
    "triton": "kernels",
    "rotary_embedding_torch": "bench",
    "einops": "bench",
    "mkdocs": "docs",
    "transformers": "hf",
    "plotly": "explore",
}


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on one line to stderr and exit with ``code``."""
    typer.echo(f"error: {' '.join(str(message).split())}", err=True)
    raise typer.Exit(code)


def missing_package(e: ImportError) -> str | None:
    """What to say when an optional package is missing (``e`` a ModuleNotFoundError, or an
    ImportError raised from one with its own advice); None when the missing module is posenc's
    own (a bug, which should show its traceback) or ``e`` is another ImportError."""
    cause = e if isinstance(e, ModuleNotFoundError) else e.__cause__
    if not isinstance(cause, ModuleNotFoundError):
        return None
    top = (cause.name or "").split(".")[0]
    if not top or top == "posenc":
        return None
    if cause is not e:
        return str(e)
    extra = EXTRAS.get(top)
    how = f"pip install 'posenc[{extra}]'" if extra else f"pip install {top}"
    return f"this command needs the package {top!r}, which is not installed: {how}"
