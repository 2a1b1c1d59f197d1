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

from dataclasses import asdict
from typing import Any

from ... import __version__, registry
from ...model import ModelConfig
from ...runs.identity import jsonable, package_source_hash, source_hash
from ..evaluation.tasks import PASSKEY_DEPTHS, PASSKEY_MIN_PER_DEPTH
from .config import LabConfig
from .options import PositionSampling

#: The rules this module applies (module docstring).
IDENTITY_VERSION = 3

#: Bump when the meaning of a stored result changes (a new metric definition, a data change).
RESULTS_SCHEMA = 1

#: ModelConfig fields that enter an identity only when set (version 1).
MODEL_FIELDS_WHEN_SET: tuple[str, ...] = ("nope_every", "temperature")


def model_identity(model: ModelConfig) -> dict[str, Any]:
    """How a model config enters an identity (version 1: the fields of
    :data:`MODEL_FIELDS_WHEN_SET` only when they are not None)."""
    out = asdict(model)
    for name in MODEL_FIELDS_WHEN_SET:
        if out.get(name) is None:
            out.pop(name, None)
    return jsonable(out)


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
    out: dict[str, Any] = {"module": module, **source_hash(module, builder)}
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
