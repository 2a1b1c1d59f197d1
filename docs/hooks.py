"""MkDocs hook: draw the guides' figures at build time with posenc itself.

Nothing generated is committed: each build adds ``img/<name>.png`` to the site from
:func:`posenc.plots.make_figure`, so the pictures always show the code being documented and the
repository stays small. The guides link them as ``img/<name>.png``; MkDocs checks those links.
"""

from __future__ import annotations

import os
from typing import Any

# Training steps of the tiny models behind the attention figures (a few seconds each). The
# docs-build test lowers it through the environment: it checks that the site builds, while
# tests/test_plots.py checks the figures themselves.
STEPS = int(os.environ.get("POSENC_DOCS_TRAIN_STEPS", "120"))

# name -> (figure kind, options), sized down from the CLI defaults to keep the build quick.
DOC_FIGURES: dict[str, tuple[str, dict[str, Any]]] = {
    "table": ("table", {}),
    "similarity": ("similarity", {}),
    "wavelengths": ("wavelengths", {}),
    "bias": ("bias", {}),
    "attention-rope": ("attention", {"encoding": "rope", "train_len": 24, "steps": STEPS}),
    "attention-shaw": ("attention", {"encoding": "shaw", "train_len": 24, "steps": STEPS}),
}
DOC_DPI = 80

_cache: dict[str, bytes] = {}  # `mkdocs serve` rebuilds often; the figures do not change


def _png(name: str) -> bytes:
    if name not in _cache:
        import torch

        from posenc.plots import make_figure
        from posenc.plots.common import figure_png_bytes

        kind, options = DOC_FIGURES[name]
        torch.manual_seed(0)
        _cache[name] = figure_png_bytes(make_figure(kind, **options), dpi=DOC_DPI)
    return _cache[name]


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name in DOC_FIGURES:
        files.append(File.generated(config, f"img/{name}.png", content=_png(name)))
    return files
