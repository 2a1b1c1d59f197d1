"""Build any encoding by name and keyword arguments (used by the model, the CLI and the lab).

Each entry is a builder ``f(ctx, **kwargs) -> nn.Module`` where ``ctx`` carries the model's
shape (:class:`BuildContext`); ``kwargs`` are the encoding's own flat options. ``shared`` says
whether one instance serves every layer (ALiBi, T5's bias, RoPE) or each layer gets its own
(KERPLE, Shaw).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ._checks import resolve_head_dim
from .attention import ENCODING_FAMILIES


@dataclass(frozen=True)
class BuildContext:
    """The model shape an encoding is built for."""

    dim: int
    num_heads: int
    head_dim: int
    max_len: int
    causal: bool = True


Builder = Callable[..., nn.Module]


@dataclass(frozen=True)
class EncodingEntry:
    name: str
    family: str
    builder: Builder
    shared: bool
    description: str


_REGISTRY: dict[str, EncodingEntry] = {}


def register(
    name: str, family: str, *, shared: bool = True, description: str = ""
) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to the registry under ``name``."""
    if family not in ENCODING_FAMILIES:
        raise ValueError(f"family must be one of {ENCODING_FAMILIES}, got {family!r}")

    def deco(fn: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"encoding {name!r} is already registered")
        _REGISTRY[name] = EncodingEntry(name, family, fn, shared, description)
        return fn

    return deco


def _load() -> None:
    # The entries live beside their families (``posenc/<family>/entries.py``); importing the
    # package registers them.
    from . import entries  # noqa: F401


def names(family: str | None = None) -> list[str]:
    """Registered encoding names, optionally of one family, in registration order."""
    _load()
    return [n for n, e in _REGISTRY.items() if family is None or e.family == family]


def entry(name: str) -> EncodingEntry:
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"unknown encoding {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def options(name: str) -> dict[str, Any]:
    """The keyword options of an encoding and their defaults."""
    sig = inspect.signature(entry(name).builder)
    return {
        p.name: p.default
        for p in list(sig.parameters.values())[1:]
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def build(
    name: str,
    *,
    dim: int,
    num_heads: int = 1,
    head_dim: int | None = None,
    max_len: int = 2048,
    causal: bool = True,
    **kwargs: Any,
) -> nn.Module:
    """Build encoding ``name`` for a model of this shape; ``kwargs`` are its own options.

    >>> from posenc.registry import build
    >>> build("sinusoidal", dim=64).family
    'absolute'
    """
    e = entry(name)
    allowed = options(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"unknown option(s) {unknown} for encoding {name!r}; allowed: {sorted(allowed) or 'none'}"
        )
    head_dim = resolve_head_dim(dim, num_heads, head_dim)
    ctx = BuildContext(
        dim=dim, num_heads=num_heads, head_dim=head_dim, max_len=max_len, causal=causal
    )
    module = e.builder(ctx, **kwargs)
    family = getattr(module, "family", None)
    if family != e.family:
        raise RuntimeError(
            f"builder for {name!r} returned family {family!r}, expected {e.family!r}"
        )
    return module
