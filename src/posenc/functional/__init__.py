"""Pure tensor functions: the parity points of posenc. Modules are thin layers over these."""

from .attention import explicit_attention, masked_softmax, repeat_kv
from .bias import (
    alibi_slopes,
    deberta_log_bucket,
    fire_normalized_distance,
    kerple_log_bias,
    kerple_power_bias,
    relative_position_matrix,
    sandwich_distance_table,
    sandwich_embedding,
    sandwich_inv_freq,
    t5_relative_bucket,
)
from .length import pose_positions, pose_positions_from, randomized_positions
from .relative import clipped_relative_index, rel_shift
from .resample import resample_1d, resample_2d
from .rope_scaling import ROPE_SCALING, extension_scaling
from .rotary import (
    MROPE_ALLOCATIONS,
    ROPE_TYPES,
    ROTARY_LAYOUTS,
    angles_cos_sin,
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
    "MROPE_ALLOCATIONS",
    "ROPE_SCALING",
    "ROPE_TYPES",
    "ROTARY_LAYOUTS",
    "SINUSOIDAL_LAYOUTS",
    "alibi_slopes",
    "angles_cos_sin",
    "apply_rotary",
    "apply_rotary_qk",
    "clipped_relative_index",
    "deberta_log_bucket",
    "explicit_attention",
    "extension_scaling",
    "fire_normalized_distance",
    "kerple_log_bias",
    "kerple_power_bias",
    "masked_softmax",
    "mrope_axis_index",
    "mrope_cos_sin",
    "normalize_scaling",
    "pose_positions",
    "pose_positions_from",
    "randomized_positions",
    "rel_shift",
    "relative_position_matrix",
    "repeat_kv",
    "resample_1d",
    "resample_2d",
    "rope_cos_sin",
    "rope_inv_freq",
    "sandwich_distance_table",
    "sandwich_embedding",
    "sandwich_inv_freq",
    "sincos_2d",
    "sinusoidal_inv_freq",
    "sinusoidal_table",
    "t5_relative_bucket",
    "yarn_mscale",
]
