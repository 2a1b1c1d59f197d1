"""Griffe extension for the API reference: render Sphinx roles in docstrings as code.

The docstrings cross-reference with Sphinx roles (``:func:`rope_inv_freq```), which Markdown
would show verbatim. Each becomes a code span of its target (the last component for the ``~``
form, as Sphinx shows it).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
