"""Result files as strict JSON: a non-finite float (NaN, ±Infinity) is written ``null``.

Python's ``json`` writes NaN and Infinity as bare ``NaN``/``Infinity`` by default, which no
other JSON reader accepts (``jq``, JavaScript's ``JSON.parse``, pandas' strict mode). Every
writer of result rows (the lab's store, the bench rows files) goes through :func:`dumps`; the
readers take ``null`` where a float was not finite, as they took NaN.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float inside it (objects, lists and tuples, to any depth)
    replaced by None; anything else as it is (a tuple becomes a list, as JSON writes it)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite floats as ``null`` (:func:`finite_or_null`);
    ``allow_nan=False``, so a value the conversion missed raises instead of writing ``NaN``."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)
