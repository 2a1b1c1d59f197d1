"""Pure-PyTorch rotary embedding: the one reference rotation. Every fused kernel in
:mod:`posenc.kernels` is tested against it, ``backend="torch"`` runs it, and
:func:`posenc.functional.apply_rotary` is it with its inputs checked.

Shapes: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d`` head_dim, ``r`` rotary_dim
(``r <= d``, even), ``n`` table rows. Tables ``cos``, ``sin`` hold ``r/2`` angles per position.

The two layouts pair the rotated dims differently (``c_i``, ``s_i`` the cos and sin of angle
``i``)::

    half        (NeoX/LLaMA)  pairs (x[i], x[i + r/2]):
                [x0 x1 | x2 x3] -> [x0 c0 - x2 s0, x1 c1 - x3 s1 | x2 c0 + x0 s0, x3 c1 + x1 s1]
    interleaved (GPT-J)       pairs (x[2i], x[2i + 1]):
                [x0 x1 x2 x3]   -> [x0 c0 - x1 s0, x1 c0 + x0 s0, x2 c1 - x3 s1, x3 c1 + x2 s1]

Dims ``r..d-1`` (partial rotary) are passed through untouched. ``x c - y s`` is rounded as
transformers' ``q * cos + rotate_half(q) * sin`` rounds it (two products, one sum; negation is
exact), so float32 results are bit-identical to theirs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class RopeArgs(NamedTuple):
    """One rotation of q and k in the kernels' canonical form (``rope_op.rope_qk`` builds it,
    after its checks). Fields in the order of the ``posenc::rope_qk`` ops' arguments.

    ``q [b, h, s, d]``, ``k [b, hk, t, d]`` (any strides; the fused kernels need a unit stride on
    ``d``); ``cos_q``, ``sin_q [bt, n, r/2]`` float32 (``bt`` 1 or ``b``; the reference also
    takes ``[n, r/2]``), likewise ``cos_k``, ``sin_k``; ``positions_q [bp, s]``, ``positions_k
    [bp', t]`` integer rows of the tables, or None (row ``i`` is position ``i``).
    """

    q: torch.Tensor
    k: torch.Tensor
    cos_q: torch.Tensor
    sin_q: torch.Tensor
    cos_k: torch.Tensor
    sin_k: torch.Tensor
    positions_q: torch.Tensor | None
    positions_k: torch.Tensor | None
    rotary_dim: int
    interleaved: bool


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x0 x1 x2 x3] -> [-x2 -x3 x0 x1]`` over the last dim (even length)."""
    x1, x2 = x.chunk(2, dim=-1)  # [..., r/2] each
    return torch.cat((-x2, x1), dim=-1)  # [..., r]


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """``[x0 x1 x2 x3] -> [-x1 x0 -x3 x2]`` over the last dim (even length)."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., r/2, 2]
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # [..., r]


def apply_rotary_reference(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    rotary_dim: int | None = None,
    conj: bool = False,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` (default ``2 * cos.shape[-1]``) dims of ``x`` by the
    angles whose cos/sin are given. Inputs are not checked (see ``functional.apply_rotary``).

    Shapes: ``x [..., d]``; ``cos``, ``sin [..., r/2]`` broadcastable against ``x[..., :r/2]``
    (e.g. ``[s, r/2]`` for ``x [b, h, s, d]``, or ``[b, 1, s, r/2]``). Returns a new tensor of
    ``x``'s shape and dtype.

    ``conj=True`` rotates by the opposite angles (``sin -> -sin``): the inverse rotation, which is
    also the backward of the forward one (a rotation's Jacobian is the rotation itself, so
    ``grad_x = R(-theta) grad_out``).

    The math runs in float32 (float64 if ``x`` or the tables are float64): a bf16 product keeps
    8 significant bits, so ``x c - y s`` in bf16 would round three times; in float32 the only
    bf16 rounding is the final cast.
    """
    r = 2 * cos.shape[-1] if rotary_dim is None else rotary_dim
    math_dtype = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    c, s = cos.to(math_dtype), sin.to(math_dtype)  # [..., r/2]
    if conj:
        s = -s
    rot = x[..., :r].to(math_dtype)  # [..., r]
    if layout == "half":
        x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]  # [..., r/2] each: [x0 x1 | x2 x3]
        # [x0 x1 | x2 x3] -> [x0 c0 - x2 s0, x1 c1 - x3 s1 | x2 c0 + x0 s0, x3 c1 + x1 s1]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)  # [..., r]
    else:
        pairs = rot.unflatten(-1, (r // 2, 2))  # [..., r/2, 2]: (x0 x1) (x2 x3)
        x1, x2 = pairs[..., 0], pairs[..., 1]  # [..., r/2]: x0 x2 / x1 x3
        # [x0 x1 x2 x3] -> [x0 c0 - x1 s0, x1 c0 + x0 s0, x2 c1 - x3 s1, x3 c1 + x2 s1]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)  # [..., r]
    out = out.to(x.dtype)
    if r == x.shape[-1]:
        return out
    return torch.cat((out, x[..., r:]), dim=-1)  # [..., d]: rotated head, untouched tail


def gather_rows(table: torch.Tensor, positions: torch.Tensor | None, seq_len: int) -> torch.Tensor:
    """The per-position rows of a cos or sin table, ready to broadcast against ``[b, h, s, r/2]``.

    Shapes: ``table [n, r/2]`` or ``[bt, n, r/2]`` (``bt`` 1 or ``b``); ``positions [s]`` or
    ``[bp, s]`` (``bp`` 1 or ``b``) indexing the table's rows, or None to take rows ``0..s-1``.
    Returns ``[s, r/2]`` (2-D table and 1-D or no positions) or ``[b', 1, s, r/2]``.
    The one gather of the RoPE stack; the fused kernels do the same lookup in-kernel.
    """
    if table.dim() == 2:
        rows = table[:seq_len] if positions is None else table[positions]  # [s|bp, (s), r/2]
    elif positions is None:
        rows = table[:, :seq_len]  # [bt, s, r/2]
    else:
        batch = torch.arange(table.shape[0], device=table.device)[:, None]  # [bt, 1]
        rows = table[batch, positions]  # [max(bt, bp), s, r/2]
    return rows if rows.dim() == 2 else rows.unsqueeze(1)  # [s, r/2] or [b', 1, s, r/2]


def rope_qk_reference(a: RopeArgs, conj: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The operation the fused kernels implement, on their canonical (already checked) inputs
    (:class:`RopeArgs`). Returns new ``(q', k')``; ``conj`` rotates by the opposite angles."""
    layout = "interleaved" if a.interleaved else "half"
    s, t = a.q.shape[2], a.k.shape[2]
    cq = gather_rows(a.cos_q, a.positions_q, s)  # [s, r/2] or [b', 1, s, r/2]
    sq = gather_rows(a.sin_q, a.positions_q, s)
    if a.cos_k is a.cos_q and a.sin_k is a.sin_q and a.positions_k is a.positions_q and t == s:
        ck, sk = cq, sq  # self-attention without a cache: k's rows are q's
    else:
        ck = gather_rows(a.cos_k, a.positions_k, t)  # [t, r/2] or [b', 1, t, r/2]
        sk = gather_rows(a.sin_k, a.positions_k, t)
    return (
        apply_rotary_reference(a.q, cq, sq, layout, a.rotary_dim, conj),
        apply_rotary_reference(a.k, ck, sk, layout, a.rotary_dim, conj),
    )
