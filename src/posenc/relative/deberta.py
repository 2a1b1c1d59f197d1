"""DeBERTa's disentangled attention (He et al., 2021; DeBERTa-v2/v3 log buckets)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_int_at_most, check_number, check_positive_int
from .._context import ScoreContext
from ..functional.bias import (
    MAX_TABLE_ROWS,
    deberta_check_buckets,
    deberta_log_bucket_of,
    relative_distances,
    relative_position_matrix,
)
from .common import RelativeEncoding, batch_heads, checked_sizes

DEBERTA_POS_ATT_TYPES = ("c2p", "p2c")


def _heads(x: torch.Tensor, d: int, h: int) -> torch.Tensor:
    """Shapes: ``[n, hp * d]`` -> ``[h, n, d]``, repeating ``hp`` projected heads to ``h`` (GQA)."""
    x = x.view(x.shape[0], -1, d).transpose(0, 1)  # [hp, n, d]
    return x if x.shape[0] == h else x.repeat_interleave(h // x.shape[0], dim=0)  # [h, n, d]


def _pos_att_types(pos_att_type: object) -> tuple[str, ...]:
    """``"c2p|p2c"`` (DeBERTa's config spelling) or a sequence of names -> a tuple of names."""
    if isinstance(pos_att_type, str):
        types = tuple(t.strip() for t in pos_att_type.lower().split("|"))
    elif isinstance(pos_att_type, (tuple, list)):
        types = tuple(pos_att_type)
    else:
        raise TypeError(
            f"pos_att_type must be a string like 'c2p|p2c' or a tuple of {DEBERTA_POS_ATT_TYPES}, "
            f"got {pos_att_type!r}"
        )
    types = tuple(t for t in types if t)
    for t in types:
        if t not in DEBERTA_POS_ATT_TYPES:
            raise ValueError(f"pos_att_type entries must be in {DEBERTA_POS_ATT_TYPES}, got {t!r}")
    return types


class DeBERTaRelative(RelativeEncoding):
    """``A_ij = (q_i . k_j + q_i . Kr[d(i, j)] + k_j . Qr[d(i, j)]) / sqrt(d * (1 + #terms))``.

    * c2p (content to position): query content against the projected relative embedding
      ``Kr = Wk P`` of the pair's distance bucket.
    * p2c (position to content): key content against ``Qr = Wq P``.
    * ``d(i, j) = clip(bucket(i - j) + span, 0, 2 span - 1)`` with ``i - j`` the query and key
      *positions* and ``bucket`` DeBERTa-v2's log buckets (:func:`deberta_log_bucket`) when
      ``position_buckets > 0``, else the raw distance; ``span = position_buckets`` (or
      ``max_relative_positions`` without buckets).
    * The 1/sqrt(d * scale_factor) rule: every term is divided by ``sqrt(d * (1 + #terms))``
      (``scale_factor`` 3 with both terms), i.e. ``scale / sqrt(1 + #terms)`` for the
      ``scale`` the calling attention passes (default ``1/sqrt(d)``).

    ``P`` is ``rel_embeddings.weight [2 span, dim]`` (LayerNorm-ed when ``norm_rel_ebd``), one
    table for all layers as in DeBERTa: share one instance across layers. With
    ``share_att_key=True`` (DeBERTa-v3) ``Wk, Wq`` are the calling attention's own ``k_proj``
    and ``q_proj`` (so they stay per layer); with ``False`` the instance owns ``pos_key_proj``
    and ``pos_query_proj`` (per layer in DeBERTa-v2: build one instance per layer then).

    transformers' implementation assumes query and key positions ``0..s-1`` and ``0..t-1`` and
    supports p2c only for ``s == t``; this one takes any positions (KV cache, offsets,
    ``[b, s]``), and equals it where it is defined.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int | None = None,
        *,
        position_buckets: int = 256,
        max_relative_positions: int = 512,
        pos_att_type: str | tuple[str, ...] = ("c2p", "p2c"),
        share_att_key: bool = True,
        norm_rel_ebd: bool = True,
        layer_norm_eps: float = 1e-7,
        pos_dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.num_heads, self.head_dim = checked_sizes(dim, num_heads, head_dim)
        head_dim = self.head_dim
        self.max_relative_positions = check_positive_int(
            "max_relative_positions", max_relative_positions
        )
        if isinstance(position_buckets, bool) or not isinstance(position_buckets, int):
            raise TypeError(
                f"position_buckets must be an int (<= 0 for no buckets), got {position_buckets!r}"
            )
        self.position_buckets = position_buckets
        if position_buckets > 0:
            names = ("position_buckets", "max_relative_positions")
            deberta_check_buckets(position_buckets, max_relative_positions, names)
        else:  # the relative embeddings are sized by it
            why = "without buckets it sizes the 2 * max_relative_positions relative embeddings"
            check_int_at_most("max_relative_positions", max_relative_positions, MAX_TABLE_ROWS, why)
        self.span = position_buckets if position_buckets > 0 else max_relative_positions
        self.pos_att_type = _pos_att_types(pos_att_type)
        self.share_att_key = bool(share_att_key)
        self.pos_dropout = check_number(
            "pos_dropout", pos_dropout, low=0.0, high=1.0, high_open=True
        )
        layer_norm_eps = check_number("layer_norm_eps", layer_norm_eps, low=0.0, low_open=True)
        kw = {"device": device, "dtype": dtype}
        self.rel_embeddings = nn.Embedding(2 * self.span, dim, **kw)  # type: ignore[arg-type]
        self.norm = nn.LayerNorm(dim, eps=layer_norm_eps, **kw) if norm_rel_ebd else None  # type: ignore[arg-type]
        inner, types = num_heads * self.head_dim, self.pos_att_type
        self.pos_key_proj = (
            nn.Linear(dim, inner, **kw) if not share_att_key and "c2p" in types else None  # type: ignore[arg-type]
        )
        self.pos_query_proj = (
            nn.Linear(dim, inner, **kw) if not share_att_key and "p2c" in types else None  # type: ignore[arg-type]
        )

    def reset_parameters(self) -> None:
        """Redraw the relative embeddings, norm and projections as their modules draw them."""
        for module in (self.rel_embeddings, self.norm, self.pos_key_proj, self.pos_query_proj):
            if module is not None:
                module.reset_parameters()

    @property
    def scale_factor(self) -> int:
        """``1 + `` the number of position terms (DeBERTa's ``scale_factor``)."""
        return 1 + len(self.pos_att_type)

    def relative_index(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Row of the relative table for each pair: ``[s, t]`` or ``[b, s, t]`` in ``[0, 2 span)``."""
        rel = -relative_position_matrix(positions, k_positions)  # [(b,) s, t]: i - j
        return self._relative_index(rel)

    def _relative_index(self, rel: torch.Tensor) -> torch.Tensor:
        """:meth:`relative_index` of distances ``rel = i - j`` made from checked positions."""
        if self.position_buckets > 0:
            mid = self.position_buckets // 2
            rel = deberta_log_bucket_of(rel, mid, self.max_relative_positions)
        # Clamp before shifting: i - j can be near 2**63, where adding span would wrap around.
        return rel.clamp(-self.span, self.span - 1) + self.span

    def relative_embeddings(self) -> torch.Tensor:
        """``P [2 span, dim]``, normalized and dropped out as DeBERTa does."""
        p = self.rel_embeddings.weight
        if self.norm is not None:
            p = self.norm(p)
        return F.dropout(p, self.pos_dropout, self.training)

    def _projection(self, term: str, call: ScoreContext) -> nn.Module:
        """``W_k`` (c2p) or ``W_q`` (p2c): the attention's own with ``share_att_key``, else ours."""
        if self.share_att_key:
            proj = call.k_proj if term == "c2p" else call.q_proj
            if proj is None:
                raise ValueError(
                    "share_att_key=True needs the calling attention's projections: pass q_proj and "
                    "k_proj (or attention=) to attend"
                )
        else:
            proj = self.pos_key_proj if term == "c2p" else self.pos_query_proj
        if not isinstance(proj, nn.Module):
            raise TypeError(f"no position projection for {term}: attention lacks q_proj/k_proj")
        return proj

    def check_heads(self, q: torch.Tensor) -> None:
        if q.shape[3] != self.head_dim:
            raise ValueError(f"q's head_dim must be {self.head_dim}, got {q.shape[3]}")

    def scores(self, q: torch.Tensor, k: torch.Tensor, call: ScoreContext) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k [b, h, t, d]`` -> ``[b, h, s, t]``, divided by
        ``sqrt(scale_factor)`` on top of ``call.scale``."""
        self.check_heads(q)
        b, h, _, d = q.shape
        scale = call.scale / math.sqrt(self.scale_factor)
        scores = q @ k.transpose(-1, -2)  # [b, h, s, t]
        if self.pos_att_type:
            # The context holds checked positions: the unchecked core, once per call.
            rel = -relative_distances(call.positions, call.k_positions)  # [(b,) s, t]: i - j
            idx = batch_heads(self._relative_index(rel), b, h)
            p = self.relative_embeddings()  # [2 span, dim]
        if "c2p" in self.pos_att_type:
            pos_k = _heads(self._projection("c2p", call)(p), d, h)  # [h, 2 span, d]
            c2p = q @ pos_k.transpose(-1, -2)  # [b, h, s, 2 span]
            scores = scores + c2p.gather(-1, idx)  # [b, h, s, t]
        if "p2c" in self.pos_att_type:
            pos_q = _heads(self._projection("p2c", call)(p), d, h)  # [h, 2 span, d]
            p2c = k @ pos_q.transpose(-1, -2)  # [b, h, t, 2 span]
            # Key j against the query-side embedding of the same pair's bucket d(i, j):
            # gather along keys' rows with the transposed index, then back to [b, h, s, t].
            p2c = p2c.gather(-1, idx.transpose(-1, -2))  # [b, h, t, s]
            scores = scores + p2c.transpose(-1, -2)  # [b, h, s, t]
        return scores * scale

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, position_buckets={self.position_buckets}, "
            f"max_relative_positions={self.max_relative_positions}, pos_att_type={self.pos_att_type}, "
            f"share_att_key={self.share_att_key}"
        )
