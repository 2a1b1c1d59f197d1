"""posenc's reports go through :mod:`logging`, one ``posenc`` logger hierarchy
(``logging.getLogger(__name__)`` in each module: ``posenc.lab.grid.run``, ``posenc.extend``, ...).

Library code never adds a handler (a program using posenc decides where its log goes, as for
any library); the command line calls :func:`cli_logging`, which prints the messages as the lab
always printed them: the bare text, on standard output.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class _CurrentStdout(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stdout`` is at each message (a test runner's capture, rich's
    redirect while progress bars are drawn), not the stream of the moment it was made."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ sets it; ignored
        pass


def cli_logging(quiet: bool = False, verbose: bool = False) -> logging.Logger:
    """The ``posenc`` logger as the command line shows it: messages of INFO and above
    (WARNING with ``quiet``, DEBUG with ``verbose``) printed bare on standard output. Calling
    it again only sets the level (one handler, however many commands run in a process)."""
    logger = logging.getLogger("posenc")
    if not any(isinstance(h, _CurrentStdout) for h in logger.handlers):
        handler = _CurrentStdout()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    # Records still propagate to the root logger: a test runner's capture (pytest's caplog) or a
    # program's own handlers see them too.
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    return logger


@contextmanager
def command_logging() -> Iterator[logging.Logger]:
    """:func:`cli_logging` for the length of one command, then the ``posenc`` logger as it was
    (handlers, level, propagation): a program or test runner that invokes the CLI in-process
    keeps its own logging afterwards."""
    logger = logging.getLogger("posenc")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        yield cli_logging()
    finally:
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
