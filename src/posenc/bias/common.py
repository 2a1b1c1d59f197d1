"""The base of the bias family: a content-free logit bias ``B[h, i, j]``, stated once as an
elementwise ``term(q_pos, k_pos, head)`` (attention-gym's one function per bias), in two forms.

* :meth:`PositionBias.term` is the one statement of the formula: integer query and key
  positions and a head index, tensors that broadcast, in; the bias entries out.
  :func:`term_grid` evaluates it on every ``(head, query, key)`` and :func:`term_score_mod`
  one entry at a time: every bias gets both forms from its term.
* :meth:`PositionBias.bias` materializes ``[h, s, t]`` (or ``[b, h, s, t]``) float32, for SDPA's
  float mask and for the explicit path.
* :meth:`PositionBias.score_mod` returns a FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)``
  that computes one entry at a time from small tensors: the position vectors
  (``positions[q_idx]``, ``k_positions[kv_idx]``), per-head parameters, tables indexed by query
  or key index (``O(s + t)``) or by clamped distance (a size fixed at construction). It never
  builds an ``[h, s, t]`` bias.

Both read integer positions, so KV-cache offsets, left padding and packing work unchanged.
``positions`` are the queries' and ``k_positions`` the keys' (the names every family uses).
Neither reads position values back to the host (no ``.item()``, ``.max()``): no table is
sized by a position value, so they trace into one graph and capture into CUDA graphs.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from .._checks import check_int_at_most, check_values
from ..functional.bias import MAX_TABLE_ROWS, check_pair

ScoreMod = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
PositionReader = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``term(q_pos, k_pos, head) -> B``: the bias of query position ``q_pos``, key position
#: ``k_pos`` and head ``head`` (int64 tensors that broadcast against each other), elementwise:
#: scalars inside a ``score_mod``, ``[(b,) 1, s, 1]``, ``[(b,) 1, 1, t]`` and ``[h, 1, 1]`` (or
#: ``[1, h, 1, 1]``) for the materialized ``[(b,) h, s, t]``. Floating (float32, or float64 for
#: float64 weights). Per-head values are read as ``table[head]``; nothing else is allowed to
#: depend on the shapes.
Term = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_index_layout(positions: torch.Tensor, k_positions: torch.Tensor) -> None:
    """Check the index-layout promise (``k_positions = c + arange(t)``, ``positions`` the last
    ``s`` of them) where that is free (eager CPU; a device assertion elsewhere, skipped under
    torch.compile). Shapes: ``[s]|[b, s]``, ``[t]|[b, t]``."""
    s, t = positions.shape[-1], k_positions.shape[-1]
    if s > t:
        raise ValueError(f"the index layout has s <= t (queries are the last keys), got {s} > {t}")
    if t == 0:
        return
    expected = k_positions[..., :1] + torch.arange(t, device=k_positions.device)  # [(b,) t]
    ok = (k_positions == expected).all() & (positions == expected[..., t - s :]).all()
    check_values(
        ok, lambda: "index_layout=True needs k_positions = c + arange(t) and positions their last s"
    )


def reference_position(positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """A position to measure a call's positions from: the first query's (the first key's when
    there are no queries), ``[(b,) 1]``, int64. Shapes: ``[s]|[b, s]``, ``[t]|[b, t]``.

    Schemes that depend on ``j - i`` only but compute from each side's position (a dot product
    of embeddings, angle addition) subtract it from both sides first: their angles then stay
    as small as the call's span of positions, and the same sequence at offset ``2**40`` gives
    the same numbers as at offset 0. Chosen from shapes alone (no value is read).
    """
    source = positions if positions.shape[-1] else k_positions
    return source[..., :1].long()  # [(b,) 1] (empty only when both are: nothing to measure)


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


def index_reader(offset: int) -> PositionReader:
    """``read(b, idx) -> idx + offset`` inside a ``score_mod``: the index layout's position of
    index ``idx`` (:func:`check_index_layout`), read from no tensor."""

    def read_index(b: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return idx + offset

    return read_index


def column_readers(table: torch.Tensor) -> list[PositionReader]:
    """One :func:`position_reader` per column of a table with a row per query (or key) index.

    Shapes: ``table [n, w]`` or ``[b, n, w]`` -> ``w`` readers ``read(b, idx) -> table[.., idx, c]``
    (a ``score_mod`` indexes 1-D or 2-D tensors by index tensors only).
    """
    return [position_reader(table[..., c].contiguous()) for c in range(table.shape[-1])]


def term_grid(
    term: Term, positions: torch.Tensor, k_positions: torch.Tensor, num_heads: int
) -> torch.Tensor:
    """The term on every (head, query, key): the materialized bias.

    Shapes: ``positions [s]|[b, s]``, ``k_positions [t]|[b, t]`` (checked, ``[1, *]``
    broadcasts) -> ``[h, s, t]``, or ``[b, h, s, t]`` when either is batched.
    """
    q, k = positions.long(), k_positions.long()
    head = torch.arange(num_heads, device=q.device)  # [h]
    if q.dim() == k.dim() == 1:
        s, t = q.shape[0], k.shape[0]
        out = term(q[None, :, None], k[None, None, :], head[:, None, None])  # [h, s, t]
        return out.expand(num_heads, s, t)  # a term that ignores an axis still gives it
    q = q if q.dim() == 2 else q[None]  # [b|1, s]
    k = k if k.dim() == 2 else k[None]  # [b|1, t]
    b = max(q.shape[0], k.shape[0])
    # Heads outermost, [h, b, s, t], then a view [b, h, s, t]: a head's entries are contiguous,
    # as the per-head reductions of the backward want.
    out = term(q[None, :, :, None], k[None, :, None, :], head[:, None, None, None])
    return out.expand(num_heads, b, q.shape[1], k.shape[1]).transpose(0, 1)  # [b, h, s, t]


def term_score_mod(
    term: Term,
    positions: torch.Tensor,
    k_positions: torch.Tensor,
    *,
    index_offset: int | None = None,
) -> ScoreMod:
    """A FlexAttention ``score_mod`` adding ``term`` entry by entry (no ``[h, s, t]``).

    Reads each entry's positions from ``positions`` and ``k_positions`` (checked). With
    ``index_offset`` (the index layout, see :func:`check_index_layout`: keys at their index,
    query ``q_idx`` at key index ``q_idx + index_offset``) the indices stand for the positions
    instead, which a term depending on ``j - i`` only gives the same values: no position is read.
    """
    if index_offset is not None:  # the index layout: no position read
        read_q, read_k = index_reader(index_offset), index_reader(0)
    else:
        read_q, read_k = position_reader(positions.long()), position_reader(k_positions.long())

    def add_term(
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        return score + term(read_q(b, q_idx), read_k(b, kv_idx), h).to(score.dtype)

    return _own_code(add_term, term)


# (wrapper code, term code) -> the wrapper's code object for that term.
_CODES: dict[tuple[types.CodeType, types.CodeType], types.CodeType] = {}


def _own_code(score_mod: ScoreMod, term: Term) -> ScoreMod:
    """``score_mod`` with a code object of its own per term (the same one on every call).

    TorchDynamo, which traces a ``score_mod``, keys what it learns of a function by its code
    object; one wrapper code around terms with different closures (ALiBi's slopes, FIRE's
    weights) made it read a closure cell of one term in another (an IndexError while building
    guards). One code per term keeps "same code, same closure layout", as one ``def`` per bias
    gave before; the same code on every call keeps the compiled kernel cached.
    """
    fn = score_mod
    assert isinstance(fn, types.FunctionType)
    key = (fn.__code__, getattr(term, "__code__", fn.__code__))
    name = f"{getattr(term, '__name__', 'term')}_{fn.__name__}"
    if key not in _CODES:
        names: dict[str, Any] = {"co_name": name}
        if hasattr(fn.__code__, "co_qualname"):  # Python 3.11+
            names["co_qualname"] = name
        _CODES[key] = fn.__code__.replace(**names)
    code = _CODES[key]
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


class PositionBias(nn.Module):
    """Base class of the content-free biases (``family = "bias"``).

    Subclasses implement :meth:`term`, the one statement of their formula; :meth:`bias` (the
    materialized form) and :meth:`score_mod` (FlexAttention's) come from it. ``forward`` is
    :meth:`bias`. A bias whose term holds an inner sum (FIRE's hidden units, Sandwich's
    frequencies) may evaluate the same term faster in :meth:`materialized` (a matrix product
    instead of one pass per term of the sum), tested against the term.

    A new bias is one file: a subclass with its :meth:`term` and a
    :func:`posenc.registry.register` builder beside it (``tests/test_register_bias.py``).
    """

    family: ClassVar[str] = "bias"
    # Whether Attention's backend="auto" may take FlexAttention for any positions; False when
    # the score_mod is fast only in the index layout (Sandwich).
    flex_any_positions: ClassVar[bool] = True

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        why = "one slope, ratio or table column per head"
        self.num_heads = check_int_at_most("num_heads", num_heads, MAX_TABLE_ROWS, why)

    def check_pair(
        self, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`check_pair`, with both on the device of the learned weights if there are any
        (a parameter-free bias is computed on the positions' device)."""
        weight = next(self.parameters(), None)
        if weight is None:
            return check_pair(positions, k_positions)
        return check_pair(positions, k_positions, weight.device, "the encoding's parameters")

    def term(self, device: torch.device) -> Term:
        """The bias as an elementwise ``term(q_pos, k_pos, head)`` (:data:`Term`), with its
        per-head tables and parameters on ``device`` (that of the positions it will read)."""
        raise NotImplementedError

    def materialized(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """:meth:`bias` of checked positions: the term on every entry (:func:`term_grid`)."""
        return term_grid(self.term(positions.device), positions, k_positions, self.num_heads)

    def bias(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``positions [s]|[b, s]`` (queries), ``k_positions [t]|[b, t]`` (keys) ->
        ``[h, s, t]`` or ``[b, h, s, t]`` float32 (batched when either position tensor is)."""
        q, k = self.check_pair(positions, k_positions)
        return self.materialized(q, k)

    def score_mod(
        self, positions: torch.Tensor, k_positions: torch.Tensor, *, index_layout: bool = False
    ) -> ScoreMod:
        """A FlexAttention ``score_mod`` adding the same bias entry by entry (no ``[h, s, t]``).

        ``index_layout``: the caller promises the index layout (``k_positions = c + arange(t)``,
        ``positions`` their last ``s``), known from how the call was made, never from the
        values; an encoding may then index by ``q_idx``/``kv_idx`` instead of positions.
        """
        q, k = self.check_pair(positions, k_positions)
        return term_score_mod(self.term(q.device), q, k)

    def forward(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[h, s, t]`` or ``[b, h, s, t]`` float32."""
        return self.bias(positions, k_positions)


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 if it already is (gradcheck runs learnable tables in float64).

    Detached where no gradient is recorded: a float32 parameter would come back as itself,
    still requiring grad, and torch 2.5's FlexAttention refuses a ``score_mod`` that captures
    such a tensor even under ``torch.no_grad()``.
    """
    y = x.to(torch.promote_types(x.dtype, torch.float32))
    return y if torch.is_grad_enabled() else y.detach()


def per_head(x: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """Put a head axis where the batch convention wants it.

    Shapes: ``x [h, s, t]`` (computed from ``rel [s, t]``) stays; ``x [h, b, s, t]`` (from
    ``rel [b, s, t]``) -> ``[b, h, s, t]``.
    """
    return x if rel.dim() == 2 else x.transpose(0, 1)  # [h, b, s, t] -> [b, h, s, t]
