"""The KV cache of one attention layer: rotated keys, values and key positions."""

from __future__ import annotations

import torch


class KVCache:
    """Keys (already rotated), values and key positions of one attention layer.

    Shapes: ``k, v [b, hk, t, d]``; ``positions [t]`` or ``[b, t]``. ``index_layout`` (a Python
    bool, known without reading positions) is True while every key sits at its index: all
    positions so far were the defaults ``arange(length, length + s)``.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.index_layout = True

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        *,
        index_layout: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append and return the whole cache ``(k, v, positions)``.

        ``index_layout``: the caller promises ``positions`` are ``arange(length, length + s)``.
        """
        self.index_layout = self.index_layout and index_layout
        if self.k is None or self.v is None or self.positions is None:
            # Copies laid out as every later torch.cat result is, so that a compiled decode step
            # sees the same strides at every length (a transposed view, even one contiguous but
            # for the stride of a size-1 dim, or a view of the caller's positions, would
            # recompile it once).
            fmt = torch.contiguous_format
            k, v = k.clone(memory_format=fmt), v.clone(memory_format=fmt)  # [b, hk, s, d]
            self.k, self.v, self.positions = k, v, positions.clone(memory_format=fmt)
        else:
            self.k = torch.cat((self.k, k), dim=2)  # [b, hk, t + s, d]
            self.v = torch.cat((self.v, v), dim=2)
            self.positions = cat_positions(self.positions, positions, k.shape[0])
        return self.k, self.v, self.positions


def cat_positions(a: torch.Tensor, b: torch.Tensor, batch: int) -> torch.Tensor:
    """Concatenate position tensors along the sequence, broadcasting ``[s]`` to ``[b, s]`` if needed."""
    if a.dim() == b.dim() == 1:
        return torch.cat((a, b))
    a = a.expand(batch, -1) if a.dim() == 1 else a
    b = b.expand(batch, -1) if b.dim() == 1 else b
    return torch.cat((a, b), dim=1)
