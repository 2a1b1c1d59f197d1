"""posenc._malloc: the lab's processes keep freed memory (glibc's mallopt), checked by glibc's own
count of mapped blocks (mallinfo2) in a fresh interpreter, so this process's allocator is left as
it is."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from posenc import _malloc

_LIBC, _VERSION = platform.libc_ver()
# mallopt is glibc's; mallinfo2, which the probe reads, came in glibc 2.33.
glibc_233 = pytest.mark.skipif(
    not sys.platform.startswith("linux")
    or _LIBC != "glibc"
    or tuple(int(p) for p in _VERSION.split(".")[:2]) < (2, 33),
    reason="needs glibc 2.33 or later (mallopt, mallinfo2)",
)

# In a fresh interpreter (no torch): retain or not, then malloc and free 64 MiB, reading glibc's
# mapped bytes (hblkhd) and heap bytes (arena) around it.
_PROBE = """
import ctypes, json, sys
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
from posenc._malloc import malloc_state, retain_freed_memory
state = retain_freed_memory() if sys.argv[1] == "retain" else malloc_state()
before = libc.mallinfo2()
p = libc.malloc(64 << 20)
held = libc.mallinfo2()
libc.free(ctypes.c_void_p(p))
after = libc.mallinfo2()
print(json.dumps({"state": state, "mapped": held.hblkhd - before.hblkhd,
                  "unmapped": held.hblkhd - after.hblkhd, "trimmed": held.arena - after.arena,
                  "free_after": after.fordblks,
                  "again": retain_freed_memory() if sys.argv[1] == "retain" else None}))
"""


def _probe(call: str, **env: str) -> dict:
    # glibc's own settings (MALLOC_*_, GLIBC_TUNABLES) and preloads would change what it does
    dropped = (_malloc.MALLOC_ENV, "GLIBC_TUNABLES", "LD_PRELOAD")
    run_env = {
        k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("MALLOC_")
    } | env
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, call], capture_output=True, text=True, env=run_env,
        check=True, timeout=60,
    )  # fmt: skip
    return json.loads(out.stdout)


@glibc_233
def test_retained_blocks_come_from_the_heap_and_stay_there() -> None:
    got = _probe("retain")
    assert got["state"] == "retain" and got["again"] == "retain"
    assert got["mapped"] == 0  # 64 MiB from the heap, not a mapping of its own
    # Freed and kept: the heap does not shrink, and the 64 MiB are free in it for the next one
    # (the heap may have held free space before, so its growth is not compared with 64 MiB).
    assert got["trimmed"] == 0
    assert got["free_after"] >= 64 << 20


@glibc_233
def test_without_the_call_glibc_maps_and_returns_large_blocks() -> None:
    got = _probe("none")
    assert got["state"] == "system: not asked"
    assert got["mapped"] >= 64 << 20
    assert got["unmapped"] >= 64 << 20  # handed back to the system when freed


@glibc_233
def test_posenc_malloc_system_leaves_glibc_as_it_is() -> None:
    got = _probe("retain", POSENC_MALLOC="system")
    assert got["state"] == "system: POSENC_MALLOC=system"
    assert got["mapped"] >= 64 << 20


def test_a_preloaded_allocator_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_malloc, "_applied", None)  # as in a fresh process
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    monkeypatch.delenv(_malloc.MALLOC_ENV, raising=False)
    assert not _malloc.retains()
    expected = "system: LD_PRELOAD allocator" if _LIBC == "glibc" else "system: not glibc"
    assert _malloc.retain_freed_memory() == _malloc.malloc_state() == expected


def test_a_bad_posenc_malloc_is_refused_naming_the_choices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(_malloc.MALLOC_ENV, "jemalloc")
    with pytest.raises(
        ValueError, match=r"^POSENC_MALLOC must be one of retain, system, got 'jemalloc'$"
    ):
        _malloc.malloc_choice()
    monkeypatch.setenv(_malloc.MALLOC_ENV, " System ")
    assert _malloc.malloc_choice() == "system"


@pytest.mark.parametrize("command", [(), ("extend",)])
def test_the_lab_commands_refuse_a_bad_posenc_malloc_in_one_line(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from posenc.cli import app

    env = {"COLUMNS": "250", "NO_COLOR": "1", _malloc.MALLOC_ENV: "tcmalloc"}
    args = ["lab", *command, "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(app, [*args, *(() if command else ("--dry-run",))], env=env)
    assert res.exit_code == 2, res.output
    assert res.output.strip() == (
        "error: POSENC_MALLOC must be one of retain, system, got 'tcmalloc'"
    ), res.output
    assert not (tmp_path / "out").exists()


def test_run_grid_and_run_extend_refuse_a_bad_posenc_malloc_before_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Called from code, the workers would each fail every cell on it: one error here instead.
    from posenc.lab.cells.presets import LabConfig
    from posenc.lab.extension.extend import run_extend
    from posenc.lab.extension.plan import ExtendConfig
    from posenc.lab.grid.experiment import RunOptions, run_grid

    monkeypatch.setenv(_malloc.MALLOC_ENV, "tcmalloc")
    opts = RunOptions(out=tmp_path / "out", quiet=True)
    for run in (lambda: run_grid(LabConfig(), opts), lambda: run_extend(ExtendConfig(), opts)):
        with pytest.raises(ValueError, match=r"^POSENC_MALLOC must be one of retain, system"):
            run()
    assert not (tmp_path / "out").exists()
