"""The position context of a forward and the score context of one layer's call.

At the bottom of the package (it imports nothing of posenc), so that the encodings, which read
them, sit below :mod:`posenc.attention`, which builds them (:func:`posenc.attention.position_context`).

A model (or :class:`~posenc.attention.Attention` called alone) builds one
:class:`PositionContext` per forward: the checked query ``positions``, the ``k_positions`` of the
call's new keys (memory first, for Transformer-XL segments), whether every key sits at its index
(``index_layout``) and a memo of each encoding's per-forward product (RoPE's cos/sin, a bias
tensor or ``score_mod``), computed by the first layer that asks and reused by the others.
Positions are validated once, where the context is built; nothing below checks them again.

A context serves one forward of one stack of layers whose KV caches advance together (the layers
of a model): the products are keyed by encoding (shapes would make ``torch.compile`` specialize on lengths),
not by the cache's values or lengths. Each
layer's call then has a :class:`ScoreContext`: the key positions after its cache, the mask, the
scale, what a content-dependent encoding's ``scores`` needs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class PositionContext:
    """Positions of one forward, checked once, and the encodings' per-forward products.

    Shapes: ``positions [s]`` or ``[1|b, s]`` (integer, on the input's device); ``k_positions``
    ``[t]`` or ``[1|b, t]`` for the call's new keys (``positions`` itself, the same object, unless
    memory precedes them). ``past``: keys before them (the cache's or memory's length).
    ``index_layout``: every key of the call sits at its index (all positions defaults), known
    from which arguments were given, never from their values.
    """

    positions: torch.Tensor
    k_positions: torch.Tensor
    index_layout: bool
    past: int = 0
    products: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    def product(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for in this forward, the same value after."""
        if key not in self.products:
            self.products[key] = make()
        return self.products[key]


@dataclass
class ScoreContext:
    """One layer's call, after its KV cache: what the score terms of an encoding read.

    Shapes: ``positions [s]|[1|b, s]``; ``k_positions [t]|[1|b, t]`` of every key the queries see
    (cache included); ``mask`` bool keep-mask ``[s, t]`` or ``[b, 1|h, s, t]`` (None: every
    key). ``scale``: the softmax scale; ``causal``: the layer's mask hides later keys by index.
    ``q_proj``/``k_proj``: the layer's query and key projections (DeBERTa projects its
    relative embeddings with them when it shares the attention's keys).
    """

    positions: torch.Tensor
    k_positions: torch.Tensor
    index_layout: bool
    scale: float
    causal: bool
    mask: torch.Tensor | None = None
    q_proj: nn.Module | None = None
    k_proj: nn.Module | None = None
    #: what an encoding computes once per call and reads twice (Shaw: each pair's distance).
    scratch: dict[Any, Any] = field(default_factory=dict, repr=False)
