"""Cell labels: ``name`` or ``name:key=value:...``, parsed once into a :class:`Label`.

On the command line a label may also name a module's encoding, ``mymod:myenc[:key=value...]``
(a colon *not* followed by ``key=value``): :func:`normalize_label` imports ``mymod`` and writes
the label with the registered name (:func:`posenc.plugins.module_label` gives the rule).

A label names a registered encoding and its options: the encoding's own registry options and
the lab options (:data:`posenc.lab.cells.options.LAB_OPTIONS`). It keys a grid's options
(:attr:`posenc.lab.cells.config.LabConfig.encoding_kwargs`), its result rows and its checkpoints, so
its text is kept as given (the CLI writes one spelling, :func:`normalize_label`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .config import LabConfig


def parse_encoding(spec: str) -> tuple[str, dict[str, Any]]:
    """``"rope:base=500:partial=0.5"`` -> ``("rope", {"base": 500, "partial": 0.5})``.

    Values are read as JSON where they parse (numbers, true/false, null, quoted strings),
    else kept as strings.
    """
    name, *opts = spec.strip().split(":")
    if not name:
        raise ValueError(f"empty encoding name in {spec!r}")
    kwargs: dict[str, Any] = {}
    for opt in opts:
        key, sep, raw = opt.partition("=")
        if not sep or not key:
            hint = (
                " (a module's encoding, module:encoding, is read by posenc lab -e and "
                "posenc.lab.cells.labels.normalize_label)"
                if opt is opts[0]
                else ""
            )
            raise ValueError(f"encoding option {opt!r} in {spec!r} must look like key=value{hint}")
        try:
            kwargs[key] = json.loads(raw)
        except json.JSONDecodeError:
            kwargs[key] = raw
    return name, kwargs


def normalize_label(label: str) -> str:
    """``"ALiBi:eps=1"`` -> ``"alibi:eps=1"``: registry names are case-insensitive, while a label
    keys the preset's options, the results and the checkpoints, so one spelling is kept.

    ``"mymod:MyEnc:scale=2"`` -> ``"myenc:scale=2"``, with ``mymod`` imported and its encoding
    registered (:func:`posenc.plugins.module_label`; ValueError for the forms it refuses)."""
    from ...plugins import module_label

    name, sep, rest = module_label(label).partition(":")
    return name.strip().lower() + sep + rest


@dataclass(frozen=True)
class Label:
    """One parsed label: its ``text`` (stripped), the encoding ``name`` and the options written
    in it (``given``: encoding and lab options together, as parsed)."""

    text: str
    name: str
    given: dict[str, Any] = field(default_factory=dict, hash=False)

    def options(self, cfg: LabConfig) -> dict[str, Any]:
        """Every option of this label in grid ``cfg``: the grid's defaults for it (by label,
        else by name), then the label's own, which win."""
        defaults = cfg.encoding_kwargs.get(self.text, cfg.encoding_kwargs.get(self.name, {}))
        return {**defaults, **self.given}

    def __str__(self) -> str:
        return self.text


def parse_label(text: str) -> Label:
    """The one parser of a label string (:func:`parse_encoding`); raises ValueError on an
    empty name or an option that is not ``key=value``."""
    name, given = parse_encoding(text)
    return Label(text.strip(), name, given)
