"""Worker processes for a grid's cells (``posenc lab --jobs N``).

:func:`run_pool` starts ``jobs`` processes, hands each one task at a time and passes what they
report to the caller, in the parent, which alone writes the results store. The processes come from
multiprocessing's ``forkserver`` on Linux (:func:`_context`): a server process, started once for
the life of this one, that imports torch and the task's module and forks each worker from that
state, with no thread or lock of this process; elsewhere ``spawn``, a fresh interpreter each. A
worker:

* sets torch's thread count to its share before any torch op;
* runs in its own process group, so a terminal's Ctrl-C reaches the parent only, which forwards
  the signal once to every worker: each then stops at its next step boundary, writing a
  checkpoint as a single-process run does;
* takes the parent's environment as it is when the pool starts (a forkserver's children would
  otherwise inherit the server's, as it was when it started);
* ends with the parent: a watch of multiprocessing's parent sentinel (a pipe from the parent,
  for either start method) and ``PR_SET_PDEATHSIG`` on Linux (SIGTERM, so it checkpoints first),
  so a ``kill -9`` of the parent leaves no worker running.

What a task does is the caller's: ``setup(*setup_args, stop=, emit=)`` runs once in each worker
and returns ``run(index, task) -> outcome``; ``emit(kind, value)`` sends an :class:`Event` to
the parent while a task runs (progress, log lines). Arguments, tasks and outcomes are pickled.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import multiprocessing as mp
import os
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import forkserver
from multiprocessing.connection import wait
from typing import Any

from ... import registry
from ..training.train import StopFlag

#: ``emit(kind, value)``: a worker's report to the parent.
Emit = Callable[[str, Any], None]
#: ``setup(*args, stop=StopFlag, emit=Emit) -> run(index, task) -> outcome``, in each worker.
Setup = Callable[..., Callable[[int, Any], Any]]

#: How long the parent waits for its workers to exit after the last task (then it kills them).
JOIN_SECONDS = 30.0

#: What the forkserver imports before it forks a worker, with the task's own module. torch is
#: most of a worker's start (1.8 s of CPU on the 2-core VM); torch._dynamo is another 1.6 s,
#: imported by torch.optim on an optimizer's first parameter group (``torch._disable_dynamo``).
PRELOAD = ("torch", "torch._dynamo")


@dataclass
class Event:
    """What a worker reported for task ``index``: ``kind`` ``"done"`` (``value``: the outcome),
    ``"crash"`` (the worker died or raised; ``value``: why), or the caller's own kinds."""

    kind: str
    index: int
    value: Any


@dataclass
class _Worker:
    proc: Any  # multiprocessing's SpawnProcess
    inbox: Any  # its task queue
    task: int | None = None  # the task index it runs, None while idle


@dataclass
class _Pool:
    """The parent's side: its workers, what is left to hand out, the stop state."""

    start: Callable[[], _Worker]
    stop: StopFlag
    pending: deque[tuple[int, Any]]
    workers: list[_Worker] = field(default_factory=list)
    halted: bool = False  # no more tasks are handed out
    forwarded: bool = False  # the parent's signal was passed on to the workers

    def busy(self) -> list[_Worker]:
        return [w for w in self.workers if w.task is not None]

    def forward_signal(self) -> None:
        """The parent was signalled: hand out nothing more, and pass the signal on, once."""
        self.halted = True
        if self.forwarded or self.stop.signum is None:
            return
        self.forwarded = True
        for w in self.workers:
            if w.proc.is_alive() and w.proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w.proc.pid, self.stop.signum)

    def dispatch(self) -> None:
        for w in self.workers:
            if self.halted or not self.pending:
                return
            if w.task is None and w.proc.is_alive():
                index, task = self.pending.popleft()
                w.task = index
                w.inbox.put((index, task))

    def reap(self, on_event: Callable[[Event], bool | None]) -> None:
        """A worker that died with a task: report the task, and start another in its place."""
        for i, w in enumerate(self.workers):
            if w.proc.exitcode is None:
                continue
            if w.task is not None:
                index, w.task = w.task, None
                why = f"its worker process ended with exit code {w.proc.exitcode}"
                if on_event(Event("crash", index, why)):
                    self.halted = True
            if not self.halted and self.pending:
                self.workers[i] = self.start()


def run_pool(
    setup: Setup,
    setup_args: tuple[Any, ...],
    tasks: list[tuple[int, Any]],
    *,
    jobs: int,
    threads: int,
    stop: StopFlag,
    on_event: Callable[[Event], bool | None],
    poll: float = 0.2,
) -> None:
    """Run ``tasks`` (``(index, task)`` pairs, handed out in order) on ``jobs`` worker processes
    of ``threads`` torch threads each, calling ``on_event`` in this process for everything they
    report. ``on_event`` returning True hands out no further task (the running ones finish).
    After a signal (``stop`` set) nothing more is handed out and the signal is forwarded to the
    workers; this returns once every running task has reported. An exception raised here (by
    ``on_event``, or a second signal) ends the workers before it propagates."""
    ctx = _context(setup)
    outbox = ctx.Queue()
    env = dict(os.environ)

    def start() -> _Worker:
        inbox = ctx.Queue()
        args = (setup, setup_args, threads, env, inbox, outbox)
        proc = ctx.Process(target=_worker_main, args=args, daemon=True, name="posenc-lab-job")
        with _main_left_out():
            proc.start()
        return _Worker(proc, inbox)

    pool = _Pool(start, stop, deque(tasks))
    try:
        pool.workers = [start() for _ in range(max(1, min(jobs, len(tasks))))]
        while True:
            if stop.signum is not None:
                pool.forward_signal()
            pool.dispatch()
            if not pool.busy():
                return
            try:
                pid, kind, index, value = outbox.get(timeout=poll)
            except queue.Empty:
                pool.reap(on_event)
                continue
            if kind in ("done", "crash"):
                for w in pool.workers:
                    if w.proc.pid == pid:
                        w.task = None
            if on_event(Event(kind, index, value)):
                pool.halted = True
    except BaseException:  # the running tasks stop at a checkpoint before the workers end
        for w in pool.busy():
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(w.proc.pid, signal.SIGTERM)
        raise
    finally:
        _shutdown(pool.workers, outbox)


def _context(setup: Setup) -> Any:
    """The workers' multiprocessing context: ``forkserver`` on Linux, preloaded with
    :data:`PRELOAD` and ``setup``'s module, else ``spawn``.

    A spawned worker imports torch again (3.4 s of CPU per worker, most of a small cell's time);
    the forkserver imports it once and forks every later worker of this process from it, in
    milliseconds. Forking from the server is safe where forking this process is not: it runs no
    torch op and holds no lock of this one. macOS and Windows keep ``spawn`` (fork is unsafe with
    macOS's system libraries; Windows has no fork), and so does a host where the server cannot
    start (it listens on a Unix socket, which a sandbox may forbid). The preload takes effect
    where this process starts its forkserver; one already running (started by other code) is
    used as it is."""
    if not sys.platform.startswith("linux"):
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    module = getattr(setup, "__module__", None)
    ctx.set_forkserver_preload([*PRELOAD, *([module] if module not in (None, "__main__") else [])])
    try:
        forkserver.ensure_running()  # here, not at the first worker: its failure is ours to handle
    except OSError:
        return mp.get_context("spawn")
    return ctx


@contextlib.contextmanager
def _main_left_out() -> Any:
    """Start a worker without running this program's ``__main__`` in it (spawn and forkserver
    run it again, as ``__mp_main__``, unless it is a package's ``__main__``): a worker needs
    nothing from it (an encoding registered there runs in this process instead,
    :func:`encoding_modules`), and a script calling :func:`~posenc.lab.grid.experiment.run_grid`
    without an ``if __name__ == "__main__":`` guard would start its grid again in every
    worker."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved: dict[str, Any] = {
        k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__
    }
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _shutdown(workers: list[_Worker], outbox: Any) -> None:
    """Tell every worker to exit, wait for them, and end any that does not."""
    for w in workers:
        if w.proc.is_alive():
            with contextlib.suppress(Exception):
                w.inbox.put(None)
    deadline = time.monotonic() + JOIN_SECONDS
    for w in workers:
        w.proc.join(max(0.0, deadline - time.monotonic()))
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join()
    for q in [outbox, *(w.inbox for w in workers)]:
        q.close()
        q.cancel_join_thread()  # a dead worker's unread messages must not block the exit


# --- encodings a worker can build -----------------------------------------------------------


def encoding_modules(names: set[str]) -> tuple[list[str], str]:
    """The modules a fresh process imports to have the encodings ``names`` registered, and why
    it could not ('' if it can): an encoding registered in ``__main__``, inside a function, or
    by a module loaded from a file path rather than found on ``sys.path``."""
    modules: set[str] = set()
    for name in sorted(names):
        module, qualname = _home(registry.entry(name).builder)
        top = module.split(".")[0]
        if module in ("__main__", "__mp_main__") or "<locals>" in qualname:
            return [], f"encoding {name!r} is registered in {module} ({qualname})"
        if top not in sys.builtin_module_names and (
            importlib.machinery.PathFinder.find_spec(top, sys.path) is None
        ):
            return [], f"encoding {name!r} comes from {module}, which is not on sys.path"
        modules.add(module)
    return sorted(modules), ""


def _home(builder: Callable[..., Any]) -> tuple[str, str]:
    """Where ``builder`` is defined: its module and qualified name, or those of the class a
    :func:`posenc.registry.register_class` builder (a closure) builds."""
    module = getattr(builder, "__module__", None) or "__main__"
    qualname = getattr(builder, "__qualname__", "")
    for cell in getattr(builder, "__closure__", None) or ():
        value = cell.cell_contents
        if "<locals>" in qualname and isinstance(value, type):
            return value.__module__, value.__qualname__
    return module, qualname


def import_encodings(modules: list[str]) -> None:
    """In a worker: import the modules :func:`encoding_modules` named."""
    for module in modules:
        importlib.import_module(module)


# --- in the worker -------------------------------------------------------------------------


def _worker_main(
    setup: Setup,
    setup_args: tuple[Any, ...],
    threads: int,
    env: dict[str, str],
    inbox: Any,
    outbox: Any,
) -> None:
    """A worker's life: take the parent's environment, detach from the terminal's signals, die
    with the parent, set torch's threads, build the task runner, then run tasks until told to
    stop (None), or until the parent is gone (after the running task has stopped at a
    checkpoint)."""
    os.environ.clear()
    os.environ.update(env)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # Ctrl-C goes to the parent, which forwards it once
    import torch

    torch.set_num_threads(threads)
    stop = StopFlag()
    stop.install()
    parent = mp.parent_process()
    assert parent is not None, "a worker is started by run_pool"
    _die_with_parent(parent, stop)
    me, current = os.getpid(), [-1]

    def emit(kind: str, value: Any) -> None:
        outbox.put((me, kind, current[0], value))

    try:
        run = setup(*setup_args, stop=stop, emit=emit)
    except Exception as e:  # every task it is given reports why
        why = f"the worker process could not start: {type(e).__name__}: {e}"

        def run(index: int, task: Any) -> Any:
            raise RuntimeError(why)

    while (item := _next_task(inbox, parent)) is not None:
        index, task = item
        current[0] = index
        try:
            outcome = run(index, task)
        except BaseException as e:  # reported to the parent, which decides
            outbox.put((me, "crash", index, f"{type(e).__name__}: {e}"))
            if not isinstance(e, Exception):
                break
            continue
        outbox.put((me, "done", index, outcome))
    _exit(outbox, orphaned=not parent.is_alive())


def _exit(outbox: Any, orphaned: bool) -> None:
    """End the worker once what it queued has reached the parent (an orphan's queue is dropped:
    nobody reads it), skipping the interpreter's teardown (seconds, for torch's modules):
    every file it wrote was closed and synced by the code that wrote it."""
    if orphaned:
        outbox.cancel_join_thread()
    outbox.close()
    if not orphaned:
        outbox.join_thread()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)


def _next_task(inbox: Any, parent: Any) -> Any:
    """The next task, or None when told to stop or when the parent is gone."""
    while parent.is_alive():
        try:
            return inbox.get(timeout=1.0)
        except queue.Empty:
            continue
    return None


def _die_with_parent(parent: Any, stop: StopFlag) -> None:
    """Stop this process's task (SIGTERM: it checkpoints) when ``parent`` (multiprocessing's
    parent process) ends: a watch of its sentinel, a pipe whose other end only the parent holds
    (everywhere, whatever the start method, and for a parent that died before the prctl), that
    signals only a worker not already stopping; and the kernel's parent-death signal on Linux
    (the forkserver's death, which follows the parent's, for a forked worker)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))

    def watch() -> None:
        wait([parent.sentinel])
        if stop.signum is None:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
