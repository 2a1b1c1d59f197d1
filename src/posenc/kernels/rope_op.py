"""Fused rotary embedding of q and k: the entry point, the ``torch.library`` ops and autograd.

:func:`rope_qk` is the entry point. It turns every accepted input form into one canonical form
(``q [b, h, s, d]`` views, float32 tables ``[1 or b, n, r/2]``, int positions ``[1 or b, s]``;
the checks are in :mod:`posenc.kernels.canonical`) and runs it through one of the backends that
:mod:`posenc.kernels.backends` chooses from:

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

import torch

from .backends import available_backends, mixed_backend, select_backend, triton_status
from .canonical import canonicalize, check_inplace, unit_last
from .constants import ROTARY_LAYOUTS
from .cpu_rope import rope_cpu_qk
from .reference import RopeArgs, rope_qk_reference

# The backend choice (.backends) and the input checks (.canonical) are importable from here too.
__all__ = [
    "available_backends",
    "mixed_backend",
    "rope_qk",
    "rope_qk_canonical",
    "select_backend",
    "triton_status",
    "unit_last",
]

# --- the ops ------------------------------------------------------------------------------------


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
    a = canonicalize(
        q, k, cos, sin, cos_k, sin_k, positions, k_positions, cu_seqlens, rotary_dim, seq_layout,
        layout == "interleaved",
    )  # fmt: skip
    if inplace:
        check_inplace(q, k)
    q_rot, k_rot = rope_qk_canonical(a, backend, inplace=inplace)
    if inplace:
        return q, k
    # Back to the caller's form (views, no copies).
    if cu_seqlens is not None:
        return q_rot.transpose(1, 2).squeeze(0), k_rot.transpose(1, 2).squeeze(0)  # [total, h, d]
    if seq_layout == "bshd":
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)  # [b, s, h, d]
    return q_rot, k_rot
