"""A time bound on one call of the implementation :func:`~posenc.testing.check_rope` checks.

Two mechanisms, chosen per call by where it runs:

* **The main thread on POSIX** (a script, pytest, a notebook kernel): ``SIGALRM`` from
  ``setitimer``. The handler raises :class:`ImplTimeout` in the call itself, so a pure-Python
  loop stops at its next bytecode and a ``time.sleep`` is cut short (the signal interrupts it).
  A call blocked inside one C function (one long torch op) stops when that function returns.
  A timer and handler already set (pytest-timeout's, say) are put back afterwards, with the time
  they had left.
* **Any other thread, or Windows** (no ``SIGALRM`` there): the call runs in a daemon worker
  thread, ``join(timeout)`` waits for it. A thread cannot be killed: on timeout
  :class:`ImplTimeout` is *posted* to the worker (``PyThreadState_SetAsyncExc``), which stops a
  pure-Python loop at its next bytecode; a worker blocked in C code (a sleep, a kernel) keeps
  running in the background until that returns, then dies of the posted exception, its result
  discarded. The check itself goes on at once either way.

A subprocess would kill any hang, C included, but it needs a picklable implementation (most are
closures) and a second torch import (seconds) per check: not worth it for a test helper.

:class:`ImplTimeout` derives from ``BaseException`` so that an implementation's own
``except Exception`` cannot swallow it.
"""

from __future__ import annotations

import ctypes
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ImplTimeout(BaseException):
    """The implementation did not return within the time bound."""


def call_with_timeout(fn: Callable[[], T], timeout: float | None) -> T:
    """``fn()``, or :class:`ImplTimeout` once it has run ``timeout`` seconds (None: no bound)."""
    if timeout is None:
        return fn()
    if hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread():
        return _with_alarm(fn, timeout)
    return _with_thread(fn, timeout)


def _with_alarm(fn: Callable[[], T], timeout: float) -> T:
    """``fn()`` under ``SIGALRM`` after ``timeout`` s; the previous handler and timer restored."""

    def expire(signum: int, frame: Any) -> None:
        raise ImplTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    left, _ = signal.setitimer(signal.ITIMER_REAL, timeout)
    start = time.monotonic()
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left > 0:  # an outer timer was running: give it back what it had left
            signal.setitimer(signal.ITIMER_REAL, max(left - (time.monotonic() - start), 1e-3))


def _with_thread(fn: Callable[[], T], timeout: float) -> T:
    """``fn()`` in a daemon thread joined for ``timeout`` s (see the module docstring)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except ImplTimeout:
            pass  # posted by us after the deadline: nobody waits for this result any more
        except BaseException as err:  # handed to the caller's thread, raised there
            box["error"] = err

    worker = threading.Thread(target=work, name="check_rope-impl", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        assert worker.ident is not None
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(worker.ident), ctypes.py_object(ImplTimeout)
        )
        raise ImplTimeout
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
