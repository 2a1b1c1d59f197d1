"""Helpers of the content-dependent relative schemes (Shaw, Transformer-XL, DeBERTa)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._checks import check_int_at_most
from .bias import MAX_TABLE_ROWS, relative_position_matrix

__all__ = ["clip_relative", "clipped_relative_index", "rel_shift"]


def clipped_relative_index(
    positions: torch.Tensor, k_positions: torch.Tensor, max_distance: int
) -> torch.Tensor:
    """Shaw et al.'s table row of each (query, key) pair: ``clip(j - i, -k, k) + k`` in ``[0, 2k]``.

    Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[s, t]`` or ``[b, s, t]`` int64.
    """
    check_int_at_most("max_distance", max_distance, MAX_TABLE_ROWS, "a table of 2k + 1 rows")
    rel = relative_position_matrix(positions, k_positions)  # [(b,) s, t]: j - i
    return clip_relative(rel, max_distance)


def clip_relative(rel: torch.Tensor, max_distance: int) -> torch.Tensor:
    """:func:`clipped_relative_index` of distances ``rel = j - i`` already made from checked
    positions (:func:`~posenc.functional.bias.relative_distances`); no validation."""
    return rel.clamp(-max_distance, max_distance) + max_distance


def rel_shift(x: torch.Tensor, key_len: int) -> torch.Tensor:
    """Transformer-XL's relative shift: turn scores by distance into scores by key.

    Shapes: ``x [..., s, L]`` -> ``[..., s, t]`` with ``t = key_len``. Column ``c`` of ``x`` holds
    distance ``t - 1 - c`` (largest first, as Transformer-XL orders ``R``). Query ``i`` sits at
    ``t - s + i`` (the last ``s`` of ``t`` contiguous positions), so its key ``j`` is at distance
    ``t - s + i - j`` and ``out[i, j] = x[i, j + s - 1 - i]``: row ``i`` moves left by
    ``s - 1 - i``. With one zero column appended, flattening and re-reading the rows with a
    stride of one element less does exactly that, without a gather::

        s = 2, t = 2, L = 3 (distances 1, 0, -1)
        x = [a1 a0 a-1 | 0]      flat: a1 a0 a-1 0 b1 b0 b-1 0
            [b1 b0 b-1 | 0]      skip s - 1 = 1, rows of L = 3: [a0 a-1 0] [b1 b0 b-1]
        out = [a0 a-1]  (query 0 at position 0: keys at distance 0, -1)
              [b1 b0 ]  (query 1 at position 1: keys at distance 1, 0)

    ``L = s + t - 1`` covers every distance (``t - 1`` down to ``1 - s``) and the result is exact.
    ``L = t`` (distances ``t - 1 .. 0``, Transformer-XL's causal layout) fills the entries above
    the causal diagonal (``j > t - s + i``) with other entries or zeros: mask them.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise TypeError(f"x must be a tensor [..., s, L], got {getattr(x, 'shape', x)!r:.60}")
    s, length = x.shape[-2], x.shape[-1]
    if isinstance(key_len, bool) or not isinstance(key_len, int) or not 0 <= key_len <= length:
        raise ValueError(
            f"key_len must be an integer in [0, L={length}] (x's distance columns), got {key_len!r}"
        )
    padded = F.pad(x, (0, 1))  # [..., s, L + 1]
    flat = padded.flatten(-2)  # [..., s * (L + 1)]
    shifted = flat[..., s - 1 : s - 1 + s * length]  # [..., s * L]
    return shifted.unflatten(-1, (s, length))[..., :key_len]  # [..., s, L] -> [..., s, t]
