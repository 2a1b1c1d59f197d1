"""Sinusoidal tables (Vaswani et al., 2017) and their published variants.

Angles are computed in float64 from integer positions and rounded once to the output dtype, so a
table at position 1e6 is as exact as float32 storage allows (float32 angle arithmetic would lose
about 0.06 rad there).
"""

from __future__ import annotations

import math

import torch

from .._checks import check_choice, check_number, check_positions, check_positive_int

SINUSOIDAL_LAYOUTS = ("interleaved", "concat", "fairseq")
SINCOS_2D_LAYOUTS = ("mae", "timm")


def sinusoidal_inv_freq(
    dim: int, base: float = 10000.0, layout: str = "interleaved"
) -> torch.Tensor:
    """The ``dim // 2`` angular frequencies of a sinusoidal table, float64.

    ``interleaved``/``concat``: ``base ** (-2i / dim)`` (the paper).
    ``fairseq``: ``exp(-i * log(base) / (dim/2 - 1))`` (tensor2tensor/fairseq: the last frequency
    is exactly ``1/base``).
    """
    check_positive_int("dim", dim)
    check_choice("layout", layout, SINUSOIDAL_LAYOUTS)
    base = check_number("base", base, low=1.0, low_open=True)
    half = dim // 2
    i = torch.arange(half, dtype=torch.float64)
    if layout == "fairseq":
        if half < 2:
            raise ValueError(
                f"dim must be >= 4 for the fairseq layout (it divides by dim/2 - 1), got {dim}"
            )
        return torch.exp(i * (-math.log(base) / (half - 1)))
    return torch.exp(i * 2.0 * (-math.log(base) / dim))


def sinusoidal_table(
    positions: torch.Tensor,
    dim: int,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    inv_freq: torch.Tensor | None = None,
    *,
    signed: bool = False,
) -> torch.Tensor:
    """Sinusoidal encodings of integer ``positions``.

    Shapes: ``positions [*]`` (any shape, integer) -> ``[*, dim]``. ``inv_freq``: the float64
    frequencies of :func:`sinusoidal_inv_freq` already on ``positions``' device (a module keeps
    a copy there: building them on the host and copying each call is a synchronous transfer,
    which CUDA-graph capture forbids).

    Layouts (``f_i`` from :func:`sinusoidal_inv_freq`, ``p`` the position)::

        interleaved  [sin(p f0) cos(p f0) sin(p f1) cos(p f1) ...]   the paper; dim must be even
        concat       [sin(p f0) sin(p f1) ... | cos(p f0) cos(p f1) ...]   Transformer-XL; even dim
        fairseq      [sin ... | cos ... | 0]   fairseq/tensor2tensor frequencies; odd dim gets a
                     zero last column

    ``signed=True`` accepts negative positions: the relative sinusoid of Transformer-XL and
    Conformer encodes offsets ``j - i`` of either sign (``sin`` odd, ``cos`` even in ``p``).
    """
    check_choice("layout", layout, SINUSOIDAL_LAYOUTS)
    check_positive_int("dim", dim)
    if dim % 2 and layout != "fairseq":
        raise ValueError(
            f"dim must be even for the {layout!r} sinusoidal layout, got {dim} "
            "(only layout='fairseq' allows an odd dim, with a zero last column)"
        )
    positions = check_positions(positions, allow_negative=bool(signed))
    if inv_freq is None:
        inv_freq = sinusoidal_inv_freq(dim, base, layout).to(positions.device)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # [*, dim//2]
    sin, cos = angles.sin(), angles.cos()
    if layout == "interleaved":
        table = torch.stack((sin, cos), dim=-1).flatten(-2)  # [*, dim//2, 2] -> [*, dim]
    else:
        table = torch.cat((sin, cos), dim=-1)  # [*, dim - dim % 2]
        if dim % 2:
            table = torch.nn.functional.pad(table, (0, 1))  # [*, dim]
    return table.to(dtype)


def sincos_2d(
    grid_h: int,
    grid_w: int,
    dim: int,
    base: float = 10000.0,
    layout: str = "mae",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """2-D sin-cos table for a ``grid_h x grid_w`` patch grid, row-major tokens.

    Shapes: -> ``[grid_h * grid_w, dim]``; token ``r * grid_w + c`` is patch (row r, column c).

    Half the channels encode one axis with a 1-D ``concat`` table of ``dim/2`` channels
    (``[sin | cos]``, frequencies ``base ** (-2i / (dim/2))``), the other half the other axis.

    ``mae``: MAE's ``get_2d_sincos_pos_embed`` (also used by DiT, I-JEPA): ``[enc(col) | enc(row)]``.
      ``dim`` must be divisible by 4.
    ``timm``: timm's ``build_sincos2d_pos_embed`` default (``reverse_coord=False``,
      ``interleave_sin_cos=False``): ``[sin(row) sin(col) | cos(row) cos(col)]`` with frequencies
      ``base ** (-i / (dim/4))``, i.e. the same frequencies, row first, sin/cos grouped.
    """
    check_positive_int("grid_h", grid_h)
    check_positive_int("grid_w", grid_w)
    check_choice("layout", layout, SINCOS_2D_LAYOUTS)
    check_positive_int("dim", dim)
    if dim % 4:
        raise ValueError(f"dim must be divisible by 4 for a 2-D sin-cos table, got {dim}")
    if grid_h * grid_w * dim > 1 << 28:
        raise ValueError(
            f"grid_h * grid_w * dim must be <= 2**28 (the table's values), got "
            f"{grid_h} * {grid_w} * {dim}"
        )
    rows = torch.arange(grid_h).repeat_interleave(grid_w)  # [h*w]: 0 0 .. 1 1 ..
    cols = torch.arange(grid_w).repeat(grid_h)  # [h*w]: 0 1 .. 0 1 ..
    if layout == "mae":
        enc_c = sinusoidal_table(cols, dim // 2, base, "concat", torch.float64)  # [h*w, dim/2]
        enc_r = sinusoidal_table(rows, dim // 2, base, "concat", torch.float64)
        return torch.cat((enc_c, enc_r), dim=-1).to(dtype)  # [h*w, dim]
    inv_freq = sinusoidal_inv_freq(dim // 2, base, "concat")  # [dim/4]
    ang_r = rows.to(torch.float64)[:, None] * inv_freq  # [h*w, dim/4]
    ang_c = cols.to(torch.float64)[:, None] * inv_freq
    return torch.cat((ang_r.sin(), ang_c.sin(), ang_r.cos(), ang_c.cos()), dim=-1).to(dtype)
