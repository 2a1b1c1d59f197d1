"""A Hugging Face config's M-RoPE as posenc reads it: the sections (pairs per temporal,
height and width axis) and how they are laid over the rotated pairs (Qwen2-VL's contiguous
sections, Qwen3-VL's interleaved ones, ERNIE-4.5-VL's alternating H/W), by model type
(:mod:`posenc.hf.architectures`) where the config does not say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .architectures import (
    INTERLEAVED_MROPE_MODEL_TYPES,
    MROPE_ALLOCATION_MODEL_TYPES,
    MROPE_MODEL_TYPES,
    MROPE_REFUSALS,
)


def mrope_kwargs(params: Mapping[str, Any], model_types: frozenset[str]) -> dict[str, Any]:
    """``{"mrope_section", "mrope_interleaved"}`` of a layer's rope ``params`` (``{}``: no
    M-RoPE): the sections given, or the model type's default; their allocation by model type
    (:data:`~posenc.hf.architectures.MROPE_ALLOCATION_MODEL_TYPES`, Qwen3-VL's interleaved
    ones) or the config's flag; a layout posenc does not reproduce refused by name."""
    known = model_types & MROPE_MODEL_TYPES.keys()
    section = params.get("mrope_section")
    refused = model_types & MROPE_REFUSALS.keys()
    if refused:
        section = section if section is not None else params.get("xdrope_section")
        if section is not None:
            listed = list(section) if isinstance(section, (list, tuple)) else section
            n = len(listed) if isinstance(listed, list) else "?"
            reason = MROPE_REFUSALS[min(refused)].format(n=n, section=listed)
            raise ValueError(f"model_type {sorted(model_types)}: {reason}")
    if section is None and known:
        section = next((MROPE_MODEL_TYPES[t] for t in sorted(known) if MROPE_MODEL_TYPES[t]), None)
    if section is None:
        return {}
    if model_types and not known:
        raise ValueError(
            f"model_type {sorted(model_types)} has mrope_section but posenc reproduces the "
            f"M-RoPE of {sorted(MROPE_MODEL_TYPES)} only (other models lay sections out "
            "differently)"
        )
    allocation = model_types & MROPE_ALLOCATION_MODEL_TYPES.keys()
    interleaved: bool | str
    if allocation:
        interleaved = MROPE_ALLOCATION_MODEL_TYPES[min(allocation)]
    elif model_types & INTERLEAVED_MROPE_MODEL_TYPES:
        interleaved = True
    elif known:
        interleaved = False  # Qwen2-VL and Qwen2.5-VL ignore mrope_interleaved
    else:
        interleaved = bool(params.get("mrope_interleaved", False))
    return {"mrope_section": list(section), "mrope_interleaved": interleaved}


def temporal_rest(kw: dict[str, Any]) -> None:
    """Interleaved sections over fewer pairs than are rotated (Qwen4-exp's default ``[11, 11,
    10]`` of 128 pairs): Qwen3-VL's recomposition, which these models share, leaves every pair
    past the height and width sections temporal, so the temporal section takes the rest."""
    section, pairs = kw.get("mrope_section"), (kw.get("rotary_dim") or 0) // 2
    if section is not None and kw.get("mrope_interleaved") is True and 0 < sum(section) < pairs:
        kw["mrope_section"] = [section[0] + pairs - sum(section), *section[1:]]
