"""Pure tensor functions: the parity points of posenc. Modules are thin layers over these."""

from .resample import resample_1d, resample_2d
from .rotary import (
    ROPE_TYPES,
    ROTARY_LAYOUTS,
    apply_rotary,
    apply_rotary_qk,
    mrope_axis_index,
    mrope_cos_sin,
    normalize_scaling,
    rope_cos_sin,
    rope_inv_freq,
    yarn_mscale,
)
from .sinusoidal import SINUSOIDAL_LAYOUTS, sincos_2d, sinusoidal_inv_freq, sinusoidal_table

__all__ = [
    "ROPE_TYPES",
    "ROTARY_LAYOUTS",
    "SINUSOIDAL_LAYOUTS",
    "apply_rotary",
    "apply_rotary_qk",
    "mrope_axis_index",
    "mrope_cos_sin",
    "normalize_scaling",
    "resample_1d",
    "resample_2d",
    "rope_cos_sin",
    "rope_inv_freq",
    "sincos_2d",
    "sinusoidal_inv_freq",
    "sinusoidal_table",
    "yarn_mscale",
]
