"""Model types outside :data:`~posenc.hf.supported.SUPPORTED` that :func:`~posenc.hf.apply_posenc`
takes all the same: those whose modeling module's ``apply_rotary_pos_emb`` rotates as one of
:data:`~posenc.hf.supported.DETECTABLE` (Llama's half-split pairs, with or without channels
passed through; GLM's and Cohere's interleaved pairs). Most of this year's decoders copy Llama's
attention (``# Copied from`` / modular files), so one probe finds them instead of a hand list.

The probe is the one every entry passes at patch time
(:func:`~posenc.hf.patch.check_rotation`); that the whole model then gives the stock logits,
and transformers' logits under each scaling, is what :mod:`posenc.testing.coverage` sweeps.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from .architectures import NO_ROPE_MODEL_TYPES
from .shadow import plain_function
from .supported import OPTIONAL_K_DETECTABLE, SINGLE_DETECTABLE, Rotation

_DETECTED: dict[str, tuple[tuple[str, dict[str, Rotation]] | None, str]] = {}


def detected_entry(
    model_type: str, check: Callable[[Any, Rotation, str], None]
) -> tuple[tuple[str, dict[str, Rotation]] | None, str]:
    """``(entry, "")`` for a model type outside :data:`SUPPORTED` whose modeling module's
    ``apply_rotary_pos_emb(q, k, cos, sin, ...)`` rotates as one of
    :data:`~posenc.hf.supported.DETECTABLE` (checked on random probes, as every entry is at
    patch time: ``check``, :func:`~posenc.hf.patch.check_rotation`), else ``(None, why)``. The entry is ``(module name, {name: rotation})`` as in
    :data:`SUPPORTED`; the model-level parity of every such type is
    :mod:`posenc.testing.coverage`'s sweep."""
    if model_type in _DETECTED:
        return _DETECTED[model_type]
    from .supported import DETECTABLE, NOT_DETECTED, modeling_module_name

    found: tuple[tuple[str, dict[str, Rotation]] | None, str]
    name = modeling_module_name(model_type)
    if model_type in NOT_DETECTED:
        found = None, NOT_DETECTED[model_type]
    elif model_type in NO_ROPE_MODEL_TYPES:  # by name: its module may rotate a vision encoder
        found = None, f"it has no RoPE: {NO_ROPE_MODEL_TYPES[model_type]}"
    elif name is None:
        found = None, "transformers has no such model type"
    else:
        found = _detect(name, DETECTABLE, check)
    _DETECTED[model_type] = found
    return found


def _detect(
    name: str, candidates: tuple[Rotation, ...], check: Callable[[Any, Rotation, str], None]
) -> tuple[tuple[str, dict[str, Rotation]] | None, str]:
    try:
        modeling = importlib.import_module(name)
    except ImportError as e:
        return None, f"its modeling module does not import ({e})"
    stock = plain_function(getattr(modeling, "apply_rotary_pos_emb", None))
    if not callable(stock):
        return None, "its modeling module has no apply_rotary_pos_emb for posenc to replace"
    signature = inspect.signature(stock)
    params = list(signature.parameters)
    if len(params) >= 4 and signature.parameters[params[1]].default is None:
        # ``f(q, k=None, cos=None, sin=None)``: Qwen4-exp's indexer rotates its queries alone
        # through the same name; the stand-in takes both forms (each probed by ``check``)
        candidates = OPTIONAL_K_DETECTABLE
    elif len(params) >= 2 and params[1:3] == ["cos", "sin"]:
        # one tensor at a time, ``f(x, cos, sin, unsqueeze_dim=1)``: Gemma-3n's and Gemma-4's
        # attention rotates its queries and keys by separate calls
        candidates = SINGLE_DETECTABLE
    elif len(params) < 4:
        return None, (
            f"its apply_rotary_pos_emb takes {params}, not (q, k, cos, sin, ...) or (x, cos, sin)"
        )
    for rotation in candidates:
        try:
            check(stock, rotation, f"{name}.apply_rotary_pos_emb")
        except Exception:  # a probe the stock function cannot take: not this rotation
            continue
        return (name.split(".")[-2], {"apply_rotary_pos_emb": rotation}), ""
    return None, "its apply_rotary_pos_emb rotates as none of posenc's rotations"
