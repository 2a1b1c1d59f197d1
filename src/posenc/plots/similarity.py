"""How similar is position ``p`` to position ``p + k``? Sinusoidal tables and RoPE's decay bound.

Left panel: the dot product ``PE(p) · PE(p+k)`` of sinusoidal encodings against the offset ``k``.
For the paper's table it equals ``sum_i cos(k w_i)``: it does not depend on ``p`` (a relative
quantity built from absolute encodings), it is symmetric in ``k``, and it falls, with ripples, as
``|k|`` grows. The cosine is that divided by ``|PE|^2 = dim / 2``.

Right panel: RoPE's long-term decay (RoFormer, Su et al. 2021, section 3.4.3). Writing the rotated
score as a sum over the ``d/2`` rotation planes and summing by parts (Abel), its size is bounded
by ``max_i |h_{i+1} - h_i| * sum_{j=1}^{d/2} |S_j|`` with the partial sums
``S_j = sum_{k=0}^{j-1} exp(i r theta_k)`` at relative distance ``r``. The content-free factor
``(1 / (d/2)) * sum_{j=1}^{d/2} |S_j|`` (the "relative upper bound" of the paper's figure 2) is
what decays with ``r`` for ``theta_k = base^(-2k/d)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._checks import check_positive_int
from .._sizes import FIGURE_BYTES, check_fits
from ..functional.sinusoidal import sinusoidal_table
from .common import add_caption, label_axes, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_BASES = (100.0, 10000.0, 500000.0)

CAPTION = (
    "Look at: similarity depends only on the offset and falls (with ripples) as it grows; "
    "a larger base makes RoPE's bound decay more slowly."
)


#: Bytes per (offset, dimension) while a curve is computed: RoPE's complex128 phases and their
#: partial sums (16 bytes each, half the dimensions), the sinusoidal float64 table with its
#: angles (measured: 1.3 GB for --dim 2000 x --max-offset 20000, 32 bytes per entry).
CURVE_ENTRY_BYTES = 32


def check_curve_size(encoding: str, dim: int, max_offset: int) -> None:
    """ValueError (one line) when the ``(max_offset + 1) x dim`` arrays of a similarity curve
    will not fit in memory."""
    need = (max_offset + 1) * dim * CURVE_ENTRY_BYTES + FIGURE_BYTES
    what = f"the {encoding} curve of --dim {dim} x --max-offset {max_offset}"
    check_fits(need, what, "--dim or --max-offset")


def sinusoidal_similarity_data(
    dim: int = 128,
    max_offset: int = 256,
    start: int = 100,
    bases: Sequence[float] = DEFAULT_BASES,
    layout: str = "interleaved",
) -> dict[str, Any]:
    """Dot product and cosine of the sinusoidal encodings at ``start`` and ``start + k``.

    Computed from the tables themselves (float64), not from the closed form.

    Returns ``offsets [K]`` (``K = max_offset + 1``, ``k = 0..max_offset``), ``bases [B]``,
    ``dot [B, K]``, ``cosine [B, K]``, and the scalars ``dim``, ``start``.
    """
    check_positive_int("dim", dim)
    check_positive_int("max_offset", max_offset)
    check_curve_size("sinusoidal", dim, max_offset)
    if start < 0:
        raise ValueError(f"start must be a non-negative position, got {start}")
    positions = torch.arange(start, start + max_offset + 1)  # [K]
    dots, cosines = [], []
    for base in bases:
        table = sinusoidal_table(positions, dim, base, layout, dtype=torch.float64)  # [K, dim]
        anchor = table[0]  # [dim], position `start`
        dot = table @ anchor  # [K]
        cos = dot / (table.norm(dim=-1) * anchor.norm())  # [K]
        dots.append(dot.numpy())
        cosines.append(cos.numpy())
    return {
        "offsets": np.arange(max_offset + 1),
        "bases": np.asarray(bases, dtype=np.float64),
        "dot": np.stack(dots),
        "cosine": np.stack(cosines),
        "dim": dim,
        "start": start,
    }


def rope_inverse_frequencies(head_dim: int, base: float) -> np.ndarray:
    """RoPE's ``d/2`` angular frequencies ``theta_k`` as float64, from :mod:`posenc.functional.rotary`."""
    from ..functional.rotary import rope_inv_freq

    inv_freq, _ = rope_inv_freq(head_dim, base, dtype=torch.float64)
    return inv_freq.cpu().numpy()


def rope_decay_data(
    head_dim: int = 128,
    max_distance: int = 256,
    bases: Sequence[float] = DEFAULT_BASES,
) -> dict[str, Any]:
    """RoFormer's relative upper bound ``(1/(d/2)) sum_{j=1}^{d/2} |S_j|`` against distance.

    ``S_j = sum_{k=0}^{j-1} exp(i r theta_k)`` with RoPE's frequencies ``theta_k`` for each base.

    Returns ``distances [R]`` (``r = 0..max_distance``), ``bases [B]``, ``bound [B, R]``, and
    ``head_dim``. At ``r = 0`` every term is 1, so the bound is ``(d/2 + 1) / 2``.
    """
    check_positive_int("head_dim", head_dim)
    check_positive_int("max_distance", max_distance)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    check_curve_size("rope", head_dim, max_distance)
    distances = np.arange(max_distance + 1, dtype=np.float64)  # [R]
    bounds = []
    for base in bases:
        theta = rope_inverse_frequencies(head_dim, base)  # [d/2]
        phases = np.exp(1j * distances[:, None] * theta[None, :])  # [R, d/2]
        partial = np.cumsum(phases, axis=-1)  # [R, d/2]: column j-1 holds S_j
        bounds.append(np.abs(partial).mean(axis=-1))  # [R]
    return {
        "distances": distances.astype(np.int64),
        "bases": np.asarray(bases, dtype=np.float64),
        "bound": np.stack(bounds),
        "head_dim": head_dim,
    }


def similarity_data(
    dim: int = 128,
    max_offset: int = 256,
    bases: Sequence[float] = DEFAULT_BASES,
    start: int = 100,
) -> dict[str, Any]:
    """Both panels' data: ``{"sinusoidal": ..., "rope": ...}`` (the same ``dim`` and range)."""
    return {
        "sinusoidal": sinusoidal_similarity_data(dim, max_offset, start, bases),
        "rope": rope_decay_data(dim, max_offset, bases),
    }


def _base_label(base: float) -> str:
    return f"base {base:,.0f}" if float(base).is_integer() else f"base {base:g}"


def draw_similarity(data: dict[str, Any]) -> Figure:
    """Two panels: sinusoidal dot product vs offset; RoPE decay bound vs distance."""
    fig, (ax1, ax2) = new_figure(1, 2, width=11, height=4.4)
    sin = data["sinusoidal"]
    for base, dot in zip(sin["bases"], sin["dot"], strict=True):
        ax1.plot(sin["offsets"], dot, lw=1.2, label=_base_label(base))
    ax1.axhline(0, color="0.6", lw=0.6)
    label_axes(
        ax1,
        f"Sinusoidal: PE(p)·PE(p+k), d={sin['dim']}, p={sin['start']}",
        "offset k",
        "dot product",
    )
    half = sin["dim"] / 2  # |PE|^2 = dim/2 for every position, so cosine = dot / (dim/2)
    sec = ax1.secondary_yaxis("right", functions=(lambda y: y / half, lambda c: c * half))
    sec.set_ylabel("cosine")
    ax1.legend(fontsize=8)

    rope = data["rope"]
    for base, bound in zip(rope["bases"], rope["bound"], strict=True):
        ax2.plot(rope["distances"], bound, lw=1.2, label=_base_label(base))
    label_axes(
        ax2,
        f"RoPE long-term decay (RoFormer §3.4.3), d={rope['head_dim']}",
        "relative distance r",
        "relative upper bound (1/(d/2)) Σ_j |S_j|",
    )
    ax2.legend(fontsize=8)
    add_caption(fig, CAPTION)
    return fig
