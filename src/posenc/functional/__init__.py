"""Pure tensor functions: the parity points of posenc. Modules are thin layers over these."""

from .resample import resample_1d, resample_2d
from .sinusoidal import SINUSOIDAL_LAYOUTS, sincos_2d, sinusoidal_inv_freq, sinusoidal_table

__all__ = [
    "SINUSOIDAL_LAYOUTS",
    "resample_1d",
    "resample_2d",
    "sincos_2d",
    "sinusoidal_inv_freq",
    "sinusoidal_table",
]
