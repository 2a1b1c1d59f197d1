"""Per-head bias maps ``B[h, i, j]`` of the content-free bias family.

Every registered bias encoding (``registry.names("bias")``, or those asked for) is built through
the registry exactly as a model would build it (learned ones at
their initialization, from a fixed seed) and asked for ``bias(positions, positions)``. Rows are
encodings, columns heads; the causal mask's future keys are grey.

* ALiBi: ``-m_h (i - j)``, a straight ramp whose slope halves head by head.
* T5: a learned value per log-spaced distance bucket: bands that widen with distance.
* KERPLE: ``-r1 log(1 + r2 |i - j|)``, a learned logarithmic decay.
* FIRE: an MLP of the normalized distance ``psi(i - j) / psi(i)``: it depends on the query's
  position too, so it stretches with the sequence instead of running past a trained range.
* Sandwich: the sinusoidal dot product ``sum_k cos((i - j) w_k) - d'/2``, divided per head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .. import registry
from .._checks import check_positive_int
from .._sizes import FIGURE_BYTES, check_fits
from .common import add_caption, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: How each kind's penalty grows with the distance ``i - j`` (the caption names the kinds drawn);
#: a registered bias without a sentence here is named as it is.
GROWTH = {
    "alibi": "linear (ALiBi)",
    "t5": "bucketed (T5)",
    "kerple": "logarithmic (KERPLE)",
    "fire": "stretched to the query position (FIRE)",
    "sandwich": "sinusoidal (Sandwich)",
}


def bias_caption(kinds: Sequence[str]) -> str:
    """The caption of a bias figure showing ``kinds``: what to look at in those, and only those.

    A registered bias encoding this module has no sentence for is named as it is.
    """
    ways = [GROWTH.get(k, k) for k in kinds]
    if len(ways) > 1:
        ways = [", ".join(ways[:-1]) + " or " + ways[-1]]
    return f"Look at: how the penalty grows with the distance i-j: {ways[0]}."


def available_bias_kinds(kinds: Sequence[str] | None = None) -> list[str]:
    """Those of ``kinds`` that are registered bias encodings (None: every registered one, in
    registration order)."""
    registered = registry.names("bias")
    return list(registered) if kinds is None else [k for k in kinds if k in registered]


#: Bytes per bias entry of one encoding: its float32 map, the float64 copy kept and the
#: masked one, and matplotlib's copies while it draws (measured: 27-33 bytes per entry for
#: ALiBi's 4 x 1000 x 1000 maps, drawn and saved).
BIAS_ENTRY_BYTES = 40
#: The bias figure has a column per head: past this many the columns are too thin to read.
MAX_BIAS_HEADS = 16


def check_bias_size(kinds: int, num_heads: int, length: int) -> None:
    """ValueError (one line) when ``kinds`` encodings' ``[h, s, s]`` maps will not fit."""
    need = kinds * num_heads * length * length * BIAS_ENTRY_BYTES + FIGURE_BYTES
    what = f"the bias figure of {kinds} encoding(s) x --heads {num_heads} x --length {length}"
    check_fits(need, what, "--length or --heads, or name fewer kinds")


def bias_data(
    kinds: Sequence[str] | None = None,
    num_heads: int = 4,
    length: int = 64,
    causal: bool = True,
    seed: int = 0,
    dim: int = 64,
) -> dict[str, Any]:
    """The bias maps of each encoding in ``kinds`` (None: every registered bias encoding) for
    positions ``0..length-1``.

    Returns ``kinds``, ``bias`` (``{kind: [h, s, s]}`` float64 numpy, ``-inf``-free: masked
    entries are NaN when ``causal``), ``modules`` (``{kind: the module}``, for checks against
    its parameters), and ``num_heads``, ``length``, ``causal``.
    """
    check_positive_int("num_heads", num_heads)
    check_positive_int("length", length)
    check_bias_size(len(kinds) if kinds is not None else len(registry.names("bias")),
                    num_heads, length)  # fmt: skip
    registered = registry.names("bias")
    kinds = registered if kinds is None else list(kinds)
    unknown = [k for k in kinds if k not in registered]
    if unknown:
        raise ValueError(
            f"unknown bias encoding(s) {unknown}; registered bias encodings: "
            f"{', '.join(registered) or 'none'}"
        )
    positions = torch.arange(length)
    i, j = positions[:, None], positions[None, :]
    future = j > i  # [s, s] keys a causal query cannot see
    maps, modules = {}, {}
    for kind in kinds:
        torch.manual_seed(seed)  # learned tables at a reproducible initialization
        module: Any = registry.build(  # a bias module: .bias(q_positions, k_positions)
            kind, dim=dim, num_heads=num_heads, max_len=length, causal=causal
        )
        with torch.no_grad():
            b = module.bias(positions, positions).double()  # [h, s, s]
        if causal:
            b = b.masked_fill(future, float("nan"))
        maps[kind] = b.numpy()
        modules[kind] = module
    return {
        "kinds": list(kinds),
        "bias": maps,
        "modules": modules,
        "num_heads": num_heads,
        "length": length,
        "causal": causal,
    }


#: Display names (others: the registered name).
_NAMES = {
    "alibi": "ALiBi",
    "t5": "T5 buckets",
    "kerple": "KERPLE",
    "fire": "FIRE",
    "sandwich": "Sandwich",
}


def draw_bias(data: dict[str, Any]) -> Figure:
    """A grid of heatmaps: one row per encoding (its own colour bar), one column per head."""
    kinds, h = data["kinds"], data["num_heads"]
    if not kinds:
        raise ValueError("draw_bias needs at least one bias encoding")
    if h > MAX_BIAS_HEADS:
        raise ValueError(
            f"the bias figure draws a column per head: at most {MAX_BIAS_HEADS} heads, got {h}; "
            "lower --heads"
        )
    import matplotlib

    fig, axes = new_figure(len(kinds), h, width=2.4 * h + 1.6, height=2.3 * len(kinds) + 0.9)
    axes = np.asarray(axes).reshape(len(kinds), h)
    # Masked (future) entries are NaN: grey, a colour the map itself never takes.
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.88")
    for row, kind in enumerate(kinds):
        maps = data["bias"][kind]  # [h, s, s]
        finite = maps[np.isfinite(maps)]
        lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if hi - lo < 1e-12:  # a constant map (e.g. a zero-initialized table): still draw it
            lo, hi = lo - 0.5, hi + 0.5
        image = None
        for head in range(h):
            ax = axes[row, head]
            image = ax.imshow(maps[head], cmap=cmap, vmin=lo, vmax=hi, interpolation="nearest")
            ax.set_title(f"{_NAMES.get(kind, kind)}, head {head}", fontsize=9)
            if row == len(kinds) - 1:
                ax.set_xlabel("key position j")
            if head == 0:
                ax.set_ylabel("query position i")
        assert image is not None
        fig.colorbar(image, ax=list(axes[row]), label="bias", shrink=0.9, pad=0.01)
    mask = "causal; future keys grey" if data["causal"] else "bidirectional"
    fig.suptitle(
        f"Bias maps B[h, i, j] at initialization, {data['length']} positions ({mask})",
        fontsize=11,
    )
    add_caption(fig, bias_caption(kinds))
    return fig
