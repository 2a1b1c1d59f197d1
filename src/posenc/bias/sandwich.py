"""Sandwich: parameter-free sinusoidal-product biases (Chi et al., 2023)."""

from __future__ import annotations

import torch

from .._checks import check_positive_int
from ..functional.bias import relative_position_matrix, sandwich_distance_table
from .common import PositionBias, ScoreMod, check_pair, exact_buffer, per_head, position_reader


class Sandwich(PositionBias):
    """``B[h, i, j] = (sum_{k=1}^{d'/2} cos((i - j) / base^(2k/d')) - d'/2) / r_h``, ``r_h = 8h/H``.

    The inner product of two sinusoidal embeddings of width ``d'`` (see
    :func:`~posenc.functional.bias.sandwich_distance_table`), compressed per head by ALiBi's
    ratios ``8h/H`` (``h = 1..H``) so that heads decay at different rates. No parameters.

    The distance table (float64 formula, stored float32) for distances below ``cache_len`` is a
    non-persistent buffer; longer distances extend it on the fly, rounded up to a multiple of
    ``cache_len`` so a compiled FlexAttention kernel sees few distinct table sizes.
    """

    def __init__(
        self,
        num_heads: int,
        d_prime: int = 128,
        base: float = 10000.0,
        cache_len: int = 4096,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(num_heads)
        self.d_prime, self.base = d_prime, float(base)
        self.cache_len = check_positive_int("cache_len", cache_len)
        table = sandwich_distance_table(cache_len - 1, d_prime, base).float()  # validates d_prime
        # Recomputable, so non-persistent: state_dict stays empty.
        self.register_buffer("table", table.to(device), persistent=False)  # [cache_len]
        self.register_buffer("inv_ratio", self._inv_ratio().to(device), persistent=False)  # [h]

    def _inv_ratio(self) -> torch.Tensor:
        """``1 / r_h`` with ALiBi's compression ratios ``r_h = 8h/H``, ``h = 1..H``, float32."""
        ratio = 8.0 * torch.arange(1, self.num_heads + 1, dtype=torch.float64) / self.num_heads
        return (1.0 / ratio).float()

    def distance_table(self, max_distance: int, device: torch.device) -> torch.Tensor:
        """Head-independent bias for ``|i - j| = 0 .. >= max_distance``, float32 ``[n]``."""
        table: torch.Tensor = self.table  # type: ignore[assignment]
        if max_distance < table.shape[0]:
            return exact_buffer(table, lambda: self._table(table.shape[0])).to(device)
        n = -(-(max_distance + 1) // self.cache_len) * self.cache_len  # round up
        return self._table(n).to(device)

    def _table(self, n: int) -> torch.Tensor:
        return sandwich_distance_table(n - 1, self.d_prime, self.base).float()  # [n]

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[h, s, t]`` or ``[b, h, s, t]`` float32."""
        q, k = check_pair(q_positions, k_positions)
        dist = relative_position_matrix(q, k).abs()  # [(b,) s, t]
        max_distance = int(dist.max()) if dist.numel() else 0
        table = self.distance_table(max_distance, dist.device)
        inv_ratio = exact_buffer(self.inv_ratio, self._inv_ratio)  # type: ignore[arg-type]
        shared = table[dist]  # [(b,) s, t]
        ratio = inv_ratio.to(dist.device).view(-1, *([1] * dist.dim()))  # [h, 1, 1(, 1)]
        return per_head(ratio * shared, dist)  # [(b,) h, s, t]

    def score_mod(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> ScoreMod:
        q, k = check_pair(q_positions, k_positions)
        read_q, read_k = position_reader(q), position_reader(k)
        # Positions are non-negative, so |i - j| <= max position: one O(max position) table.
        max_distance = max(int(q.max()) if q.numel() else 0, int(k.max()) if k.numel() else 0)
        table = self.distance_table(max_distance, q.device)  # [n]
        inv_ratio = exact_buffer(self.inv_ratio, self._inv_ratio).to(q.device)  # type: ignore[arg-type]

        def sandwich(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            qi: torch.Tensor,
            ki: torch.Tensor,
        ) -> torch.Tensor:
            dist = (read_k(b, ki) - read_q(b, qi)).abs()
            return score + (table[dist] * inv_ratio[h]).to(score.dtype)

        return sandwich

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, d_prime={self.d_prime}, base={self.base}"
