"""One run per output folder: an exclusive lock on ``<out>/lab.lock`` for as long as a grid runs.

Two ``posenc lab`` processes on one folder would train the same cells, each taking the other's
checkpoints for an interrupted run (and deleting them under it). So a run takes an exclusive
operating-system lock (the ``filelock`` package: ``flock`` on POSIX, ``msvcrt.locking`` on
Windows) on ``<out>/.lab.lock`` and writes who holds it (pid, host, start time, command) into
``<out>/lab.lock``; a second run, from another process or from this one, is refused with that
description. (The description has a file of its own: a lock file's contents are the locking
library's, which may truncate it on open or delete it on release.)

The system releases the lock when its holder dies, however it dies, so a lock left by a killed
run is never mistaken for a live one (and a reused pid does not matter): the next run gets the
lock, finds the dead holder's description still in ``lab.lock``, and says it took over a stale
lock. A clean exit empties ``lab.lock``. A description written on *another* host cannot be
checked from here (file locks are not reliable across hosts on every network filesystem), so that
run is refused too, with the file to delete once that run is known to be gone.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

#: Who holds the folder (JSON), empty when no run does.
LOCK_FILE = "lab.lock"
#: What the operating-system lock is taken on (its contents are filelock's).
MUTEX_FILE = ".lab.lock"


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


def _read(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()[: 1 << 16].decode(errors="replace").strip()
    except FileNotFoundError:
        return None
    if not raw:
        return None
    try:
        holder = json.loads(raw)
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "command": raw[:100]}
    return holder if isinstance(holder, dict) else {"command": raw[:100]}


def _write(path: Path, holder: dict[str, Any] | None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        if holder is not None:
            f.write(json.dumps(holder) + "\n")
        f.flush()
        os.fsync(f.fileno())


@dataclass
class HeldLock:
    """A folder lock this process holds (:func:`acquire`); give it back with :func:`release`."""

    mutex: FileLock
    path: Path  # the description, ``<out>/lab.lock``


def acquire(out: Path, *, command: str) -> tuple[HeldLock, dict[str, Any] | None]:
    """Lock ``out`` (created if needed) for this process: ``(held, stale)``, where ``stale``
    describes a killed run whose lock this one took over (None if the folder was free).
    ``command`` names the kind of run that locks (``posenc lab``, ``posenc extend``) in the
    refusal, since the folder's kind decides which command could be holding it.

    Raises :class:`FolderLocked` naming the holder when a live run (another process, or another
    acquisition in this one) or a run on another host holds it.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    # Not thread-local: the lock is the process's, whichever thread releases it.
    mutex = FileLock(out / MUTEX_FILE, thread_local=False)
    try:
        mutex.acquire(timeout=0)
    except Timeout:
        holder = _read(path) or {}
        raise FolderLocked(
            f"{out} is in use by another {command} run ({describe(holder)}); wait for "
            "it to finish, or pass another --out"
        ) from None
    try:
        stale = _read(path)
        here = socket.gethostname()
        if stale is not None and stale.get("host") not in (here, None):
            raise FolderLocked(
                f"{out} is locked by a {command} run on another host ({describe(stale)}), "
                f"which cannot be checked from {here}; delete {path} if that run is no longer "
                "running, or pass another --out"
            )
        _write(path, _holder())
    except BaseException:
        mutex.release()
        raise
    return HeldLock(mutex, path), stale


def release(held: HeldLock) -> None:
    """Empty the description (a clean exit leaves no holder behind) and unlock the folder."""
    try:
        _write(held.path, None)
    finally:
        held.mutex.release()


@contextmanager
def folder_lock(out: Path, *, command: str) -> Iterator[dict[str, Any] | None]:
    """Hold the lock on ``out`` for the ``with`` body; yields the stale holder taken over, if
    any (:func:`acquire`; ``command`` names the run in a refusal)."""
    held, stale = acquire(out, command=command)
    try:
        yield stale
    finally:
        release(held)
