"""Copies of a transformers modeling module whose rotation functions are posenc's, and the
picklable per-layer forwards that read them.

An attention class's ``forward`` calls ``apply_rotary_pos_emb`` by its global name. To change
what that name means for one model (not for every model of the class), each patched layer gets a
:class:`PatchedForward`: its class's ``forward`` copied with another globals dict, a *shadow* of
the modeling module in which the rotation functions are posenc's. A shadow is registered in
``sys.modules`` under a fixed name per (modeling module, backend): torch.compile finds the
globals of what it traces by their module's name, and one shadow per pair never piles up. A
:class:`PatchedForward` pickles as ``(layer, model_type, backend)`` and rebuilds its function
on load, so a patched model survives ``copy.deepcopy``, ``pickle`` and ``torch.save``.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

# (modeling module, backend, the stock functions' ids) -> shadow; a changed stock function
# (another transformers patching it) makes a new shadow under the same name.
_SHADOWS: dict[tuple[str, str, tuple[int, ...]], types.ModuleType] = {}
_FORWARDS: dict[tuple[int, type], Any] = {}  # (id of a shadow, attention class) -> forward copy


def shadow_name(modeling: types.ModuleType, backend: str) -> str:
    return f"posenc_shadow__{modeling.__name__.replace('.', '_')}__{backend}"


def shadow_module(
    modeling: types.ModuleType, backend: str, overrides: Mapping[str, Callable[..., Any]]
) -> types.ModuleType:
    """A copy of module ``modeling`` in which the names ``overrides`` resolve differently."""
    key = (modeling.__name__, backend, tuple(id(getattr(modeling, n)) for n in sorted(overrides)))
    shadow = _SHADOWS.get(key)
    if shadow is None:
        name = shadow_name(modeling, backend)
        shadow = types.ModuleType(name, modeling.__doc__)
        skip = ("__name__", "__spec__", "__loader__", "__doc__")
        shadow.__dict__.update({k: v for k, v in vars(modeling).items() if k not in skip})
        shadow.__dict__.update(overrides)
        _SHADOWS[key] = shadow
    sys.modules[shadow.__name__] = shadow
    return shadow


def patched_forward_function(cls: type, shadow: types.ModuleType) -> Any:
    """``cls.forward`` reading its globals from ``shadow`` (one copy per class and shadow)."""
    key = (id(shadow), cls)  # shadows live in _SHADOWS for good: ids are never reused
    fn = _FORWARDS.get(key)
    if fn is None:
        fn = _FORWARDS[key] = with_globals(cls.forward, vars(shadow))  # type: ignore[attr-defined]
    return fn


class PatchedForward:
    """The forward of one patched attention layer: its class's, with posenc's rotation.

    Set as the layer's ``forward`` attribute; called as ``layer.forward(*args, **kwargs)``.
    ``factory(model_type, backend)`` returns the shadow module to read (so that unpickling in a
    new process builds it again).
    """

    def __init__(
        self,
        layer: nn.Module,
        model_type: str,
        backend: str,
        factory: Callable[[str, str], types.ModuleType],
    ) -> None:
        self.layer, self.model_type, self.backend, self.factory = (
            layer,
            model_type,
            backend,
            factory,
        )
        self.fn = patched_forward_function(type(layer), factory(model_type, backend))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(self.layer, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PatchedForward, (self.layer, self.model_type, self.backend, self.factory))

    def __repr__(self) -> str:
        return (
            f"<posenc forward of {type(self.layer).__name__} ({self.model_type}, {self.backend})>"
        )


def with_globals(fn: Any, scope: dict[str, Any]) -> Any:
    """A copy of function ``fn`` that reads its global names from ``scope``.

    Decorated functions (``functools.wraps`` chains, e.g. transformers' ``deprecate_kwarg``)
    are copied wrapper by wrapper: each copy's closure holds the copy of the function it wraps;
    the wrappers keep their own globals.
    """
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        globals_, closure = scope, fn.__closure__
    else:
        new_inner = with_globals(inner, scope)
        cells = list(fn.__closure__ or ())
        held = [i for i, c in enumerate(cells) if _cell(c) is inner]
        if not held:
            raise RuntimeError(f"cannot re-create the decorator around {fn.__qualname__}")
        for i in held:
            cells[i] = types.CellType(new_inner)
        globals_, closure = fn.__globals__, tuple(cells)
    new: Any = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(new, fn, updated=())
    if inner is not None:
        new.__wrapped__ = new_inner
    else:
        del new.__wrapped__
    return new


def _inner(fn: Any) -> Any:
    while getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__wrapped__
    return fn


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def plain_function(obj: Any) -> Any:
    """The Python function behind a modeling module's rotation function.

    With the ``kernels`` package (a dependency of transformers from 5.25), transformers'
    ``@use_kernel_forward_from_hub`` turns a decorated function into an *instance* of a
    ``Func`` module whose ``forward`` calls it (so the hub can swap in a kernel): it has no
    ``__name__`` and its signature is ``(*args, **kwargs)``. Anything else is returned as is.
    """
    if not (isinstance(obj, nn.Module) and hasattr(type(obj), "kernel_layer_name")):
        return obj
    forward = type(obj).forward
    cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or (), strict=True))
    func = _cell(cells["func"]) if "func" in cells else None
    if not callable(func):
        raise RuntimeError(
            f"cannot find the function inside {type(obj).__module__}.{type(obj).__qualname__} "
            "(kernels' wrapper of a transformers function): this kernels version is not "
            "supported by posenc.hf"
        )
    return func


def code_names(fn: Any) -> set[str]:
    """The global names the innermost function of a decorator chain reads."""
    return set(_inner(fn).__code__.co_names)
