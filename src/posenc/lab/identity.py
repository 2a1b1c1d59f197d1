"""What a lab result *is*: the identities (and their hashes) that key checkpoints and rows.

Everything that changes what a cell computes goes into its identity; everything that only changes
how fast or where it runs (threads, compile, output folder, progress bar, checkpoint interval)
stays out, so a finished cell is found again whatever those are.

The identities are the lab's, not the model's: :func:`model_identity` decides how a
:class:`~posenc.model.ModelConfig` enters a hash, so the library's config can grow fields
without moving any stored result. :data:`IDENTITY_VERSION` names the rules below; a change
that would move the hash of an existing cell bumps it, and the reader says how to convert.

Version 1 (every result written so far):

* a model is its config's fields, minus ``nope_every`` and ``temperature`` when they are None
  (options added after the lab's first results: a configuration without them keeps the hash it
  had before they existed);
* a cell's training identity is ``{"schema", "model", "train", "data" (+ the data
  fingerprint), "seed"}`` and, only for a training-time length method, ``"positions"`` with its
  resolved range;
* hashes are :func:`stable_hash` of the identity as JSON (tuples as lists).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from ..model import ModelConfig
from .config import LabConfig
from .options import PositionSampling
from .tasks import PASSKEY_DEPTHS, PASSKEY_MIN_PER_DEPTH

#: The rules this module applies (module docstring).
IDENTITY_VERSION = 1

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


def data_identity(cfg: LabConfig, data_fingerprint: str) -> dict[str, Any]:
    return {**asdict(cfg.data), "fingerprint": data_fingerprint}


def train_identity(
    cfg: LabConfig,
    model: ModelConfig,
    seed: int,
    data_fingerprint: str,
    positions: PositionSampling | None = None,
) -> dict[str, Any]:
    """Everything that decides a cell's trained weights (the checkpoint's identity), as JSON.

    The training positions enter only when set (a randomized cell's default range is the
    longest eval length, so a longer eval length retrains it: it trains on other positions)."""
    identity: dict[str, Any] = {
        "schema": RESULTS_SCHEMA,
        "model": model_identity(model),
        "train": asdict(cfg.train),
        "data": data_identity(cfg, data_fingerprint),
        "seed": seed,
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
