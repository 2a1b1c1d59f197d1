"""Building the position context of a forward: positions checked once, defaults after the cache."""

from __future__ import annotations

import torch

from .._checks import check_positions, default_positions
from .._context import PositionContext, ScoreContext
from .cache import cat_positions

__all__ = ["PositionContext", "ScoreContext", "check_seq_positions", "position_context"]


def check_seq_positions(
    p: torch.Tensor, name: str, b: int, n: int, device: torch.device
) -> torch.Tensor:
    """Check ``p`` is integer ``[n]`` or ``[1|b, n]`` on x's ``device`` (values only where free)."""
    p = check_positions(p, name, ranks=(1, 2), device=device, device_of="x")
    if p.shape[-1] != n or (p.dim() == 2 and p.shape[0] not in (1, b)):
        raise ValueError(f"{name} must be [{n}] or [{b}, {n}], got {list(p.shape)}")
    return p


def position_context(
    positions: torch.Tensor | None,
    *,
    batch: int,
    seq: int,
    device: torch.device,
    past: int = 0,
    memory: int | None = None,
    memory_positions: torch.Tensor | None = None,
) -> PositionContext:
    """The :class:`PositionContext` of a forward over ``batch`` sequences of ``seq`` tokens.

    ``positions [s]|[b, s]`` default to ``arange(past, past + s)``; ``past`` is the KV cache's
    length (or the memory's). ``memory``: the number ``m`` of Transformer-XL memory states
    before the tokens (None: no memory), at ``memory_positions [m]|[b, m]`` (default
    ``arange(m)``); they are prepended to the keys' positions.
    """
    index_layout = positions is None
    if positions is None:
        positions = default_positions(seq, device, offset=past)
    else:
        positions = check_seq_positions(positions, "positions", batch, seq, device)
    if memory is None:
        return PositionContext(positions, positions, index_layout, past)
    if memory_positions is None:
        memory_positions = default_positions(memory, device)
    else:
        memory_positions = check_seq_positions(
            memory_positions, "memory_positions", batch, memory, device
        )
        index_layout = False
    k_positions = cat_positions(memory_positions, positions, batch)
    return PositionContext(positions, k_positions, index_layout, past)
