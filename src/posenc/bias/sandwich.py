"""Sandwich: parameter-free sinusoidal-product biases (Chi et al., 2023)."""

from __future__ import annotations

import torch

from .._checks import check_int_at_most, check_number
from .._constants import DeviceConstants
from ..functional.bias import (
    MAX_D_PRIME,
    MAX_TABLE_ROWS,
    sandwich_distance_table,
    sandwich_embedding,
    sandwich_inv_freq,
)
from ..registry import BuildContext, register
from .common import (
    PositionBias,
    ScoreMod,
    Term,
    check_index_layout,
    column_readers,
    per_head,
    reference_position,
    term_score_mod,
)


class Sandwich(PositionBias):
    """``B[h, i, j] = (sum_{k=1}^{d'/2} cos((i - j) / base^(2k/d')) - d'/2) / r_h``, ``r_h = 8h/H``.

    The inner product of two sinusoidal embeddings of width ``d'`` (see
    :func:`~posenc.functional.bias.sandwich_distance_table`), compressed per head by ALiBi's
    ratios ``8h/H`` (``h = 1..H``) so that heads decay at different rates. No parameters.

    Costs follow ``s * t``, never the position values (a table indexed by distance would be as
    long as the largest position, and sizing it would read the positions back to the host):

    * :meth:`bias` computes it as what it is, a dot product ``e(i) . e(j) - d'/2`` of the
      embeddings ``e [*, d']`` of the query and key positions
      (:func:`~posenc.functional.bias.sandwich_embedding`): one ``[s, d'] @ [d', t]`` product.
      Positions are measured from the call's first query position first
      (:func:`~posenc.bias.common.reference_position`; the bias depends on ``i - j`` only), so
      the angles stay as small as the call's span and far positions lose no precision.
    * :meth:`score_mod` in the index layout (the default positions of a plain, cached or
      memory call) reads a table by *index* distance ``|t - s + q_idx - kv_idx| < t``: one
      gather per entry. The first ``cache_len`` distances are computed once (float64 formula,
      stored float32); longer calls build a ``[t]`` table on the device. Other positions take
      the dot product unrolled per entry (``d'`` multiply-adds: exact but slower, and a slow
      kernel compile, so ``backend="auto"`` keeps such calls on SDPA).
    """

    # FlexAttention's "auto" choice: only in the index layout (class docstring).
    flex_any_positions = False

    def __init__(
        self,
        num_heads: int,
        d_prime: int = 128,
        base: float = 10000.0,
        cache_len: int = 4096,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(num_heads)
        why = "the width of the sinusoidal embeddings"
        self.d_prime = check_int_at_most("d_prime", d_prime, MAX_D_PRIME, why)
        self.base = check_number("base", base, low=1.0, low_open=True)
        why = "the distances cached as a table; longer calls build their own"
        self.cache_len = check_int_at_most("cache_len", cache_len, MAX_TABLE_ROWS, why)
        # Both move with the module, never cast (module.to(bfloat16) would round them); not in
        # state_dict.
        self.constants = DeviceConstants(**self._constants()).to(device)  # validates d_prime

    def _constants(self) -> dict[str, torch.Tensor]:
        table = sandwich_distance_table(self.cache_len - 1, self.d_prime, self.base).float()
        # 1 / r_h with ALiBi's compression ratios r_h = 8h/H, h = 1..H.
        h = self.num_heads
        ratio = 8.0 * torch.arange(1, h + 1, dtype=torch.float64) / h
        return {"inv_ratio": (1.0 / ratio).float(), "table": table}  # [h], [cache_len]

    def reset_parameters(self) -> None:
        """Recompute the ratios and the distance table (after ``to_empty()``; no weights)."""
        self.constants.reset_(**self._constants())

    def inv_ratio(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``1 / r_h`` on ``device``, float32 ``[h]``."""
        return self.constants.get("inv_ratio", torch.device(device))

    def distance_table(self, n: int, device: torch.device) -> torch.Tensor:
        """Head-independent bias of the distances ``0 .. n - 1``, float32 ``[>= n]``, on ``device``."""
        if n <= self.cache_len:
            return self.constants.get("table", device)  # [cache_len]
        return sandwich_distance_table(n - 1, self.d_prime, self.base, device).float()  # [n]

    def embedding(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Shapes: ``positions [*]`` -> ``e [*, d']`` (``e(i) . e(j) - d'/2 = B(i - j)``)."""
        return sandwich_embedding(positions, self.d_prime, self.base, dtype)

    def term(self, device: torch.device) -> Term:
        """The formula entry by entry, ``d'/2`` cosines each (float64 angles of ``i - j``).

        An inner sum, so the module evaluates the same term faster (class docstring): a dot
        product of embeddings (:meth:`materialized`, and :meth:`score_mod` for any positions)
        or a table by distance (:meth:`score_mod` in the index layout); each is tested against
        this one. Not for a ``score_mod`` itself (it makes a ``[..., d'/2]`` intermediate)."""
        inv_freq = sandwich_inv_freq(self.d_prime, self.base, device)  # [d'/2] float64
        inv_ratio, half = self.inv_ratio(device), self.d_prime // 2  # [h]

        def sandwich(q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
            angles = (q_pos - k_pos).to(torch.float64)[..., None] * inv_freq  # [..., d'/2]
            return (angles.cos().sum(-1) - half).float() * inv_ratio[head]

        return sandwich

    def materialized(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The term as one ``[s, d'] @ [d', t]`` product of embeddings (class docstring).
        Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[h, s, t]`` or ``[b, h, s, t]`` float32."""
        ref = reference_position(positions, k_positions)  # [(b,) 1]: B depends on i - j only
        q, k = positions.long() - ref, k_positions.long() - ref  # offsets, int64: exact
        # float64: a float32 product of d' terms near 1 minus d'/2 loses ~15x the float32
        # rounding of the result (3e-5 at d' = 128); float64 makes it the rounding alone.
        eq, ek = self.embedding(q, torch.float64), self.embedding(k, torch.float64)
        # [(b,) s, d'] @ [(b,) d', t] -> [(b,) s, t]; a [1, *] side broadcasts like the positions.
        shared = (eq @ ek.transpose(-1, -2) - self.d_prime // 2).float()
        ratio = self.inv_ratio(shared.device).view(-1, *([1] * shared.dim()))  # [h, 1, 1(, 1)]
        return per_head(ratio * shared, shared)  # [h, (b,) s, t] -> [(b,) h, s, t]

    def score_mod(
        self, positions: torch.Tensor, k_positions: torch.Tensor, *, index_layout: bool = False
    ) -> ScoreMod:
        q, k = self.check_pair(positions, k_positions)
        inv_ratio = self.inv_ratio(q.device)  # [h]
        if not index_layout:
            return self._dot_score_mod(q, k, inv_ratio)
        check_index_layout(q, k)
        s, t = q.shape[-1], k.shape[-1]
        table = self.distance_table(t, q.device)  # [>= t]: the term's sum by distance (< t)

        def by_distance(
            q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor
        ) -> torch.Tensor:
            return table[(q_pos - k_pos).abs()] * inv_ratio[head]

        # Query q_idx sits at key index q_idx + t - s.
        return term_score_mod(by_distance, q, k, index_offset=t - s)

    def _dot_score_mod(self, q: torch.Tensor, k: torch.Tensor, inv_ratio: torch.Tensor) -> ScoreMod:
        """The score_mod for any positions: the embeddings' dot product, entry by entry."""
        ref = reference_position(q, k)  # [(b,) 1]: as in bias(), positions become offsets
        q, k = q.long() - ref, k.long() - ref
        # Embeddings by query and key index: O((s + t) d') whatever the position values.
        read_q, read_k = column_readers(self.embedding(q)), column_readers(self.embedding(k))
        half = self.d_prime // 2

        def sandwich(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            qi: torch.Tensor,
            ki: torch.Tensor,
        ) -> torch.Tensor:
            # The dot product unrolled (score_mod sees one scalar entry at a time, and a fused
            # kernel loads scalars), one term cos(i f_k) cos(j f_k) + sin sin - 1 = cos((i - j)
            # f_k) - 1 per frequency, summed pairwise: float32 error ~4 ulp instead of ~15.
            terms = [
                read_q[c](b, qi) * read_k[c](b, ki)
                + read_q[c + half](b, qi) * read_k[c + half](b, ki)
                - 1.0
                for c in range(half)
            ]
            while len(terms) > 1:
                pairs = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
                terms = pairs + terms[len(terms) - len(terms) % 2 :]
            return score + (terms[0] * inv_ratio[h]).to(score.dtype)

        return sandwich

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, d_prime={self.d_prime}, base={self.base}"


@register("sandwich", "bias", description="Sandwich: sinusoidal dot-product bias, per-head ratios")
def _sandwich(ctx: BuildContext, *, d_prime: int = 128, base: float = 10000.0) -> Sandwich:
    return Sandwich(ctx.num_heads, d_prime=d_prime, base=base)
