"""Rotary encodings: queries and keys are rotated by their positions, ``q' = R(pos) q``."""

from . import entries  # noqa: F401  (registers the family's encodings in posenc.registry)
from .axial import Axial2DRoPE, axial_inv_freq, grid_coords
from .base import RotaryEncoding
from .embedding import RotaryEmbedding
from .fope import FoPE, apply_fope, fope_inv_freq
from .mla import DecoupledRoPE, expand_shared_key, mla_softmax_scale
from .mrope import MRoPE, mrope_positions
from .mrope_index import (
    MROPE_POSITION_LAYOUTS,
    MROPE_POSITION_MODEL_TYPES,
    TOKEN_TYPES,
    MRoPEPositionLayout,
    mrope_position_ids,
)
from .temperature import QueryTemperature, llama4_scaling_scale, llama4_temperature_scale
from .trailing import TrailingRotaryEmbedding, rotate_trailing
from .xpos import XPos, xpos_zeta

__all__ = [
    "MROPE_POSITION_LAYOUTS",
    "MROPE_POSITION_MODEL_TYPES",
    "TOKEN_TYPES",
    "Axial2DRoPE",
    "DecoupledRoPE",
    "FoPE",
    "MRoPE",
    "MRoPEPositionLayout",
    "QueryTemperature",
    "RotaryEmbedding",
    "RotaryEncoding",
    "TrailingRotaryEmbedding",
    "XPos",
    "apply_fope",
    "axial_inv_freq",
    "expand_shared_key",
    "fope_inv_freq",
    "grid_coords",
    "llama4_scaling_scale",
    "llama4_temperature_scale",
    "mla_softmax_scale",
    "mrope_position_ids",
    "mrope_positions",
    "rotate_trailing",
    "xpos_zeta",
]
