"""Rotary encodings: queries and keys are rotated by their positions, ``q' = R(pos) q``."""

from .axial import Axial2DRoPE, axial_inv_freq, grid_coords
from .embedding import RotaryEmbedding
from .mla import DecoupledRoPE, expand_shared_key, mla_softmax_scale
from .mrope import MRoPE, mrope_positions
from .trailing import rotate_trailing
from .temperature import QueryTemperature, llama4_scaling_scale, llama4_temperature_scale
from .xpos import XPos, xpos_zeta

__all__ = [
    "Axial2DRoPE",
    "DecoupledRoPE",
    "MRoPE",
    "QueryTemperature",
    "RotaryEmbedding",
    "XPos",
    "axial_inv_freq",
    "expand_shared_key",
    "grid_coords",
    "llama4_scaling_scale",
    "llama4_temperature_scale",
    "mla_softmax_scale",
    "mrope_positions",
    "rotate_trailing",
    "xpos_zeta",
]
