"""Content-free logit biases ``B[h, i, j]`` added to attention scores (ALiBi, T5, KERPLE, FIRE,
Sandwich). Each has a materialized form for SDPA and a FlexAttention ``score_mod``."""

from .alibi import ALiBi
from .common import PositionBias
from .fire import FIRE
from .kerple import KERPLE, KERPLE_VARIANTS
from .sandwich import Sandwich
from .t5 import T5RelativeBias

__all__ = [
    "FIRE",
    "KERPLE",
    "KERPLE_VARIANTS",
    "ALiBi",
    "PositionBias",
    "Sandwich",
    "T5RelativeBias",
]
