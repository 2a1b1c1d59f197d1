"""Keep the memory a process frees for its next allocation (glibc), for the lab's processes.

glibc serves a block of more than its mmap threshold (128 KiB, rising with use to at most 32
MiB) with its own ``mmap`` and unmaps it when it is freed, and trims freed memory at the heap's
top back to the system. A training step or an evaluation batch frees and allocates the same
large tensors again and again (at eval length 512, ``[16, 4, 512, 512]`` float32 score tensors
of 64 MiB, past any threshold), so each of them is faulted in and zeroed by the kernel page by
page every time: ``a + b`` on two such tensors took 37 ms against 5 ms for ``a.add_(b)``, on one
core of the 2-core AMD EPYC VM. :func:`retain_freed_memory` sets ``M_MMAP_MAX`` to 0 (every
block from an arena's heap: for the thread that runs a cell, the main one) and
``M_TRIM_THRESHOLD`` to -1 (nothing handed back), so a freed block is reused as it is. The
numbers computed do not change (the same operations on the same values); a process then holds
its peak of memory until it exits.

Only the processes the lab owns call it (``posenc lab`` and ``posenc lab extend``, and the
grid's worker processes); the library never changes the allocator of a program that imports it.
``POSENC_MALLOC=system`` leaves glibc as it is.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

#: ``system``: leave the allocator as it is; ``retain`` (or unset): :func:`retain_freed_memory`.
MALLOC_ENV = "POSENC_MALLOC"
MALLOC_CHOICES = ("retain", "system")

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER = -1  # M_TRIM_THRESHOLD -1: never trim (mallopt(3))

_applied: str | None = None  # what the first call did (the settings last for the process)


def _glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def _preloaded() -> bool:
    """Another allocator preloaded (its mallopt, or glibc's, would not govern the tensors)."""
    preload = os.environ.get("LD_PRELOAD", "")
    return any(name in preload for name in ("jemalloc", "tcmalloc", "mimalloc"))


def retains() -> bool:
    """Whether :func:`retain_freed_memory` keeps freed memory here (glibc, no other allocator
    preloaded, ``POSENC_MALLOC`` not ``system``), without calling it: what the lab's workers
    will do."""
    return _glibc() and not _preloaded() and malloc_choice() == "retain"


def malloc_choice() -> str:
    """``$POSENC_MALLOC`` checked (``retain`` when unset); ValueError naming the choices."""
    value = os.environ.get(MALLOC_ENV, "").strip().lower() or "retain"
    if value not in MALLOC_CHOICES:
        raise ValueError(
            f"{MALLOC_ENV} must be one of {', '.join(MALLOC_CHOICES)}, "
            f"got {os.environ[MALLOC_ENV]!r}"
        )
    return value


def retain_freed_memory() -> str:
    """Make this process's glibc keep what it frees (module docstring); once per process.

    Returns what holds now: ``"retain"``, or ``"system: <why>"`` (asked by ``POSENC_MALLOC``,
    not Linux with glibc, jemalloc, tcmalloc or mimalloc in ``LD_PRELOAD``, or mallopt
    refused). ValueError for a bad ``POSENC_MALLOC``.
    """
    global _applied
    choice = malloc_choice()  # a bad value is refused whatever an earlier call did
    if _applied is not None:
        return _applied
    if choice == "system":
        why = f"system: {MALLOC_ENV}=system"
    elif not _glibc():
        why = "system: not glibc"
    elif _preloaded():
        why = "system: LD_PRELOAD allocator"
    else:
        libc = ctypes.CDLL(None)  # this process's C library, already loaded
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER) == 1
        why = "retain" if ok else "system: mallopt refused the settings"
    _applied = why
    return why


def malloc_state() -> str:
    """What :func:`retain_freed_memory` did in this process (``"system: not asked"`` before
    any call: a program that runs the lab's functions itself keeps its own allocator)."""
    return _applied or "system: not asked"
