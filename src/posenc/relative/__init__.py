"""Content-dependent relative encodings: the position term depends on the query or key content
(Shaw et al., Transformer-XL, DeBERTa, CoPE), so each computes its own scores (``attend``)."""

from . import entries  # noqa: F401  (registers the family's encodings in posenc.registry)
from .common import RelativeEncoding
from .cope import CoPE
from .deberta import DEBERTA_POS_ATT_TYPES, DeBERTaRelative
from .shaw import ShawRelative
from .transformer_xl import TransformerXLRelative

__all__ = [
    "DEBERTA_POS_ATT_TYPES",
    "CoPE",
    "DeBERTaRelative",
    "RelativeEncoding",
    "ShawRelative",
    "TransformerXLRelative",
]
