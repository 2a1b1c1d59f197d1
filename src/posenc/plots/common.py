"""Shared figure helpers: headless backend, captions, saving, file-type checks.

matplotlib is an optional dependency (the ``plots`` extra), so it is imported inside the functions
that need it: importing :mod:`posenc.plots` and computing figure data works without it.
"""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGURE_SUFFIXES = (".png", ".svg")
#: How to install what the figures need (pyproject's ``plots`` extra).
PLOTS_INSTALL = "pip install -e '.[plots]' in the posenc clone"
CAPTION_GID = "posenc-caption"  # the caption's id in the figure (and in an SVG file)
DEFAULT_DPI = 110


def require_matplotlib() -> Any:
    """Import matplotlib on the Agg (file-only) backend, or say how to install it."""
    try:
        import matplotlib
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"posenc plots need matplotlib: {PLOTS_INSTALL} (or matplotlib>=3.7)"
        ) from e
    # Agg draws into memory only: no display needed, and no GUI window ever opens.
    matplotlib.use("Agg", force=True)
    return matplotlib


def plots_ready(what: str) -> bool:
    """Whether matplotlib imports; if not, say on one line (stderr) that ``what`` is not drawn
    and which extra to install. For a command that writes figures beside its tables (``posenc
    lab``, ``posenc lab report``): the tables are still written, and the missing figure is
    said, not silent."""
    try:
        require_matplotlib()
    except ImportError as e:
        print(f"note: {what} not drawn: {e}", file=sys.stderr)
        return False
    return True


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float = 9.0, height: float = 4.2, **kw: Any
) -> tuple[Figure, Any]:
    """A ``Figure`` and its axes (``subplots`` semantics), built without pyplot's global state.

    Returns ``(fig, axes)``; ``axes`` is a single ``Axes`` for 1x1, else an array.
    """
    fig = blank_figure(width, height)
    axes = fig.subplots(nrows, ncols, squeeze=True, **kw)
    return fig, axes


def blank_figure(width: float, height: float) -> Figure:
    """A ``Figure`` without axes (constrained layout), for a layout of subfigures or a grid."""
    require_matplotlib()
    from matplotlib.figure import Figure

    # A bare Figure (not pyplot.figure) is garbage-collected like any object: plotting in a loop
    # or a long-lived process leaks nothing, and no backend is ever selected behind our back.
    return Figure(figsize=(width, height), layout="constrained")


def add_caption(fig: Figure, text: str) -> None:
    """Put the one-line "what to look at" caption under the figure (id ``posenc-caption``).

    It is the figure's ``supxlabel``, so the constrained layout makes room for it (a free
    ``fig.text`` would overlap the axes when the caption wraps); wrapped to the figure's width.
    """
    width = max(40, int(fig.get_figwidth() * 15))  # ~15 characters per inch at 9 pt italic
    label = fig.supxlabel(textwrap.fill(text, width), fontsize=9, style="italic")
    label.set_gid(CAPTION_GID)


def caption(fig: Figure) -> str:
    """The caption set by :func:`add_caption` (unwrapped), or ``""``."""
    for t in fig.texts:
        if t.get_gid() == CAPTION_GID:
            return " ".join(str(t.get_text()).split())
    return ""


def take_caption(fig: Figure) -> str:
    """Remove the caption from ``fig``'s drawing and return its text (unwrapped): for a page that
    prints the caption under the image itself (``posenc report``), so it is read once."""
    text = caption(fig)
    for t in fig.texts:
        if t.get_gid() == CAPTION_GID:
            t.set_visible(False)
            t.set_in_layout(False)  # the constrained layout gives its room back to the axes
    return text


def check_figure_path(path: str | Path) -> Path:
    """Return ``path`` as a Path if its suffix is an allowed figure type (.png or .svg)."""
    p = Path(path)
    if p.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(
            f"figure file must end in {' or '.join(FIGURE_SUFFIXES)}, got {str(path)!r}"
        )
    return p


def save_figure(fig: Figure, path: str | Path, dpi: int = DEFAULT_DPI) -> Path:
    """Write ``fig`` as PNG or SVG (chosen by the suffix), creating parent folders.

    SVG keeps text as text (``svg.fonttype='none'``) so the file stays small and searchable.
    """
    p = check_figure_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    require_matplotlib()
    import matplotlib

    fmt = p.suffix.lower().lstrip(".")
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "posenc"}):
        fig.savefig(p, format=fmt, dpi=dpi, metadata=_metadata(fmt))
    return p


def figure_png_bytes(fig: Figure, dpi: int = DEFAULT_DPI) -> bytes:
    """The figure as PNG bytes (for embedding in HTML)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata=_metadata("png"))
    return buf.getvalue()


def _metadata(fmt: str) -> dict[str, Any]:
    # No creation date or software version in the files: the same data gives the same bytes,
    # so regenerated figures do not show up as changes.
    if fmt == "svg":
        return {"Date": None, "Creator": None}
    return {"Software": None}


def label_axes(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
