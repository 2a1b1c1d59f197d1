"""Absolute encodings: added to token embeddings, ``x + P[pos]``."""

from .learned import Learned2D, LearnedEncoding
from .none import NoPE
from .sinusoidal import SinusoidalEncoding

__all__ = ["Learned2D", "LearnedEncoding", "NoPE", "SinusoidalEncoding"]
