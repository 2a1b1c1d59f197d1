"""A resolved method put on a loaded model and taken off again: what a study cell, the dry
run's per-layer plan and lm-eval's ``posenc`` model each do before they measure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .names import Resolved, as_transformers


def with_method(model: Any, resolved: Resolved) -> Callable[[], None]:
    """Apply ``resolved`` to ``model`` (``none``: the model as loaded); returns the undo."""
    if resolved.scaling is None and resolved.extension is None:
        return lambda: None
    from ...hf import apply_posenc, remove_posenc

    scaling = as_transformers(resolved.scaling, model.config, resolved.layers)
    apply_posenc(model, scaling=scaling, extension=resolved.extension)

    def undo() -> None:
        remove_posenc(model)

    return undo
