"""The base of the bias family: a content-free logit bias ``B[h, i, j]`` in two forms.

* :meth:`PositionBias.bias` materializes ``[h, s, t]`` (or ``[b, h, s, t]``) float32, for SDPA's
  float mask and for the explicit path.
* :meth:`PositionBias.score_mod` returns a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)``
  that computes one entry at a time from small tensors: the position vectors
  (``q_positions[q_idx]``, ``k_positions[kv_idx]``) and per-head parameters or per-distance
  tables of size ``O(s + t)``. It never builds an ``[h, s, t]`` bias.

Both read integer positions, so KV-cache offsets, left padding and packing work unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from .._checks import check_positions, check_positive_int

ScoreMod = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
PositionReader = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_pair(
    q_positions: torch.Tensor, k_positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate query/key positions: integer, ``[s]`` or ``[b, s]``, batch sizes that broadcast."""
    q = check_positions(q_positions, "q_positions", ranks=(1, 2))
    k = check_positions(k_positions, "k_positions", ranks=(1, 2))
    if (
        q.dim() == 2
        and k.dim() == 2
        and q.shape[0] != k.shape[0]
        and 1 not in (q.shape[0], k.shape[0])
    ):
        raise ValueError(
            "q_positions [b, s] and k_positions [b, t] must have the same batch size (or 1), got "
            f"{list(q.shape)} and {list(k.shape)}"
        )
    return q, k


def position_reader(positions: torch.Tensor) -> PositionReader:
    """``read(b, idx) -> position`` inside a ``score_mod``: ``positions[idx]`` or ``positions[b, idx]``.

    ``[1, s]`` is read as ``[s]`` so that a broadcast batch does not index out of range.
    """
    if positions.dim() == 2 and positions.shape[0] == 1:
        positions = positions[0]  # [s]
    if positions.dim() == 1:
        flat = positions

        def read_1d(b: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            return flat[idx]

        return read_1d
    batched = positions

    def read_2d(b: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return batched[b, idx]

    return read_2d


class PositionBias(nn.Module):
    """Base class of the content-free biases (``family = "bias"``).

    Subclasses implement :meth:`bias` and :meth:`score_mod`; ``forward`` is :meth:`bias`.
    """

    family: ClassVar[str] = "bias"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_positive_int("num_heads", num_heads)

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``q_positions [s]|[b, s]``, ``k_positions [t]|[b, t]`` -> ``[h, s, t]`` or
        ``[b, h, s, t]`` float32 (batched when either position tensor is)."""
        raise NotImplementedError

    def score_mod(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> ScoreMod:
        """A FlexAttention ``score_mod`` adding the same bias entry by entry (no ``[h, s, t]``)."""
        raise NotImplementedError

    def forward(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[h, s, t]`` or ``[b, h, s, t]`` float32."""
        return self.bias(q_positions, k_positions)


def exact_buffer(buffer: torch.Tensor, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A recomputable float buffer in at least float32.

    ``module.to(torch.bfloat16)`` casts buffers too, and a bf16 slope or distance table would
    shift every bias (a Sandwich entry near -64 by up to 0.25); recompute it then.
    """
    if buffer.dtype in (torch.float32, torch.float64):
        return buffer
    return make().to(buffer.device, torch.float32)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 if it already is (gradcheck runs learnable tables in float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def per_head(x: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """Put a head axis where the batch convention wants it.

    Shapes: ``x [h, s, t]`` (computed from ``rel [s, t]``) stays; ``x [h, b, s, t]`` (from
    ``rel [b, s, t]``) -> ``[b, h, s, t]``.
    """
    return x if rel.dim() == 2 else x.transpose(0, 1)  # [h, b, s, t] -> [b, h, s, t]
