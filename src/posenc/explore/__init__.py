"""``posenc explore``: one self-contained, offline HTML page to explore positional encodings
interactively (encoding, ``d_model``, position, RoPE scaling type and factor), every number
precomputed by :mod:`posenc.functional` (:mod:`.data`) and drawn with Plotly (:mod:`.page`, the
``explore`` extra)."""

from .data import explorer_data
from .page import explorer_html, write_explorer

__all__ = ["explorer_data", "explorer_html", "write_explorer"]
