"""Input checks shared by every family. Each error says what was wrong and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

# Re-exported: they live in _ints (torch-free, for the registry).
from ._ints import check_int_in as check_int_in
from ._ints import check_positive_int as check_positive_int
from ._ints import resolve_head_dim as resolve_head_dim

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


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
    *,
    device: torch.device | None = None,
    device_of: str = "q",
) -> torch.Tensor:
    """Validate an integer position tensor and return it.

    Positions must be integers: float (and above all bf16) positions lose exactness past a few
    hundred and are a known source of silent errors elsewhere. ``device``: the device the
    positions must be on (that of ``device_of``, named in the error): a kernel handed positions
    (or tables built from them) on another device reads memory that is not there.
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
    if device is not None:
        check_device(name, positions, device, device_of)
    if not allow_negative and positions.numel():
        check_values(
            positions >= 0,
            lambda: f"{name} must be non-negative, got minimum {int(positions.min())}",
        )
    return positions


def check_device(name: str, t: torch.Tensor, device: torch.device, device_of: str) -> None:
    """``t`` is on ``device`` (the device of ``device_of``): a shape-level check, no value read."""
    if t.device != device:
        raise ValueError(f"{name} must be on the device of {device_of} ({device}), got {t.device}")


def host_readable(t: torch.Tensor) -> bool:
    """Whether reading ``t``'s values on the host is free: eager mode and a CPU tensor.

    Anywhere else (CUDA tensors, ``torch.compile``, CUDA-graph capture) a read is a stream stall,
    a graph break or an error, so value checks take :func:`check_values`' other branches.
    """
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def check_values(ok: torch.Tensor, message: Callable[[], str]) -> None:
    """Raise ``ValueError(message())`` unless every element of the bool tensor ``ok`` is true.

    Capture-safe: on CPU in eager mode the check reads ``ok`` (free); on an accelerator in eager
    mode it is ``torch._assert_async`` (no host sync: a failure surfaces as a device-side
    assertion at the next sync, with ``message()`` lost, so the message is computed lazily only
    where it can be raised); under ``torch.compile`` value checks are skipped (a data-dependent
    branch would break the graph), and shape/dtype checks alone stand.
    """
    if host_readable(ok):
        if not bool(ok.all()):
            raise ValueError(message())
    elif not torch.compiler.is_compiling() and not _capturing(ok):
        torch._assert_async(ok.all())


def _capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured (``_assert_async`` is legal there too, but the
    assertion kernel would then be replayed; keeping captured graphs check-free is simpler)."""
    return t.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def default_positions(seq_len: int, device: torch.device | None, offset: int = 0) -> torch.Tensor:
    """``arange(offset, offset + seq_len)`` as int64: the positions when none are given."""
    return torch.arange(offset, offset + seq_len, device=device, dtype=torch.long)


# The largest init_std of a learned table: a normal sample of std 1e38 is past float32 (inf),
# and nothing trains from weights of 1e6.
INIT_STD_MAX = 1e6


def check_number(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float if it is a finite real number within the bounds, else an error naming
    ``name`` and the allowed range (TypeError for a non-number, ValueError for a bad value).

    ``low``/``high`` are inclusive unless ``low_open``/``high_open``. NaN and infinities are never
    allowed: an option that takes them silently turns every output into NaN.
    """
    lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
    hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
    allowed = "a finite number" + (f" {lo}" if lo else "") + (" and" if lo and hi else "")
    allowed += f" {hi}" if hi else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {allowed}, got {value!r} ({type(value).__name__})")
    number = float(value)
    bad = not math.isfinite(number)
    if low is not None:
        bad = bad or (number <= low if low_open else number < low)
    if high is not None:
        bad = bad or (number >= high if high_open else number > high)
    if bad:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return number


def check_int_at_most(name: str, value: object, limit: int, why: str) -> int:
    """A positive integer no larger than ``limit`` (an option that sizes a buffer): the error says
    what would be built."""
    check_positive_int(name, value)
    assert isinstance(value, int)
    if value > limit:
        raise ValueError(f"{name} must be <= {limit} ({why}), got {value}")
    return value
