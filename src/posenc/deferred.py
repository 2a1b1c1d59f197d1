"""Deferred initialization: build on the meta device, allocate later, initialize in place.

The convention of torch, FSDP2 and torchtitan: a model built under ``torch.device("meta")`` has
shapes but no memory; it is sharded (or not) as it is, given memory by ``to_empty()``, and
filled by ``reset_parameters()``::

    with torch.device("meta"):
        model = TransformerLM(cfg)       # no memory allocated, nothing initialized
    model.to_empty(device="cpu")         # memory, uninitialized
    model.reset_parameters()             # every weight, buffer and frequency set

Every posenc module has ``reset_parameters()``. Each resets what it owns: learned weights (drawn
in the order the constructor draws them, so the same seed gives the same weights as a direct
build), deterministic buffers (recomputed exactly: frequencies, slopes, tables) and the rotary
frequency sets (plain CPU attributes in float64/float32, which ``to_empty`` does not touch and
``.to(dtype)`` never rounds). :class:`~posenc.attention.Attention` and
:class:`~posenc.model.TransformerLM` reset everything inside them, each shared encoding once.

For a model of your own that holds posenc modules, :func:`materialize` does both steps; or call
:func:`reset_submodules`, which calls ``reset_parameters()`` of each submodule once, parents
before children only where the parent does not reset its children itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = ["materialize", "reset_module", "reset_submodules"]


def reset_submodules(module: nn.Module, seen: set[int] | None = None) -> None:
    """Reset every submodule of ``module`` once, in registration order (the order in which a
    direct build draws its random numbers).

    A child with ``reset_parameters()`` is reset by it, which covers that child's own
    submodules; a child without one is walked into. ``seen`` (module ids) carries modules
    already reset across calls, so an encoding shared by several layers is reset once, as it
    was built once. Composite posenc modules (``Attention``, ``TransformerLM``) reset through
    the same walk.
    """
    seen = set() if seen is None else seen
    for child in module.children():
        if id(child) in seen:
            continue
        seen.add(id(child))
        _reset(child, seen)


def _reset(module: nn.Module, seen: set[int]) -> None:
    walk: Callable[[set[int]], None] | None = getattr(module, "_reset_tree", None)
    if walk is not None:  # a composite posenc module: the same walk, sharing ``seen``
        walk(seen)
    elif callable(reset := getattr(module, "reset_parameters", None)):
        reset()
    else:
        reset_submodules(module, seen)


def reset_module(module: nn.Module) -> nn.Module:
    """``module.reset_parameters()`` where it has one, else :func:`reset_submodules`; returns
    ``module``."""
    _reset(module, {id(module)})
    return module


def materialize(module: nn.Module, device: torch.device | str = "cpu") -> nn.Module:
    """``module.to_empty(device=device)``, then :func:`reset_module`: a meta-built module (or
    model) with memory on ``device`` and the values of a direct build. Returns ``module``."""
    module.to_empty(device=device)
    return reset_module(module)
