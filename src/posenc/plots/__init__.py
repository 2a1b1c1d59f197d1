"""Figures of positional encodings: pure data functions, and drawing functions on top.

Every figure kind has a data function that returns plain arrays (checked against the papers'
formulas in the tests) and a drawing function that turns them into a matplotlib ``Figure``:

| kind | data | drawing |
|---|---|---|
| table | ``table.table_data`` | ``table.draw_table`` |
| similarity | ``similarity.similarity_data`` | ``similarity.draw_similarity`` |
| wavelengths | ``wavelengths.wavelength_data`` | ``wavelengths.draw_wavelengths`` |
| bias | ``bias.bias_data`` | ``bias.draw_bias`` |
| attention | ``attention.attention_data`` | ``attention.draw_attention`` |
| lab | ``lab.lab_data`` | ``lab.draw_lab`` |

``make_figure(kind, **options)`` builds any of them by name and ``save_figure(fig, path)`` writes
PNG or SVG. matplotlib (the ``plots`` extra) is imported only when a figure is drawn, on the
file-only Agg backend.
"""

from .common import FIGURE_SUFFIXES, caption, save_figure
from .figures import FIGURES, make_figure

__all__ = ["FIGURES", "FIGURE_SUFFIXES", "caption", "make_figure", "save_figure"]
