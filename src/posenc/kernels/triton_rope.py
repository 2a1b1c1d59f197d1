"""Triton kernel: rotary embedding of q and k in one launch, and its launcher.

This file holds only the kernel and a launcher that checks its inputs; the custom op, autograd
and dispatch are in :mod:`posenc.kernels.rope_op`. Importing it requires triton.

Shapes: ``b`` batch, ``h`` query heads, ``hk`` key heads, ``s`` query length, ``t`` key
length, ``d`` head_dim, ``r`` rotary_dim. ``q [b, h, s, d]`` and ``k [b, hk, t, d]`` come with
any strides except a unit stride on ``d`` (so ``[b, s, h, d]`` storage is a transposed view).

Grid: (position blocks, batch, head groups). A program takes ``BLOCK_S`` positions of one batch
row and ``heads_per_program`` heads of q (the first groups) or of k (the rest): q and k go
through one launch. It loads the cos/sin rows of its positions once and reuses them for each of
its heads. Loads and math are float32 whatever the storage dtype: bf16 keeps 8 significant
bits, so ``x*cos - y*sin`` in bf16 would round three times; here the only rounding is the final
store.
"""

# No `from __future__ import annotations` here: the interpreter (TRITON_INTERPRET=1) of triton
# 3.1, torch 2.5.1's, finds a kernel's constexpr parameters only by the annotation object
# tl.constexpr, not the string "tl.constexpr" (it passed BLOCK_S to tl.arange as an array).
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .canonical import check_kernel_tensor
from .constants import TRITON_DTYPES
from .reference import RopeArgs

# Heads per program once there are enough (position block, batch, head) items to fill a GPU.
HEADS_PER_PROGRAM = 4
MIN_PROGRAMS_TO_GROUP_HEADS = 4096


@triton.jit
def _rotate_side(
    X,
    OUT,
    COS,
    SIN,
    POS,
    b,
    rows,
    seq,
    head0,
    n_heads,
    heads_per_program,
    stride_xb,
    stride_xh,
    stride_xs,
    stride_ob,
    stride_oh,
    stride_os,
    stride_cb,
    stride_cs,
    stride_sb,
    stride_ss,
    stride_pb,
    head_dim,
    HALF: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    CONJ: tl.constexpr,
    HAS_POS: tl.constexpr,
    COPY_TAIL: tl.constexpr,
):
    """One program's share of q or of k: rows ``rows`` (those below ``seq``) of heads ``head0 ..
    head0 + heads_per_program - 1`` (those below ``n_heads``), rotated with the cos/sin rows of
    those positions, loaded once as ``[BLOCK_S, BLOCK_R]`` float32 tiles (sin negated for CONJ)."""
    row_mask = rows < seq
    cols = tl.arange(0, BLOCK_R)
    col_mask = (cols < HALF)[None, :]
    if HAS_POS:
        table_rows = tl.load(POS + b * stride_pb + rows, mask=row_mask, other=0).to(tl.int64)
    else:
        table_rows = rows
    table_mask = row_mask[:, None] & col_mask
    cos = tl.load(
        COS + b * stride_cb + table_rows[:, None] * stride_cs + cols[None, :],
        mask=table_mask,
        other=0.0,
    ).to(tl.float32)
    sin = tl.load(
        SIN + b * stride_sb + table_rows[:, None] * stride_ss + cols[None, :],
        mask=table_mask,
        other=0.0,
    ).to(tl.float32)
    if CONJ:
        sin = -sin
    if INTERLEAVED:
        # pairs (x[2i], x[2i + 1])
        c1 = 2 * cols
        c2 = 2 * cols + 1
    else:
        # pairs (x[i], x[i + r/2])
        c1 = cols
        c2 = cols + HALF
    tcols = 2 * HALF + tl.arange(0, BLOCK_T)
    tcol_mask = (tcols < head_dim)[None, :]
    # Pointers advance by one head per step (pointer arithmetic is 64-bit; a head index times
    # its stride in int32 could overflow on long sequences).
    xp = X + b * stride_xb + head0.to(tl.int64) * stride_xh + rows[:, None] * stride_xs
    op = OUT + b * stride_ob + head0.to(tl.int64) * stride_oh + rows[:, None] * stride_os
    for i in range(heads_per_program):
        # [BLOCK_S, 1]; the head test is broadcast to a vector first (the interpreter rejects
        # a mask combined from a vector and a scalar)
        live = (row_mask & ((tl.zeros_like(rows) + head0 + i) < n_heads))[:, None]
        mask = live & col_mask
        x1 = tl.load(xp + c1[None, :], mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(xp + c2[None, :], mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        tl.store(op + c1[None, :], o1.to(OUT.dtype.element_ty), mask=mask)
        tl.store(op + c2[None, :], o2.to(OUT.dtype.element_ty), mask=mask)
        if COPY_TAIL:
            # partial rotary, out of place: dims r..d-1 are copied through unchanged
            tmask = live & tcol_mask
            tail = tl.load(xp + tcols[None, :], mask=tmask, other=0.0)
            tl.store(op + tcols[None, :], tail, mask=tmask)
        xp += stride_xh
        op += stride_oh


@triton.jit
def _rope_qk_kernel(
    Q,
    K,
    QO,
    KO,
    COS_Q,
    SIN_Q,
    COS_K,
    SIN_K,
    POS_Q,
    POS_K,
    n_heads_q,
    n_heads_k,
    seq_q,
    seq_k,
    heads_per_program,
    q_groups,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qob,
    stride_qoh,
    stride_qos,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kob,
    stride_koh,
    stride_kos,
    stride_cqb,
    stride_cqs,
    stride_sqb,
    stride_sqs,
    stride_ckb,
    stride_cks,
    stride_skb,
    stride_sks,
    stride_pqb,
    stride_pkb,
    head_dim,
    HALF: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    CONJ: tl.constexpr,
    HAS_POS_Q: tl.constexpr,
    HAS_POS_K: tl.constexpr,
    COPY_TAIL: tl.constexpr,
):
    # 64-bit offsets: b * stride overflows int32 past 2**31 elements.
    b = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_S + tl.arange(0, BLOCK_S).to(tl.int64)
    group = tl.program_id(2)
    if group < q_groups:
        _rotate_side(
            Q, QO, COS_Q, SIN_Q, POS_Q, b, rows, seq_q, group * heads_per_program, n_heads_q,
            heads_per_program, stride_qb, stride_qh, stride_qs, stride_qob, stride_qoh, stride_qos,
            stride_cqb, stride_cqs, stride_sqb, stride_sqs, stride_pqb, head_dim,
            HALF, BLOCK_R, BLOCK_T, INTERLEAVED, CONJ, HAS_POS_Q, COPY_TAIL,
        )  # fmt: skip
    else:
        _rotate_side(
            K, KO, COS_K, SIN_K, POS_K, b, rows, seq_k, (group - q_groups) * heads_per_program,
            n_heads_k, heads_per_program, stride_kb, stride_kh, stride_ks, stride_kob, stride_koh,
            stride_kos, stride_ckb, stride_cks, stride_skb, stride_sks, stride_pkb, head_dim,
            HALF, BLOCK_R, BLOCK_T, INTERLEAVED, CONJ, HAS_POS_K, COPY_TAIL,
        )  # fmt: skip


def _check_table(name: str, t: torch.Tensor, b: int, half: int, device: torch.device) -> None:
    if t.dtype != torch.float32 or t.dim() != 3 or t.shape[-1] != half:
        raise ValueError(
            f"{name} must be a float32 table [1 or b, n, r/2={half}], got {t.dtype} "
            f"{tuple(t.shape)}"
        )
    if t.shape[0] not in (1, b) or t.stride(-1) != 1 or t.device != device:
        raise ValueError(
            f"{name} must have batch 1 or {b}, a unit last stride and live on {device}, got "
            f"shape {tuple(t.shape)}, strides {t.stride()}, device {t.device}"
        )


def _check_positions(
    name: str, p: torch.Tensor | None, b: int, s: int, device: torch.device
) -> None:
    if p is None:
        return
    if p.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {p.dtype}")
    if p.dim() != 2:
        raise ValueError(f"{name} must be 2-D [1 or b, s], got shape {tuple(p.shape)}")
    if p.shape[0] not in (1, b) or p.shape[1] != s or p.stride(-1) != 1 or p.device != device:
        raise ValueError(
            f"{name} must be [1 or {b}, {s}] with a unit last stride on {device}, got shape "
            f"{tuple(p.shape)} on {p.device}"
        )


def _bstride(t: torch.Tensor) -> int:
    """Batch stride, 0 for a batch-1 table or position row shared by every batch row."""
    return t.stride(0) if t.shape[0] > 1 else 0


def _check_args(a: RopeArgs, q_out: torch.Tensor, k_out: torch.Tensor) -> None:
    """The launcher's input checks (see :func:`rope_qk_triton` for the shapes)."""
    q, k, cos_q, sin_q, cos_k, sin_k, positions_q, positions_k, rotary_dim, _ = a
    device = q.device
    for name, x in (("q", q), ("k", k), ("q_out", q_out), ("k_out", k_out)):
        check_kernel_tensor(name, x, "Triton kernel", device, TRITON_DTYPES)
    if q_out.shape != q.shape or k_out.shape != k.shape:
        raise ValueError("q_out and k_out must have the shapes of q and k")
    if len({q.dtype, k.dtype, q_out.dtype, k_out.dtype}) != 1:
        raise TypeError(f"q, k and the outputs must share a dtype, got {q.dtype} and {k.dtype}")
    b, _, s, d = q.shape
    bk, _, t, dk = k.shape
    if bk != b or dk != d:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on b and d")
    if rotary_dim % 2 or not 0 < rotary_dim <= d:
        raise ValueError(f"rotary_dim must be even and in [2, head_dim={d}], got {rotary_dim}")
    half = rotary_dim // 2
    for name, tab in (("cos_q", cos_q), ("sin_q", sin_q), ("cos_k", cos_k), ("sin_k", sin_k)):
        _check_table(name, tab, b, half, device)
    _check_positions("positions_q", positions_q, b, s, device)
    _check_positions("positions_k", positions_k, b, t, device)
    if (positions_q is None and cos_q.shape[1] < s) or (positions_k is None and cos_k.shape[1] < t):
        raise ValueError("without positions the tables need a row for every position")


class _Launch(NamedTuple):
    """How the kernel is launched for one call."""

    block_s: int  # positions per program
    block_r: int  # rotated pairs, padded to a power of 2
    block_t: int  # pass-through dims r..d-1, padded to a power of 2
    heads_per_program: int
    q_groups: int  # programs along the head axis that take q's heads (the rest take k's)
    grid: tuple[int, int, int]  # (position blocks, batch, q groups + k groups)


def _geometry(b: int, hq: int, hk: int, s: int, t: int, d: int, rotary_dim: int) -> _Launch:
    """Block sizes and grid for q ``[b, hq, s, d]`` and k ``[b, hk, t, d]``."""
    block_r = triton.next_power_of_2(rotary_dim // 2)
    block_t = triton.next_power_of_2(max(d - rotary_dim, 1))
    # About 2K pairs per head step: 16 per thread at 4 warps.
    block_s = max(1, min(triton.next_power_of_2(max(s, t)), max(1, 2048 // block_r)))
    s_blocks = triton.cdiv(max(s, t), block_s)
    # Heads per program: several, so that each program reuses its cos/sin rows, unless that
    # leaves too few programs to fill a GPU (short sequences, decoding).
    grouped = s_blocks * b * (hq + hk) >= MIN_PROGRAMS_TO_GROUP_HEADS
    heads_per_program = HEADS_PER_PROGRAM if grouped else 1
    q_groups = triton.cdiv(hq, heads_per_program)
    k_groups = triton.cdiv(hk, heads_per_program)
    grid = (s_blocks, b, q_groups + k_groups)
    return _Launch(block_s, block_r, block_t, heads_per_program, q_groups, grid)


def rope_qk_triton(a: RopeArgs, q_out: torch.Tensor, k_out: torch.Tensor, conj: bool) -> None:
    """Write the rotations of ``a.q`` and ``a.k`` into ``q_out`` and ``k_out`` in one launch.

    ``q_out`` may be ``q`` and ``k_out`` may be ``k`` (in place). Shapes (:class:`RopeArgs`):
    ``q, q_out [b, h, s, d]``; ``k, k_out [b, hk, t, d]``; ``cos_q``, ``sin_q [bt, n, r/2]``
    float32 (``bt`` 1 or ``b``), likewise for k; ``positions_q [bp, s]``, ``positions_k [bp,
    t]`` int32/int64 table rows (the caller checks they are in range) or None for row ``i`` =
    position ``i``. ``conj`` rotates by the opposite angles (the backward).
    """
    _check_args(a, q_out, k_out)
    q, k, cos_q, sin_q, cos_k, sin_k, positions_q, positions_k, rotary_dim, interleaved = a
    if q.numel() == 0 and k.numel() == 0:
        return
    b, hq, s, d = q.shape
    _, hk, t, _ = k.shape
    g = _geometry(b, hq, hk, s, t, d, rotary_dim)
    copy_tail = rotary_dim < d and (q_out is not q or k_out is not k)
    dummy = cos_q  # stands in for absent position tensors (never read: HAS_POS is False)
    pq = positions_q if positions_q is not None else dummy
    pk = positions_k if positions_k is not None else dummy
    _rope_qk_kernel[g.grid](
        q, k, q_out, k_out, cos_q, sin_q, cos_k, sin_k, pq, pk,
        hq, hk, s, t, g.heads_per_program, g.q_groups,
        q.stride(0), q.stride(1), q.stride(2),
        q_out.stride(0), q_out.stride(1), q_out.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        k_out.stride(0), k_out.stride(1), k_out.stride(2),
        _bstride(cos_q), cos_q.stride(1), _bstride(sin_q), sin_q.stride(1),
        _bstride(cos_k), cos_k.stride(1), _bstride(sin_k), sin_k.stride(1),
        _bstride(pq) if positions_q is not None else 0,
        _bstride(pk) if positions_k is not None else 0,
        d,
        HALF=rotary_dim // 2,
        BLOCK_S=g.block_s,
        BLOCK_R=g.block_r,
        BLOCK_T=g.block_t,
        INTERLEAVED=interleaved,
        CONJ=conj,
        HAS_POS_Q=positions_q is not None,
        HAS_POS_K=positions_k is not None,
        COPY_TAIL=copy_tail,
        num_warps=4,
    )  # fmt: skip
