"""An append is whole or absent: a short ``os.write`` (a full disk takes part of a row) is
rolled back to the file's previous size and raised, so a torn row is never counted as done and
the next append starts clean."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from posenc.runs.store import ResultStore


def _row(i: int) -> dict[str, object]:
    return {"encoding": "rope", "seed": i, "config_hash": f"h{i}", "x": "y" * 50}


def _short_writes(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """``os.write`` on ``path`` writes the first half of what it is given (the rest: no room)."""
    real = os.write

    def short(fd: int, data: bytes) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(path.resolve()):
            return real(fd, bytes(data)[: max(1, len(data) // 2)])
        return real(fd, data)

    monkeypatch.setattr(os, "write", short)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_short_write_is_rolled_back_and_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(_row(0))
    before = store.path.read_bytes()
    with monkeypatch.context() as m:
        _short_writes(m, store.path)
        with pytest.raises(OSError, match="rolled back") as err:
            store.append(_row(1))
    assert err.value.errno == errno.ENOSPC and "\n" not in str(err.value)
    assert store.path.read_bytes() == before  # nothing of the torn row is left
    assert not store.has("rope", 1, "h1")
    assert store.append(_row(1))  # and with room again it is written whole
    assert [r["seed"] for r in store.rows()] == [0, 1]


def test_a_failed_write_is_rolled_back_and_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails outright (ENOSPC after part of the row reached the file)."""
    store = ResultStore(tmp_path / "results.jsonl")
    store.append(_row(0))
    before = store.path.read_bytes()
    real = os.write

    def partial_then_full(fd: int, data: bytes) -> int:
        real(fd, bytes(data)[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "write", partial_then_full)
        with pytest.raises(OSError, match="rolled back"):
            store.append(_row(1))
    assert store.path.read_bytes() == before
