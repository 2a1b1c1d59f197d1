"""How the command line reports a user's mistake: one line, ``error: <what was wrong>``, exit
code 2, never a traceback (a bad option value, an unknown encoding, a missing file or package)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import typer


def install_hint(extra: str) -> str:
    """How to add an extra: posenc installs from its clone (it is no package on PyPI, where
    ``pip install 'posenc[...]'`` would find nothing or another project), docs/install.md."""
    return f"pip install -e '.[{extra}]' in the posenc clone"


#: The extra of :func:`install_hint` that brings each optional package.
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
    how = install_hint(extra) if extra else f"pip install {top}"
    return f"this command needs the package {top!r}, which is not installed: {how}"


#: errno -> what a failed write says (the rest: the system's own words).
_WRITE_ERRORS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}
#: Errors that only a write gives: the disk is full or read-only.
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


def os_error_message(e: OSError, where: object = None) -> str:
    """One line for an OSError: a full or read-only disk as ``no space left on device writing
    runs/lab/results.jsonl`` (``where``: what to name when ``e`` names no file, e.g. the output
    folder); any other as the system says it, with the file (``Permission denied: x.txt``)."""
    name = e.filename if e.filename is not None else where
    if e.errno in _DISK_ERRNOS:
        what = _WRITE_ERRORS[e.errno]
        return f"{what} writing {name}" if name is not None else what
    what = e.strerror or str(e) or type(e).__name__
    return f"{what}: {name}" if name is not None else what


def _probe(folder: Path) -> None:
    """Create ``folder`` (and its parents) and write then remove a small file in it."""
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".posenc-write-test-{os.getpid()}"
    with open(probe, "wb") as f:
        f.write(b"x")
    probe.unlink()


#: The free space :func:`check_can_write` and :func:`check_writable` ask of a disk before a run
#: writes there.
MIN_FREE_BYTES = 16 * 2**20


def _check_free(here: Path, folder: Path, option: str) -> None:
    """ValueError when the disk of ``here`` has under :data:`MIN_FREE_BYTES` free: a full disk
    found before the run, not by its first row."""
    free = shutil.disk_usage(here).free
    if free < MIN_FREE_BYTES:
        raise ValueError(
            f"{option} {folder}: its disk has {free / 2**20:.1f} MiB free, under the "
            f"{MIN_FREE_BYTES // 2**20} MiB a run needs for its rows and files; free some space "
            "or choose a folder on another disk"
        )


def _check_write(probe: Callable[[], object], here: Path, folder: Path, option: str) -> None:
    """Run ``probe`` (a write in ``here``, ``folder`` or the nearest folder above it that
    exists): its OSError becomes one ValueError naming ``option``; then the free space of
    ``here``'s disk (:func:`_check_free`)."""
    try:
        probe()
    except OSError as e:
        what = _WRITE_ERRORS.get(e.errno or 0) or e.strerror or str(e)
        raise ValueError(
            f"{option} {folder}: cannot write there ({what}); choose a writable folder"
        ) from None
    _check_free(here, folder, option)


def check_writable(folder: Path, option: str = "--out", *, create: bool = True) -> None:
    """ValueError naming ``option`` when ``folder`` cannot be created or written (read-only,
    not a folder, no permission, no space), before any work is done; ``create=False`` leaves
    a folder that is not there alone (a reader says what is missing)."""
    folder = Path(folder)
    if not create and not folder.exists():
        return
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {folder}: not a folder; give a folder to write into")
    _check_write(lambda: _probe(folder), folder, folder, option)


def check_can_write(folder: Path, option: str = "--out") -> None:
    """ValueError naming ``option`` when ``folder`` could not be created and written (a file in
    its place or above it, a read-only file system, no permission, a full disk: under
    :data:`MIN_FREE_BYTES` free), checked without creating anything: the nearest folder that
    exists gets an anonymous temporary file, gone at once."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {folder}: not a folder; give a folder to write into")
    here = folder
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise ValueError(f"{option} {folder}: {here} is a file, not a folder; give a folder path")
    _check_write(lambda: tempfile.TemporaryFile(dir=here).close(), here, folder, option)
