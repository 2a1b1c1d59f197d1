"""The encoding matrix itself: positions down, dimensions across.

Sinusoidal (interleaved, the paper's layout): columns alternate ``sin(p w_i)``, ``cos(p w_i)``
with ``w_i = base^(-2i/d)``; the left columns turn fast, the right ones barely move over a few
hundred positions. RoPE's cos table (half-split NeoX/LLaMA layout): ``cos(p theta_i)`` for
``i < d/2``, repeated for the second half.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._checks import check_choice, check_positive_int
from .._sizes import FIGURE_BYTES, check_fits
from ..functional.sinusoidal import sinusoidal_table
from .common import add_caption, label_axes, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TABLE_ENCODINGS = ("sinusoidal", "rope")

#: Bytes per table entry while a table is built and drawn: the float64 table, its angles and
#: numpy copy, and matplotlib's masked, normalized and resampled copies (measured: 2000 x 2000
#: tables drawn and saved take 80-90 bytes per entry, a fixed ~100 MB of it the renderer's).
TABLE_ENTRY_BYTES = 64


def check_table_size(encoding: str, num_positions: int, dim: int) -> None:
    """ValueError (one line) when a ``num_positions x dim`` table will not fit in memory."""
    need = num_positions * dim * TABLE_ENTRY_BYTES + FIGURE_BYTES
    what = f"the {encoding} table of --positions {num_positions} x --dim {dim}"
    check_fits(need, what, "--dim or --positions")


CAPTION = (
    "Look at: each column is a wave whose period grows along the dimension index; "
    "low dimensions tell nearby positions apart, high ones far-apart positions."
)


def rope_cos_table(positions: torch.Tensor, head_dim: int, base: float) -> torch.Tensor:
    """RoPE's cos table in the half-split layout. Shapes: ``positions [n]`` -> ``[n, d]``.

    :func:`posenc.functional.rotary.rope_cos_sin` gives ``cos(p theta_i)`` for the ``d/2`` pairs
    (float32); the half layout pairs channel ``i`` with ``i + d/2``, so both halves see it.
    """
    from ..functional.rotary import rope_cos_sin, rope_inv_freq

    inv_freq, _ = rope_inv_freq(head_dim, base, dtype=torch.float64)  # [d/2]
    cos, _sin = rope_cos_sin(positions, inv_freq)  # [n, d/2]
    return torch.cat((cos, cos), dim=-1).double()  # [n, d]: [c0 .. c_{d/2-1} | c0 .. c_{d/2-1}]


def table_data(
    encoding: str = "sinusoidal",
    num_positions: int = 128,
    dim: int = 64,
    base: float = 10000.0,
) -> dict[str, Any]:
    """The encoding matrix of ``encoding`` for positions ``0..num_positions-1``.

    Returns ``positions [n]``, ``table [n, dim]`` (float64), and ``encoding``, ``dim``, ``base``.
    """
    check_choice("encoding", encoding, TABLE_ENCODINGS)
    check_positive_int("num_positions", num_positions)
    check_positive_int("dim", dim)
    if dim % 2:
        raise ValueError(f"dim must be even for a {encoding} table, got {dim}")
    check_table_size(encoding, num_positions, dim)
    positions = torch.arange(num_positions)
    if encoding == "sinusoidal":
        table = sinusoidal_table(positions, dim, base, "interleaved", dtype=torch.float64)
    else:
        table = rope_cos_table(positions, dim, base)
    return {
        "encoding": encoding,
        "positions": positions.numpy(),
        "table": table.numpy(),
        "dim": dim,
        "base": float(base),
    }


_TITLES = {
    "sinusoidal": "Sinusoidal table PE[p, j] (interleaved sin/cos)",
    "rope": "RoPE cos table cos(p·θ_i) (half-split layout)",
}


def draw_table(tables: Sequence[dict[str, Any]]) -> Figure:
    """One heatmap per table from :func:`table_data`, side by side, sharing one colour bar."""
    if not tables:
        raise ValueError("draw_table needs at least one table")
    fig, axes = new_figure(1, len(tables), width=5.2 * len(tables) + 1.2, height=4.6)
    axes = np.atleast_1d(axes)
    image = None
    for ax, data in zip(axes, tables, strict=True):
        n, d = data["table"].shape
        image = ax.imshow(
            data["table"],
            aspect="auto",
            cmap="RdBu_r",
            vmin=-1,
            vmax=1,
            interpolation="nearest",
            origin="upper",
            extent=(-0.5, d - 0.5, n - 0.5, -0.5),
        )
        label_axes(
            ax,
            f"{_TITLES[data['encoding']]}\nd={d}, base={data['base']:g}",
            "dimension j",
            "position p",
        )
    assert image is not None
    fig.colorbar(image, ax=list(axes), label="value", shrink=0.9)
    add_caption(fig, CAPTION)
    return fig
