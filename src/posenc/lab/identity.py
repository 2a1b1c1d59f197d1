"""What a lab result *is*: the identities (and their hashes) that key checkpoints and rows.

Everything that changes what a cell computes goes into its identity; everything that only changes
how fast or where it runs (threads, compile, output folder, progress bar, checkpoint interval)
stays out, so a finished cell is found again whatever those are.

The identities are the lab's, not the model's: :func:`model_identity` decides how a
:class:`~posenc.model.ModelConfig` enters a hash, so the library's config can grow fields
without moving any stored result. :data:`IDENTITY_VERSION` names the rules below; a change
that would move the hash of an existing cell bumps it, and the reader says how to convert.

Version 3 (version 2 plus posenc's own source; version 1, every result written before the code
entered, is version 2 without the code):

* a model is its config's fields, minus ``nope_every`` and ``temperature`` when they are None
  (options added after the lab's first results: a configuration without them keeps the hash it
  had before they existed);
* a cell's training identity is ``{"schema", "model", "train", "data" (+ the data
  fingerprint), "seed"}`` and, only for a training-time length method, ``"positions"`` with its
  resolved range;
* the training identity holds ``"code"`` (:func:`code_identity`): the module that defines the
  encoding (its builder, or the class registered by
  :func:`~posenc.registry.register_class`) and a hash of that module's source file, for
  posenc's own encodings posenc's version too, and for every encoding ``"package"``: the hash
  of posenc's own source (:func:`package_source_hash`, every ``.py`` and C file of the
  package), since a cell computes through posenc's model, training and evaluation whichever
  module registered its encoding; editing the module or any file of posenc (one character)
  moves the hash, so the cell trains again. A row written under version 1 has no ``"code"``
  (under version 2, no ``"package"``): it is read and reported as before, in its group (the
  group holds no code), and is not found by the skip test, so its cell trains again;
* hashes are :func:`stable_hash` of the identity as JSON (tuples as lists).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import marshal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import __version__, registry
from ..model import ModelConfig
from .config import LabConfig
from .options import PositionSampling
from .tasks import PASSKEY_DEPTHS, PASSKEY_MIN_PER_DEPTH

#: The rules this module applies (module docstring).
IDENTITY_VERSION = 3

#: Bump when the meaning of a stored result changes (a new metric definition, a data change).
RESULTS_SCHEMA = 1

#: ModelConfig fields that enter an identity only when set (version 1).
MODEL_FIELDS_WHEN_SET: tuple[str, ...] = ("nope_every", "temperature")


def stable_hash(obj: Any, n: int = 12) -> str:
    """A short hash of a JSON-able object, independent of dict order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def jsonable(obj: Any) -> Any:
    """Tuples to lists, so an identity compares equal after a JSON or checkpoint round trip."""
    return json.loads(json.dumps(obj, default=str))


def model_identity(model: ModelConfig) -> dict[str, Any]:
    """How a model config enters an identity (version 1: the fields of
    :data:`MODEL_FIELDS_WHEN_SET` only when they are not None)."""
    out = asdict(model)
    for name in MODEL_FIELDS_WHEN_SET:
        if out.get(name) is None:
            out.pop(name, None)
    return jsonable(out)


def _source_hash(module_name: str, fn: Any) -> dict[str, str]:
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


def code_identity(encoding: str) -> dict[str, Any]:
    """The code that defines registered encoding ``encoding``: the module of its builder (for
    a class registered by :func:`~posenc.registry.register_class`, the class's module) and a
    hash of that module's source file.

    posenc's own encodings add posenc's version. Their computation is spread over several
    modules (``rotary/entries.py`` registers RoPE, ``rotary/embedding.py`` and
    ``functional/`` compute it), and an installed posenc changes those files only with its
    version: the version identifies the code of an installed posenc, the hash an edit of the
    registering module in a checkout. Every encoding, posenc's or a plugin's, also adds the
    hash of posenc's whole source (:func:`package_source_hash`): in a checkout an edit of
    ``rotary/embedding.py``, ``functional/``, the model or the training loop changes what a
    cell computes as surely as an edit of the registering module does."""
    builder = registry.entry(encoding).builder
    module = getattr(builder, "__module__", None) or "?"
    out: dict[str, Any] = {"module": module, **_source_hash(module, builder)}
    if module == "posenc" or module.startswith("posenc."):
        out["posenc"] = __version__
    out["package"] = package_source_hash()
    return out


def data_identity(cfg: LabConfig, data_fingerprint: str) -> dict[str, Any]:
    return {**asdict(cfg.data), "fingerprint": data_fingerprint}


def train_identity(
    cfg: LabConfig,
    model: ModelConfig,
    seed: int,
    data_fingerprint: str,
    positions: PositionSampling | None = None,
) -> dict[str, Any]:
    """Everything that decides a cell's trained weights (the checkpoint's identity), as JSON:
    the code of its encoding included (:func:`code_identity`).

    The training positions enter only when set (a randomized cell's default range is the
    longest eval length, so a longer eval length retrains it: it trains on other positions)."""
    identity: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "model": model_identity(model),
        "train": asdict(cfg.train),
        "data": data_identity(cfg, data_fingerprint),
        "seed": seed,
        "code": code_identity(model.encoding),
    }
    if positions is not None:
        identity["positions"] = positions.identity()
    return jsonable(identity)


def eval_identity(cfg: LabConfig) -> dict[str, Any]:
    """Everything that decides a cell's metrics once the weights are fixed (for the passkey
    task also its heatmap's depths and sequences per depth, which live in the task module)."""
    out = {**asdict(cfg.eval), "lengths": cfg.eval_lengths()}
    if cfg.data.source == "task" and cfg.data.task == "passkey":
        out["passkey"] = {"depths": list(PASSKEY_DEPTHS), "min_per_depth": PASSKEY_MIN_PER_DEPTH}
    return out


def cell_identity(train_id: dict[str, Any], eval_id: dict[str, Any]) -> dict[str, Any]:
    return {"train": train_id, "eval": eval_id}


def group_identity(cfg: LabConfig, data_fingerprint: str) -> dict[str, Any]:
    """What the cells of one table share: the grid minus its encodings and seeds."""
    return {
        "schema": RESULTS_SCHEMA,
        "train_len": cfg.train_len,
        "model": asdict(cfg.model),
        "train": asdict(cfg.train),
        "data": data_identity(cfg, data_fingerprint),
        "eval": eval_identity(cfg),
    }
