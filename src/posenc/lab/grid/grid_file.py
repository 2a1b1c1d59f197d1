"""``posenc lab --config grid.toml``: a grid from a TOML file whose keys are the command's flags.

Each key is a flag's long name without its dashes (``train-len = 64`` for ``--train-len 64``;
``plots = false`` for ``--no-plots``), taken from the one flag table
(:data:`posenc.lab.cells.flags.LAB_FLAGS`): a flag added there is a key here. A value has the flag's
type (an integer, a number, a string, true/false); the flags that take several values
(:attr:`~posenc.lab.cells.flags.Flag.several`: ``encodings``, ``eval-lens``, ``rope-scalings``,
``force``, ``import``) also take a TOML list. The file's values become exactly what the same
flags on the command line give (a list is joined with commas, as the flag spells it), so
``posenc lab --config FILE`` runs the grid those flags run, bit for bit; a flag given beside
``--config`` overrides the file's key. Paths are read from the current folder, as on the
command line. ``posenc lab extend --config FILE`` reads its own flags' table
(:data:`posenc.lab.extension.flags.EXTEND_FLAGS`: ``target``, ``methods``, ``curve``, ...) the same way.
"""

from __future__ import annotations

import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

from ..cells.flags import Flag

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the tomli backport (a conditional dependency)
    import tomli as tomllib


def flag_key(flag: Flag) -> str:
    """The file's key of ``flag``: its long name without dashes (``--no-...`` dropped)."""
    long = next(d for d in flag.decls if d.startswith("--"))
    return long.split("/")[0].removeprefix("--")


def file_keys(flags: tuple[Flag, ...]) -> dict[str, Flag]:
    """Key -> flag, for every flag of ``flags`` except ``--config`` itself."""
    return {flag_key(f): f for f in flags if f.field != "config"}


def _base(tp: Any) -> Any:
    """``int | None`` -> int; ``list[str] | None`` -> list; a plain type as it is."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    return typing.get_origin(tp) or tp


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          Path: "a path (a string)", list: "a list of strings"}  # fmt: skip


def _kind(value: Any) -> str:
    """What a TOML value is, in the file's words."""
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return f"{value!r}"


def convert(key: str, flag: Flag, value: Any) -> Any:
    """``value`` of key ``key`` as the command line gives ``flag``'s parameter; ValueError
    saying what the key takes."""
    base = _base(flag.type)
    several = flag.several
    if several and base is str and isinstance(value, list):
        if not value or not all(
            isinstance(v, (str, int)) and not isinstance(v, bool) for v in value
        ):
            raise ValueError(f"key {key!r} takes a string or a non-empty list of strings, got "
                             f"{_kind(value)}")  # fmt: skip
        return ",".join(map(str, value))
    if base is list:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise ValueError(f"key {key!r} takes a string or a list of strings, got {_kind(value)}")
        return list(items)
    ok = isinstance(value, base) and (base is bool or not isinstance(value, bool))
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if base is Path and isinstance(value, str):
        value, ok = Path(value), True
    if not ok:
        takes = _NAMES.get(base, str(base)) + (" or a list" if several else "")
        raise ValueError(f"key {key!r} takes {takes}, got {_kind(value)}")
    if flag.min is not None and value < flag.min:
        raise ValueError(f"key {key!r} must be >= {flag.min}, got {value}")
    return value


def read_grid_file(path: Path, flags: tuple[Flag, ...]) -> dict[str, Any]:
    """The values a grid file at ``path`` gives, by ``flags``' parameter names, each as its flag
    on the command line gives it. ValueError (naming the file) for a file that is missing or
    not TOML, an unknown key (the allowed ones listed, the closest suggested) or a value of the
    wrong type."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"--config: no file {path}") from None
    except IsADirectoryError:
        raise ValueError(f"--config: {path} is a folder; give a .toml file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"--config {path}: not valid TOML: {e}") from None
    keys = file_keys(flags)
    out: dict[str, Any] = {}
    for key, value in table.items():
        flag = keys.get(key)
        if flag is None:
            close = difflib.get_close_matches(key.replace("_", "-"), list(keys), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"--config {path}: unknown key {key!r}{hint}; allowed keys: {', '.join(keys)}"
            )
        try:
            out[flag.field] = convert(key, flag, value)
        except ValueError as e:
            raise ValueError(f"--config {path}: {e}") from None
    return out
