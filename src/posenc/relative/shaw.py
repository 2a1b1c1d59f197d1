"""Shaw et al. (2018): learned embeddings of the clipped relative distance, on keys and values."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import INIT_STD_MAX, check_int_at_most, check_number, check_positive_int
from .._context import ScoreContext
from ..functional.bias import MAX_TABLE_ROWS, relative_distances
from ..functional.relative import clip_relative
from .common import RelativeEncoding, batch_heads


class ShawRelative(RelativeEncoding):
    """``e_ij = q_i . (k_j + aK[c(j - i)]) * scale`` and ``z_i = sum_j a_ij (v_j + aV[c(j - i)])``.

    ``c(r) = clip(r, -k, k)`` with ``k = max_distance``: beyond ``k`` every distance shares one
    embedding. ``aK, aV [2k + 1, d]`` are shared by the heads of one layer, as in the paper;
    build one instance per layer. ``values=False`` keeps only the key term. ``per_head=True``
    gives each of ``num_heads`` heads its own embeddings: ``aK, aV [2k + 1, h, d]``.
    """

    def __init__(
        self,
        head_dim: int,
        max_distance: int = 16,
        values: bool = True,
        init_std: float = 0.02,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        per_head: bool = False,
        num_heads: int | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.per_head = bool(per_head)
        if self.per_head:
            if num_heads is None:
                raise ValueError("per_head=True needs num_heads (a positive integer), got None")
            self.num_heads: int | None = check_positive_int("num_heads", num_heads)
        elif num_heads is not None:
            raise ValueError(
                f"num_heads sizes per-head tables and is allowed only with per_head=True, "
                f"got num_heads={num_heads!r} with per_head=False"
            )
        else:
            self.num_heads = None
        why = "it sizes the 2 * max_distance + 1 embeddings"
        self.max_distance = check_int_at_most("max_distance", max_distance, MAX_TABLE_ROWS, why)
        init_std = check_number("init_std", init_std, low=0.0, high=INIT_STD_MAX)
        n = 2 * max_distance + 1
        shape = (n, head_dim) if self.num_heads is None else (n, self.num_heads, head_dim)
        kw = {"device": device, "dtype": dtype}
        self.init_std = init_std
        self.rel_k = nn.Parameter(torch.empty(shape, **kw))  # type: ignore[arg-type]
        self.rel_v = nn.Parameter(torch.empty(shape, **kw)) if values else None  # type: ignore[arg-type]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw ``aK`` (then ``aV``) from ``N(0, init_std**2)``."""
        for table in (self.rel_k, self.rel_v):
            if table is not None:
                nn.init.normal_(table, std=self.init_std)  # the values of randn(n, d) * init_std

    def check_heads(self, q: torch.Tensor) -> None:
        h, d = q.shape[1], q.shape[3]
        if d != self.head_dim:
            raise ValueError(f"q's head_dim must be {self.head_dim}, got {d}")
        if self.num_heads is not None and h != self.num_heads:
            raise ValueError(f"q must have num_heads = {self.num_heads} heads (per_head), got {h}")

    def _index(self, call: ScoreContext, b: int, h: int) -> torch.Tensor:
        """Each pair's clipped distance, ``[b, h, s, t]``; made once per call (scores and values)."""
        idx = call.scratch.get(self)
        if idx is None:
            # The context holds checked positions: the unchecked core, once per call.
            rel = clip_relative(
                relative_distances(call.positions, call.k_positions), self.max_distance
            )
            idx = call.scratch[self] = batch_heads(rel, b, h)  # [b, h, s, t]
        return idx

    def scores(self, q: torch.Tensor, k: torch.Tensor, call: ScoreContext) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k [b, h, t, d]`` -> ``[b, h, s, t]``."""
        self.check_heads(q)
        idx = self._index(call, q.shape[0], q.shape[1])  # [b, h, s, t]
        # q . aK for the 2k + 1 distinct distances, then pick each pair's: O(s k d), not O(s t d).
        if self.num_heads is None:
            rel_logits = q @ self.rel_k.t()  # [b, h, s, 2k + 1]
        else:
            rel_logits = torch.einsum("bhsd,rhd->bhsr", q, self.rel_k)  # [b, h, s, 2k + 1]
        return (q @ k.transpose(-1, -2) + rel_logits.gather(-1, idx)) * call.scale  # [b, h, s, t]

    def values(self, probs: torch.Tensor, call: ScoreContext) -> torch.Tensor | None:
        """``sum_j a_ij aV[c(j - i)]``: ``probs [b, h, s, t]`` -> ``[b, h, s, d]`` (None without aV)."""
        if self.rel_v is None:
            return None
        b, h, s, _ = probs.shape
        idx = self._index(call, b, h)  # [b, h, s, t]
        # sum_j a_ij aV[c(j - i)] = sum_r (sum of a_ij over keys at clipped distance r) aV[r]
        by_distance = probs.new_zeros(b, h, s, self.rel_v.shape[0])  # [b, h, s, 2k + 1]
        by_distance.scatter_add_(-1, idx, probs)
        if self.num_heads is None:
            return by_distance @ self.rel_v
        return torch.einsum("bhsr,rhd->bhsd", by_distance, self.rel_v)

    def extra_repr(self) -> str:
        heads = "" if self.num_heads is None else f", per_head=True, num_heads={self.num_heads}"
        return (
            f"head_dim={self.head_dim}, max_distance={self.max_distance}, "
            f"values={self.rel_v is not None}{heads}"
        )
