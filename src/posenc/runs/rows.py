"""The schema a stored row is read by, for every kind of run: nested shapes (:class:`Keys`,
:class:`Each`, :class:`ListOf`, :class:`OneOf` and leaves), :func:`shape_problem` (why a parsed
JSON value does not have a shape, recursing only as deep as the shape) and :func:`nan_at_floats`
(the nulls the store wrote for non-finite floats read back as NaN).

A reader declares the shape of what it indexes in a row, and a row that does not have it is
skipped with one warning (:data:`posenc.runs.store.RowCheck`), never a ``KeyError`` in a report.
The lab's rows (:mod:`posenc.lab.reports.rows`) and ``posenc extend``'s
(:mod:`posenc.extend.study.rows`) are both declared in these shapes.
"""

from __future__ import annotations

import json
import math
import reprlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Keys:
    """An object with the ``required`` keys and, where present, the ``optional`` ones, each of
    its shape; ``rest``: the shape of every other key's value (None: not looked at)."""

    required: dict[str, Any]
    optional: dict[str, Any] = field(default_factory=dict)
    rest: Any = None


@dataclass(frozen=True)
class Each:
    """An object whose every value has the shape ``value``; ``int_keys``: its keys are integers
    written as strings (an eval length)."""

    value: Any
    int_keys: bool = False


@dataclass(frozen=True)
class ListOf:
    """A list whose every item has the shape ``item``."""

    item: Any


@dataclass(frozen=True)
class OneOf:
    """Any of ``options`` (a shape each)."""

    options: tuple[Any, ...]


#: Leaves: ``float`` is any JSON number that is a float (an integer too; a bool is no number)
#: or null, which the store writes for a non-finite float (strict JSON) and the reader reads back
#: as NaN (:func:`posenc.lab.reports.results.nan_for_null`); ``NUMBER_OR_NULL`` keeps a null as None.
#: ``int`` an integer, ``str`` a string, ``None`` null, ``Any`` anything.
NUMBER_OR_NULL = OneOf((float, None))


#: A value in a warning: short, and bounded in depth (a deeply nested value is not recursed).
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxstring = 2, 3, 3, 30


def short_repr(value: object) -> str:
    """``value`` for a warning: short, and bounded in depth."""
    return _SHORT.repr(value)


def _leaf_ok(value: object, leaf: Any) -> bool:
    """A leaf of a nested shape (:mod:`posenc.lab.reports.rows`): ``float`` any number a float holds
    (an integer past float's range is none) or null (a non-finite float, which the store writes
    null: :func:`nan_at_floats` reads it back as NaN), ``int``, ``str``, ``None``, ``Any``."""
    if leaf is Any:
        return True
    if leaf is None or value is None:
        return value is None and leaf in (None, float)
    if isinstance(value, bool):
        return leaf is bool
    if leaf is float:
        return isinstance(value, float) or (isinstance(value, int) and _fits_float(value))
    return isinstance(value, leaf)


def _fits_float(value: int) -> bool:
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _shape_name(shape: Any) -> str:
    if isinstance(shape, Keys | Each):
        return "an object"
    if isinstance(shape, ListOf):
        return "a list"
    if isinstance(shape, OneOf):
        return " or ".join(_shape_name(s) for s in shape.options)
    names = {float: "a number", int: "an integer", str: "a string", None: "null"}
    return names.get(shape, "anything")


def read_shaped_json(path: Path, shape: Any, where: str, what: str) -> Any:
    """The JSON file ``path`` parsed and checked against ``shape`` (:func:`shape_problem`, the
    top level named ``where``): not JSON, or a field missing or of the wrong type, is one
    ValueError naming the file and saying it is no ``what``."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{path} is no JSON ({e}); it is no {what}") from None
    problem = shape_problem(value, shape, where)
    if problem is not None:
        raise ValueError(f"{path}: {problem}; it is no {what}")
    return value


def shape_problem(value: object, shape: Any, where: str) -> str | None:
    """Why ``value`` (parsed JSON, at ``where``: ``eval.variants.base``) does not have the
    nested ``shape`` (:class:`Keys`, ``Each``, ``ListOf``, ``OneOf`` or a
    leaf); None if it has. Recurses only as deep as the shape, never into the value beyond."""
    wrong = f"{where} is {short_repr(value)}, not {_shape_name(shape)}"
    if isinstance(shape, OneOf):
        fits = [s for s in shape.options if shape_problem(value, s, where) is None]
        if fits:
            return None
        typed = [s for s in shape.options if isinstance(s, Keys | Each | ListOf)]
        inner = [s for s in typed if isinstance(value, list if isinstance(s, ListOf) else dict)]
        return shape_problem(value, inner[0], where) if inner else wrong
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            return wrong
        for i, item in enumerate(value):
            if (problem := shape_problem(item, shape.item, f"{where}[{i}]")) is not None:
                return problem
        return None
    if isinstance(shape, Keys | Each):
        return _object_problem(value, shape, where) if isinstance(value, dict) else wrong
    return None if _leaf_ok(value, shape) else wrong


def _object_problem(value: dict[str, Any], shape: Keys | Each, where: str) -> str | None:
    if isinstance(shape, Each):
        for key, item in value.items():
            if shape.int_keys and not (key.isascii() and key.isdigit()):
                return f"{where} has the key {short_repr(key)}, not a length"
            if (problem := shape_problem(item, shape.value, f"{where}.{key}")) is not None:
                return problem
        return None
    for key, item in value.items():
        sub = shape.required.get(key, shape.optional.get(key, shape.rest))
        if sub is not None and (problem := shape_problem(item, sub, f"{where}.{key}")):
            return problem
    missing = [k for k in shape.required if k not in value]
    return f"no {where}.{missing[0]}" if missing else None


def nan_at_floats(value: Any, shape: Any) -> Any:
    """``value`` (of ``shape``, checked by :func:`shape_problem`) with a null at each ``float``
    leaf as NaN; the objects and lists on the way are copies."""
    if shape is float:
        return math.nan if value is None else value
    if isinstance(shape, OneOf):
        if value is None and None in shape.options:
            return None  # null is one of its values (not applicable), not a lost float
        fits = [s for s in shape.options if shape_problem(value, s, "") is None]
        return nan_at_floats(value, fits[0]) if fits else value
    if isinstance(shape, ListOf) and isinstance(value, list):
        return [nan_at_floats(v, shape.item) for v in value]
    if isinstance(shape, Each) and isinstance(value, dict):
        return {k: nan_at_floats(v, shape.value) for k, v in value.items()}
    if isinstance(shape, Keys) and isinstance(value, dict):
        subs = {**shape.required, **shape.optional}
        return {k: nan_at_floats(v, subs.get(k, shape.rest)) for k, v in value.items()}
    return value
