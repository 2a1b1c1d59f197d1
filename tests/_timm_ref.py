"""Load timm's own layer files (``pos_embed``, ``pos_embed_sincos``) without importing the timm
package: its ``__init__`` imports torchvision, whose PyPI build is a CUDA one that does not load
beside a CPU torch. Only real timm files are executed; the two package entries are bare shells."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types


def _timm_root() -> str | None:
    mod = sys.modules.get("timm")
    if mod is not None and getattr(mod, "__path__", None):
        return str(next(iter(mod.__path__)))
    spec = importlib.util.find_spec("timm")
    return None if spec is None or spec.origin is None else os.path.dirname(spec.origin)


def timm_module(name: str) -> types.ModuleType | None:
    root = _timm_root()
    if root is None:
        return None
    for pkg, path in (("timm", root), ("timm.layers", os.path.join(root, "layers"))):
        if pkg not in sys.modules:
            shell = types.ModuleType(pkg)
            shell.__path__ = [path]
            sys.modules[pkg] = shell
    try:
        return importlib.import_module(f"timm.layers.{name}")
    except ImportError:
        return None
