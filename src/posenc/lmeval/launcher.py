"""lm-eval's own command line with the ``posenc`` model registered.

lm-eval 0.4.13 finds no models from installed packages: a model is known once the module that
defines it is imported. :func:`main` imports :mod:`posenc.lmeval.model` (which registers
``posenc``), then runs lm-eval's CLI (``lm_eval.__main__.cli_evaluate``) on the arguments as
given, so every lm-eval option works as documented there (``--config FILE.yaml`` included):

    python -m posenc.lmeval --model posenc \\
        --model_args pretrained=DIR,method=yarn:factor=4 --tasks niah_single_1
    posenc lm-eval --model posenc --model_args ... --tasks ...
    accelerate launch --num_processes 2 -m posenc.lmeval --model posenc ...

A mistake posenc reports (an unknown method or option, a request past ``max_length``) ends in
one line, ``error: ...``, and exit code 2, as posenc's own commands do.

Where every ``--tasks`` name is a task or tag of the ``--include_path`` folders (a folder of
``posenc extend lm-eval-tasks``, say), lm-eval's own 14 thousand task files are not indexed: that
index is about 6 s of every start on two cores (and of each ``accelerate`` process), and the
run is the same without it (:func:`only_included`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence

from ..cli_errors import install_hint

#: What installs lm-eval with what the ``posenc`` model needs.
LMEVAL_INSTALL = install_hint("lmeval")


def main(argv: Sequence[str] | None = None) -> None:
    """Run lm-eval's CLI on ``argv`` (default: this process's arguments) with ``posenc``
    registered."""
    try:
        from lm_eval.__main__ import cli_evaluate

        from . import model  # noqa: F401 - registers the posenc model
    except ImportError as err:
        if (err.name or "").split(".")[0] not in ("lm_eval", "transformers", "accelerate"):
            raise
        _fail(f"the posenc model of lm-eval needs lm-eval ({err.name} is missing): "
              f"{LMEVAL_INSTALL}")  # fmt: skip
    args = list(sys.argv[1:] if argv is None else argv)
    saved = sys.argv
    sys.argv = ["lm-eval", *args]  # lm-eval's parser reads sys.argv (and inserts `run`)
    try:
        with _defaults_left_out(only_included(args)):
            cli_evaluate()
    except ValueError as err:  # posenc's refusals, and lm-eval's own configuration errors
        _fail(str(err))
    finally:
        sys.argv = saved


def _option(args: Sequence[str], name: str) -> list[str]:
    """Every value of ``--name VALUE`` / ``--name=VALUE`` in ``args`` (lm-eval's spelling)."""
    out = []
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith(name + "="):
            out.append(a.split("=", 1)[1])
    return out


def only_included(args: Sequence[str]) -> bool:
    """Whether every task the command line names is a task or a tag of its ``--include_path``
    folders alone (as lm-eval's own index of those folders reads them): then lm-eval's built-in
    tasks are not needed. A group (its members may be built-in tasks), a ``--config`` file (its
    tasks are not on the command line), or a name found nowhere keeps lm-eval's whole index."""
    from lm_eval.tasks import TaskManager

    paths = [p for value in _option(args, "--include_path") for p in value.split(",") if p]
    tasks = [t for value in _option(args, "--tasks") for t in value.split(",") if t]
    if not paths or not tasks or _option(args, "--config"):
        return False
    try:
        included = TaskManager(include_path=paths, include_defaults=False)
    except Exception:  # lm-eval's own run says what is wrong with the folder
        return False
    names = set(included.all_subtasks) | set(included.all_tags)
    return all(t in names for t in tasks)


@contextlib.contextmanager
def _defaults_left_out(leave_out: bool) -> Iterator[None]:
    """lm-eval's TaskManager without its built-in tasks while the run lasts (``leave_out``)."""
    if not leave_out:
        yield
        return
    from lm_eval.tasks import manager

    original = manager.TaskManager.__init__

    def init(self: object, *a: object, include_defaults: bool = True, **kw: object) -> None:
        original(self, *a, include_defaults=False, **kw)  # type: ignore[arg-type]

    manager.TaskManager.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        manager.TaskManager.__init__ = original  # type: ignore[method-assign]


def _fail(message: str) -> None:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)
