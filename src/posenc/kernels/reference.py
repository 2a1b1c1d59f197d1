"""Pure-PyTorch rotary embedding: the reference every fused kernel in :mod:`posenc.kernels` is
tested against, and the ``backend="torch"`` path.

Shapes: ``b`` batch, ``h`` heads, ``s`` sequence length, ``d`` head_dim, ``r`` rotary_dim
(``r <= d``, even). Tables ``cos``, ``sin`` hold ``r/2`` angles per position.

The two layouts pair the rotated dims differently (``c``, ``s`` for one angle each)::

    half        (NeoX/LLaMA)  pairs (x[i], x[i + r/2]):
                [x0 x1 | x2 x3] -> [x0 c0 - x2 s0, x1 c1 - x3 s1 | x2 c0 + x0 s0, x3 c1 + x1 s1]
    interleaved (GPT-J)       pairs (x[2i], x[2i + 1]):
                [x0 x1 x2 x3]   -> [x0 c0 - x1 s0, x1 c0 + x0 s0, x2 c1 - x3 s1, x3 c1 + x2 s1]

Dims ``r..d-1`` (partial rotary) are passed through untouched.
"""

from __future__ import annotations

import torch

ROPE_LAYOUTS = ("half", "interleaved")


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
    angles whose cos/sin are given.

    Shapes: ``x [..., d]``; ``cos``, ``sin [..., r/2]`` broadcastable against ``x[..., :r/2]``
    (e.g. ``[s, r/2]`` for ``x [b, h, s, d]``, or ``[b, 1, s, r/2]``). Returns ``x``'s shape
    and dtype.

    ``conj=True`` rotates by the opposite angles (``sin -> -sin``): the inverse rotation, which is
    also the backward of the forward one (a rotation's Jacobian is the rotation itself, so
    ``grad_x = R(-theta) grad_out``).

    The math runs in float32 (float64 if ``x`` or the tables are float64): a bf16 product keeps
    8 significant bits, so ``x*cos + rotate(x)*sin`` in bf16 rounds three times and drifts from
    the true rotation; in float32 the only bf16 rounding is the final cast.
    """
    d = x.shape[-1]
    r = 2 * cos.shape[-1] if rotary_dim is None else rotary_dim
    if r % 2 or not 0 < r <= d:
        raise ValueError(f"rotary_dim must be even and in [2, head_dim={d}], got {r}")
    if cos.shape[-1] != r // 2 or sin.shape != cos.shape:
        raise ValueError(
            f"cos and sin must both end in rotary_dim/2={r // 2}, got {tuple(cos.shape)} and "
            f"{tuple(sin.shape)}"
        )
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    math_dtype = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    xr = x[..., :r].to(math_dtype)  # [..., r]
    c, s = cos.to(math_dtype), sin.to(math_dtype)  # [..., r/2]
    if conj:
        s = -s
    if layout == "half":
        c, s = torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)  # [..., r]: c0 c1 | c0 c1
        out = xr * c + rotate_half(xr) * s
    else:
        c, s = c.repeat_interleave(2, dim=-1), s.repeat_interleave(2, dim=-1)  # c0 c0 c1 c1
        out = xr * c + rotate_interleaved(xr) * s
    out = out.to(x.dtype)
    if r == d:
        return out
    return torch.cat((out, x[..., r:]), dim=-1)  # [..., d]: rotated head, untouched tail


def gather_rows(table: torch.Tensor, positions: torch.Tensor | None, seq_len: int) -> torch.Tensor:
    """The per-position rows of a cos or sin table, ready to broadcast against ``[b, h, s, r/2]``.

    Shapes: ``table [bt, n, r/2]`` (``bt`` 1 or ``b``); ``positions [bp, s]`` (``bp`` 1 or ``b``)
    indexing the table's rows, or None to take rows ``0..s-1``. Returns ``[b', 1, s, r/2]``.
    """
    if positions is None:
        rows = table[:, :seq_len]  # [bt, s, r/2]
    else:
        batch = torch.arange(table.shape[0], device=table.device)[:, None]  # [bt, 1]
        if table.shape[0] == 1:
            batch = torch.zeros_like(batch)
        rows = table[batch, positions.long()]  # [max(bt, bp), s, r/2]
    return rows.unsqueeze(1)  # [b', 1, s, r/2]


def rope_qk_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_q: torch.Tensor,
    sin_q: torch.Tensor,
    cos_k: torch.Tensor,
    sin_k: torch.Tensor,
    positions_q: torch.Tensor | None,
    positions_k: torch.Tensor | None,
    rotary_dim: int,
    interleaved: bool,
    conj: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The operation the fused kernels implement, on their canonical (already checked) inputs.

    Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]`` (any strides); ``cos_q``, ``sin_q
    [bt, n, r/2]``; ``cos_k``, ``sin_k [bt', n', r/2]``; ``positions_q [bp, s]``,
    ``positions_k [bp', t]`` or None (then row ``i`` of the table is position ``i``).
    Returns new ``(q', k')``.
    """
    layout = "interleaved" if interleaved else "half"
    cq = gather_rows(cos_q, positions_q, q.shape[2])  # [b', 1, s, r/2]
    sq = gather_rows(sin_q, positions_q, q.shape[2])
    ck = gather_rows(cos_k, positions_k, k.shape[2])  # [b', 1, t, r/2]
    sk = gather_rows(sin_k, positions_k, k.shape[2])
    return (
        apply_rotary_reference(q, cq, sq, layout, rotary_dim, conj),
        apply_rotary_reference(k, ck, sk, layout, rotary_dim, conj),
    )
