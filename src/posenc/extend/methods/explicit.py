"""Attention over disjoint key sets, each with its own positions, in memory linear in the key
length: the reference path of every method of :mod:`.keysets` (Self-Extend, Dual Chunk Attention,
STRING, ReRoPE, Leaky ReRoPE, log-n).

A method keeps the model's RoPE and changes which positions (and frequencies) a query and a key
are rotated by, according to which *set* the key falls in relative to the query
(:class:`~posenc.extend.methods.keysets.KeySets`: the sets, their bands and position rules).

A softmax over the union of disjoint key sets equals the log-sum-exp merge of the softmaxes over
each set (ChunkLlama's and flash-attn's merge of partial outputs); here the merge is done exactly
by computing, for a block of query rows at a time, each set's logits only where that set can hold
keys (its band of distances), choosing per key the logit of the set it belongs to, and taking one
float32 softmax. Memory is ``O(rows * t)`` per block, never the ``s x t`` logit matrix; the
result is the same as the papers' full-matrix code. A learned attention sink (gpt-oss's
``sinks``, one logit per head with no value) is one more term of that softmax's denominator, as
transformers' eager attention has it.

This explicit path is the reference: :mod:`posenc.extend.methods.fused` computes the same attention as
one fused kernel call per key set merged by log-sum-exp (tested against this path), and falls
back to it where the fused calls do not apply (a soft cap, a padding mask).

Positions: ``q_pos [b, s]`` are the queries' integer positions (transformers' ``position_ids``).
The keys are the cache's slots in order and the queries are the last ``s`` of them with
contiguous positions (as in every transformers cache, left padding included), so key slot ``j``
has position ``q_pos[:, -1] - (t - 1 - j)``: nothing is read back from the device.

Shapes: ``q [b, h, s, d]`` (unrotated), ``k, v [b, hk, t, d]`` (unrotated keys, ``h % hk == 0``),
``keep [b, 1, s, t]`` bool or None (padding and causality; None: causal by position) ->
``[b, h, s, d]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ...functional.rotary import angles_cos_sin
from ...kernels.reference import apply_rotary_reference
from .keysets import KeySets, positions, prepared

#: Logit elements one block of query rows may hold per key set (float32: 64 MiB).
BLOCK_ELEMENTS = 1 << 24


def key_positions(q_pos: torch.Tensor, t: int) -> torch.Tensor:
    """Positions of the ``t`` cached keys whose last ``s`` are the queries: ``[b, s] -> [b, t]``."""
    offsets = torch.arange(t - 1, -1, -1, device=q_pos.device, dtype=q_pos.dtype)  # [t]: t-1 .. 0
    return q_pos[:, -1:] - offsets  # [b, t]


def rotate(
    x: torch.Tensor,
    pos: torch.Tensor,
    inv_freq: torch.Tensor,
    attention_scaling: float = 1.0,
    layout: str = "half",
) -> torch.Tensor:
    """``x [b, h, n, d]`` rotated by integer positions ``pos [b, n]`` (angles in float32; the
    first ``2 * len(inv_freq)`` channels rotate, the rest pass), as transformers rotates."""
    cos, sin = angles_cos_sin(pos[..., None], inv_freq, attention_scaling)  # [b, n, r/2]
    return apply_rotary_reference(x, cos[:, None], sin[:, None], layout)  # [b, h, n, d]


@dataclass(frozen=True)
class KeySet:
    """One set of keys: the queries and keys rotated by that set's positions.

    ``q [b, h, s, d]``, ``k [b, hk, t, d]``; ``max_distance``: no key of this set is farther than
    this from its query (None: unbounded), so its logits are computed on that band only.
    """

    q: torch.Tensor
    k: torch.Tensor
    max_distance: int | None


#: ``which(dist [b, r, n], q_pos [b, r], k_pos [b, n]) -> set index [b, r, n]`` (long).
Which = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``q [b, h, r, d] @ k [b, hk, n, d]^T * scale -> [b, h, r, n]`` in float32, GQA by view.

    The query heads of one kv head are stacked as rows (``[b, hk, g r, d]``), so the product is
    one plain batched matmul per kv head: a broadcast ``[b, hk, g, r, d] @ [b, hk, 1, d, n]``
    would copy the keys ``g`` times."""
    b, h, r, d = q.shape
    hk = k.shape[1]
    qg = q.reshape(b, hk, (h // hk) * r, d)  # [b, hk, g r, d]: query heads grouped by kv head
    out = torch.matmul(qg, k.transpose(-1, -2))  # [b, hk, g r, n]
    out = out.float() if out.dtype != torch.float32 else out
    return out.mul_(scale).view(b, h, r, -1)  # [b, h, r, n]


def _softmax(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of float32 ``logits [b, h, r, n]``, with one more term
    ``exp(sinks[h])`` in each row's denominator where ``sinks [h]`` is given (a sink: a logit
    with no value, whose weight is dropped), as transformers' eager attention with ``sinks``."""
    if sinks is None:
        return torch.softmax(logits, dim=-1)
    sink = sinks.float().view(1, -1, 1, 1)  # [1, h, 1, 1]
    top = torch.maximum(logits.amax(dim=-1, keepdim=True), sink)  # [b, h, r, 1]
    probs = torch.exp(logits - top)
    return probs.div_(probs.sum(dim=-1, keepdim=True) + torch.exp(sink - top))


def set_attention(
    sets: list[KeySet],
    v: torch.Tensor,
    q_pos: torch.Tensor,
    which: Which,
    keep: torch.Tensor | None,
    scale: float,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention in which each (query, key) pair takes its logit from the set ``which`` names.

    ``sets[0]`` must be unbounded (``max_distance=None``); the others are bounded bands. Keys
    later than the query (by position) and keys ``keep`` drops get no weight. ``softcap``:
    Gemma-2's ``cap * tanh(logit / cap)`` on each scaled logit before the mask (as transformers'
    eager attention), elementwise, so applying it to the chosen logits is applying it per set.
    ``sinks [h]``: learned sink logits (:func:`_softmax`). Returns ``[b, h, s, d]`` in ``v``'s
    dtype.
    """
    b, h, s, _d = sets[0].q.shape
    t, hk = v.shape[2], v.shape[1]
    k_pos = key_positions(q_pos, t)  # [b, t]
    rows = max(16, BLOCK_ELEMENTS // max(1, b * h * t))
    out = v.new_empty(b, h, s, v.shape[-1])
    lowest = torch.finfo(torch.float32).min
    for r0 in range(0, s, rows):
        r1 = min(s, r0 + rows)
        end = t - s + r1  # keys after the block's last query are never visible (a cache)
        qp = q_pos[:, r0:r1]  # [b, r]
        dist = qp[:, :, None] - k_pos[:, None, :end]  # [b, r, end]
        chosen = which(dist, qp, k_pos[:, :end])  # [b, r, end]
        logits = _logits(sets[0].q[:, :, r0:r1], sets[0].k[:, :, :end], scale)  # [b, h, r, end]
        for index, ks in enumerate(sets[1:], start=1):
            assert ks.max_distance is not None, "only the first key set may be unbounded"
            lo = max(0, end - (r1 - r0) - ks.max_distance)  # the band this set can reach
            band = _logits(ks.q[:, :, r0:r1], ks.k[:, :, lo:end], scale)  # [b, h, r, end - lo]
            mine = chosen[:, None, :, lo:] == index  # [b, 1, r, end - lo]
            logits[..., lo:] = torch.where(mine, band, logits[..., lo:])  # in place on the band
        if softcap:
            logits = torch.tanh(logits.div_(softcap)).mul_(softcap)
        visible = dist[:, None] >= 0  # [b, 1, r, end]: causal by position
        if keep is not None:  # [b, 1, s | 1, t]: per query row, or one row of valid keys
            visible = visible & (keep[..., :end] if keep.shape[2] == 1 else keep[:, :, r0:r1, :end])
        # The dtype's lowest value, not -inf: a padded query row with no visible key then gets
        # uniform weights (as transformers' eager path gives it), not NaN.
        logits.masked_fill_(~visible, lowest)
        probs = _softmax(logits, sinks).to(v.dtype)  # [b, h, r, end]
        pg = probs.view(b, hk, (h // hk) * (r1 - r0), end)  # [b, hk, g r, end]
        pv = torch.matmul(pg, v[:, :, :end])  # [b, hk, g r, d]
        out[:, :, r0:r1] = pv.view(b, h, r1 - r0, -1)  # [b, h, r, d]
    return out


def rotated_sets(
    sets: KeySets, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, **rope: Any
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each set's ``(queries, keys)`` rotated by its rules (:func:`rotate`; ``rope``:
    ``inv_freq`` and optionally ``attention_scaling``, ``layout``); sets whose key rule and
    frequencies are one share one rotation of the keys (DCA's three, STRING's two)."""
    k_pos = key_positions(q_pos, k.shape[2])  # [b, t]
    inv_freq = rope.pop("inv_freq")
    keys: dict[tuple[int, int], torch.Tensor] = {}
    out = []
    for rule in sets.sets:
        freqs = inv_freq / rule.divide if rule.divide != 1 else inv_freq
        shared = (id(rule.key), rule.divide)
        if shared not in keys:
            keys[shared] = rotate(k, positions(rule.key, k_pos), freqs, **rope)
        out.append((rotate(q, positions(rule.query, q_pos), freqs, **rope), keys[shared]))
    return out


def keyset_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    sets: KeySets,
    inv_freq: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
    attention_scaling: float = 1.0,
    layout: str = "half",
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention of the method ``sets`` defines: ``[b, h, s, d]`` from unrotated
    ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` and query positions ``q_pos [b, s]``."""
    q, scale = prepared(sets, q, q_pos, scale)
    rope = {"inv_freq": inv_freq, "attention_scaling": attention_scaling, "layout": layout}
    rotated = rotated_sets(sets, q, k, q_pos, **rope)
    ks = [KeySet(qr, kr, rule.max_distance(sets.unit)) for (qr, kr), rule in zip(
        rotated, sets.sets, strict=True)]  # fmt: skip

    def which(dist: torch.Tensor, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        return sets.which(qp, kp)

    return set_attention(ks, v, q_pos, which, keep, scale, softcap, sinks)
