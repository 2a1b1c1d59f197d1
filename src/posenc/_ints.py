"""Integer-size checks that need no torch (the registry's :class:`BuildContext` uses them, and
the registry must import without torch: ``posenc --help`` and ``posenc list``)."""

from __future__ import annotations


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_int_in(name: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[low, high]`` (no upper bound when
    ``high`` is None), else a ValueError naming ``name`` and the range."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {allowed}, got {value!r}")
    return value


def resolve_head_dim(dim: int, num_heads: int, head_dim: int | None) -> int:
    """``head_dim`` if given, else ``dim // num_heads`` (which must divide evenly)."""
    if head_dim is None:
        if dim % num_heads:
            raise ValueError(
                f"dim ({dim}) must be divisible by num_heads ({num_heads}), or pass head_dim"
            )
        head_dim = dim // num_heads
    return check_positive_int("head_dim", head_dim)
