"""Every key-set method (:mod:`.keysets`) as FlexAttention calls over disjoint key sets, merged
once by their log-sum-exp: the path meant for CUDA under ``torch.compile``.

The three implementations compute the same attention (see :mod:`posenc.extend.methods.keysets` for
the methods' rules):

* :mod:`posenc.extend.methods.explicit`, the explicit reference: per block of query rows, each set's
  logits on its band, chosen per key, one float32 softmax.
* :mod:`posenc.extend.methods.fused`, the CPU fast path: one CPU flash-kernel call per contiguous key
  slice, merged by :func:`posenc.extend.methods.merge.merge`; host reads of positions and masks.
* this module: one ``flex_attention`` call per key set, each with the set's rotated queries and
  keys (:func:`posenc.extend.methods.explicit.rotate`) and a ``BlockMask`` whose ``mask_mod`` says,
  from the positions, which (query, key) pairs belong to the set (and ``keep`` allows); the
  partial outputs are merged by :func:`posenc.extend.methods.merge.merge` with the log-sum-exp each
  call returns (and a learned sink's). Each set of a definition is one call: the pairs whose
  ``i // unit - j // unit`` is in the set's ``[lo, hi)`` (Self-Extend's near and far sets by
  distance, DCA's intra, successive and inter chunks, ...).

  The block masks skip every key block a set cannot reach (a band for the near, intra and
  successive sets), which is where the compiled kernel saves work; the eager ``flex_attention``
  computes every score densely (the correctness reference on the CPU).

Semantics kept from the explicit path, and why each needs care here:

* ``flex_attention``'s log-sum-exp is the natural log of the sum of ``exp(score)`` over the
  row's unmasked keys (after ``score_mod``), the base :func:`~posenc.extend.methods.merge.merge`
  expects (the CUDA kernel keeps log2 and the wrapper multiplies by ``ln 2``); a row that sees
  no key of a set has ``-inf`` there (and output 0; in the Triton kernel too: its row maximum
  stays ``-inf``), so it weighs nothing in the merge.
* ``softcap``: Gemma-2's ``cap * tanh(score / cap)`` on each scaled score before the mask, as a
  ``score_mod`` on every set (the explicit path caps the chosen logit, the same elementwise).
* A row no key is visible to in any set (a left-padded query under ``keep``): the explicit path
  fills masked logits with the dtype's lowest value, so such a row gets uniform weights over
  the keys its block of rows spans (keys ``0 .. t - s + r1 - 1`` for a block ending at row
  ``r1``, :data:`posenc.extend.methods.explicit.BLOCK_ELEMENTS`); :func:`_no_key_rows` gives the same
  mean of the values, where flex would give 0 and the merge NaN (``-inf - -inf``).

Nothing reads a tensor's value on the host: sizes come from shapes, the sets from ``mask_mod``
functions of the position tensors, the fully masked rows from ``torch.where``; so the path can
be captured for CUDA under ``torch.compile``. :data:`COMPILED` chooses the kernel.

Positions as in the explicit path: ``q_pos [b, s]`` the queries' positions, key slot ``j`` at
``q_pos[:, -1] - (t - 1 - j)`` (:func:`~posenc.extend.methods.explicit.key_positions`).

Shapes: unrotated ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` (``h % hk == 0``), ``keep
[b, 1, s | 1, t]`` bool or None -> ``[b, h, s, d]`` in ``v``'s dtype.

Measured (``tests/test_extend_flex.py``): equal to the explicit path within 1e-5 in float32 for
prefill, decode, left padding, GQA, a soft cap and both rotary layouts, eager on the CPU, and
inside patched transformers models; a caller's ``torch.compile(fullgraph=True)`` traces a call
into one graph; the compiled block-mask function serves every set, length and step after a
few warm-up graphs (tested). Speed, CPU,
2 busy threads, s = t = 2048, 8 query / 2 key heads of 64, float32, one call: Self-Extend
(G 4, W 512) explicit 0.84 s, fused 0.35 s, eager flex 2.48 s; DCA (chunk 1024, local 128)
1.16 s, 0.21 s, 3.50 s. Eager flex computes every set's full ``s x t`` scores: a reference,
not a CPU path (and torch 2.13 compiles no CPU flex kernel with ``return_lse``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import explicit
from .explicit import key_positions, rotated_sets
from .keysets import KeySets, prepared
from .merge import Part, merge

#: None: ``torch.compile(flex_attention)`` on CUDA, the eager (dense) one elsewhere; True or
#: False forces one. On the CPU torch 2.13's compiled kernel refuses ``return_lse``, which the
#: merge needs, so True raises there.
COMPILED: bool | None = None

#: ``mask_mod(b, h, q_idx, kv_idx) -> bool``, FlexAttention's signature (index tensors).
MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _compiled(device: torch.device) -> bool:
    return device.type == "cuda" if COMPILED is None else COMPILED


#: The upper bound of an unbounded set (no distance or chunk count reaches it).
UNBOUNDED = 1 << 62


def _mask_mod(
    q_pos: torch.Tensor, k_pos: torch.Tensor, keep: torch.Tensor, unit: int, lo: int, hi: int
) -> MaskMod:
    """The pairs of one set: visible (``dist >= 0`` by position, and ``keep``) and
    ``lo <= q // unit - k // unit < hi`` (Self-Extend: ``unit`` 1, the distance; DCA: the chunk
    length, the chunks between query and key; floor division, negative slots too).

    ``q_pos [b, s]``, ``k_pos [b, t]`` int64 and ``keep [b, 1 | s, t]`` bool, contiguous
    (:func:`_inputs`): read per index inside the kernel, never on the host. Every set of both
    methods is this one function, its numbers in a tensor, so a compiled ``create_block_mask``
    and flex kernel meet one code object with the same guards for every set, layer and step:
    constants or separate lambdas would compile one kernel each, and stride-0 views (an
    expanded mask) another, until dynamo's recompile limit (8), past which the dense eager
    function runs."""
    rows = 0 if keep.shape[1] == 1 else 1  # a [b, 1, t] mask: the same keys for every row
    bounds = torch.tensor([unit, lo, hi, rows], device=q_pos.device, dtype=torch.int64)

    def mod(b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor) -> torch.Tensor:
        qp, kp = q_pos[b, qi], k_pos[b, ki]
        band = torch.div(qp, bounds[0], rounding_mode="floor") - torch.div(
            kp, bounds[0], rounding_mode="floor"
        )
        seen = (qp >= kp) & (band >= bounds[1]) & (band < bounds[2])
        return seen & keep[b, qi * bounds[3], ki]

    return mod


def _inputs(
    q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q_pos`` as a contiguous int64 ``[b, s]`` and ``keep`` as a contiguous ``[b, 1 | s, t]``
    (all True, ``[b, 1, t]``, where None), broadcast as the explicit path broadcasts them: the
    kernel indexes both by batch row and query. A per-head ``keep`` is refused (every head of a
    layer sees the same keys; the explicit path would take one, the model patch never passes
    one). int64: the bounds (up to :data:`UNBOUNDED`) compare in the positions' dtype."""
    b, _, s, _ = q.shape
    t = k.shape[2]
    if q_pos.dim() != 2 or q_pos.shape[0] not in (1, b) or q_pos.shape[1] != s:
        raise ValueError(
            f"q_pos must be [b, s] = [{b}, {s}] or [1, {s}] (positions of the queries), "
            f"got {list(q_pos.shape)}"
        )
    if keep is None:
        keep = torch.ones(b, 1, t, dtype=torch.bool, device=q.device)
    elif keep.dim() != 4 or keep.shape[1] != 1 or keep.shape[0] not in (1, b) or (
        keep.shape[2] not in (1, s) or keep.shape[3] != t
    ):  # fmt: skip
        raise ValueError(
            f"keep must be a bool mask [b, 1, s, t] = [{b}, 1, {s}, {t}] (or 1 for b and s: "
            f"the same for every row), got {list(keep.shape)}"
        )
    else:  # a view where transformers' mask is [b, 1, s, t] already; a copy where broadcast
        keep = keep.expand(b, 1, -1, t).reshape(b, -1, t).contiguous()
    return q_pos.to(torch.int64).expand(b, s).contiguous(), keep


@functools.cache
def _block_mask_fn(compiled: bool) -> Callable[..., Any]:
    """``create_block_mask``, compiled with the kernel: eager, it evaluates ``mask_mod`` over
    the whole ``[b, s, t]`` grid (int64 intermediates: 8 GiB each at 32k); compiled, fused.
    Dynamic shapes (a decode step's growing ``t``) build here, unlike the CPU flex kernel's."""
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask) if compiled else create_block_mask


def _kernels(device: torch.device) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``(create_block_mask, flex_attention)`` as :data:`COMPILED` chooses; inside a caller's
    ``torch.compile`` the plain functions, which that compile lowers (and dynamo would trace
    through the cached wrappers, with a warning)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if torch.compiler.is_compiling():
        return create_block_mask, flex_attention
    compiled = _compiled(device)
    return _block_mask_fn(compiled), (_compiled_flex() if compiled else flex_attention)


@functools.cache
def _compiled_flex() -> Any:
    """``torch.compile(flex_attention)`` with dynamo's automatic dynamic shapes: a decode step's
    key length grows by one a call, so the second length compiles a kernel dynamic in it and
    later steps reuse that one (``dynamic=False``, the lab's choice for fixed shapes in
    :func:`posenc.attention.paths.flex_attention_fn`, would compile one per step until dynamo's
    recompile limit, then fall back to the dense eager kernel)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_mod: MaskMod,
    scale: float,
    softcap: float | None,
) -> Part:
    """One FlexAttention call of rotated ``q [b, h, s, d]`` over ``k, v [b, hk, t, d]``:
    ``(out [b, h, s, d], lse [b, h, s] float32, natural log, -inf where no key)``."""
    from torch.nn.attention.flex_attention import AuxRequest

    b, h, s, _ = q.shape
    t = k.shape[2]
    block_mask_fn, flex_fn = _kernels(q.device)
    block_mask = block_mask_fn(mask_mod, b, None, s, t, device=q.device)
    score_mod = None
    if softcap:
        cap = float(softcap)

        def capped(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            qi: torch.Tensor,
            ki: torch.Tensor,
        ) -> torch.Tensor:
            return torch.tanh(score / cap) * cap  # as the explicit path: tanh(l / cap) * cap

        score_mod = capped
    out, aux = flex_fn(
        q,
        k,
        v,
        score_mod=score_mod,
        block_mask=block_mask,
        scale=scale,
        enable_gqa=h != k.shape[1],
        return_aux=AuxRequest(lse=True),
    )
    return out, aux.lse


def _no_key_rows(v: torch.Tensor, h: int, s: int) -> torch.Tensor:
    """What the explicit path gives a row that sees no key: the mean of the values of keys
    ``0 .. t - s + r1 - 1``, ``r1`` the end of the row's block of rows (its blocks, from
    ``BLOCK_ELEMENTS``, by shapes only): ``v [b, hk, t, d] -> [b, hk, s, d]`` float32, one
    row per key head (query head ``i`` reads key head ``i // (h / hk)``)."""
    b, _, t, _ = v.shape
    rows = max(16, explicit.BLOCK_ELEMENTS // max(1, b * h * t))  # as set_attention cuts them
    r = torch.arange(s, device=v.device)
    end = t - s + torch.clamp((r // rows + 1) * rows, max=s)  # [s]: keys the row's block spans
    prefix = v.float().cumsum(2)  # [b, hk, t, d]
    return prefix[:, :, end - 1] / end[:, None].to(prefix.dtype)  # [b, hk, s, d]


def _merged(
    parts: list[Part], v: torch.Tensor, keep: torch.Tensor | None, sinks: torch.Tensor | None
) -> torch.Tensor:
    """The parts merged by log-sum-exp (and ``sinks [h]``, :func:`~posenc.extend.methods.merge.merge`);
    rows that saw no key in any set as the explicit path has them (only ``keep`` can hide every
    key: by position a query sees its own slot): with a sink, all weight on the sink (output 0,
    which the merge gives: the sink's log-sum-exp is finite)."""
    if keep is None or sinks is not None:
        return merge(parts, sinks).to(v.dtype)
    empty = torch.stack([torch.isneginf(lse) for _, lse in parts]).all(0)  # [b, h, s]
    # Every lse -inf would make the merge's weights exp(-inf - -inf) = NaN: give the first
    # part (output 0 there) the weight 1, so no NaN exists even where it is replaced.
    first = (parts[0][0], torch.where(empty, 0.0, parts[0][1]))
    out = merge([first, *parts[1:]])  # [b, h, s, d]
    b, h, s, d = out.shape
    hk = v.shape[1]
    fallback = _no_key_rows(v, h, s)[:, :, None]  # [b, hk, 1, s, d]: no copy per query head
    grouped = torch.where(empty.view(b, hk, h // hk, s, 1), fallback, out.view(b, hk, -1, s, d))
    return grouped.view(b, h, s, d).to(v.dtype)


# --- the key sets -------------------------------------------------------------------------------


def keyset_flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    sets: KeySets,
    scale: float,
    keep: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    **rope: Any,
) -> torch.Tensor:
    """The method ``sets`` defines by one FlexAttention call per set (module docstring), as
    :func:`posenc.extend.methods.explicit.keyset_attention` takes it (``rope``: ``inv_freq``
    and optionally ``attention_scaling``, ``layout``): unrotated ``q [b, h, s, d]``,
    ``k, v [b, hk, t, d]``, ``q_pos [b, s]`` -> ``[b, h, s, d]``."""
    q_pos, seen = _inputs(q, k, q_pos, keep)
    q, scale = prepared(sets, q, q_pos, scale)
    k_pos = key_positions(q_pos, k.shape[2])  # [b, t]
    rotated = rotated_sets(sets, q, k, q_pos, **rope)
    parts = [
        _call(qr, kr, v, _mask_mod(q_pos, k_pos, seen, sets.unit, rule.lo, rule.hi or UNBOUNDED),
              scale, softcap)
        for (qr, kr), rule in zip(rotated, sets.sets, strict=True)
    ]  # fmt: skip
    return _merged(parts, v, keep, sinks)


__all__ = ["COMPILED", "keyset_flex"]
