"""Encodings from the user's own modules: ``posenc lab --import mymod`` imports ``mymod``
before the grid is read, so the ``register`` calls it makes add its encodings by name."""

from __future__ import annotations

import importlib
from collections.abc import Iterable


def import_modules(names: Iterable[str]) -> None:
    """Import each module in ``names``; ValueError naming the module when it cannot be
    imported (not found, or it raised while importing)."""
    for name in names:
        if not name or not all(part.isidentifier() for part in name.split(".")):
            raise ValueError(f"--import {name!r}: not a module name (give e.g. mypkg.encodings)")
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise ValueError(
                f"--import {name}: no module named {e.name!r} (is it on PYTHONPATH, or installed?)"
            ) from None
        except Exception as e:  # the user's module raised while importing
            raise ValueError(
                f"--import {name}: importing it raised {type(e).__name__}: {e}"
            ) from None
