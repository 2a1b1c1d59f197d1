"""Encodings from the user's own modules.

``posenc lab --import mymod`` (and ``posenc list --import mymod``) imports ``mymod`` first, so
the ``register`` calls it makes add its encodings by name. ``posenc lab -e mymod:myenc`` does
the same for one label (:func:`module_label`): it imports ``mymod`` and runs ``myenc``, a name
``mymod`` registers or an encoding class it defines (registered then by
:func:`posenc.registry.register_encoding_class`).

The colon rule: in a label ``A:B:...``, a ``B`` holding ``=`` is an option of encoding ``A``
(``rope:base=500``); a ``B`` without ``=`` names encoding ``B`` of module ``A``
(``mymod:myenc``, options after it: ``mymod:myenc:scale=2``). ``A:B`` is refused when ``A`` is
a registered encoding (an option missing its ``=``, or a module named like an encoding: use
``--import A -e B``) or is no module name.

Installed packages declare encodings in the ``posenc.encodings`` entry-point group instead
(:func:`posenc.registry.load_entry_points`).
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Iterable

from torch import nn

from . import registry


def import_modules(names: Iterable[str]) -> None:
    """Import each module in ``names``, the current folder searched first as ``python -m``
    does (``mymod.py`` beside you is found by the ``posenc`` command too); ValueError naming
    the module when it cannot be imported (not found, or it raised while importing)."""
    for name in names:
        import_module(name)


def import_module(name: str, option: str = "--import") -> types.ModuleType:
    """Module ``name``, imported (the current folder on ``sys.path``, as :func:`import_modules`
    says); ValueError naming ``option`` and the module when it cannot be
    imported (not a module name, not found, or it raised while importing)."""
    if not is_module_name(name):
        raise ValueError(f"{option} {name!r}: not a module name (give e.g. mypkg.encodings)")
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)  # as python -m: a module beside you (workers inherit sys.path)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        raise ValueError(
            f"{option} {name}: no module named {e.name!r} (is it on PYTHONPATH, or installed?)"
        ) from None
    except Exception as e:  # the user's module raised while importing
        raise ValueError(f"{option} {name}: importing it raised {type(e).__name__}: {e}") from None


def is_module_name(name: str) -> bool:
    """Whether ``name`` is a dotted module path (``mypkg.encodings``)."""
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def is_module_label(label: str) -> bool:
    """Whether ``label`` is ``module:encoding[:key=value...]`` (the part after the first colon
    has no ``=``; module docstring)."""
    _, sep, rest = label.strip().partition(":")
    return bool(sep) and "=" not in rest.partition(":")[0]


def module_label(label: str) -> str:
    """``"mymod:myenc:scale=2"`` -> ``"myenc:scale=2"``, with ``mymod`` imported and ``myenc``
    registered; any other label unchanged. ValueError (one line) for the refused forms of the
    module docstring, a module that cannot be imported, or a ``myenc`` that ``mymod`` neither
    registers nor defines as an encoding class."""
    if not is_module_label(label):
        return label
    text = label.strip()
    module_name, _, rest = text.partition(":")
    attr, sep, options = rest.partition(":")
    if module_name.lower() in registry.names():
        raise ValueError(
            f"-e {text!r}: {module_name!r} is a registered encoding and {attr!r} is no "
            f"key=value option of it; to run encoding {attr!r} of a module named "
            f"{module_name!r}, give --import {module_name} -e {attr}"
        )
    if not is_module_name(module_name) or not attr:
        raise ValueError(
            f"-e {text!r}: give module:encoding (mypkg.encodings:myenc) or "
            "encoding:key=value (rope:base=500)"
        )
    module = import_module(module_name, option="-e")
    return module_encoding(module, attr) + sep + options


def module_encoding(module: types.ModuleType, attr: str) -> str:
    """The registered name of ``attr`` in ``module``: a name registered (by it or before), a
    builder it registered, or an encoding class it defines (registered now)."""
    obj = getattr(module, attr, None)
    name = attr.lower()
    registered = [n for n in registry.names() if registry.entry(n).builder is obj]
    if obj is not None and registered:
        return registered[0]
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        if name in registry.names() and registry.origin(name) == obj.__module__:
            return name  # registered by its module (register_class) under its own name
        return registry.register_encoding_class(obj, name, remember=True)
    if name in registry.names():
        return name
    ours = [n for n in registry.names() if registry.origin(n) == module.__name__]
    raise ValueError(
        f"-e {module.__name__}:{attr}: module {module.__name__} neither registers an encoding "
        f"{attr!r} nor defines an encoding class of that name (it registers: "
        f"{', '.join(ours) or 'none'})"
    )
