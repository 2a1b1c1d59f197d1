"""Self-Extend and Dual Chunk Attention as fused attention calls over disjoint key sets, merged
once by their log-sum-exp.

A softmax over the union of disjoint key sets is the merge of the softmaxes over each set, each
partial output weighted by ``exp(lse_set - lse_union)`` (flash-attn's and ChunkLlama's
``merge_attn_outputs``). Here each set is one call of PyTorch's CPU flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``, which returns the output and the
log-sum-exp of the scaled logits, takes GQA key heads as they are, a float additive mask, and
``is_causal`` aligned top-left) over a *contiguous slice of the keys*, so that no set needs more
than causality or one small band mask:

* **Self-Extend**, per block of query slots ``[q0, q1)`` (cut at ``W``, so a block lies either
  wholly before ``W``, where every key is a neighbour, or wholly after it):
  the neighbour set, keys ``[q0 - W + 1, q1)`` with the band mask ``0 <= i - j < W`` (one
  ``[B, B + W - 1]`` mask, the same for every block); the grouped set, keys ``[0, q0 - W)``
  (every row sees all of them) and keys ``[q0 - W, q1 - W)`` with ``is_causal`` (row ``i`` sees
  ``j <= i - W``).
* **Dual Chunk Attention**, per chunk of query slots: intra-chunk, keys from the chunk's start to
  ``q0`` (all visible) and ``[q0, q1)`` with ``is_causal``; successive-chunk, the previous chunk
  (all visible); inter-chunk, keys ``[0, chunk start - c)`` (all visible).

Every row of every call has at least one visible key (the kernel returns a log-sum-exp of 0,
not -inf, for a row with none, and fails on zero keys, so empty sets are never called).
Memory: the rotated queries and keys (as the explicit path), one block's partial outputs, and
the band mask; never an ``s x t`` matrix.

:func:`self_extend` and :func:`dual_chunk` choose the path: the fused one where it applies
(:func:`fused_refusal`), else the explicit reference path of :mod:`posenc.extend.methods.explicit`
(a soft cap, which the kernel cannot take; a padding mask; keys at negative positions; a device
other than the CPU). :data:`PATH` forces one: ``"explicit"``, or ``"fused"`` (a refusal then
raises).

Shapes as in :mod:`posenc.extend.methods.explicit`: unrotated ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``,
``q_pos [b, s]`` -> ``[b, h, s, d]``.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from ...kernels.constants import CPU_KERNEL_DTYPES
from ...kernels.cpu_rope import cpu_kernel_status, rope_cpu
from ...kernels.reference import apply_rotary_reference
from ...rotary.table_cache import TableCache, grown
from . import explicit
from .explicit import key_positions
from .merge import Part, merge

#: ``"auto"`` (fused where it applies, else explicit), ``"fused"`` (raise where it does not),
#: ``"explicit"``, or ``"flex"`` (:mod:`posenc.extend.methods.flex`: one FlexAttention call per key set,
#: on any device, compiled on CUDA; chosen, not automatic, until a GPU run has timed it).
PATH = "auto"
PATHS = ("auto", "fused", "explicit", "flex")

#: Query rows per Self-Extend block.
BLOCK = 512


def _call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> Part:
    """One flash-kernel call: ``q [b, h, r, d]`` over ``k, v [b, hk, n, d]`` (``n >= 1``)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale
    )
    return out, lse


def _until(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k0: int, q0: int, q1: int, scale: float
) -> list[Part]:
    """Query slots ``q0..q1-1`` over keys ``k0..q1-1``, causal by slot: the keys before ``q0``
    seen by every row (one call), then ``[q0, q1)`` with ``is_causal`` (``q``: the block's rows)."""
    if q1 - q0 == 1:
        return [_call(q, k[:, :, k0:q1], v[:, :, k0:q1], scale)]
    parts = [_call(q, k[:, :, q0:q1], v[:, :, q0:q1], scale, causal=True)]
    if k0 < q0:
        parts.append(_call(q, k[:, :, k0:q0], v[:, :, k0:q0], scale))
    return parts


# --- rotation by a cached table ---------------------------------------------------------------

#: ``(device, dtype, frequency values, factor) -> (cos, sin, first rows)``: tables of positions
#: ``0 ..`` (:func:`posenc.rotary.table_cache.grown`, the rotary modules' mechanism).
_TABLES = TableCache()


def _table(inv_freq: torch.Tensor, scaling: float, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``cos, sin [1, >= n, r/2]`` of positions ``0, 1, ...``: the same products as
    :func:`~posenc.functional.rotary.angles_cos_sin` computes per call, kept and grown. Keyed
    by the frequencies' values (a host read: the fused path runs on CPU tensors only)."""
    freqs = inv_freq.detach()
    key = (freqs.device, freqs.dtype, freqs.cpu().numpy().tobytes(), float(scaling))
    return grown(_TABLES, key, freqs, float(scaling), n - 1, first=4096)  # [1, N, r/2] each


def _native(x: torch.Tensor) -> bool:
    """Whether the native CPU rotary kernel rotates ``x``: built, a dtype it takes, a unit
    stride on ``d``, and no gradient to record (the kernel has no backward)."""
    needs_grad = torch.is_grad_enabled() and x.requires_grad
    return (
        x.dtype in CPU_KERNEL_DTYPES
        and x.stride(-1) == 1
        and not needs_grad
        and not cpu_kernel_status()
    )


def _rotate(x: torch.Tensor, pos: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    """``x [b, h, n, d]`` rotated by non-negative integer ``pos [b, n]`` (as
    :func:`posenc.extend.methods.explicit.rotate`, the angles read from a table).

    By the native CPU kernel where it applies: one pass that gathers the table's rows itself,
    against the reference's gather, products and concatenation (a decode step rotates every
    cached key again, 11x faster so: 0.3 vs 3.4 ms for 4k keys of 3 heads of 64), bit-equal."""
    scaling = rope.get("attention_scaling", 1.0)
    cos, sin = _table(rope["inv_freq"], scaling, int(pos.max()) + 1)  # [1, N, r/2]
    layout = rope.get("layout", "half")
    if _native(x):
        out = torch.empty_like(x)
        rows = pos.to(torch.int64).contiguous()  # [b, n]
        rope_cpu(x, out, cos, sin, rows, 2 * cos.shape[-1], layout != "half", False)
        return out
    return apply_rotary_reference(x, cos[0][pos][:, None], sin[0][pos][:, None], layout)


# --- the two methods ---------------------------------------------------------------------------


def _band(rows: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[rows, rows + w - 1]`` mask of the neighbour set: row ``r`` sees key column
    ``e`` (key slot ``q0 - w + 1 + e``) iff ``r <= e <= r + w - 1``."""
    e = torch.arange(rows + w - 1, device=device)[None]
    r = torch.arange(rows, device=device)[:, None]
    seen = (e >= r) & (e <= r + w - 1)
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))


def _cuts(p0: int, t: int, w: int, rows: int) -> list[tuple[int, int]]:
    """Blocks of query slots ``[p0, t)``, at most ``rows`` each, one boundary at ``w``."""
    edges = sorted({*range(p0, t, rows), t, *([w] if p0 < w < t else [])})
    return list(itertools.pairwise(edges))


def self_extend_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    group_size: int,
    neighbor_window: int,
    scale: float,
    **rope: Any,
) -> torch.Tensor:
    """Self-Extend by fused calls (module docstring); ``rope``: ``inv_freq`` and optionally
    ``attention_scaling``, ``layout``."""
    g, w = group_size, neighbor_window
    s, t = q.shape[2], k.shape[2]
    p0 = t - s  # the first query's slot
    k_pos = key_positions(q_pos, t)  # [b, t]
    # Each set's keys rotated where that set can reach them: neighbours from slot n0 (the first
    # query's window), grouped keys below t - w (the last query's window).
    n0, g1 = max(0, p0 - w + 1), max(0, t - w)
    qn, kn = _rotate(q, q_pos, rope), _rotate(k[:, :, n0:], k_pos[:, n0:], rope)
    qg = _rotate(q, q_pos // g + (w - w // g), rope)  # the grouped positions
    kg = _rotate(k[:, :, :g1], k_pos[:, :g1] // g, rope) if g1 else k[:, :, :0]
    rows = min(BLOCK, s)
    band = _band(rows, w, q.dtype, q.device) if t > w and s > 1 else None
    out = v.new_empty(*q.shape[:3], v.shape[-1])
    for q0, q1 in _cuts(p0, t, w, rows):
        r0, r1 = q0 - p0, q1 - p0
        if q0 < w:  # every key up to the query is a neighbour
            out[:, :, r0:r1] = merge(_until(qn[:, :, r0:r1], kn, v, 0, q0, q1, scale))
            continue
        lo = q0 - w + 1  # the neighbour set's first key, then grouped keys: j <= i - w
        mask = None if band is None else band[None, None, : q1 - q0, : q1 - lo]
        near = kn[:, :, lo - n0 : q1 - n0]  # [b, hk, q1 - lo, d]
        parts = [_call(qn[:, :, r0:r1], near, v[:, :, lo:q1], scale, mask=mask)]
        parts += _until(qg[:, :, r0:r1], kg, v, 0, q0 - w, q1 - w, scale)
        out[:, :, r0:r1] = merge(parts)
    return out


def dual_chunk_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    chunk_size: int,
    local_size: int,
    scale: float,
    **rope: Any,
) -> torch.Tensor:
    """Dual Chunk Attention by fused calls (module docstring), for batch rows whose positions
    share one offset from their slots (:func:`dual_chunk` splits the others)."""
    c = chunk_size - local_size
    s, t = q.shape[2], k.shape[2]
    p0 = t - s
    zero = t - 1 - int(q_pos[0, -1])  # the slot of position 0 (<= 0: keys have positions >= 0)
    keys = _rotate(k, key_positions(q_pos, t) % c, rope)  # [b, hk, t, d]
    intra = _rotate(q, q_pos % c, rope)
    succ = _rotate(q, (q_pos % c + c).clamp(max=chunk_size), rope)
    inter = _rotate(q, torch.full_like(q_pos, min(2 * c - 1, chunk_size)), rope)
    out = v.new_empty(*q.shape[:3], v.shape[-1])
    for n in range((p0 - zero) // c, (t - 1 - zero) // c + 1):
        start = zero + n * c  # the chunk's first slot
        q0, q1 = max(p0, start), min(t, start + c)
        r0, r1 = q0 - p0, q1 - p0
        lo = max(0, start)
        parts = _until(intra[:, :, r0:r1], keys, v, lo, q0, q1, scale)
        prev = max(0, start - c)
        if prev < lo:
            parts.append(_call(succ[:, :, r0:r1], keys[:, :, prev:lo], v[:, :, prev:lo], scale))
        if prev > 0:
            parts.append(_call(inter[:, :, r0:r1], keys[:, :, :prev], v[:, :, :prev], scale))
        out[:, :, r0:r1] = merge(parts)
    return out


# --- the choice --------------------------------------------------------------------------------


def _causal_only(keep: torch.Tensor, s: int, t: int) -> bool:
    """Whether ``keep [b, 1, s | 1, t]`` is plain causality by slot (an eager model's mask of
    an unpadded batch), which the fused calls apply themselves."""
    if keep.shape[2] == 1:
        return s == 1 and bool(keep.all())
    causal = torch.ones(s, t, dtype=torch.bool, device=keep.device).tril(diagonal=t - s)
    return bool((keep == causal).all())


def fused_refusal(
    q: torch.Tensor,
    t: int,
    q_pos: torch.Tensor,
    keep: torch.Tensor | None,
    softcap: float | None,
) -> str | None:
    """Why the fused path does not apply to a call of ``q [b, h, s, d]`` over ``t`` keys
    (None: it does)."""
    if q.device.type != "cpu":
        return f"the fused path runs on the CPU, not {q.device.type}"
    # From here on every value read (the mask, the positions' range, the rows' last slots, the
    # table size) is of CPU tensors in eager mode: free there (DESIGN.md, capture-safe
    # forwards); a CUDA call never reaches them, it takes the explicit path above.
    if softcap:
        return "the flash kernel takes no soft cap"
    s = q.shape[2]
    if keep is not None and not _causal_only(keep, s, t):
        return "a padding mask"
    if int((q_pos[:, -1] - (t - 1)).min()) < 0:
        return "keys at negative positions"
    return None


def _choose(q: torch.Tensor, t: int, q_pos: torch.Tensor, options: dict[str, Any]) -> bool:
    """True: run fused (``options`` loses ``keep`` and ``softcap``, which it then has no use
    for); False: explicit."""
    if PATH == "explicit":
        return False
    why = fused_refusal(q, t, q_pos, options.get("keep"), options.get("softcap"))
    if why is not None:
        if PATH == "fused":
            raise ValueError(f"posenc.extend.methods.fused.PATH is 'fused' but {why}")
        return False
    options.pop("keep", None)
    options.pop("softcap", None)
    return True


def _flex() -> Any:
    """The flex module where :data:`PATH` chooses it, else None (a wrong PATH says which are)."""
    if PATH not in PATHS:
        raise ValueError(
            f"posenc.extend.methods.fused.PATH must be one of {', '.join(PATHS)}, got {PATH!r}"
        )
    if PATH != "flex":
        return None
    from . import flex

    return flex


def self_extend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, **options: Any
) -> torch.Tensor:
    """:func:`posenc.extend.methods.explicit.self_extend_attention`'s signature; fused where it applies."""
    if (flex := _flex()) is not None:
        return flex.self_extend_flex(q, k, v, q_pos, **options)
    if _choose(q, k.shape[2], q_pos, options):
        return self_extend_fused(q, k, v, q_pos, **options)
    return explicit.self_extend_attention(q, k, v, q_pos, **options)


def dual_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, **options: Any
) -> torch.Tensor:
    """:func:`posenc.extend.methods.explicit.dual_chunk_attention`'s signature; fused where it applies
    (batch rows whose positions start at different slots run one at a time)."""
    if (flex := _flex()) is not None:
        return flex.dual_chunk_flex(q, k, v, q_pos, **options)
    if not _choose(q, k.shape[2], q_pos, options):
        return explicit.dual_chunk_attention(q, k, v, q_pos, **options)
    last = q_pos[:, -1]
    if bool((last == last[0]).all()):
        return dual_chunk_fused(q, k, v, q_pos, **options)
    rows = [
        dual_chunk_fused(q[i : i + 1], k[i : i + 1], v[i : i + 1], q_pos[i : i + 1], **options)
        for i in range(q.shape[0])
    ]
    return torch.cat(rows)
