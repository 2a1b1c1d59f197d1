"""posenc's reports go through :mod:`logging`, one ``posenc`` logger hierarchy
(``logging.getLogger(__name__)`` in each module: ``posenc.lab.run``, ``posenc.extend``, ...).

Library code never adds a handler (a program using posenc decides where its log goes, as for
any library); the command line calls :func:`cli_logging`, which prints the messages as the lab
always printed them: the bare text, on standard output.
"""

from __future__ import annotations

import logging
import sys
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
    # not also through the root logger's handlers (a basicConfig elsewhere would print twice)
    logger.propagate = False
    logger.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    return logger
