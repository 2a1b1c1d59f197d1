"""Absolute encodings: added to token embeddings, ``x + P[pos]``."""

from . import entries  # noqa: F401  (registers the family's encodings in posenc.registry)
from .learned import Learned2D, LearnedEncoding
from .none import NoPE
from .sinusoidal import SinusoidalEncoding

__all__ = ["Learned2D", "LearnedEncoding", "NoPE", "SinusoidalEncoding"]
