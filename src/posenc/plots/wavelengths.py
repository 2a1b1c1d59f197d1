"""RoPE's per-pair wavelengths and what each context-extension method does to them.

Pair ``i`` of RoPE turns by ``theta_i`` radians per position, a full turn every
``2 pi / theta_i`` positions (its wavelength). Pairs whose wavelength is longer than the training
length ``L`` never completed a turn in training: their angles at longer lengths are new to the
model. The scaling methods differ in which pairs they stretch and by how much:

* linear (position interpolation): every wavelength times ``factor``;
* NTK-aware: a larger base, so long wavelengths stretch ~``factor``, short ones barely;
* dynamic NTK: NTK with a factor that grows with the current length ``s``,
  ``factor * s / L - (factor - 1)`` (drawn at ``s = factor x L``, where that is
  ``factor^2 - factor + 1``: 13 for a factor of 4);
* YaRN: short wavelengths kept, long ones times ``factor``, a linear ramp between;
* Llama-3: the same three bands, split by wavelength against ``L / high`` and ``L / low``;
* LongRoPE: a per-pair factor list (searched per model; drawn with an illustrative ramp).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._checks import check_positive_int
from .._sizes import FIGURE_BYTES, check_fits
from ..functional.rope_scaling import extension_scaling
from .common import add_caption, label_axes, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Method names of the figure (``none`` is plain RoPE) and their legend labels.
WAVELENGTH_METHODS: dict[str, str] = {
    "none": "RoPE (no scaling)",
    "linear": "linear / PI",
    "ntk": "NTK-aware",
    "dynamic": "dynamic NTK",
    "yarn": "YaRN",
    "llama3": "Llama-3",
    "longrope": "LongRoPE (illustrative factors)",
}

CAPTION = (
    "Look at: linear stretches every pair by the factor, NTK ramps from 1x up to it, YaRN and "
    "Llama-3 keep short wavelengths and stretch only those near or past the training length."
)


def wavelength_caption(data: dict[str, Any]) -> str:
    """:data:`CAPTION`, and where dynamic NTK is drawn, why it stretches more than NTK."""
    f, dyn = data["factor"], data.get("dynamic_factor")
    if dyn is None:
        return CAPTION
    return (
        f"{CAPTION} Dynamic NTK recomputes NTK's factor from the current length s, as "
        f"f·s/L − (f − 1) (transformers' formula): at the target s = {f:g}L with f = {f:g} "
        f"that is {dyn:.3g}, so it stretches more than NTK's {f:g}x; at s <= L it is plain RoPE."
    )


def _legend(method: str, data: dict[str, Any]) -> str:
    if method == "dynamic" and data.get("dynamic_factor") is not None:
        return f"dynamic NTK (= NTK {data['dynamic_factor']:.3g}x at {data['seq_len']})"
    return WAVELENGTH_METHODS[method]


#: Bytes per pair and method, computed and drawn: the float64 wavelengths and ratios and
#: matplotlib's paths of the two panels' lines (measured: 0.94 GB for --head-dim 2000000 and
#: the seven methods, 134 bytes per point).
WAVELENGTH_POINT_BYTES = 160


def scaling_for(method: str, factor: float, train_len: int, n: int) -> dict[str, Any] | None:
    """The Hugging Face style ``scaling`` dict of ``method`` (None for plain RoPE): the scaling
    table's extension by ``factor`` of a model trained at ``train_len`` (LongRoPE with its
    illustrative per-pair factors, Llama-3 with Llama-3.1's band edges)."""
    if method not in WAVELENGTH_METHODS:
        raise ValueError(
            f"unknown scaling method {method!r}; allowed: {', '.join(WAVELENGTH_METHODS)}"
        )
    return extension_scaling("default" if method == "none" else method, factor, train_len, n)


def wavelength_data(
    head_dim: int = 128,
    base: float = 10000.0,
    train_len: int = 4096,
    factor: float = 4.0,
    methods: Sequence[str] = tuple(WAVELENGTH_METHODS),
) -> dict[str, Any]:
    """Wavelengths ``2 pi / inv_freq`` of each method, from :func:`posenc.functional.rotary.rope_inv_freq`.

    Length-dependent methods (dynamic NTK, LongRoPE) are evaluated at ``seq_len = factor * L``.

    Returns ``pairs [n]`` (``n = head_dim / 2``), ``methods`` (names, ``M`` of them),
    ``wavelength [M, n]`` and ``ratio [M, n]`` (to plain RoPE's), ``attention_factor [M]``,
    ``dynamic_factor`` (the NTK factor dynamic NTK applies at ``seq_len``, None without it),
    ``scalings`` (the dicts passed), and the scalars ``head_dim``, ``base``, ``train_len``,
    ``factor``, ``seq_len``.
    """
    from ..functional.rotary import rope_inv_freq

    check_positive_int("head_dim", head_dim)
    check_positive_int("train_len", train_len)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
    if not factor > 1:
        raise ValueError(f"factor must be > 1 (a context extension), got {factor}")
    n = head_dim // 2
    need = n * len(methods) * WAVELENGTH_POINT_BYTES + FIGURE_BYTES
    check_fits(need, f"the wavelength figure of --head-dim {head_dim}", "--head-dim or --methods")
    seq_len = math.ceil(factor * train_len)
    plain, _ = rope_inv_freq(head_dim, base, dtype=torch.float64)  # [n]
    waves, factors, scalings = [], [], []
    for method in methods:
        sc = scaling_for(method, factor, train_len, n)
        inv_freq, attention_factor = rope_inv_freq(
            head_dim, base, sc, seq_len=seq_len, dtype=torch.float64
        )  # [n]
        waves.append((2 * math.pi / inv_freq).numpy())
        factors.append(attention_factor)
        scalings.append(sc)
    wavelength = np.stack(waves)  # [M, n]
    ratio = wavelength / (2 * math.pi / plain.numpy())[None, :]  # [M, n]
    return {
        "pairs": np.arange(n),
        "methods": list(methods),
        "wavelength": wavelength,
        "ratio": ratio,
        # NTK stretches its longest pair by exactly its factor, so dynamic NTK's longest-pair
        # stretch is the factor it acts with at seq_len (read off the frequencies, not recomputed).
        "dynamic_factor": (
            float(ratio[list(methods).index("dynamic"), -1]) if "dynamic" in methods else None
        ),
        "attention_factor": np.asarray(factors),
        "scalings": scalings,
        "head_dim": head_dim,
        "base": float(base),
        "train_len": train_len,
        "factor": float(factor),
        "seq_len": seq_len,
    }


def draw_wavelengths(data: dict[str, Any]) -> Figure:
    """Left: wavelength per pair (log scale) with the training and target lengths.
    Right: the stretch (wavelength over plain RoPE's) per pair."""
    fig, (ax1, ax2) = new_figure(1, 2, width=12, height=4.8)
    styles = ["-", "--", "-.", ":", "-", "--", "-."]
    for k, (method, wave, ratio) in enumerate(
        zip(data["methods"], data["wavelength"], data["ratio"], strict=True)
    ):
        label = _legend(method, data)
        lw = 2.2 if method == "none" else 1.4
        color = "black" if method == "none" else None
        ax1.plot(data["pairs"], wave, styles[k % len(styles)], lw=lw, color=color, label=label)
        ax2.plot(data["pairs"], ratio, styles[k % len(styles)], lw=lw, color=color, label=label)
    L, F = data["train_len"], data["seq_len"]
    ax1.axhline(L, color="0.35", lw=0.9, ls=":")
    ax1.axhline(F, color="0.35", lw=0.9, ls="--")
    ax1.annotate(
        f"training length L={L}", (0, L), xytext=(2, 3), textcoords="offset points", fontsize=8
    )
    ax1.annotate(
        f"target {data['factor']:g}L={F}",
        (0, F),
        xytext=(2, 3),
        textcoords="offset points",
        fontsize=8,
    )
    ax1.set_yscale("log")
    label_axes(
        ax1,
        f"RoPE wavelength 2π/θ_i per pair, d={data['head_dim']}, base={data['base']:g}",
        "pair index i",
        "wavelength (positions, log scale)",
    )
    ax2.set_yscale("log", base=2)
    ax2.yaxis.set_major_formatter("{x:g}x")
    ax2.legend(fontsize=8, loc="upper left")
    label_axes(
        ax2,
        f"Stretch against plain RoPE, factor {data['factor']:g} (dynamic, LongRoPE at {F})",
        "pair index i",
        "wavelength / plain RoPE wavelength",
    )
    add_caption(fig, wavelength_caption(data))
    return fig
