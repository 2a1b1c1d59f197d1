"""Content-free logit biases ``B[h, i, j]`` added to attention scores (ALiBi, T5, KERPLE, FIRE,
Sandwich). Each states its bias once, as an elementwise ``term(q_pos, k_pos, head)``
(:class:`PositionBias`); the materialized form for SDPA and the FlexAttention ``score_mod``
come from it. Each module registers its encoding in :mod:`posenc.registry` beside its class:
a new bias is one file (a :class:`PositionBias` subclass and its ``register`` call)."""

# isort: off
# Imported in registration order: that of registry.names("bias") (the lab's default grid and
# tables, the bias plot's rows, the bias bench's cases).
from .alibi import ALiBi
from .t5 import T5RelativeBias
from .kerple import KERPLE, KERPLE_VARIANTS
from .fire import FIRE
from .sandwich import Sandwich

# isort: on
from .common import PositionBias, Term, term_grid, term_score_mod

__all__ = [
    "FIRE",
    "KERPLE",
    "KERPLE_VARIANTS",
    "ALiBi",
    "PositionBias",
    "Sandwich",
    "T5RelativeBias",
    "Term",
    "term_grid",
    "term_score_mod",
]
