"""A bench run as data: the rows every ``posenc bench`` subcommand writes as JSON, which its
``benchmarks/RESULTS.md`` block is rendered from (:mod:`.render`) and its targets are judged
from (:mod:`.targets`). Nothing reads a figure back out of Markdown.

One file per block, ``rows/<block>.json`` beside the results file (``benchmarks/rows/`` for
``benchmarks/RESULTS.md``)::

    {
      "schema": 1,
      "bench": "rope",                 # rope, cos-sin, bias, hf-model
      "block": "rope-cpu",             # the RESULTS.md block it renders
      "env": {"date": "...", ...},     # what the run measured on, in print order
      "command": "posenc bench rope ...",
      "settings": {...},               # the bench's run-wide facts (device, mode, limits)
      "rows": [{...}, ...]             # one flat record per measured thing, bench-specific
    }

A float that was not measured (NaN in the bench), or is not finite, is written ``null``
(:mod:`posenc.runs.strict_json`) and read back as NaN (:func:`number`).
Each bench module documents its row keys beside the function that writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runs import strict_json as strict_json

#: Bumped when a row key changes meaning; :meth:`BenchRows.load` refuses other versions.
SCHEMA = 1


def number(value: float | int | None) -> float:
    """A row's figure as a float: ``null`` (not measured) reads as NaN."""
    return float("nan") if value is None else float(value)


@dataclass
class BenchRows:
    """One bench run: its rows and what a reader needs to reproduce or discount them."""

    bench: str
    block: str
    env: dict[str, str] = field(default_factory=dict)
    command: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    schema: int = SCHEMA

    @property
    def device(self) -> str:
        return str(self.settings.get("device", "cpu"))

    def to_json(self) -> str:
        doc = {
            "schema": self.schema,
            "bench": self.bench,
            "block": self.block,
            "env": self.env,
            "command": self.command,
            "settings": self.settings,
            "rows": self.rows,
        }
        return strict_json.dumps(doc, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = "rows") -> BenchRows:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"{where}: bench rows schema must be {SCHEMA}, got {got!r}")
        missing = [k for k in ("bench", "block", "rows") if k not in doc]
        if missing:
            raise ValueError(f"{where}: bench rows lack {', '.join(missing)}")
        keys = ("bench", "block", "env", "command", "settings", "rows")
        return cls(**{k: doc[k] for k in keys if k in doc})

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: Path) -> BenchRows:
        return cls.from_json(path.read_text(encoding="utf-8"), where=str(path))


def rows_path(results: Path, block: str) -> Path:
    """Where a results file's block keeps its rows: ``<results dir>/rows/<block>.json``."""
    return results.parent / "rows" / f"{block}.json"


def load_all(folder: Path) -> dict[str, BenchRows]:
    """Every rows file of a folder, by block name (``{}`` when there is no folder)."""
    if not folder.is_dir():
        return {}
    docs = (BenchRows.load(p) for p in sorted(folder.glob("*.json")))
    return {d.block: d for d in docs}
