"""posenc: Transformer positional encodings, exact to the models that use them, and a lab."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The one place the version is set: pyproject.toml reads it ([tool.setuptools.dynamic]).
__version__ = "0.1.0"

__all__ = ["Attention", "KVCache", "ModelConfig", "TransformerLM", "__version__", "build", "names"]

# The public names load on first use (PEP 562), so that ``import posenc`` (and the CLI's
# ``--help``, ``list`` and argument errors) does not import torch. The families register their
# encodings when imported: the registry imports them before its first lookup.
_LAZY = {
    "Attention": "attention",
    "KVCache": "attention",
    "ModelConfig": "model",
    "TransformerLM": "model",
    "build": "registry",
    "names": "registry",
}

if TYPE_CHECKING:
    from .attention import Attention, KVCache
    from .model import ModelConfig, TransformerLM
    from .registry import build, names


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
