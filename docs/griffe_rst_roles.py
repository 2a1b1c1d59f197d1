"""Griffe extension for the API reference: render Sphinx roles in docstrings as code.

The docstrings cross-reference with Sphinx roles (``:func:`rope_inv_freq```), which Markdown
would show verbatim. Each becomes a code span of its target (the last component for the ``~``
form, as Sphinx shows it).

Doctest examples (``>>>`` lines, their ``...`` continuations and expected output, up to a blank
line) become ``pycon`` code blocks: as plain Markdown, ``>>>`` would be nested quotes and an
output such as ``[(0, 'full', 16)]`` a cross-reference for autorefs to resolve.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|obj|exc|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


_EXAMPLES_SECTION = re.compile(r"^\s*Examples?:\s*$", re.M)  # griffe parses those itself


def fence_doctests(text: str) -> str:
    """Each doctest run of ``text`` (from a ``>>>`` line to the next blank line, outside code
    fences) inside a ```` ```pycon ```` block at its indentation."""
    if _EXAMPLES_SECTION.search(text):
        return text
    out: list[str] = []
    in_fence = in_doctest = False
    indent = ""
    for line in text.split("\n"):
        stripped = line.lstrip()
        if in_doctest and not stripped:
            out.append(f"{indent}```")
            in_doctest = False
        elif not in_doctest and not in_fence and stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            out.append(f"{indent}```pycon")
            in_doctest = True
        elif not in_doctest and stripped.startswith("```"):
            in_fence = not in_fence
        out.append(line)
    if in_doctest:
        out.append(f"{indent}```")
    return "\n".join(out)


class RstRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(_ROLE.sub(_code, obj.docstring.value))
