"""What names a run and its code, for every kind of run (a lab cell, an extend study, a bench):
a short stable hash of any JSON-able identity, identities made JSON-round-trip-safe, and a hash of
posenc's own source, so that a result keyed by them is found again exactly when the code and
configuration that computed it are the same.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import marshal
import sys
from pathlib import Path
from typing import Any


def stable_hash(obj: Any, n: int = 12) -> str:
    """A short hash of a JSON-able object, independent of dict order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def jsonable(obj: Any) -> Any:
    """Tuples to lists, so an identity compares equal after a JSON or checkpoint round trip."""
    return json.loads(json.dumps(obj, default=str))


def source_hash(module_name: str, fn: Any) -> dict[str, str]:
    """``{"source": hash}`` of the file of module ``module_name``; for a module without one
    (defined in ``__main__`` by exec, a notebook cell) ``{"code": hash}`` of ``fn``'s compiled
    code instead, which moves with any edit of its body."""
    module = sys.modules.get(module_name)
    try:
        path = inspect.getsourcefile(module) if module is not None else None
        if path is not None:
            with open(path, "rb") as f:
                return {"source": hashlib.sha256(f.read()).hexdigest()[:16]}
    except (OSError, TypeError):
        pass
    code = getattr(fn, "__code__", None)
    blob = marshal.dumps(code) if code is not None else repr(fn).encode()
    return {"code": hashlib.sha256(blob).hexdigest()[:16]}


#: The folder whose source :func:`package_source_hash` hashes: the posenc package itself.
PACKAGE_ROOT = Path(__file__).resolve().parents[1]

#: The files of the package that hold code a cell can run: Python, and the C of the CPU kernel
#: (compiled at first use from the package's own copy).
SOURCE_SUFFIXES = (".py", ".c", ".h", ".cpp", ".cu")


def package_files(root: Path) -> list[Path]:
    """Every source file under ``root`` (:data:`SOURCE_SUFFIXES`, bytecode caches left out), in
    path order: the order is part of the hash, so it must not depend on the file system's."""
    found = (p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())
    return sorted((p for p in found if "__pycache__" not in p.parts), key=lambda p: p.as_posix())


@functools.cache
def package_source_hash(root: Path | None = None) -> str:
    """A hash of posenc's own source (``root``: default :data:`PACKAGE_ROOT`): each file's path
    relative to ``root`` and its bytes, in path order, so an edit, a new file, a removed or a
    renamed one moves it. Hashed once per process (about 2 MB, a few milliseconds): a process
    that edits posenc while it runs keeps the hash of the code it imported."""
    root = PACKAGE_ROOT if root is None else root
    h = hashlib.sha256()
    for path in package_files(root):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        # Length-prefixed, so no two file sets can give the same stream of bytes.
        h.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
        h.update(data)
    return h.hexdigest()[:16]


def config_diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """``"path: old -> new"`` for each dotted path where two nested dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            out += config_diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix[:-1] or '<root>'}: {a!r} -> {b!r}"]
