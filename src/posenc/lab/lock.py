"""One run per output folder: an exclusive lock on ``<out>/lab.lock`` for as long as a grid runs.

Two ``posenc lab`` processes on one folder would train the same cells, each taking the other's
checkpoints for an interrupted run (and deleting them under it). So a run takes an exclusive
``flock`` on ``<out>/lab.lock`` and writes who holds it (pid, host, start time, command) into
the file; a second run is refused with that description.

The kernel releases a ``flock`` when its holder dies, however it dies, so a lock left by a killed
run is never mistaken for a live one (and a reused pid does not matter): the next run gets the
lock, finds the dead holder's description still in the file, and says it took over a stale
lock. A clean exit empties the file. A description written on *another* host cannot be checked
from here (``flock`` is not reliable across hosts on every network filesystem), so that run is
refused too, with the lock file to delete once that run is known to be gone.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "lab.lock"


class FolderLocked(RuntimeError):
    """Another run holds the output folder (or may: a lock from another host)."""


def _holder() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
    }


def describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host h, started <time>: <command>`` (what is known of it)."""
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("started"):
        text += f", started {holder['started']}"
    if holder.get("command"):
        text += f": {holder['command']}"
    return text


def _read(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 1 << 16).decode(errors="replace").strip()
    if not raw:
        return None
    try:
        holder = json.loads(raw)
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "command": raw[:100]}
    return holder if isinstance(holder, dict) else {"command": raw[:100]}


def _write(fd: int, holder: dict[str, Any] | None) -> None:
    os.ftruncate(fd, 0)
    if holder is not None:
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    os.fsync(fd)


def acquire(out: Path) -> tuple[int, dict[str, Any] | None]:
    """Lock ``out`` (created if needed) for this process: ``(fd, stale)``, where ``stale``
    describes a killed run whose lock this one took over (None if the folder was free).

    Raises :class:`FolderLocked` naming the holder when a live run (or a run on another host)
    holds it.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd) or {}
                raise FolderLocked(
                    f"{out} is in use by another posenc lab run ({describe(holder)}); wait for "
                    "it to finish, or pass another --out"
                ) from None
        stale = _read(fd)
        here = socket.gethostname()
        if stale is not None and stale.get("host") not in (here, None):
            raise FolderLocked(
                f"{out} is locked by a posenc lab run on another host ({describe(stale)}), "
                f"which cannot be checked from {here}; delete {path} if that run is no longer "
                "running, or pass another --out"
            )
        _write(fd, _holder())
    except BaseException:
        os.close(fd)
        raise
    return fd, stale


def release(fd: int) -> None:
    """Empty the lock file (a clean exit leaves no holder behind) and unlock it."""
    try:
        _write(fd, None)
    finally:
        os.close(fd)  # closing the last descriptor releases the flock


@contextmanager
def folder_lock(out: Path) -> Iterator[dict[str, Any] | None]:
    """Hold the lock on ``out`` for the ``with`` body; yields the stale holder taken over, if
    any (:func:`acquire`)."""
    fd, stale = acquire(out)
    try:
        yield stale
    finally:
        release(fd)
