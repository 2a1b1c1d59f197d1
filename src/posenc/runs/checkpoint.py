"""Lab checkpoints: atomic writes, ``weights_only`` reads verified by a SHA-256 digest of the
payload, the identity check that ties a checkpoint to its cell, and the RNG states a resumed run
needs.

Checkpoints hold only tensors and plain containers/numbers/strings, so they load with
``torch.load(weights_only=True)``: a results folder from elsewhere can never run code.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .atomic import write_aside
from .identity import config_diff

CKPT_FORMAT = "posenc-lab-checkpoint"
CKPT_VERSION = 2  # 2: a SHA-256 digest of the payload is stored with it
LAST, FINAL = "last.pt", "final.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is unreadable, or belongs to another configuration."""


def rng_state() -> dict[str, Any]:
    """The torch, numpy and Python RNG states as tensors and plain containers."""
    _, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)  # type: ignore[misc]
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# --- checkpoints ---------------------------------------------------------------------------


def payload_digest(payload: Any) -> str:
    """SHA-256 of a checkpoint payload: every tensor's dtype, shape and bytes, and every plain
    value, walked in order (dict keys in insertion order, which ``torch.load`` keeps).

    Stored with the checkpoint (key ``sha256``) and recomputed on load, so a flipped byte inside
    a tensor, which the zip container does not check, is caught.
    """
    h = hashlib.sha256()
    _digest_feed(h, payload)
    return h.hexdigest()


def _digest_feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, any dtype
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for k, v in obj.items():
            _digest_feed(h, k)
            _digest_feed(h, v)
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)};".encode())
        for v in obj:
            _digest_feed(h, v)
    elif isinstance(obj, float):
        h.update(f"F{obj.hex()};".encode())
    elif isinstance(obj, str):
        data = obj.encode()
        h.update(f"S{len(data)};".encode() + data)
    else:  # None, bool, int: repr is exact
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file beside ``path``, fsync, then ``os.replace``
    (:func:`~posenc.runs.atomic.write_aside`): a crash
    leaves the old checkpoint or the new one, never half of one. The payload's digest
    (:func:`payload_digest`) is stored with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    full = {"format": CKPT_FORMAT, "version": CKPT_VERSION, **payload}
    full["sha256"] = payload_digest(full)
    write_aside(path, lambda f: torch.save(full, f))


def read_checkpoint(path: str | os.PathLike[str], hint: str | None = None) -> dict[str, Any]:
    """Load a lab checkpoint with ``weights_only=True`` and verify it: a posenc lab checkpoint,
    of this format version, whose contents match the digest stored with it.

    Raises :class:`CheckpointError` naming the file (and ``hint``, what to do) otherwise.
    Returns the payload without its digest.
    """
    path = Path(path)
    hint = (
        f"delete {path} to train this cell from step 0, or point --out at the right folder"
        if hint is None
        else hint
    )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, RuntimeError, OSError) as e:
        # torch's first sentence says what failed; the rest (e.g. advice to load with
        # weights_only=False, which would run the file's code) is not for this reader.
        first = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else ""
        raise CheckpointError(
            f"checkpoint {path} is unreadable or corrupt ({first or type(e).__name__}); {hint}"
        ) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != CKPT_FORMAT:
        raise CheckpointError(f"{path} is not a posenc lab checkpoint; {hint}")
    if ckpt.get("version") != CKPT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has format version {ckpt.get('version')}, this posenc reads "
            f"version {CKPT_VERSION}; {hint}"
        )
    stored = ckpt.pop("sha256", None)
    if stored != payload_digest(ckpt):
        raise CheckpointError(
            f"checkpoint {path} is corrupt: its contents do not match the SHA-256 digest stored "
            f"with it (a changed or lost byte); {hint}"
        )
    return ckpt


def load_checkpoint(
    path: Path, identity: dict[str, Any], hint: str | None = None
) -> dict[str, Any]:
    """:func:`read_checkpoint`, then check the checkpoint belongs to ``identity``.

    Raises :class:`CheckpointError` naming the file and what to do (``hint``; default: delete it
    to train the cell from step 0) when it is unreadable, not a lab checkpoint, of another
    version, corrupt, or of another configuration.
    """
    if hint is None:
        hint = f"delete {path} to train this cell from step 0, or point --out at the right folder"
    ckpt = read_checkpoint(path, hint)
    stored = ckpt.get("identity")
    if stored != identity:
        diff = ", ".join(config_diff(stored, identity)[:8]) or "unknown fields"
        raise CheckpointError(
            f"checkpoint {path} was written for another configuration (differs in: {diff}); {hint}"
        )
    return ckpt


def load_checkpoint_identity(path: Path) -> dict[str, Any]:
    """The configuration a checkpoint was written for (verified by :func:`read_checkpoint`)."""
    identity = read_checkpoint(path).get("identity")
    if not isinstance(identity, dict):
        raise CheckpointError(f"{path} is not a posenc lab checkpoint (it has no identity)")
    return identity


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(
            f"checkpoint {path} does not fit this model ({str(e).splitlines()[0]}); delete it "
            "to train this cell from step 0"
        ) from e
