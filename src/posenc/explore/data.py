"""The numbers of the explorer page: every array computed here by :mod:`posenc.functional`, on a
grid of control values, so the page only selects among them.

One *frame* per combination of encoding, ``d_model`` and RoPE scaling (type and factor); the
position ``p`` is not part of the key, since each frame holds every position:

* ``matrix [P/stride, c]``: the encoding against position, every ``stride``-th position. The
  sinusoidal table (``c = d``, ``[sin cos sin cos ...]``), or RoPE's cos table
  ``attention_factor * cos(p theta_i)`` (``c = d/2``, one column per rotated pair);
* ``similarity [2P - 1]``: ``<e(0), e(k)>`` for ``k = -(P-1) .. P-1``, where ``e(p)`` is the
  sinusoidal vector of position ``p``, or ``R(p) q`` for RoPE with ``q`` one in the first channel
  of every pair (``<R(m) q, R(n) q>`` depends only on ``n - m``; both do). The curve of position
  ``p`` against ``n = 0 .. P-1`` is the window ``similarity[P-1-p : 2P-1-p]``;
* ``rotation [3, 2, P]``: the 2-D point of three pairs (the fastest, a middle one and the
  slowest) at every position: RoPE rotating a ``q`` that is ``radius`` in the first channel of
  that pair (:func:`~posenc.functional.apply_rotary`), or the sinusoidal table's ``(cos, sin)``
  columns of that pair, times the same radii (three circles, one inside the other);
* ``wavelengths [n]``: ``2 pi / theta_i`` per pair, in positions.

RoPE's scaling dicts are :func:`~posenc.functional.extension_scaling`'s, built from posenc's one
table of scaling types (:data:`~posenc.functional.ROPE_SCALING`) for a model trained at
``train_len`` and extended by ``factor``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._checks import check_choice, check_positive_int
from ..functional import (
    ROPE_SCALING,
    apply_rotary,
    extension_scaling,
    rope_cos_sin,
    rope_inv_freq,
    sinusoidal_inv_freq,
    sinusoidal_table,
)

ENCODINGS: dict[str, str] = {"sinusoidal": "sinusoidal (absolute)", "rope": "RoPE (rotary)"}
#: The scaling types the page offers (``none`` is plain RoPE); labels from ROPE_SCALING.
SCALINGS: tuple[str, ...] = ("none", "linear", "ntk", "yarn", "llama3", "longrope")
DIMS: tuple[int, ...] = (16, 32, 64, 128)
FACTORS: tuple[int, ...] = (2, 4, 8)
#: Radii of the three pairs drawn in the rotation view (fastest, middle, slowest).
RADII: tuple[float, float, float] = (1.0, 0.7, 0.4)


def scaling_label(name: str) -> str:
    """The short name of a scaling type: ROPE_SCALING's label, ``none`` for plain RoPE."""
    return "none" if name == "none" else ROPE_SCALING[name].label


def _shown_pairs(n: int) -> list[int]:
    return [0, n // 2, n - 1]


def _relative_row(vectors: torch.Tensor) -> np.ndarray:
    """``[<v(0), v(k)>]`` for ``k = -(P-1) .. P-1`` from ``vectors [P, c]`` (``<v(0), v(-k)>`` is
    ``<v(k), v(0)>``, equal to ``<v(0), v(k)>`` for these shift-invariant products)."""
    row = (vectors.double() @ vectors[0].double()).numpy()  # [P]
    return np.concatenate([row[:0:-1], row]).astype(np.float32)  # [2P - 1]


def _names(pairs: list[int], wavelengths: np.ndarray) -> list[str]:
    return [f"pair {i}: wavelength {wavelengths[i]:.4g}" for i in pairs]


def _label(scaling: dict[str, Any] | None) -> str:
    if scaling is None:
        return "RoPE"
    return f"{scaling_label(scaling['rope_type'])} ×{scaling['factor']:g}"


def _short(scaling: dict[str, Any] | None) -> str:
    """A scaling dict as Python source, each long list shortened to its ends and length."""
    if scaling is None:
        return "None"
    items = []
    for key, value in scaling.items():
        if isinstance(value, list) and len(value) > 4:
            shown = f"[{value[0]:.3g}, {value[1]:.3g}, ..., {value[-1]:.3g}] ({len(value)} numbers)"
        else:
            shown = repr(value)
        items.append(f"{key!r}: {shown}")
    return "{" + ", ".join(items) + "}"


def _arrays(
    matrix: torch.Tensor,
    embedded: torch.Tensor,
    rotation: np.ndarray,
    pairs: list[int],
    wavelengths: np.ndarray,
) -> dict[str, Any]:
    """A frame's arrays: the shown ``matrix`` rows, the similarity row of the ``embedded``
    positions ``[P, d]``, the ``rotation [3, 2, P]`` of the shown ``pairs``, and every pair's
    wavelength."""
    return {
        "matrix": matrix.numpy(),
        "similarity": _relative_row(embedded),
        "rotation": rotation.astype(np.float32),
        "rotation_pairs": pairs,
        "rotation_names": _names(pairs, wavelengths),
        "wavelengths": wavelengths.astype(np.float32),
    }


def sinusoidal_frame(dim: int, num_positions: int, stride: int) -> dict[str, Any]:
    """One sinusoidal frame (module docstring): ``sinusoidal_table`` and its frequencies."""
    positions = torch.arange(num_positions)
    table = sinusoidal_table(positions, dim)  # [P, d], [sin cos sin cos ...]
    wavelengths = (2 * math.pi / sinusoidal_inv_freq(dim)).numpy()  # [d/2]
    pairs = _shown_pairs(dim // 2)
    rotation = np.stack(
        [
            r * table[:, [2 * i + 1, 2 * i]].T.numpy()  # [2, P]: (cos, sin) of pair i
            for r, i in zip(RADII, pairs, strict=True)
        ]
    )  # [3, 2, P]
    return {
        **_arrays(table[::stride], table, rotation, pairs, wavelengths),
        "attention_factor": 1.0,
        "scaling": None,
        "eval_len": None,
        "label": "sinusoidal",
        "call": f"sinusoidal_table(torch.arange({num_positions}), {dim})",
    }


def rope_frame(
    dim: int,
    num_positions: int,
    stride: int,
    scaling: dict[str, Any] | None,
    eval_len: int,
    base: float = 10000.0,
) -> dict[str, Any]:
    """One RoPE frame (module docstring) for the scaling dict ``scaling`` (None: plain RoPE);
    ``eval_len`` is the current length the length-dependent types choose by (LongRoPE)."""
    inv_freq, attention_factor = rope_inv_freq(dim, base, scaling, seq_len=eval_len)  # [n]
    n = dim // 2
    positions = torch.arange(num_positions)
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor)  # [P, n] each
    q = torch.cat([torch.ones(n), torch.zeros(n)])  # [d], half layout: pair i is (i, i + n)
    rotated = apply_rotary(q.expand(num_positions, dim), cos, sin)  # [P, d]: R(p) q
    pairs = _shown_pairs(n)
    q_pairs = torch.zeros(dim)
    q_pairs[pairs] = torch.tensor(RADII)
    turning = apply_rotary(q_pairs.expand(num_positions, dim), cos, sin)  # [P, d]
    rotation = np.stack([turning[:, [i, i + n]].T.numpy() for i in pairs])  # [3, 2, P]
    wavelengths = (2 * math.pi / inv_freq.double()).numpy()  # [n]
    return {
        **_arrays(cos[::stride], rotated, rotation, pairs, wavelengths),
        "attention_factor": attention_factor,
        "scaling": scaling,
        "eval_len": eval_len,
        "label": _label(scaling),
        "call": f"rope_inv_freq({dim}, {base:g}, {_short(scaling)}, seq_len={eval_len}) "
        f"-> attention_factor {attention_factor:.4g}",
    }


def explorer_data(
    dims: Sequence[int] = DIMS,
    num_positions: int = 256,
    train_len: int = 32,
    factors: Sequence[int] = FACTORS,
    scalings: Sequence[str] = SCALINGS,
    stride: int = 2,
    base: float = 10000.0,
) -> dict[str, Any]:
    """Every frame of the explorer page: ``{"meta": ..., "frames": ...}`` (module docstring).

    ``frames[encoding][str(d)][scaling][str(factor)]`` is one frame (numpy float32 arrays);
    sinusoidal frames and plain RoPE (``scaling="none"``) exist for factor ``"1"`` only, their
    arrays do not depend on the factor. ``meta`` holds the grid: the controls' values and labels,
    ``eval_len[str(factor)] = train_len * factor`` (the length each extension targets) and the
    positions of the matrix rows.
    """
    _check_grid(dims, num_positions, train_len, factors, scalings, stride)
    eval_lens = {str(f): train_len * f for f in factors}
    frames: dict[str, Any] = {"sinusoidal": {}, "rope": {}}
    for d in dims:
        frames["sinusoidal"][str(d)] = {"none": {"1": sinusoidal_frame(d, num_positions, stride)}}
        frames["rope"][str(d)] = {
            name: _rope_frames(d, num_positions, stride, name, factors, train_len, base)
            for name in scalings
        }
    meta = {
        "encodings": [{"id": k, "label": v} for k, v in ENCODINGS.items()],
        "dims": [int(d) for d in dims],
        "scalings": [{"id": s, "label": scaling_label(s)} for s in scalings],
        "factors": [int(f) for f in factors],
        "num_positions": num_positions,
        "train_len": train_len,
        "eval_len": eval_lens,
        "base": base,
        "stride": stride,
        "matrix_positions": list(range(0, num_positions, stride)),
        "radii": list(RADII),
    }
    return {"meta": meta, "frames": frames}


def _check_grid(
    dims: Sequence[int],
    num_positions: int,
    train_len: int,
    factors: Sequence[int],
    scalings: Sequence[str],
    stride: int,
) -> None:
    check_positive_int("num_positions", num_positions)
    check_positive_int("train_len", train_len)
    check_positive_int("stride", stride)
    for d in dims:
        check_positive_int("d_model", d)
        if d % 2 or d < 4:
            raise ValueError(f"each d_model must be even and >= 4, got {d}")
    for name in scalings:
        check_choice("scaling", name, SCALINGS)
    for f in factors:
        if isinstance(f, bool) or not isinstance(f, int) or f < 2:
            raise ValueError(
                f"each factor must be an integer >= 2 (a context extension), got {f!r}"
            )


def _rope_frames(
    d: int,
    num_positions: int,
    stride: int,
    name: str,
    factors: Sequence[int],
    train_len: int,
    base: float,
) -> dict[str, Any]:
    """``{str(factor): frame}`` of one scaling (plain RoPE, ``"none"``: factor ``"1"`` only)."""
    if name == "none":
        return {"1": rope_frame(d, num_positions, stride, None, train_len, base)}
    return {
        str(f): rope_frame(
            d,
            num_positions,
            stride,
            extension_scaling(name, float(f), train_len, d // 2),
            train_len * f,
            base,
        )
        for f in factors
    }
