"""Which RoPE backend runs a call: what is available here, why a kernel cannot take an input, and
``backend="auto"``'s choice (memoized per device type and dtype).

The checks that build or import a kernel are constant for the life of the process and marked so
for ``torch.compile`` (:func:`_constant_under_compile`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import torch

from .._checks import check_choice
from .constants import CPU_KERNEL_DTYPES, ROTARY_BACKENDS, TRITON_DTYPES
from .cpu_rope import cpu_kernel_status

F = TypeVar("F", bound=Callable[..., object])


@functools.lru_cache(maxsize=1)
def triton_status() -> str:
    """``""`` when triton imports (the kernel module with it), else why not."""
    try:
        from . import triton_rope  # noqa: F401
    except Exception as e:  # ImportError, or a triton that fails at import on this platform
        return f"triton is not importable ({type(e).__name__}: {e})"
    return ""


def _constant_under_compile(fn: F) -> F:
    """``torch.compiler.assume_constant_result`` without importing ``torch._dynamo`` when posenc
    is imported (that import alone takes about a second): the decorator only sets this mark,
    which Dynamo reads when it meets the function (checked by the tests)."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


# Constant for the life of the process: torch.compile calls these once and keeps the result
# instead of tracing them (building or loading the CPU kernel runs a compiler and ctypes).
@_constant_under_compile
def _cpu_ready() -> bool:
    return cpu_kernel_status() == ""


@_constant_under_compile
def _triton_ready() -> bool:
    return triton_status() == ""


@_constant_under_compile
def _triton_interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """The backends that can run on ``device`` here, fastest first (``"torch"`` always last)."""
    dev = torch.device(device)
    out = []
    if _triton_ready() and (
        dev.type in ("cuda", "xpu") or (dev.type == "cpu" and _triton_interpret())
    ):
        out.append("triton")
    if dev.type == "cpu" and _cpu_ready():
        out.append("cpu")
    return [*out, "torch"]


def _why_not(backend: str, x: torch.Tensor, tables: tuple[torch.Tensor, ...]) -> str:
    """Why ``backend`` cannot run this call ("" when it can)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tables):
        return "cos/sin require grad and the fused kernels give no gradient for them"
    other = [t.dtype for t in tables if t.dtype != torch.float32]
    if other:
        return f"the fused kernels take float32 cos/sin, got {other[0]}"
    if backend == "triton":
        if not _triton_ready():
            return triton_status()
        if not (
            x.device.type in ("cuda", "xpu") or (x.device.type == "cpu" and _triton_interpret())
        ):
            return (
                f"the Triton kernel needs CUDA/XPU tensors (or TRITON_INTERPRET=1), got {x.device}"
            )
        if x.dtype not in TRITON_DTYPES:
            return f"the Triton kernel takes float32, float16 or bfloat16, got {x.dtype}"
    elif backend == "cpu":
        if x.device.type != "cpu":
            return f"the CPU kernel needs CPU tensors, got {x.device}"
        if x.dtype not in CPU_KERNEL_DTYPES:
            return f"the CPU kernel takes float32 or bfloat16, got {x.dtype}"
        if not _cpu_ready():
            return cpu_kernel_status()
    return ""


def select_backend(backend: str, x: torch.Tensor, tables: tuple[torch.Tensor, ...]) -> str:
    """The backend that runs: ``backend`` itself (ValueError if it cannot) or auto's choice."""
    if backend == "auto" and not torch.compiler.is_compiling():
        # Memoized for the common case (float32 tables without grad), which leaves only the
        # input's device and dtype to decide: this runs on every decode step.
        plain = all(t.dtype == torch.float32 and not t.requires_grad for t in tables)
        if plain:
            key = (x.device.type, x.dtype)
            chosen = _AUTO_CHOICE.get(key)
            if chosen is None:
                chosen = _AUTO_CHOICE[key] = _select(backend, x, tables)
            return chosen
    return _select(backend, x, tables)


def mixed_backend(backend: str, q: torch.Tensor, k: torch.Tensor) -> str:
    """``"torch"`` when q and k differ in dtype or device (one fused launch takes one of each;
    the reference rotates each in its own dtype), ``""`` when they agree. A fused backend asked
    for by name cannot run such a call: ValueError."""
    if q.dtype == k.dtype and q.device == k.device:
        return ""
    if backend not in ("auto", "torch"):
        raise ValueError(
            f"backend={backend!r} needs q and k of one dtype and device, got {q.dtype}/{q.device} "
            f"and {k.dtype}/{k.device}; use backend='auto' or 'torch'"
        )
    return "torch"


# (device type, dtype) -> auto's choice for float32 tables that need no gradient.
_AUTO_CHOICE: dict[tuple[str, torch.dtype], str] = {}


def _select(backend: str, x: torch.Tensor, tables: tuple[torch.Tensor, ...]) -> str:
    check_choice("backend", backend, ROTARY_BACKENDS)
    if backend == "torch":
        return "torch"
    if backend != "auto":
        reason = _why_not(backend, x, tables)
        if reason:
            raise ValueError(f"backend={backend!r} cannot run this call: {reason}")
        return backend
    for candidate in ("triton",) if x.device.type in ("cuda", "xpu") else ("cpu",):
        if not _why_not(candidate, x, tables):
            return candidate
    return "torch"
