"""Writes that appear whole or not at all: a file or a folder is written under a unique hidden
name beside its place, fsynced, and renamed into place (``rename(2)`` is atomic), so a run killed
at any moment leaves the old version or the new one, never half of one, and no half-written
thing that blocks a rerun. Used for checkpoints, ``run.json`` files, exported model folders and
cached prompts alike.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def write_aside(path: Path, write: Callable[[IO[Any]], object], *, text: bool = False) -> None:
    """``write(f)`` into a uniquely named file beside ``path`` (opened ``"wb"``, or ``"w"`` as
    UTF-8 with ``text``), fsynced, then renamed over ``path``: a crash leaves the old file or
    the new one. The temporary file is removed whatever happens."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "w" if text else "wb", encoding="utf-8" if text else None) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_file_atomically(path: Path, text: str) -> None:
    """``text`` to a uniquely named file beside ``path``, fsynced, then renamed over it."""
    write_aside(path, lambda f: f.write(text), text=True)


def _partials(out: Path) -> list[Path]:
    """The temporary folders :func:`folder_written_aside` makes for ``out``."""
    return sorted(out.parent.glob(f".{out.name}.*.partial"))


def remove_partials(out: Path) -> None:
    """Remove what killed writes of ``out`` left beside it (:func:`folder_written_aside`); only
    for a caller that holds the lock of the folder they are in (no write of it is running)."""
    for path in _partials(out):
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def folder_written_aside(out: Path) -> Iterator[Path]:
    """A new folder, uniquely named beside ``out`` (absent or an empty folder), to write into;
    on a clean exit its files are fsynced and it is renamed to ``out``, on any error (a kill
    included: ``KeyboardInterrupt``) removed. A kill -9 leaves a hidden ``.NAME.*.partial``
    folder beside ``out``, never a half-written ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{uuid.uuid4().hex[:12]}.partial"
    tmp.mkdir()
    try:
        yield tmp
        for path in sorted(tmp.rglob("*")):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        try:
            os.replace(tmp, out)  # over an empty folder too (rename(2) replaces an empty one)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise ValueError(
                    f"{str(out)!r} was written meanwhile and is not an empty folder; nothing was "
                    "written"
                ) from None
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
