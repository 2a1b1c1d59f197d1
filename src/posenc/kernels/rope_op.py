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

from collections.abc import Mapping
from typing import Any, TypeVar

import torch

from .backends import available_backends, mixed_backend, select_backend, triton_status
from .canonical import Given, call_key, canonicalize, check_inplace, check_rows, unit_last
from .constants import ROTARY_LAYOUTS
from .cpu_rope import CpuCall, prepare_cpu_qk, rope_cpu_qk
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
        if not inplace and (q.stride(-1) != 1 or k.stride(-1) != 1) and q.shape[-1] > 1:
            # The kernels read d with a unit stride (in place checked that already).
            q, k = unit_last(q), unit_last(k)
            a = a._replace(q=q, k=k)
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


# --- the decode fast path: one plan per call layout -------------------------------------------


class OutsideTable(Exception):
    """A planned call's position lies outside its table (nothing was written): raised by the
    plans of callers that run their own checked path then (:func:`direct_plan`'s
    ``fallback``)."""


class DirectPlan:
    """How to run, without checking again, a call whose layout passed the checks before: an
    eager CPU-kernel call without gradients whose canonical tensors are views of the caller's
    (so their data pointers are the caller's). Keyed by :func:`~.canonical.call_key`.

    ``q_out``/``k_out``: ``(shape, strides)`` of the outputs in the caller's form (what the
    checked path returns); ``rows``: the rows of q's and k's tables that their positions must
    index (0: no positions), which the kernel checks before it writes; ``k_rows``: where k's
    rows come from (0 none, 1 q's positions, 2 k_positions); ``fallback``: a position outside
    the table raises :class:`OutsideTable` (the caller's checked path handles it) instead of
    the checked path's ValueError."""

    __slots__ = (
        "call", "device", "dtype", "fallback", "inplace", "k_out", "k_rows", "like", "q_out",
        "rows", "table_len", "tables",
    )  # fmt: skip

    def __init__(
        self,
        call: CpuCall,
        q_out: tuple[torch.Size, tuple[int, ...]],
        k_out: tuple[torch.Size, tuple[int, ...]],
        dtype: torch.dtype,
        device: torch.device,
        rows: tuple[int, int],
        k_rows: int,
        inplace: bool,
        fallback: bool = False,
    ) -> None:
        self.call, self.q_out, self.k_out, self.dtype, self.device = (
            call,
            q_out,
            k_out,
            dtype,
            device,
        )
        self.rows, self.k_rows, self.inplace, self.fallback = rows, k_rows, inplace, fallback
        self.like = False  # set by _direct_plan where empty_like gives q_out's and k_out's layout
        # For a module keying its own plans: the (cos, sin) table every call of the key reads,
        # and the module's table length it was made for
        self.tables: tuple[torch.Tensor, torch.Tensor] | None = None
        self.table_len = 0

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cos_k: torch.Tensor | None,
        sin_k: torch.Tensor | None,
        positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The call: the outputs (in place: q and k apart) and one foreign call, which checks
        that the positions index the tables before it writes (there reading them is free)."""
        if self.inplace:
            if q.data_ptr() == k.data_ptr():
                check_inplace(q, k)  # raises: q and k start at one address
            q_out, k_out = q, k
        elif self.like:  # what the checked path returns is empty_like's layout
            q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        else:
            q_out = torch.empty_strided(*self.q_out, dtype=self.dtype, device=self.device)
            k_out = torch.empty_strided(*self.k_out, dtype=self.dtype, device=self.device)
        pq = 0 if positions is None else positions.data_ptr()
        pk = (0, pq, 0 if k_positions is None else k_positions.data_ptr())[self.k_rows]
        cq, sq = cos.data_ptr(), sin.data_ptr()
        ck = cq if cos_k is None else cos_k.data_ptr()
        sk = sq if sin_k is None else sin_k.data_ptr()
        if not self.call(q, q_out, cq, sq, pq, k, k_out, ck, sk, pk):
            self._outside(positions, k_positions)
        return q_out, k_out

    def _outside(self, positions: torch.Tensor | None, k_positions: torch.Tensor | None) -> None:
        """A position outside its table: the checked path's error (or :class:`OutsideTable`)."""
        if self.fallback:
            raise OutsideTable
        rows_q, rows_k = self.rows
        if rows_q:
            check_rows("positions", positions, rows_q)  # type: ignore[arg-type]
        if rows_k:  # k's table, through k_positions or q's positions
            check_rows("k_positions", positions if self.k_rows == 1 else k_positions, rows_k)  # type: ignore[arg-type]
        raise AssertionError(
            "the CPU kernel found a position outside its table; the checks did not"
        )


# call_key -> DirectPlan. Bounded: a prefill of every length adds one key per length.
_MAX_PLANS = 512


def direct_plan(
    a: RopeArgs,
    given: Given,
    outs: tuple[torch.Tensor, torch.Tensor],
    fallback: bool = False,
) -> DirectPlan | None:
    """The :class:`DirectPlan` of a call that ran the CPU kernel on ``a`` (checked, no
    gradient, eager) into the canonical ``outs``, for a caller that keys its own plans
    (``RotaryEmbedding``); ``given`` as :func:`_direct_plan`'s. None where no plan applies."""
    return _direct_plan(a, given, outs, outs, False, fallback)


def plan_of(*given: torch.Tensor | None, options: tuple) -> DirectPlan | None:
    """The plan a checked :func:`rope_qk` call with these tensors ``(q, k, cos, sin, cos_k,
    sin_k, positions, k_positions)`` and ``options`` (its other arguments, in
    :func:`rope_qk`'s order from ``rotary_dim``) made, if any: for callers that canonicalize
    their own inputs on top of :func:`rope_qk` (:func:`posenc.hf.apply_rotary_pos_emb`)."""
    if torch.compiler.is_compiling():
        return None
    return lookup(_PLANS, call_key(given, *options))[1]  # type: ignore[arg-type]


def _aliases(canonical: torch.Tensor | None, given: torch.Tensor | None) -> bool:
    """``canonical`` is a view of ``given``'s memory at its start (no copy was made)."""
    if canonical is None or given is None:
        return canonical is None and given is None
    return canonical.data_ptr() == given.data_ptr()


def _direct_plan(
    a: RopeArgs,
    given: Given,
    outs: tuple[torch.Tensor, torch.Tensor],
    canonical_outs: tuple[torch.Tensor, torch.Tensor],
    inplace: bool,
    fallback: bool = False,
) -> DirectPlan | None:
    """The plan of a checked call that ran the CPU kernel directly (None where the kernel read
    a copy of an input: a copy must be made on every call, which the checked path does).

    ``given``: the caller's ``(q, k, cos, sin, cos_k, sin_k, positions, k_positions)``;
    ``fallback``: a position outside the table raises :class:`OutsideTable` (a module that
    then serves it from its checked path: positions past its cached table)."""
    q, k, cos, sin, cos_k, sin_k, positions, k_positions = given
    pq, pk = a.positions_q, a.positions_k
    k_rows = 0 if pk is None else 1 if pk is pq else 2
    pairs = [(a.q, q), (a.k, k), (a.cos_q, cos), (a.sin_q, sin), (pq, positions)]
    pairs += [
        (a.cos_k, cos if cos_k is None else cos_k),
        (a.sin_k, sin if sin_k is None else sin_k),
    ]
    if k_rows == 2:
        pairs.append((pk, k_positions))
    ok = all(_aliases(c, g) for c, g in pairs) and all(
        p is None or (p.dtype == torch.int64 and p.is_contiguous()) for p in (pq, pk)
    )
    if (
        not ok
        or (a.q.stride(-1) != 1 and a.q.shape[-1] > 1)
        or (a.k.stride(-1) != 1 and a.k.shape[-1] > 1)
    ):
        return None
    # The rows each side's positions must index: the kernel checks them before it writes.
    rows = (0 if pq is None else a.cos_q.shape[1], 0 if pk is None else a.cos_k.shape[1])
    plan = DirectPlan(
        prepare_cpu_qk(a, *canonical_outs, rows=rows), (outs[0].shape, outs[0].stride()),
        (outs[1].shape, outs[1].stride()), a.q.dtype, a.q.device, rows, k_rows, inplace, fallback,
    )  # fmt: skip
    # empty_like's layout follows the input's strides alone, so one look decides for the key.
    assert q is not None and k is not None
    plan.like = all(
        torch.empty_like(x).stride() == out.stride() for x, out in ((q, outs[0]), (k, outs[1]))
    )
    return plan


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
    given = (q, k, cos, sin, cos_k, sin_k, positions, k_positions)
    key = None
    if cu_seqlens is None and not torch.compiler.is_compiling():
        # A layout seen before passed every shape check: the kernel checks the values.
        options = (rotary_dim, seq_layout, layout, inplace, backend)
        key, plan = lookup(_PLANS, call_key(given, *options))
        if plan is not None:
            return plan.run(*given)
    return _checked(given, key, cu_seqlens, rotary_dim, seq_layout, layout, inplace, backend)


def _checked(
    given: tuple,
    key: tuple | None,
    cu_seqlens: torch.Tensor | None,
    rotary_dim: int | None,
    seq_layout: str,
    layout: str,
    inplace: bool,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`rope_qk` with every check, keeping its plan under ``key`` where one applies."""
    q, k = given[0], given[1]
    a = canonicalize(given, cu_seqlens, rotary_dim, seq_layout, layout == "interleaved")
    if inplace:
        check_inplace(q, k)  # then the backend, which rope_qk_canonical would choose likewise
    chosen = mixed_backend(backend, q, k) or select_backend(backend, a.q, a[2:6])
    q_rot, k_rot = rope_qk_canonical(a, chosen, inplace=inplace, checked=True)
    outs = _caller_form(q, k, q_rot, k_rot, cu_seqlens, seq_layout, inplace)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if key is not None and chosen == "cpu" and not needs_grad:
        remember(_PLANS, key, _direct_plan(a, given, outs, (q_rot, k_rot), inplace))
    return outs


_T = TypeVar("_T")


class Plans(dict):
    """``call_key -> plan``, remembering its last hit: the layers of a decode step call with one
    layout, and comparing a key with the last one's (equal fields are mostly the same objects)
    costs less than hashing its ~30 fields for the dict."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        super().__init__()
        self.last: tuple | None = None  # (key, plan) of the last hit

    def get(self, key: Any, default: Any = None) -> Any:
        last = self.last
        if last is not None and key == last[0]:
            return last[1]
        plan = dict.get(self, key, default)
        if plan is not None:
            self.last = (key, plan)
        return plan

    def __setitem__(self, key: Any, plan: Any) -> None:
        self.last = None  # it may hold this key's plan before this one
        dict.__setitem__(self, key, plan)

    def clear(self) -> None:
        self.last = None
        super().clear()

    def __reduce__(self) -> tuple:
        # A cache: a copy (deepcopy, pickle of a module) starts empty and plans its own calls
        # (a plan holds a foreign function and the kernel's argument layout of this version).
        return (Plans, ())


_PLANS: dict[tuple, DirectPlan] = Plans()


def lookup(plans: Mapping[tuple, _T], key: tuple | None) -> tuple[tuple | None, _T | None]:
    """``(key, plans[key] or None)``; ``(None, None)`` for a key that cannot be one (None, or
    an unhashable option: the checks will say what is wrong with it)."""
    try:
        return key, plans.get(key) if key is not None else None
    except (TypeError, RuntimeError):  # unhashable; an option whose == is not a bool (a tensor)
        return None, None


def remember(plans: dict[tuple, _T], key: tuple, plan: _T | None, limit: int = _MAX_PLANS) -> None:
    """Keep ``plan`` (if any) under ``key``; a full dict starts again (a prefill of every length
    adds one key per length)."""
    if plan is not None:
        if len(plans) >= limit:
            plans.clear()
        plans[key] = plan


def _caller_form(
    q: torch.Tensor,
    k: torch.Tensor,
    q_rot: torch.Tensor,
    k_rot: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    seq_layout: str,
    inplace: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated ``[b, h, s, d]`` q and k back in the caller's form (views, no copies)."""
    if inplace:
        return q, k
    if cu_seqlens is not None:
        return q_rot.transpose(1, 2).squeeze(0), k_rot.transpose(1, 2).squeeze(0)  # [total, h, d]
    if seq_layout == "bshd":
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)  # [b, s, h, d]
    return q_rot, k_rot
