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
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

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
        cli_evaluate()
    except ValueError as err:  # posenc's refusals, and lm-eval's own configuration errors
        _fail(str(err))
    finally:
        sys.argv = saved


def _fail(message: str) -> None:
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    raise SystemExit(2)
