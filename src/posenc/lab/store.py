"""The results store: one JSON line per finished cell, append-only, in ``<out>/results.jsonl``.

A row is appended with one ``write`` on a file opened ``O_APPEND`` and then fsynced, so a
process killed at any moment leaves whole rows behind (at worst a torn last line, which the
reader skips with a warning and the next append starts on a fresh line). Rows are keyed by
``(encoding, seed, config_hash)``; a key already present is never written again, so a rerun skips
finished cells and no result is duplicated.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.jsonl"


def row_key(row: dict[str, Any]) -> tuple[str, int, str]:
    return (row["encoding"], int(row["seed"]), row["config_hash"])


class ResultStore:
    """Append-only JSON-lines results at ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row, in the order written; the first row of a key wins."""
        seen: set[tuple[str, int, str]] = set()
        out = []
        for row in self._read():
            key = row_key(row)
            if key not in seen:
                seen.add(key)
                out.append(row)
        return out

    def keys(self) -> set[tuple[str, int, str]]:
        return {row_key(r) for r in self._read()}

    def has(self, encoding: str, seed: int, config_hash: str) -> bool:
        return (encoding, seed, config_hash) in self.keys()

    def append(self, row: dict[str, Any]) -> bool:
        """Append ``row`` unless its key is stored already; True if it was written."""
        for field in ("encoding", "seed", "config_hash"):
            if field not in row:
                raise ValueError(f"a result row needs {field!r}")
        if row_key(row) in self.keys():
            return False
        # Key order is kept (not sorted): the report lists variants in the order evaluated.
        line = json.dumps(row, allow_nan=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            # A torn last line (a writer killed mid-row) must not swallow this row.
            prefix = "\n" if self._ends_mid_line() else ""
            os.write(fd, (prefix + line + "\n").encode())
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

    def _read(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    warnings.warn(
                        f"{self.path}:{i}: skipping an unreadable (torn) result line",
                        stacklevel=3,
                    )
                    continue
                if isinstance(row, dict) and "config_hash" in row:
                    yield row
