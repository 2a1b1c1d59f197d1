"""An extended model folder that stock transformers loads with no posenc installed.

The weights are written as loaded (a GGUF model dequantized, as transformers loaded it), the
tokenizer beside them, and ``config.json`` with the chosen method as transformers'
``rope_parameters`` and ``max_position_embeddings`` raised to the target length. posenc's own
``ntk`` (static NTK-aware scaling) is written as what it is, the default RoPE with the base
``theta * factor ** (d / (d - 2))``. Methods that change attention itself (the key-set
methods: ``self_extend``, ``dual_chunk``, ``string``, ``rerope``, ``leaky_rerope``, ``logn``) have
no transformers config: they are refused here, and need ``apply_posenc``.

The folder is written aside (a uniquely named temporary folder beside it) and renamed into place
(:func:`~posenc.runs.atomic.folder_written_aside`): an interrupted export leaves no half-written
folder, and the next export into the same place runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ...hf.extension import EXTENSION_METHODS
from ...hf.rotary import with_rope_parameters
from ...hf.scaling import is_keyed
from ...runs.atomic import folder_written_aside
from ..model.load import rotated_pairs, trained_length
from .names import Method, as_transformers, resolve

EXPORT_NOTE = "posenc_export.json"


def export_model(
    model: Any,
    tokenizer: Any,
    method: Method,
    target_len: int,
    out: str | Path,
) -> Path:
    """Write ``model`` with ``method`` (resolved for ``target_len``) to the folder ``out``.

    ``tokenizer`` (None: none written) is saved beside the weights. The model must not carry a
    posenc patch. Raises ValueError (nothing written) for a method
    transformers cannot express, or an ``out`` that is a non-empty folder.
    """
    if method.name in EXTENSION_METHODS:
        raise ValueError(
            f"{method.name} changes attention itself and has no transformers config: it cannot be "
            "exported; load the model and call posenc.hf.apply_posenc(model, extension=...)"
        )
    if method.name == "none":  # its max_position_embeddings would read as a trained length
        raise ValueError(
            "none is the model as trained: there is nothing to export (the model's own folder "
            "is it); export a scaling such as yarn"
        )
    if getattr(model, "posenc_patch", None) is not None:
        raise ValueError("export the model as loaded: call remove_posenc(model) first")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{str(out)!r} exists and is not an empty folder; nothing was written")
    config = model.config
    train = trained_length(config)
    resolved = resolve(method, train, target_len, rotated_pairs(config))
    if resolved.identity:  # not a factor of 1 written as if it extended anything
        raise ValueError(
            f"{method.label} for {target_len} tokens is the model as trained (factor 1: it was "
            f"trained at {train}); nothing was written: export for a length above {train}, or "
            "give a factor"
        )
    params = as_transformers(resolved.scaling, config, resolved.layers)
    dynamic = resolved.scaling is not None and resolved.scaling.get("rope_type") == "dynamic"
    if params is not None and dynamic:
        # transformers' dynamic NTK takes max_position_embeddings as its original length
        params = _without_original_length(params)
    new = with_rope_parameters(config, params) if params is not None else copy.deepcopy(config)
    if not dynamic:  # (dynamic stretches itself as the sequence grows: the length stays)
        new.max_position_embeddings = max(int(target_len), int(config.max_position_embeddings))
    for attr in ("quantization_config",):  # a GGUF model is written dequantized, as loaded
        if hasattr(new, attr):
            delattr(new, attr)
    try:
        with folder_written_aside(out) as tmp:  # removed again however the write ends
            _save(model, tokenizer, new, tmp)
            note = _note(method, new, train, resolved)
            (tmp / EXPORT_NOTE).write_text(json.dumps(note, indent=1) + "\n")
    except (OSError, _safetensor_error()) as e:  # a full disk: OSError(ENOSPC) or safetensors'
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise ValueError(
            f"writing the export to {str(out)!r} failed ({why}; is the disk full?); nothing was "
            "written and no partial folder is left"
        ) from None
    return out


def _safetensor_error() -> type[BaseException]:
    """safetensors' own error (what a full disk raises from ``save_file``), or OSError where
    safetensors is missing."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return OSError
    return SafetensorError


def _save(model: Any, tokenizer: Any, config: Any, out: Path) -> None:
    """``model`` with ``config`` (and ``tokenizer``, if any) saved to the folder ``out``; the
    model's own config and quantizer are put back however the save ends."""
    old_config, old_quantizer = model.config, getattr(model, "hf_quantizer", None)
    model.config = config
    if old_quantizer is not None:
        model.hf_quantizer = None
    try:
        model.save_pretrained(out)
    finally:
        model.config = old_config
        if old_quantizer is not None:
            model.hf_quantizer = old_quantizer
    if tokenizer is not None:
        tokenizer.save_pretrained(out)


def _note(method: Method, new: Any, train: int, resolved: Any) -> dict[str, Any]:
    """What ``posenc_export.json`` says of the export."""
    return {
        "method": method.label,
        "rope_parameters": new.rope_parameters,
        "trained_length": train,
        "max_position_embeddings": new.max_position_embeddings,
        "posenc_scaling": resolved.scaling,
    }


def _without_original_length(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` (flat, or keyed by layer type) less ``original_max_position_embeddings``."""
    if is_keyed(params):
        return {t: _without_original_length(p) for t, p in params.items()}
    return {k: v for k, v in params.items() if k != "original_max_position_embeddings"}
