"""Interop with Hugging Face transformers: configs read exactly, and posenc inside the model.

* :mod:`.config`: :func:`rope_from_hf`, :func:`hf_rope_kwargs`,
  :func:`attention_temperature_from_hf` (a config object or ``config.json`` dict to posenc's
  rotary module, exact to the architecture named by ``model_type``).
* :mod:`.plan`: :func:`position_plan` (what each decoder layer does with positions: rotation or
  NoPE, span, query temperature); :mod:`.inspect` prints it (``posenc inspect``).
* :mod:`.patch`: :func:`apply_posenc` / :func:`remove_posenc` (posenc's fused rotation inside a
  loaded transformers model, per instance, exact to the stock model).
* :mod:`.rotary`: transformers-shaped pieces: :class:`HFRotaryEmbedding`
  (``forward(x, position_ids) -> (cos, sin)``), :func:`apply_rotary_pos_emb` and
  :func:`apply_rotary_emb` (fused, on transformers' cos/sin).
* :mod:`.labels`: rope sets named by label (DeepSeek-V4's ``main``/``compress``, the DSA
  indexers' ``indexer``); :mod:`.fope`: :func:`fope_from_hf` (Intern-S1-Pro's FoPE).
* :mod:`.load`: :func:`resolve_config` (a dict, config object, ``config.json`` path, model folder
  or cached model id; never the network).
"""

from .config import (
    FALLBACK_DEFAULTS,
    HF_ROPE_TYPES,
    INTERLEAVED_MODEL_TYPES,
    INTERLEAVED_MROPE_MODEL_TYPES,
    LLAMA4_MODEL_TYPES,
    LLAMA4_SCALING_MODEL_TYPES,
    MROPE_MODEL_TYPES,
    ROPE_INTERLEAVE_MODEL_TYPES,
    ROTARY_DIM_MODEL_TYPES,
    UNSUPPORTED_MODEL_TYPES,
    hf_rope_kwargs,
    rope_from_hf,
)
from .extension import EXTENSION_METHODS, extension_from_config, normalize_extension
from .fope import fope_from_hf
from .labels import LABELLED_ROPES, LAYER_TYPE_LABELS
from .load import resolve_config
from .patch import (
    PosencPatch,
    apply_posenc,
    extension_model_types,
    remove_posenc,
    supported_model_types,
)
from .plan import LayerPositions, PositionPlan, position_plan
from .rotary import HFRotaryEmbedding, apply_rotary_emb, apply_rotary_pos_emb
from .temperature import attention_temperature_from_hf

__all__ = [
    "EXTENSION_METHODS",
    "FALLBACK_DEFAULTS",
    "HF_ROPE_TYPES",
    "INTERLEAVED_MODEL_TYPES",
    "INTERLEAVED_MROPE_MODEL_TYPES",
    "LABELLED_ROPES",
    "LAYER_TYPE_LABELS",
    "LLAMA4_MODEL_TYPES",
    "LLAMA4_SCALING_MODEL_TYPES",
    "MROPE_MODEL_TYPES",
    "ROPE_INTERLEAVE_MODEL_TYPES",
    "ROTARY_DIM_MODEL_TYPES",
    "UNSUPPORTED_MODEL_TYPES",
    "HFRotaryEmbedding",
    "LayerPositions",
    "PosencPatch",
    "PositionPlan",
    "apply_posenc",
    "apply_rotary_emb",
    "apply_rotary_pos_emb",
    "attention_temperature_from_hf",
    "extension_from_config",
    "extension_model_types",
    "fope_from_hf",
    "hf_rope_kwargs",
    "normalize_extension",
    "position_plan",
    "remove_posenc",
    "resolve_config",
    "rope_from_hf",
    "supported_model_types",
]
