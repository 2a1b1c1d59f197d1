"""The one reader of a results store (``<out>/results.jsonl``): grid rows by group and by the
question they answer, and ``posenc lab extend``'s rows.

Rows come back as the dicts :mod:`posenc.lab.reports.rows` writes, with the fields older rows lack filled
in (:func:`posenc.lab.reports.rows.upgrade_row`), so a folder written by an earlier posenc reads like a
new one. A row of another results schema is refused with what to do.
"""

from __future__ import annotations

import math
import types
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from ...runs.rows import nan_at_floats, shape_problem, short_repr
from ...runs.store import RESULTS_FILE, ResultStore
from ..cells.config import LENGTH_ENCODINGS
from ..cells.identity import RESULTS_SCHEMA
from .rows import (
    EXTEND,
    EXTEND_SHAPES,
    GRID_SHAPES,
    REFERENCE,
    ExtendRow,
    GridRow,
    upgrade_row,
)


@cache
def _row_fields(kind: type[GridRow] | type[ExtendRow]) -> dict[str, Any]:
    """Field -> type of a stored row's dataclass."""
    hints = get_type_hints(kind)
    return {f.name: hints[f.name] for f in fields(kind)}


def _is(value: object, hint: Any) -> bool:
    """Whether ``value`` (parsed JSON) has the type ``hint`` at its top level (``dict[str, Any]``:
    any object; ``float``: any number; a bool is no number)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        return any(_is(value, a) for a in get_args(hint))
    base = origin or hint
    if isinstance(value, bool):
        return base is bool
    if base is float:
        return isinstance(value, int | float)
    return isinstance(value, base)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def nan_for_null(row: dict[str, Any]) -> dict[str, Any]:
    """A stored row (checked by :func:`row_problem`) with its nulls that stand for a non-finite
    float as NaN, which is how the readers took such a float before the store wrote strict JSON
    (:mod:`posenc.runs.strict_json`): each null at a ``float`` leaf of the row's shapes
    (:data:`~posenc.lab.reports.rows.GRID_SHAPES`, :data:`~posenc.lab.reports.rows.EXTEND_SHAPES`), and the
    ``bits`` and ``acc`` of a measured result (``tokens`` > 0; a length that does not apply has
    no tokens, and its null ``bits`` stays None). Other fields, and the row given, as they are."""
    shapes = EXTEND_SHAPES if row.get("kind") else GRID_SHAPES
    out = {k: nan_at_floats(v, shapes[k]) if k in shapes else v for k, v in row.items()}
    ev = out.get("eval")
    variants = ev.get("variants", {}) if isinstance(ev, dict) else {}
    for variant in variants.values():
        for res in variant["results"].values():  # copies (Keys, Each): safe to set
            if isinstance(res.get("tokens"), int) and res["tokens"] > 0:
                for name in ("bits", "acc"):
                    if name in res and res[name] is None:
                        res[name] = math.nan
    return out


#: The fields a stored row is read without (rows written before them lack them) are typed when
#: present; these it cannot be read without (beyond the store's key).
REQUIRED_FIELDS = ("group",)


def row_problem(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """A stored row against its dataclass (:class:`GridRow`, or :class:`ExtendRow` for a row
    with a ``kind``): why it cannot be read (a field of :data:`REQUIRED_FIELDS` missing, or a
    field of the wrong type; None if it can), and a note naming fields no posenc row has (they
    are ignored). A nested field is checked against its shape (:data:`~posenc.lab.reports.rows.GRID_SHAPES`,
    :data:`~posenc.lab.reports.rows.EXTEND_SHAPES`: what the reports read inside it). Raises ValueError
    for a row of another results schema."""
    schema = row.get("schema", RESULTS_SCHEMA)
    if schema != RESULTS_SCHEMA:
        raise ValueError(
            f"a row of results schema {schema!r} ({row.get('encoding')!r}, seed "
            f"{row.get('seed')}); this posenc reads schema {RESULTS_SCHEMA}. Read it with the "
            "posenc that wrote it, or rerun the grid into a new --out (its checkpoints under "
            "ckpt/ are reused where their identity still matches)"
        )
    wanted = _row_fields(ExtendRow if row.get("kind") else GridRow)
    problem = _field_problem(row, wanted)
    if problem is not None:
        # The row's key is stored, so its cell counts as finished: say how to run it again.
        again = "" if row.get("kind") else f"; its grid with --force {row['encoding']} reruns it"
        return problem + again, None
    unknown = [repr(k) for k in row if k not in wanted and k != "kind"]
    if unknown:
        return None, f"ignoring field(s) no result row has: {', '.join(unknown)}"
    return None, None


def _field_problem(row: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    """A required field missing, a field of the wrong type, or a nested field of the wrong
    shape (:func:`shape_problem`); None if there is none."""
    for name in REQUIRED_FIELDS:
        if name not in row:
            return f"no {name!r}"
    for name, value in row.items():
        if name in wanted and not _is(value, wanted[name]):
            return f"{name!r} is {short_repr(value)}, not {_type_name(wanted[name])}"
    for name, shape in (EXTEND_SHAPES if row.get("kind") else GRID_SHAPES).items():
        if name in row and (problem := shape_problem(row[name], shape, name)) is not None:
            return problem
    return None


def store_rows(out: str | Path) -> list[dict[str, Any]]:
    """Every row of the store at ``out`` in the order written (the first of a key wins),
    upgraded to this version's fields. Raises ValueError for a row of another results schema.

    A row that :func:`row_problem` refuses (a field of the wrong type, or one it cannot be read
    without) is skipped with one warning naming the file and the line; a field no row has is
    ignored, with a warning. A non-finite float, stored as null, reads as NaN
    (:func:`nan_for_null`)."""
    path = Path(out) / RESULTS_FILE
    try:
        rows = ResultStore(path).numbered_rows(row_problem)
    except ValueError as e:
        raise ValueError(f"{path} holds {e}") from None
    return [upgrade_row(nan_for_null(row)) for _, row in rows]


def check_store(out: str | Path) -> None:
    """Refuse a run whose store it could not report: ValueError (the one line ``posenc lab
    report`` gives, from :func:`store_rows`) for a row of another results schema in the store
    at ``out``. A run checks this before it trains, so an unreadable store costs no training."""
    store_rows(out)


def grid_store_rows(out: str | Path) -> list[dict[str, Any]]:
    """Every grid row of the store at ``out`` (rows without a ``kind``), in the order written."""
    return [r for r in store_rows(out) if not r.get("kind")]


def extend_rows(out: str | Path, group: str | None = None) -> list[dict[str, Any]]:
    """The extend rows of ``group`` (hash prefix; default: the newest extend run)."""
    rows = [r for r in store_rows(out) if r.get("kind") in (EXTEND, REFERENCE)]
    if not rows:
        return []
    group = group if group is not None else rows[-1]["group"]
    return [r for r in rows if r["group"].startswith(group)]


#: The lab's questions, each answered by a kind of grid (its rows' data and options):
#: extrapolation (the default grid, on text or a synthetic task), length (training-time length methods and the
#: Llama-4 options: ``--encodings length``), passkey (``--task passkey``).
QUESTIONS = ("extrapolation", "length", "passkey")


def question_of(row: dict[str, Any]) -> str:
    """Which of :data:`QUESTIONS` a grid row answers (the copy/reverse/recall tasks, like text,
    are extrapolation)."""
    fingerprint = str(row.get("data", {}).get("fingerprint", ""))
    if fingerprint.startswith("task-passkey"):
        return "passkey"
    if row.get("lab_options") or row.get("length_method", "arange") != "arange":
        return "length"
    return "extrapolation"


def question_rows(rows: list[dict[str, Any]], question: str) -> list[dict[str, Any]]:
    """The rows of one group that answer ``question``.

    A group is a grid minus its encodings, so ``posenc lab`` and ``posenc lab --encodings
    length`` into one folder share it: ``extrapolation`` takes its plain rows (no lab option),
    ``length`` its rows with a lab option and the plain rows of the length set
    (:data:`~posenc.lab.cells.presets.LENGTH_ENCODINGS`: their baselines, CoPE; nothing when no row
    has a lab option), ``passkey`` the passkey task's."""
    if question not in QUESTIONS:
        raise ValueError(f"unknown question {question!r}; choose one of {', '.join(QUESTIONS)}")
    if question == "length":
        if not any(question_of(r) == "length" for r in rows):
            return []  # baselines alone are no length table
        return [
            r
            for r in rows
            if question_of(r) == "length"
            or (question_of(r) == "extrapolation" and r["encoding"] in LENGTH_ENCODINGS)
        ]
    return [r for r in rows if question_of(r) == question]


def question_of_rows(rows: list[dict[str, Any]]) -> str:
    """The question a group's rows answer as a whole: ``passkey`` for the passkey task,
    ``length`` when every row belongs to the length table (a length grid alone; its plain
    ``rope`` is a baseline), else ``extrapolation`` (a default grid, with or without a length
    grid in the same folder)."""
    asked = {question_of(r) for r in rows}
    if "passkey" in asked:
        return "passkey"
    if "length" in asked and len(question_rows(rows, "length")) == len(rows):
        return "length"
    return "extrapolation"


def newest_group(out: str | Path, question: str) -> str | None:
    """The group of the newest grid row of a group that answers ``question``: first among the
    groups that answer it as a whole (:func:`question_of_rows`), else among those with any row
    for it (:func:`question_rows`); None if there is none."""
    if question not in QUESTIONS:
        raise ValueError(f"unknown question {question!r}; choose one of {', '.join(QUESTIONS)}")
    rows = grid_store_rows(out)
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    for whole in (True, False):
        for r in reversed(rows):
            group = by_group[r["group"]]
            if (question_of_rows(group) == question) if whole else question_rows(group, question):
                return str(r["group"])
    return None


def load_rows(
    out: str | Path, group: str | None = None, all_groups: bool = False
) -> list[dict[str, Any]]:
    """Grid rows of ``group`` (default: the group of the newest grid row), or every grid row.

    Rows of another kind (``posenc lab extend``'s, which carry a ``kind``) are left out: they
    have their own table (:mod:`posenc.lab.reports.extend_report`)."""
    rows = grid_store_rows(out)
    if not rows or all_groups:
        return rows
    if group is None:
        group = rows[-1]["group"]
    picked = [r for r in rows if r["group"].startswith(group)]
    if not picked:
        groups = sorted({r["group"] for r in rows})
        raise ValueError(f"no results in group {group!r}; groups: {', '.join(groups)}")
    return newest_per_cell(picked)


def newest_per_cell(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row written of each ``(group, encoding, seed)``, in the order of the first: a
    cell rerun under a new identity (its encoding's code edited) replaces its older row in a
    table instead of counting as another seed."""
    newest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:  # a key assigned again keeps its first place
        newest[(r["group"], r["encoding"], r["seed"])] = r
    return list(newest.values())


def groups(out: str | Path) -> dict[str, int]:
    """Group hash -> number of rows."""
    counts: dict[str, int] = {}
    for r in grid_store_rows(out):
        counts[r["group"]] = counts.get(r["group"], 0) + 1
    return counts
