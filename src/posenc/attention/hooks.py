"""One hook per encoding family, resolved once when an :class:`~posenc.attention.Attention` is
built (or its ``encoding`` is set): the module then calls the hook's methods and never tests
which family it hosts.

* rotary: ``encoding.prepare(q, k, ctx)`` rotates queries and keys with the context's
  per-forward cos/sin (a module with only ``forward(q, k, positions, k_positions)`` is called so);
* bias: ``encoding.bias(positions, k_positions)`` (materialized, for SDPA and the explicit path)
  or ``encoding.score_mod(positions, k_positions, index_layout=)`` (FlexAttention), each made
  once per forward and encoding;
* relative: ``encoding.scores(q, k, call)`` gives the scaled logits and, where values carry
  position too, ``encoding.values(probs, call)`` a term added to ``probs @ v``; the mask, the
  softmax and ``@ v`` belong to the path;
* none: nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from .._context import PositionContext, ScoreContext
from ..functional.attention import ScoreFn, ValueFn

ENCODING_FAMILIES = ("none", "absolute", "rotary", "bias", "relative")


class RotaryFamily(Protocol):
    """What Attention calls on a ``family = "rotary"`` encoding (see ``posenc.rotary``)."""

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class BiasFamily(Protocol):
    """What Attention calls on a ``family = "bias"`` encoding (see ``posenc.bias``)."""

    def bias(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor: ...

    def score_mod(
        self, positions: torch.Tensor, k_positions: torch.Tensor, *, index_layout: bool = False
    ) -> Callable[..., torch.Tensor]: ...


class RelativeFamily(Protocol):
    """What Attention calls on a ``family = "relative"`` encoding (see ``posenc.relative``):
    the scaled logits ``[b, h, s, t]`` of ``q [b, h, s, d]`` and ``k [b, h, t, d]`` (keys
    already repeated for grouped-query attention)."""

    def scores(self, q: torch.Tensor, k: torch.Tensor, call: ScoreContext) -> torch.Tensor: ...


class FamilyHook:
    """Where an encoding enters attention; this base is NoPE's (nothing anywhere)."""

    kind = "none"
    #: SDPA's plain causal kernel applies (no position term reaches the logits).
    plain_logits = True
    #: backend="auto" may take FlexAttention for any positions (not only the index layout).
    flex_any_positions = True

    def __init__(self, encoding: nn.Module | None = None) -> None:
        self.encoding = encoding

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q [b, h, s, d]``, ``k [b, hk, t, d]`` before the cache -> the same, rotated."""
        return q, k

    def bias(self, ctx: PositionContext, call: ScoreContext) -> torch.Tensor | None:
        """The logit bias ``[(b,) h, s, t]`` float32 of this call, or None."""
        return None

    def score_mod(self, ctx: PositionContext, call: ScoreContext) -> Callable[..., Any] | None:
        """The FlexAttention ``score_mod`` of this call, or None."""
        return None

    def scores(self, call: ScoreContext) -> ScoreFn | None:
        """``scores(q, k)`` of a content-dependent encoding, or None (plain ``q k^T * scale``)."""
        return None

    def values(self, call: ScoreContext) -> ValueFn | None:
        """``values(probs)`` of a content-dependent encoding, or None."""
        return None


class RotaryHook(FamilyHook):
    kind = "rotary"

    def __init__(self, encoding: nn.Module) -> None:
        super().__init__(encoding)
        prepare = getattr(encoding, "prepare", None)
        self._prepare = prepare if callable(prepare) else self._by_forward

    def _by_forward(
        self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.encoding is not None
        return self.encoding(q, k, ctx.positions, k_positions=ctx.k_positions)

    def prepare(
        self, q: torch.Tensor, k: torch.Tensor, ctx: PositionContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self._prepare(q, k, ctx)


class BiasHook(FamilyHook):
    kind = "bias"
    plain_logits = False

    def __init__(self, encoding: nn.Module) -> None:
        super().__init__(encoding)
        self.flex_any_positions = bool(getattr(encoding, "flex_any_positions", True))
        self._encoding: Any = encoding
        # The bias of positions already checked (the context's), where the encoding has one.
        materialized: Any = getattr(encoding, "materialized", None)
        if not callable(materialized) or _overrides(type(encoding), "bias", "materialized"):
            materialized = self._encoding.bias
        self._materialize: Callable[..., torch.Tensor] = materialized

    def _shared(self) -> bool:
        """Whether one product may serve every layer of the forward: always, unless a gradient
        flows into the encoding's weights (a learned shared bias is then made per layer, so
        that its gradient sums over the layers in the order it always has)."""
        return not torch.is_grad_enabled() or not any(
            p.requires_grad for p in self._encoding.parameters()
        )

    def bias(self, ctx: PositionContext, call: ScoreContext) -> torch.Tensor:
        def make() -> torch.Tensor:
            return self._materialize(call.positions, call.k_positions)  # [(b,) h, s, t]

        if not self._shared():
            return make()
        return ctx.product((self._encoding, "bias"), make)

    def score_mod(self, ctx: PositionContext, call: ScoreContext) -> Callable[..., Any]:
        def make() -> Callable[..., Any]:
            return self._encoding.score_mod(
                call.positions, call.k_positions, index_layout=call.index_layout
            )

        if not self._shared():
            return make()
        return ctx.product((self._encoding, "score_mod", call.index_layout), make)


class RelativeHook(FamilyHook):
    kind = "relative"
    plain_logits = False

    def __init__(self, encoding: nn.Module) -> None:
        super().__init__(encoding)
        if not callable(getattr(encoding, "scores", None)):
            raise TypeError(
                f"a relative-family encoding must have scores(q, k, call) (its scaled logits; "
                f"posenc.relative.RelativeEncoding), got {type(encoding).__name__}"
            )
        self._encoding: Any = encoding

    def scores(self, call: ScoreContext) -> ScoreFn:
        def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            return self._encoding.scores(q, k, call)  # [b, h, s, t]

        return scores

    def values(self, call: ScoreContext) -> ValueFn | None:
        values = getattr(self._encoding, "values", None)
        if not callable(values):
            return None

        def term(probs: torch.Tensor) -> torch.Tensor | None:
            return values(probs, call)  # [b, h, s, d] or None

        return term


def _overrides(cls: type, method: str, other: str) -> bool:
    """Whether ``cls`` defines ``method`` below (in a subclass of) the class defining ``other``:
    then ``other`` would bypass it (a ``bias`` overridden above the base's ``materialized``)."""
    mro = cls.__mro__
    owner = next((c for c in mro if method in c.__dict__), object)
    other_owner = next((c for c in mro if other in c.__dict__), object)
    return mro.index(owner) < mro.index(other_owner)


HOOKS: dict[str, type[FamilyHook]] = {
    "none": FamilyHook,
    "rotary": RotaryHook,
    "bias": BiasHook,
    "relative": RelativeHook,
}


def encoding_family(encoding: nn.Module | None, backend: str) -> str:
    """The family of ``encoding`` ("none" for None), checked against the backend."""
    if encoding is not None and not hasattr(encoding, "family"):
        raise TypeError(
            f"encoding must be a posenc encoding with a 'family' attribute (one of "
            f"{ENCODING_FAMILIES}), or None for NoPE; got {type(encoding).__name__}"
        )
    family = getattr(encoding, "family", "none") if encoding is not None else "none"
    if family not in ENCODING_FAMILIES:
        raise ValueError(f"encoding.family must be one of {ENCODING_FAMILIES}, got {family!r}")
    if family == "absolute":
        # Attention would ignore it and run as NoPE: an absolute encoding adds to the tokens.
        raise ValueError(
            f"{type(encoding).__name__} is an absolute encoding: it adds position to the token "
            "embeddings (x = encoding(x, positions)) before the first layer, not inside "
            "attention; TransformerLM applies it there (ModelConfig(encoding=...)). Attention "
            "takes a rotary, bias or relative encoding, or None"
        )
    if family == "relative" and backend in ("sdpa", "flex"):
        raise ValueError(
            f"backend {backend!r} cannot run a relative-family encoding (its position term "
            "depends on the content, so it computes its own scores): use 'auto' or 'explicit'"
        )
    return str(family)


def resolve_hook(encoding: nn.Module | None, backend: str) -> FamilyHook:
    """The hook of ``encoding`` for an Attention with ``backend`` (errors as ``encoding_family``)."""
    family = encoding_family(encoding, backend)
    if encoding is None or family == "none":
        return FamilyHook(encoding)
    return HOOKS[family](encoding)
