"""A study's model found again on the reader's machine, and recognized when it moved.

A study records its model twice: ``run.json``'s ``source`` (where it was loaded from: a folder
and, for a GGUF, the file's name) and every row's identity (:func:`~.load.model_identity`:
the source as text, type, sizes, trained length, dtype, config hash, a GGUF file's size). The
source is a path of the machine that ran the study; the rest names the model anywhere. So:

* :func:`same_model`: two identities that differ only in the path name one model (a study
  resumed, reported or exported after the model moved, or on another machine);
* :func:`locate`: the model of a ``run.json`` on this machine: its recorded path where that
  still holds the file, else what the record says the model is: a packaged model by its GGUF
  file's name (``posenc extend smollm2`` on another machine), a model id from the Hugging Face
  cache by its snapshot path (``.../models--ORG--NAME/snapshots/...``), else one line naming the
  model and the ``--model`` option that points at it. The caller checks the loaded model's
  identity against the record (:func:`same_model`), so a file that only shares a name is refused.
* :func:`reference`: what a new ``run.json`` records besides the path (``locate`` reads it first).
* :func:`model_source`: ``MODEL`` as ``posenc extend`` takes it (a packaged name among the rest).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .load import ModelSource, resolve_source


def model_source(model: str, gguf: str | None = None) -> ModelSource:
    """``MODEL`` (and ``--gguf``) as ``posenc extend`` takes it: a packaged model by name
    (``smollm2``, where no such path exists), else a folder, ``.gguf`` file or cached model id."""
    from .packaged import PACKAGED, packaged_gguf

    if model.lower() in PACKAGED and not Path(model).exists():
        return resolve_source(str(packaged_gguf(model)))
    return resolve_source(model, gguf)


#: The identity field that is a path of the machine that ran the study.
PATH_FIELD = "source"
_HUB_SNAPSHOT = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/[^/]+/?$")


def same_model(a: Any, b: Any) -> bool:
    """``a`` and ``b`` (model identities) name one model: equal in everything but the path."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return {k: v for k, v in a.items() if k != PATH_FIELD} == {
        k: v for k, v in b.items() if k != PATH_FIELD
    }


def _packaged_files() -> dict[str, str]:
    """GGUF file name -> packaged model name, for the packaged models (:mod:`.packaged`)."""
    from .load import SMOLLM2_FILE
    from .packaged import GEMMA3_FILE

    return {SMOLLM2_FILE: "smollm2", GEMMA3_FILE: "gemma3-270m"}


def reference(source: ModelSource) -> dict[str, Any]:
    """What names ``source`` on any machine: the packaged model whose GGUF it is, or the Hugging
    Face model id whose cached snapshot it is (None where neither)."""
    packaged = _packaged_files().get(source.gguf or "")
    hub = _HUB_SNAPSHOT.search(source.path.replace("\\", "/"))
    return {
        "packaged": packaged,
        "hub_id": f"{hub.group(1)}/{hub.group(2)}" if hub and not source.gguf else None,
        "file": source.gguf,
    }


def _described(spec: dict[str, Any]) -> str:
    got = spec.get("model")
    model: dict[str, Any] = got if isinstance(got, dict) else {}
    parts = [str(model.get(k)) for k in ("model_type",) if model.get(k)]
    if model.get("parameters"):
        parts.append(f"{model['parameters'] / 1e6:.0f}M parameters")
    if model.get("config_hash"):
        parts.append(f"config hash {model['config_hash']}")
    return ", ".join(parts)


def locate(spec: dict[str, Any], run: Path) -> ModelSource:
    """The model of ``run``'s ``run.json`` (``spec``) on this machine (see the module)."""
    source = spec.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("path"), str):
        raise ValueError(f"{run / 'run.json'}: 'source' must be {{'path': ..., 'gguf': ...}}, "
                         f"got {source!r}")  # fmt: skip
    gguf = source.get("gguf")
    if gguf is not None and not isinstance(gguf, str):
        raise ValueError(f"{run / 'run.json'}: source 'gguf' must be a file name, got {gguf!r}")
    recorded = ModelSource(source["path"], gguf)
    where = Path(recorded.path) / gguf if gguf else Path(recorded.path)
    if where.exists():
        return resolve_source(str(where)) if gguf else resolve_source(recorded.path)
    given = spec.get("locate")
    ref: dict[str, Any] = given if isinstance(given, dict) else reference(recorded)
    if ref.get("packaged"):
        from .packaged import packaged_gguf

        return resolve_source(str(packaged_gguf(ref["packaged"])))
    if ref.get("hub_id"):
        return resolve_source(ref["hub_id"])  # the local cache only; a one-line miss
    raise ValueError(
        f"the model of {run} ({recorded.describe()}: {_described(spec)}) is not on this machine; "
        "give its folder or .gguf file with --model PATH (it must be the same model)"
    )
