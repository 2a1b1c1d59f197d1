"""Build any encoding by name and keyword arguments (used by the model, the CLI and the lab).

The registry is the one answer to "which encodings (which biases, which rotary ones) exist":
consumers ask :func:`names` (``names(family="bias")``) instead of keeping lists. Entries are
registered beside their family, as timm's ``register_model``: each family package registers
its encodings on import (``posenc/absolute/entries.py``, ``posenc/rotary/entries.py``,
``posenc/relative/entries.py``, and each bias in its own module of ``posenc/bias``). The registry
imports the families by name (:data:`BUILTIN_PACKAGES`) at its first use, as it loads entry
points; nothing is imported at module level, so ``import posenc`` and the CLI's help need no
torch.

Each entry is a builder ``f(ctx, **kwargs) -> nn.Module`` where ``ctx`` carries the model's
shape (:class:`BuildContext`); ``kwargs`` are the encoding's own flat options, checked against
the builder's annotations before it runs (a wrong type names the option). ``shared`` says
whether one instance serves every layer (ALiBi, T5's bias, RoPE) or each layer gets its own
(KERPLE, Shaw). Names are case-insensitive; an unknown name gets "did you mean" suggestions.

Installed packages add encodings through the ``posenc.encodings`` entry-point group
(:data:`ENTRY_POINT_GROUP`): each entry point names a module whose import registers them, a
registered builder, or an encoding class (registered under the entry point's name by
:func:`posenc.plugins.register_encoding_class`). They are loaded once, lazily
(:func:`load_entry_points`): by a lookup of a name not registered, by ``posenc list`` and by the
lab; one that fails to load is skipped with one warning naming it.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._ints import check_positive_int, resolve_head_dim

if typing.TYPE_CHECKING:
    from torch import nn

#: Where position enters, in the order :func:`names` lists them (DESIGN.md's table).
FAMILIES = ("none", "absolute", "rotary", "bias", "relative")


@dataclass(frozen=True)
class BuildContext:
    """The model shape an encoding is built for (each size a positive integer)."""

    dim: int
    num_heads: int
    head_dim: int
    max_len: int
    causal: bool = True

    def __post_init__(self) -> None:
        for name in ("dim", "num_heads", "head_dim", "max_len"):
            check_positive_int(name, getattr(self, name))
        if not isinstance(self.causal, bool):
            raise TypeError(f"causal must be a bool, got {self.causal!r}")


Builder = Callable[..., "nn.Module"]


@dataclass(frozen=True)
class EncodingEntry:
    name: str
    family: str
    builder: Builder
    shared: bool
    description: str
    #: Whether the encoding reads the position ids (NoPE does not; CoPE counts its positions
    #: from the content): training-time position methods change nothing for one that does not.
    reads_positions: bool = True


_REGISTRY: dict[str, EncodingEntry] = {}

#: The packages whose import registers posenc's own encodings (each family registers beside
#: itself). They load on the registry's first use, not on ``import posenc``: the CLI's help and
#: ``posenc list`` run without torch (:mod:`posenc.catalog` lists them without importing them).
BUILTIN_PACKAGES = ("posenc.absolute", "posenc.rotary", "posenc.bias", "posenc.relative")

_BUILTINS_LOADED = False


def _load_builtins() -> None:
    """Import the family packages once, before any lookup or registration, so posenc's own
    encodings always come first within their family."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True  # first: the families' own register() calls come back here
    for package in BUILTIN_PACKAGES:
        importlib.import_module(package)


def register(
    name: str,
    family: str,
    *,
    shared: bool = True,
    description: str = "",
    reads_positions: bool = True,
) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to the registry under ``name`` (lower case).

    >>> @register("my-bias", "bias", description="...")  # doctest: +SKIP
    ... def _build(ctx: BuildContext, *, scale: float = 1.0) -> nn.Module:
    ...     return MyBias(ctx.num_heads, scale=scale)
    """
    _load_builtins()
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if name != name.lower():
        raise ValueError(f"encoding names are lower case, got {name!r}")

    def deco(fn: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"encoding {name!r} is already registered")
        _REGISTRY[name] = EncodingEntry(name, family, fn, shared, description, reads_positions)
        return fn

    return deco


def register_class(
    name: str,
    family: str,
    cls: type[nn.Module],
    *,
    args: Callable[[BuildContext], tuple[Any, ...]],
    options: tuple[str, ...],
    **kwargs: Any,
) -> Builder:
    """Register ``cls`` built as ``cls(*args(ctx), **opts)``, its options ``options`` with
    their defaults and types read from ``cls.__init__`` (stated once, in the class). For an
    encoding whose options need the model's shape (a default from ``ctx``), write the builder
    and use :func:`register`. ``kwargs`` go to :func:`register`."""
    params = inspect.signature(cls.__init__).parameters
    missing = [o for o in options if o not in params]
    if missing:
        raise ValueError(f"{cls.__name__}.__init__ takes no option(s) {missing}")
    hints = typing.get_type_hints(cls.__init__)

    def builder(ctx: BuildContext, **opts: Any) -> nn.Module:
        return cls(*args(ctx), **opts)

    ctx_param = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    kw = [params[o].replace(kind=inspect.Parameter.KEYWORD_ONLY) for o in options]
    builder.__signature__ = inspect.Signature([ctx_param, *kw])  # type: ignore[attr-defined]
    builder.__annotations__ = {o: hints[o] for o in options if o in hints}
    builder.__name__ = builder.__qualname__ = f"_build_{name.replace('-', '_')}"
    builder.__module__ = cls.__module__  # the code that defines it (posenc.lab.cells.identity)
    return register(name, family, **kwargs)(builder)


#: The model shape a class registered by :func:`register_encoding_class` may take, by name.
SHAPE_ARGS = ("dim", "num_heads", "head_dim", "max_len", "causal")


def register_encoding_class(
    cls: type[nn.Module], name: str | None = None, *, remember: bool = False
) -> str:
    """Register encoding class ``cls`` under ``name`` (default: its class name, lower case),
    its family its ``family`` attribute, and return the name. ``__init__``'s leading
    parameters named as the model's shape (:data:`SHAPE_ARGS`: ``num_heads``, ``head_dim``,
    ...) are filled from it; every other parameter, each with a default, is an option. A
    ``cls`` registered already (by this function) returns its name.

    ``remember``: also for a fresh process of this program (the lab's worker processes), which
    imports ``cls``'s module but would not register it there: the registration is written to
    :data:`CLASSES_ENV`, which such a process inherits, and :func:`entry` reads it."""
    known = [
        e.name for e in _REGISTRY.values() if getattr(e.builder, "encoding_class", None) is cls
    ]
    if known:
        return known[0]
    name = name or cls.__name__.lower()
    family = getattr(cls, "family", None)
    if family not in FAMILIES:
        raise ValueError(
            f"{cls.__name__} has family {family!r}; an encoding class sets family to one of "
            f"{', '.join(FAMILIES)}"
        )
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    shape = [p.name for p in params if p.name in SHAPE_ARGS]
    if [p.name for p in params[: len(shape)]] != shape:
        raise ValueError(
            f"{cls.__name__}.__init__: the model's shape ({', '.join(shape)}) must come first"
        )
    rest = [p for p in params[len(shape) :] if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    needed = [p.name for p in rest if p.default is inspect.Parameter.empty]
    if needed:
        raise ValueError(
            f"{cls.__name__}.__init__ needs {needed}, neither the model's shape "
            f"({', '.join(SHAPE_ARGS)}) nor an option with a default; register a builder "
            "with posenc.registry.register instead"
        )
    builder = register_class(
        name, family, cls, args=lambda ctx: tuple(getattr(ctx, a) for a in shape),
        options=tuple(p.name for p in rest), description=_first_line(cls.__doc__),
    )  # fmt: skip
    builder.encoding_class = cls  # type: ignore[attr-defined]
    if remember and cls.__module__ not in ("__main__", "__mp_main__"):
        _remembered()[name] = f"{cls.__module__}:{cls.__qualname__}"
        _write_remembered()
    return name


#: Classes registered by name outside their module (``posenc lab -e mymod:MyEnc``), as
#: ``name=module:qualname`` pairs, comma-separated (:func:`register_encoding_class`).
CLASSES_ENV = "POSENC_ENCODING_CLASSES"


def _remembered() -> dict[str, str]:
    global _REMEMBERED
    if _REMEMBERED is None:
        pairs = [p.partition("=") for p in os.environ.get(CLASSES_ENV, "").split(",") if p]
        _REMEMBERED = {name: where for name, _, where in pairs}
    return _REMEMBERED


def _write_remembered() -> None:
    text = ",".join(f"{k}={v}" for k, v in _remembered().items())
    if text:
        os.environ[CLASSES_ENV] = text
    else:
        os.environ.pop(CLASSES_ENV, None)


def _register_remembered(key: str) -> bool:
    """Register ``key`` from :data:`CLASSES_ENV` if it is there; False if not (or it fails:
    the lookup then says the name is unknown)."""
    where = _remembered().get(key)
    if where is None:
        return False
    module, _, qualname = where.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        register_encoding_class(obj, key)
    except Exception:
        return False
    return True


_REMEMBERED: dict[str, str] | None = None


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().split("\n", 1)[0]


#: The entry-point group of installed packages' encodings (``pyproject.toml``:
#: ``[project.entry-points."posenc.encodings"]``, ``myenc = "mypkg.encodings:MyEnc"``).
ENTRY_POINT_GROUP = "posenc.encodings"

#: Name -> where an encoding that did not come with posenc came from (``posenc list``).
ORIGINS: dict[str, str] = {}

_ENTRY_POINTS_LOADED = False


class PluginWarning(UserWarning):
    """An entry point of :data:`ENTRY_POINT_GROUP` that could not be loaded (it is skipped)."""


def load_entry_points() -> list[str]:
    """Load the :data:`ENTRY_POINT_GROUP` entry points (once per process) and return the
    names they registered. One that fails to load, or that names no encoding, is skipped with
    one :class:`PluginWarning` naming it and its package."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return []
    _ENTRY_POINTS_LOADED = True
    _load_builtins()
    from importlib.metadata import entry_points

    added: list[str] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "an installed package"
        where = f"entry point {ep.name} = {ep.value} ({dist})"
        before = set(_REGISTRY)
        try:
            _add_entry_point(ep.name, ep.load())
        except Exception as e:  # the package's code raised: skip it, say which
            warnings.warn(
                f"{ENTRY_POINT_GROUP} {where} not loaded: {type(e).__name__}: {e}",
                PluginWarning,
                stacklevel=2,
            )
            continue
        for name in [n for n in _REGISTRY if n not in before]:
            ORIGINS[name] = where
            added.append(name)
    return added


def _add_entry_point(name: str, obj: object) -> None:
    """Register what entry point ``name`` loaded: a module (its import registered it), a
    registered builder, or an encoding class (registered under ``name``)."""
    if isinstance(obj, types.ModuleType) or any(e.builder is obj for e in _REGISTRY.values()):
        return
    from torch import nn

    if isinstance(obj, type) and issubclass(obj, nn.Module):
        register_encoding_class(obj, name.strip().lower())
        return
    raise TypeError(
        f"{obj!r} is no module, registered builder or encoding class (an nn.Module subclass "
        "with a family)"
    )


def origin(name: str) -> str:
    """Where encoding ``name`` came from: ``"posenc"``, the module that registered it, or the
    entry point that loaded it."""
    e = entry(name)
    if e.name in ORIGINS:
        return ORIGINS[e.name]
    module = getattr(e.builder, "__module__", None) or "?"
    return "posenc" if module == "posenc" or module.startswith("posenc.") else module


def unregister(name: str) -> None:
    """Remove encoding ``name`` (registered by :func:`register`); KeyError if it is not there."""
    key = name.strip().lower()
    _load_builtins()
    if key not in _REGISTRY:
        raise KeyError(f"encoding {name!r} is not registered")
    del _REGISTRY[key]
    ORIGINS.pop(key, None)
    if _remembered().pop(key, None) is not None:
        _write_remembered()


def names(family: str | None = None) -> list[str]:
    """Registered encoding names, optionally of one family: family by family in
    :data:`FAMILIES` order, each family's in registration order."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    _load_builtins()
    entries = sorted(_REGISTRY.values(), key=lambda e: FAMILIES.index(e.family))  # stable
    return [e.name for e in entries if family is None or e.family == family]


def suggest(name: str, choices: list[str] | None = None) -> str:
    """``" (did you mean 'rope'?)"`` for a near miss of a registered name, else ``""``."""
    close = difflib.get_close_matches(name.lower(), choices or names(), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def entry(name: str) -> EncodingEntry:
    """The entry of ``name`` (any case); ValueError naming the registered ones otherwise."""
    if not isinstance(name, str):
        raise TypeError(f"encoding name must be a str, got {type(name).__name__}")
    key = name.strip().lower()
    _load_builtins()
    if key not in _REGISTRY and not _register_remembered(key):
        load_entry_points()  # once per process: an installed package may declare it
    if key not in _REGISTRY:
        raise ValueError(
            f"unknown encoding {name!r}{suggest(key)}; registered: {', '.join(names())}"
        )
    return _REGISTRY[key]


def options(name: str) -> dict[str, Any]:
    """The keyword options of an encoding and their defaults."""
    sig = inspect.signature(entry(name).builder)
    return {
        p.name: p.default
        for p in list(sig.parameters.values())[1:]
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }


def _hints(fn: Builder) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that does not evaluate: no type checks for this builder
        return {}


def _matches(value: object, hint: Any) -> bool:
    """Whether ``value`` fits the annotation ``hint`` (the types options take: JSON's)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return any(_matches(value, h) for h in args)
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        numeric = (int,) if hint is int else (int, float)
        return isinstance(value, numeric) and not isinstance(value, bool)
    if origin in (list, tuple) or hint in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value if args)
    if origin is dict or hint is dict:
        return isinstance(value, Mapping)
    return not isinstance(hint, type) or isinstance(value, hint)


def _describe(hint: Any) -> str:
    """``int | None`` -> ``"int or None"``; ``list[int]`` -> ``"a list of int"``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " or ".join(_describe(h) for h in args)
    if hint is type(None):
        return "None"
    if origin in (list, tuple):
        return f"a list of {_describe(args[0])}" if args else "a list"
    if origin is dict:
        return "a dict"
    return getattr(hint, "__name__", str(hint))


def check_options(name: str, kwargs: Mapping[str, Any]) -> None:
    """Raise TypeError for an option ``name`` does not take or a value of the wrong type."""
    e = entry(name)
    allowed = options(e.name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise TypeError(
            f"unknown option(s) {unknown} for encoding {e.name!r}{suggest(unknown[0], list(allowed))}; "
            f"allowed: {sorted(allowed) or 'none'}"
        )
    hints = _hints(e.builder)
    for key, value in kwargs.items():
        if key in hints and not _matches(value, hints[key]):
            raise TypeError(
                f"option {key!r} of encoding {e.name!r} must be {_describe(hints[key])}, "
                f"got {value!r} ({type(value).__name__})"
            )


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
    check_options(e.name, kwargs)
    check_positive_int("dim", dim)
    check_positive_int("num_heads", num_heads)
    head_dim = resolve_head_dim(dim, num_heads, head_dim)
    ctx = BuildContext(
        dim=dim, num_heads=num_heads, head_dim=head_dim, max_len=max_len, causal=causal
    )
    module = e.builder(ctx, **kwargs)
    family = getattr(module, "family", None)
    if family != e.family:
        raise RuntimeError(
            f"builder for {e.name!r} returned family {family!r}, expected {e.family!r}"
        )
    return module
