"""The results store: one JSON line per finished cell, append-only, in ``<out>/results.jsonl``.

A row is appended with one ``write`` on a file opened ``O_APPEND`` and then fsynced, so a
process killed at any moment leaves whole rows behind (at worst a torn last line, which the
reader skips with a warning and the next append starts on a fresh line); a write that fails or
is short (a full disk) is truncated away again and raised, so a row is whole or absent. Rows are keyed by
``(encoding, seed, config_hash)``; a key already present is never written again, so a rerun skips
finished cells and no result is duplicated, except by a rerun asked for (``posenc lab --force``):
its row is appended with ``replace=True`` and, read back, takes the earlier row's place. A line
is strict JSON: a non-finite float (NaN, Infinity) is written ``null``. Any other line that is no row (invalid UTF-8 or
JSON, a key field missing or of the wrong type) is skipped the same way, with one warning naming
the file and the line, and the rows around it are read.
"""

from __future__ import annotations

import errno
import json
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import strict_json as strict_json

RESULTS_FILE = "results.jsonl"

#: A reader's own test of a row (after the store's: an object with a well-typed key): why it is
#: skipped (None: it is read) and a note on a row that is read (None: nothing to say); each is
#: warned with the file and the line.
RowCheck = Callable[[dict[str, Any]], tuple[str | None, str | None]]


def row_key(row: dict[str, Any]) -> tuple[str, int, str]:
    return (row["encoding"], int(row["seed"]), row["config_hash"])


def key_problem(row: object) -> str | None:
    """What keeps ``row`` (a parsed line) from being a stored row: not an object, or its key
    (``encoding``, ``seed``, ``config_hash``) missing or of the wrong type; None if it is one."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    wanted = {"encoding": "a string", "seed": "an integer", "config_hash": "a string"}
    for field, kind in wanted.items():
        if field not in row:
            return f"no {field!r}"
        value = row[field]
        ok = (
            isinstance(value, int) and not isinstance(value, bool)
            if field == "seed"
            else isinstance(value, str)
        )
        if not ok:
            return f"{field!r} is {value!r:.40}, not {kind}"
    return None


def warn_line(path: Path, line: int, problem: str) -> None:
    """The one warning for a result line that is skipped or read in part: file, line, why.

    Issued from here, whichever read finds the line, so Python's default filter shows it once
    per process however often the store is read (a run's skip test, then its report)."""
    warnings.warn(f"{path}:{line}: {problem}", stacklevel=1)


def _write_whole(fd: int, path: Path, data: bytes) -> None:
    """Append ``data`` to ``fd`` (opened ``O_APPEND``) whole, or not at all: a short write (a
    full disk takes part of a row) or a failed one is rolled back to the file's previous size
    and raised as OSError (``ENOSPC`` for a short write), so a torn row is never counted as a
    finished cell."""
    size = os.fstat(fd).st_size
    try:
        written = os.write(fd, data)
    except OSError as e:
        os.ftruncate(fd, size)
        raise OSError(
            e.errno, f"{path}: writing a result row failed ({e.strerror}); it was rolled back"
        ) from e
    if written != len(data):
        os.ftruncate(fd, size)
        raise OSError(
            errno.ENOSPC,
            f"{path}: only {written} of {len(data)} bytes of a result row were written (is the "
            "disk full?); it was rolled back",
        )


class ResultStore:
    """Append-only JSON-lines results at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row, in the order written; a key's last row, at its first row's place."""
        return [row for _, row in self.numbered_rows()]

    def numbered_rows(self, check: RowCheck | None = None) -> list[tuple[int, dict[str, Any]]]:
        """``(line number, row)`` of every stored row, in the order written; of the rows of one
        key (only a forced rerun appends a second) the last is read, at the first's place. A line that is no row (invalid UTF-8 or JSON, JSON nested too deep, not an
        object, a key field missing or of the wrong type, or refused by ``check``) is skipped
        with one warning naming the file and the line, in the order of the lines."""
        at: dict[tuple[str, int, str], int] = {}
        out: list[tuple[int, dict[str, Any]]] = []
        for i, row in self._read(check):
            key = row_key(row)
            if key in at:
                out[at[key]] = (i, row)
            else:
                at[key] = len(out)
                out.append((i, row))
        return out

    def every_row(self, check: RowCheck | None = None) -> list[tuple[int, dict[str, Any]]]:
        """``(line number, row)`` of every readable line, a key's rows all kept (a reader that
        refuses two rows of one key, where :meth:`numbered_rows` reads the last)."""
        return list(self._read(check))

    def keys(self) -> set[tuple[str, int, str]]:
        return {row_key(r) for _, r in self._read()}

    def has(self, encoding: str, seed: int, config_hash: str) -> bool:
        return (encoding, seed, config_hash) in self.keys()

    def append(self, row: dict[str, Any], *, replace: bool = False) -> bool:
        """Append ``row`` unless its key is stored already (``replace``: even then; it is read
        in place of the earlier row); True if it was written."""
        for field in ("encoding", "seed", "config_hash"):
            if field not in row:
                raise ValueError(f"a result row needs {field!r}")
        if not replace and row_key(row) in self.keys():
            return False
        # Key order is kept (not sorted): the report lists variants in the order evaluated.
        # Strict JSON: a non-finite float is written null (the reader takes it as NaN did).
        line = strict_json.dumps(row)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # A torn last line (a writer killed mid-row) must not swallow this row.
            prefix = "\n" if self._ends_mid_line() else ""
            _write_whole(fd, self.path, (prefix + line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return True

    def _ends_mid_line(self) -> bool:
        size = self.path.stat().st_size if self.path.exists() else 0
        if size == 0:
            return False
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            return f.read(1) != b"\n"

    def _read(self, check: RowCheck | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            for i, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    warn_line(self.path, i, f"skipping a line that is not UTF-8 ({e.reason})")
                    continue
                except RecursionError:
                    warn_line(self.path, i, "skipping a line whose JSON is nested too deep")
                    continue
                except ValueError as e:  # JSONDecodeError; a torn last line is one
                    why = f"skipping a line that is not JSON, such as a row torn by a killed writer ({e})"
                    warn_line(self.path, i, why)
                    continue
                problem = key_problem(row)
                if problem is not None:
                    warn_line(self.path, i, f"skipping a line that is no result row: {problem}")
                    continue
                note = None
                if check is not None:
                    problem, note = check(row)
                    if problem is not None:
                        warn_line(
                            self.path, i, f"skipping a result row that cannot be read: {problem}"
                        )
                        continue
                if note is not None:
                    warn_line(self.path, i, note)
                yield i, row
