"""Fused rotary embedding of q and k: checks, the ``torch.library`` ops, autograd, dispatch.

:func:`rope_qk` is the entry point. It turns every accepted input form into one canonical form
(``q [b, h, s, d]`` views, float32 tables ``[1 or b, n, r/2]``, int positions ``[1 or b, s]``)
and runs it through one of:

* ``"triton"``: :mod:`posenc.kernels.triton_rope`, q and k in one launch (CUDA/XPU tensors; CPU
  tensors under ``TRITON_INTERPRET=1``, for tests).
* ``"cpu"``: the native kernel of :mod:`posenc.kernels.cpu_rope` (float32 and bfloat16).
* ``"torch"``: :func:`posenc.kernels.reference.rope_qk_reference`, pure PyTorch.

``backend="auto"`` picks triton for GPU tensors, the native kernel for CPU tensors, and torch
whenever the chosen kernel does not apply (dtype, no compiler, no triton, cos/sin that need
gradients). The kernels run inside the custom ops ``posenc::rope_qk`` (out of place, with
autograd) and ``posenc::rope_qk_`` (in place), so ``torch.compile(fullgraph=True)`` keeps them
in the graph as single calls.

Shapes: ``b`` batch, ``h`` query heads, ``hk`` key heads, ``s`` query length, ``t`` key length,
``d`` head_dim, ``r`` rotary_dim, ``n`` table rows, ``total`` packed tokens.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TypeVar

import torch

from .._checks import check_choice, check_device, check_values
from .constants import (
    CPU_KERNEL_DTYPES,
    ROTARY_BACKENDS,
    ROTARY_LAYOUTS,
    SEQ_LAYOUTS,
    TRITON_DTYPES,
)
from .cpu_rope import cpu_kernel_status, rope_cpu_qk
from .reference import RopeArgs, rope_qk_reference

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


# --- the ops ------------------------------------------------------------------------------------


def unit_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a unit stride on its last dim (the kernels' one layout requirement)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _int64_rows(p: torch.Tensor | None) -> torch.Tensor | None:
    if p is None or (p.dtype == torch.int64 and p.is_contiguous()):
        return p
    return p.to(torch.int64).contiguous()


def _launch(
    backend: str, a: RopeArgs, q_out: torch.Tensor, k_out: torch.Tensor, conj: bool
) -> None:
    """Write the rotation of ``a.q``, ``a.k`` into ``q_out``, ``k_out`` (may be them: in place)."""
    if backend == "triton":
        from .triton_rope import rope_qk_triton

        rope_qk_triton(a, q_out, k_out, conj)
    elif backend == "cpu":
        # The native kernel reads contiguous int64 positions.
        pq = _int64_rows(a.positions_q)
        pk = pq if a.positions_k is a.positions_q else _int64_rows(a.positions_k)
        rope_cpu_qk(a._replace(positions_q=pq, positions_k=pk), q_out, k_out, conj)
    else:
        raise ValueError(f"the rope ops run backend 'triton' or 'cpu', got {backend!r}")


# The ops' arguments: RopeArgs' fields, then conj and backend. Written once, for both ops (the
# in-place one marks q and k as mutated).
_OP_ARGS = (
    "Tensor{0} q, Tensor{1} k, Tensor cos_q, Tensor sin_q, Tensor cos_k, Tensor sin_k, "
    "Tensor? positions_q, Tensor? positions_k, SymInt rotary_dim, bool interleaved, bool conj, "
    "str backend"
)


@torch.library.custom_op(
    "posenc::rope_qk", mutates_args=(), schema=f"({_OP_ARGS.format('', '')}) -> (Tensor, Tensor)"
)
def _rope_qk_op(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place rotation of canonical q ``[b, h, s, d]`` and k ``[b, hk, t, d]``."""
    a, conj, backend = _unpack(args)
    a = a._replace(q=unit_last(a.q), k=unit_last(a.k))
    # empty_like keeps a dense input's stride order, so a [b, s, h, d] tensor seen through a
    # transposed [b, h, s, d] view gets a [b, s, h, d]-contiguous output.
    q_out, k_out = torch.empty_like(a.q), torch.empty_like(a.k)
    _launch(backend, a, q_out, k_out, conj)
    return q_out, k_out


def _unpack(args: tuple) -> tuple[RopeArgs, bool, str]:
    """The ops' flat arguments as ``(RopeArgs, conj, backend)``."""
    *fields, conj, backend = args
    return RopeArgs(*fields), conj, backend


@_rope_qk_op.register_fake
def _rope_qk_fake(
    q: torch.Tensor, k: torch.Tensor, *args: object
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = unit_last(q), unit_last(k)
    return torch.empty_like(q), torch.empty_like(k)


def _save(ctx: torch.autograd.function.FunctionCtx, a: RopeArgs, backend: str) -> None:
    """What a backward needs: the tables and rows (saved tensors) and the parameters."""
    ctx.save_for_backward(*a[2:8])  # type: ignore[arg-type]
    ctx.params = (a.rotary_dim, a.interleaved, backend)  # type: ignore[attr-defined]


def _backward(
    ctx: torch.autograd.function.FunctionCtx, gq: torch.Tensor, gk: torch.Tensor, conj: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    # A rotation's Jacobian is the rotation, so grad_x = R(-theta) grad_out: the same kernel
    # with the opposite angles. No gradient flows to cos/sin (the dispatcher routes tables that
    # require grad to the torch path).
    rotary_dim, interleaved, backend = ctx.params  # type: ignore[attr-defined]
    saved = ctx.saved_tensors  # type: ignore[attr-defined]
    return _rope_qk_op(gq, gk, *saved, rotary_dim, interleaved, conj, backend)


def _rope_qk_setup(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: object) -> None:
    a, conj, backend = _unpack(inputs)
    _save(ctx, a, backend)
    ctx.conj = conj  # type: ignore[attr-defined]


def _rope_qk_backward(
    ctx: torch.autograd.function.FunctionCtx,
    grad_q: torch.Tensor | None,
    grad_k: torch.Tensor | None,
) -> tuple[torch.Tensor | None, ...]:
    if grad_q is None or grad_k is None:
        raise RuntimeError("rope_qk backward needs both gradients")  # autograd passes zeros
    return (*_backward(ctx, grad_q, grad_k, not ctx.conj), *(None,) * 10)  # type: ignore[attr-defined]


torch.library.register_autograd("posenc::rope_qk", _rope_qk_backward, setup_context=_rope_qk_setup)


@torch.library.custom_op(
    "posenc::rope_qk_", mutates_args=("q", "k"), schema=f"({_OP_ARGS.format('(a!)', '(b!)')}) -> ()"
)
def _rope_qk_inplace_op(*args: object) -> None:
    """In-place rotation of canonical q and k (checked by :func:`rope_qk`)."""
    a, conj, backend = _unpack(args)
    _launch(backend, a, a.q, a.k, conj)


@_rope_qk_inplace_op.register_fake
def _rope_qk_inplace_fake(*args: object) -> None:
    return None


# --- the entry point ----------------------------------------------------------------------------


def _as_table(name: str, t: torch.Tensor, half: int, b: int, device: torch.device) -> torch.Tensor:
    """A cos/sin table on q's ``device`` as ``[1 or b, n, r/2]``."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t))}"
        )
    check_device(name, t, device, "q")
    if t.dim() == 2:
        t = t.unsqueeze(0)  # [1, n, r/2]
    if t.dim() != 3 or t.shape[-1] != half or t.shape[0] not in (1, b):
        raise ValueError(
            f"{name} must be [n, r/2] or [1 or b={b}, n, r/2] with r/2={half}, got {tuple(t.shape)}"
        )
    return unit_last(t)


def _as_positions(name: str, p: torch.Tensor, b: int, s: int, device: torch.device) -> torch.Tensor:
    """Positions on q's ``device`` as ``[1 or b, s]``."""
    if not isinstance(p, torch.Tensor) or p.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"{name} must be an int32/int64 tensor of table rows, got "
            f"{getattr(p, 'dtype', type(p))}; build positions with torch.arange(..., dtype=torch.long)"
        )
    check_device(name, p, device, "q")
    if p.dim() == 1:
        p = p.unsqueeze(0)  # [1, s]
    if p.dim() != 2 or p.shape[1] != s or p.shape[0] not in (1, b):
        raise ValueError(f"{name} must be [s={s}] or [1 or b={b}, s], got {tuple(p.shape)}")
    return unit_last(p)


def _check_rows(name: str, p: torch.Tensor | None, seq: int, table: torch.Tensor) -> None:
    """Every position indexes a row of its table: checked where reading values is free (eager,
    CPU), as an async device assertion on accelerators, skipped under torch.compile."""
    n = table.shape[1]
    if p is None:
        if n != seq:
            raise ValueError(
                f"without {name}, the table rows are the positions 0..{seq - 1}: expected {seq} "
                f"rows, got {n}; pass {name}= to index a longer table"
            )
        return
    if p.numel():
        check_values(
            (p >= 0) & (p < n),
            lambda: (
                f"{name} must index the table's {n} rows, got values in "
                f"[{int(p.min())}, {int(p.max())}]"
            ),
        )


def _varlen_positions(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Position of each packed token inside its own sequence: ``[total]``.

    ``cu_seqlens = [0, 3, 5]`` -> ``[0 1 2 0 1]``.
    """
    idx = torch.arange(total, device=cu_seqlens.device, dtype=cu_seqlens.dtype)  # [total]
    seq = torch.searchsorted(cu_seqlens[1:], idx, right=True)  # [total] sequence of each token
    return idx - cu_seqlens[seq]  # [total]


def _check_qk(q: torch.Tensor, k: torch.Tensor, seq_layout: str) -> None:
    """q and k are floating-point tensors on one device; ``seq_layout`` is known. (Of different
    dtypes they go to the reference: :func:`mixed_backend`.)"""
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}"
            )
    if q.device != k.device:
        raise TypeError(f"q and k must be on one device, got {q.device} and {k.device}")
    if seq_layout not in SEQ_LAYOUTS:
        raise ValueError(f"seq_layout must be one of {SEQ_LAYOUTS}, got {seq_layout!r}")


def _check_cu_seqlens(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor) -> None:
    """Packed q and k ``[total, h, d]`` and boundaries that rise from 0 to ``total``."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0]:
        raise ValueError(
            "with cu_seqlens, q and k must be packed [total, h, d] with the same total, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (
        torch.int32,
        torch.int64,
    ):
        got = getattr(cu_seqlens, "dtype", type(cu_seqlens).__name__)
        raise TypeError(f"cu_seqlens must be a 1-D int32/int64 tensor, got {got}")
    if cu_seqlens.dim() != 1:
        raise ValueError(
            f"cu_seqlens must be 1-D [num_seqs + 1], got shape {tuple(cu_seqlens.shape)}"
        )
    check_device("cu_seqlens", cu_seqlens, q.device, "q")
    total = q.shape[0]
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries [0, total], got {cu_seqlens}")
    bounds = torch.tensor([0, total], device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    check_values(
        torch.cat(((cu_seqlens[1:] >= cu_seqlens[:-1]), cu_seqlens[[0, -1]] == bounds)),
        lambda: (
            f"cu_seqlens must rise from 0 to total={total} (one entry per sequence "
            f"boundary), got {cu_seqlens.tolist()}"
        ),
    )


_Views = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def _packed_views(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens: torch.Tensor,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
) -> _Views:
    """Packed q, k as one batch row ``[1, h, total, d]``, with positions counted from each
    sequence's start when none are given: ``(q4, k4, positions, k_positions)``."""
    _check_cu_seqlens(q, k, cu_seqlens)
    q4 = q.unsqueeze(0).transpose(1, 2)  # [total, h, d] -> [1, h, total, d]
    k4 = k.unsqueeze(0).transpose(1, 2)  # [1, hk, total, d]
    if positions is None:
        positions = _varlen_positions(cu_seqlens, q.shape[0])  # [total]
        if k_positions is None:
            k_positions = positions  # the same object: q and k share the table rows
    return q4, k4, positions, k_positions


def _bhsd_views(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    seq_layout: str,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
) -> _Views:
    """q ``[b, h, s, d]`` and k ``[b, hk, t, d]`` views of any accepted form, and the positions
    (packed input without positions gets its own): ``(q4, k4, positions, k_positions)``."""
    if cu_seqlens is not None:
        return _packed_views(q, k, cu_seqlens, positions, k_positions)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q and k must be 4-D ({seq_layout}) or packed [total, h, d] with cu_seqlens, got "
            f"{tuple(q.shape)} and {tuple(k.shape)}"
        )
    if seq_layout == "bshd":
        # [b, s, h, d] -> [b, h, s, d] view; k likewise -> [b, hk, t, d]
        return q.transpose(1, 2), k.transpose(1, 2), positions, k_positions
    return q, k, positions, k_positions


_Tables = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _canonical_tables(
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_k: torch.Tensor | None,
    sin_k: torch.Tensor | None,
    rotary_dim: int | None,
    b: int,
    d: int,
    device: torch.device,
) -> _Tables:
    """``(r, cos_q, sin_q, cos_k, sin_k)``, each table ``[1 or b, n, r/2]`` on q's ``device``;
    k's are q's (the same objects) without ``cos_k``/``sin_k``."""
    if not isinstance(cos, torch.Tensor) or cos.dim() == 0:
        raise TypeError(f"cos must be a tensor [n, r/2] or [b, n, r/2], got {type(cos).__name__}")
    r = 2 * cos.shape[-1] if rotary_dim is None else rotary_dim
    if isinstance(r, bool) or not isinstance(r, int) or r % 2 or not 0 < r <= d:
        raise ValueError(f"rotary_dim must be an even integer in [2, head_dim={d}], got {r!r}")
    half, dev = r // 2, device
    cos_q3, sin_q3 = _as_table("cos", cos, half, b, dev), _as_table("sin", sin, half, b, dev)
    if (cos_k is None) != (sin_k is None):
        raise ValueError("give both cos_k and sin_k, or neither")
    if cos_k is None or sin_k is None:
        cos_k3, sin_k3 = cos_q3, sin_q3
    else:
        cos_k3 = _as_table("cos_k", cos_k, half, b, dev)
        sin_k3 = _as_table("sin_k", sin_k, half, b, dev)
    if cos_q3.shape != sin_q3.shape or cos_k3.shape != sin_k3.shape:
        raise ValueError(
            f"cos and sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    return r, cos_q3, sin_q3, cos_k3, sin_k3


def _canonical_positions(
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    own_k_table: bool,
    b: int,
    s: int,
    t: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(pos_q [1 or b, s], pos_k [1 or b, t])`` on q's ``device``, either None for row i =
    position i; pos_k is pos_q (the same object) where k shares q's table and rows."""
    pos_q = None if positions is None else _as_positions("positions", positions, b, s, device)
    if k_positions is not None:
        # The same object as q's (self-attention) lets the kernels share the loaded table rows.
        same = k_positions is positions and not own_k_table
        pos_k = pos_q if same else _as_positions("k_positions", k_positions, b, t, device)
        return pos_q, pos_k
    if own_k_table:
        return pos_q, None  # k's own table, row i = position i
    if t != s:  # k shares q's table and rows: it must cover the same positions
        raise ValueError(
            f"k has {t} positions and q {s}: pass k_positions (rows of the shared table) or "
            "cos_k/sin_k (k's own table)"
        )
    return pos_q, pos_q


def _canonicalize(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cos_k: torch.Tensor | None,
    sin_k: torch.Tensor | None,
    positions: torch.Tensor | None,
    k_positions: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    rotary_dim: int | None,
    seq_layout: str,
    interleaved: bool,
) -> RopeArgs:
    """Check every accepted input form and return the canonical one (module docstring)."""
    _check_qk(q, k, seq_layout)
    q4, k4, positions, k_positions = _bhsd_views(
        q, k, cu_seqlens, seq_layout, positions, k_positions
    )
    b, _, s, d = q4.shape
    if k4.shape[0] != b or k4.shape[3] != d:
        raise ValueError(
            f"q and k must agree on batch and head_dim, got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    t = k4.shape[2]
    dev = q.device
    r, cos_q3, sin_q3, cos_k3, sin_k3 = _canonical_tables(
        cos, sin, cos_k, sin_k, rotary_dim, b, d, dev
    )
    pos_q, pos_k = _canonical_positions(positions, k_positions, cos_k is not None, b, s, t, dev)
    _check_rows("positions", pos_q, s, cos_q3)
    if pos_k is not pos_q or cos_k3 is not cos_q3:
        _check_rows("k_positions", pos_k, t, cos_k3)
    return RopeArgs(q4, k4, cos_q3, sin_q3, cos_k3, sin_k3, pos_q, pos_k, r, interleaved)


def _may_overlap(x: torch.Tensor) -> bool:
    """Whether two indices of ``x`` may share memory. False is proof: with the dims sorted by
    stride, each stride exceeds the span of the dims inside it (every dense or sliced tensor).
    True is reported for stride-0 dims (``expand``) and for layouts that fail this test."""
    span = 0  # elements spanned by the dims placed so far, minus one
    dims = sorted((st, n) for n, st in zip(x.shape, x.stride(), strict=True) if n > 1)
    for stride, size in dims:
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def _check_inplace(q: torch.Tensor, k: torch.Tensor) -> None:
    """In place needs memory where each element of q and k is its own: a unit stride on
    head_dim, no overlap inside a tensor (``expand``), and q and k not the same memory. (Slices
    of one packed qkv tensor are fine; partially overlapping q and k are not detected.)"""
    for name, x in (("q", q), ("k", k)):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(
                f"inplace=True needs {name} contiguous along head_dim (stride 1), got strides "
                f"{tuple(x.stride())}; call .contiguous() first or use inplace=False"
            )
        if _may_overlap(x):
            raise ValueError(
                f"inplace=True needs {name} without overlapping memory (got strides "
                f"{tuple(x.stride())}, e.g. from expand()); writing in place would rotate shared "
                "elements more than once. Use inplace=False"
            )
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        for name, x in (("q", q), ("k", k)):
            base = x._base if x._base is not None else x
            if x.requires_grad and base.is_leaf:
                what = "a leaf tensor" if base is x else "a view of a leaf tensor"
                raise ValueError(
                    f"inplace=True cannot write into {name}: it is {what} that requires grad, "
                    "which autograd forbids to modify; use inplace=False, or rotate a non-leaf "
                    "(e.g. the projection's output) instead"
                )
    same = q is k or (
        not torch.compiler.is_compiling()  # data pointers are not traceable
        and q.numel() > 0
        and k.numel() > 0
        and q.data_ptr() == k.data_ptr()
    )
    if same:
        raise ValueError(
            "inplace=True needs q and k in separate memory, but they start at one address"
        )


def rope_qk_canonical(
    a: RopeArgs, backend: str = "auto", *, inplace: bool = False, checked: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the rotation on inputs already in canonical form, without checking them again.

    For callers that validated their inputs once (:func:`rope_qk`, ``RotaryEmbedding``), in the
    form of :class:`RopeArgs` with: a unit stride on ``d``; float32 tables ``[1 or b, n, r/2]``
    with a unit last stride; integer positions ``[1 or b, s]`` whose values index the tables,
    or None. Returns ``(q', k')`` as ``[b, h, s, d]`` (``q`` and ``k`` themselves when
    ``inplace``). ``checked=True``: ``backend`` is a concrete choice the caller made with
    :func:`select_backend` for these inputs' device and dtype.

    Eager calls that need no gradient launch the kernel directly (the custom op's dispatch costs
    more than a decode step's whole rotation); under torch.compile or autograd the calls go
    through the ``posenc::rope_qk`` ops, which Dynamo keeps in the graph as single nodes.
    ``inplace`` under autograd rotates out of place and copies the result into ``q`` and ``k``
    (:func:`rope_qk` checks first that autograd allows writing into them).
    """
    q, k = a.q, a.k
    chosen = (
        backend if checked else mixed_backend(backend, q, k) or select_backend(backend, q, a[2:6])
    )
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if chosen == "torch":
        q_rot, k_rot = rope_qk_reference(a)
    elif not needs_grad and not torch.compiler.is_compiling():
        q_out, k_out = (q, k) if inplace else (torch.empty_like(q), torch.empty_like(k))
        _launch(chosen, a, q_out, k_out, False)
        return q_out, k_out
    elif inplace and not needs_grad:
        _rope_qk_inplace_op(*a, False, chosen)
        return q, k
    else:
        q_rot, k_rot = _rope_qk_op(*a, False, chosen)
    if not inplace:
        return q_rot, k_rot
    # In place under autograd: the rotation out of place, then copied in. Autograd records the
    # copies, into views too (bshd transposes, slices of a packed qkv), which an autograd
    # Function marking two views dirty cannot do; the rotation's backward needs only the tables.
    q.copy_(q_rot)
    k.copy_(k_rot)
    return q, k


def rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    cos_k: torch.Tensor | None = None,
    sin_k: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    layout: str = "half",
    rotary_dim: int | None = None,
    seq_layout: str = "bhsd",
    inplace: bool = False,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys by their positions' angles (RoPE), in one fused pass.

    Shapes:
        q: ``[b, h, s, d]`` (``seq_layout="bhsd"``, SDPA's), ``[b, s, h, d]`` (``"bshd"``), or
            packed ``[total, h, d]`` with ``cu_seqlens``.
        k: the same form with ``hk`` heads (``h % hk`` need not be 0) and ``t`` positions.
        cos, sin: float tables ``[n, r/2]`` or ``[1 or b, n, r/2]``; float32 for the kernels.
            Without ``positions`` row ``i`` belongs to position ``i`` (``n == s``; for packed
            input, ``i`` counts from each sequence's start). With ``positions``, the rows are
            looked up: ``positions [s]`` or ``[b, s]`` (packed: ``[total]``).
        cos_k, sin_k, k_positions: k's own table and rows, when k's positions differ from q's
            (a KV cache); default q's.
        cu_seqlens: ``[num_seqs + 1]`` int boundaries of packed sequences (``[0, 3, 5]``: tokens
            0..2 and 3..4).

    Args:
        layout: ``"half"`` (NeoX/LLaMA: pairs ``(x[i], x[i + r/2])``) or ``"interleaved"``
            (GPT-J: pairs ``(x[2i], x[2i + 1])``).
        rotary_dim: ``r``, the rotated leading dims (default ``2 * cos.shape[-1]``); dims
            ``r..d-1`` pass through.
        inplace: write into ``q`` and ``k`` (they need a unit stride on ``d`` and no overlapping
            memory) and return them; otherwise neither is modified.
        backend: ``"auto"``, ``"triton"``, ``"cpu"`` or ``"torch"`` (module docstring).

    Returns ``(q', k')`` in the input forms and dtype. The rotation is computed in float32.
    """
    if layout not in ROTARY_LAYOUTS:
        raise ValueError(f"layout must be one of {ROTARY_LAYOUTS}, got {layout!r}")
    a = _canonicalize(
        q, k, cos, sin, cos_k, sin_k, positions, k_positions, cu_seqlens, rotary_dim, seq_layout,
        layout == "interleaved",
    )  # fmt: skip
    if inplace:
        _check_inplace(q, k)
    q_rot, k_rot = rope_qk_canonical(a, backend, inplace=inplace)
    if inplace:
        return q, k
    # Back to the caller's form (views, no copies).
    if cu_seqlens is not None:
        return q_rot.transpose(1, 2).squeeze(0), k_rot.transpose(1, 2).squeeze(0)  # [total, h, d]
    if seq_layout == "bshd":
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)  # [b, s, h, d]
    return q_rot, k_rot
