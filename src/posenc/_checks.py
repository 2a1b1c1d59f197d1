"""Input checks shared by every family. Each error says what was wrong and what is allowed."""

from __future__ import annotations

import torch

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
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


def check_even(name: str, value: int, why: str) -> int:
    check_positive_int(name, value)
    if value % 2:
        raise ValueError(f"{name} must be even for {why}, got {value}")
    return value


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def check_positions(
    positions: object,
    name: str = "positions",
    ranks: tuple[int, ...] | None = None,
    allow_negative: bool = False,
) -> torch.Tensor:
    """Validate an integer position tensor and return it.

    Positions must be integers: float (and above all bf16) positions lose exactness past a few
    hundred and are a known source of silent errors elsewhere.
    """
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"{name} must be an integer torch.Tensor, got {type(positions).__name__}")
    if positions.dtype not in _INT_DTYPES:
        raise TypeError(
            f"{name} must have an integer dtype (int32 or int64), got {positions.dtype}; "
            "build positions with torch.arange(..., dtype=torch.long), never in a float dtype"
        )
    if ranks is not None and positions.dim() not in ranks:
        shapes = " or ".join(f"{r}-D" for r in ranks)
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(positions.shape)}")
    if not allow_negative and positions.numel() and bool((positions < 0).any()):
        raise ValueError(f"{name} must be non-negative, got minimum {int(positions.min())}")
    return positions


def default_positions(seq_len: int, device: torch.device | None, offset: int = 0) -> torch.Tensor:
    """``arange(offset, offset + seq_len)`` as int64: the positions when none are given."""
    return torch.arange(offset, offset + seq_len, device=device, dtype=torch.long)
