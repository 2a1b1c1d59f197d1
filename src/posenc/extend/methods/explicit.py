"""Self-Extend and Dual Chunk Attention: attention over disjoint key sets, each with its own
positions, in memory linear in the key length.

Both methods keep the model's RoPE and change which positions a query and a key are rotated by,
according to which *set* the key falls in relative to the query:

* **Self-Extend** (Jin et al. 2024, "LLM Maybe LongLM"): keys within ``W`` positions of the
  query (the neighbour window) use the normal positions ``i`` and ``j``; farther keys use grouped
  positions, query ``i // G + W - W // G`` and key ``j // G``, so the largest relative distance
  a model sees stays near ``W + (L - W) / G``. One softmax spans both sets.
* **Dual Chunk Attention** (An et al. 2024, "Training-Free Long-Context Scaling of LLMs";
  the rules of the authors' ChunkLlama and of vLLM's ``DualChunkRotaryEmbedding``): positions
  are cut into chunks of ``c = chunk_size - local_size``; a key at position ``j`` is rotated by
  ``j % c``; a query at ``i`` attends to keys of its own chunk with position ``i % c``
  (intra-chunk, causal), to the previous chunk with ``min(i % c + c, chunk_size)``
  (successive-chunk: true distances to its neighbours, capped at ``chunk_size``), and to all
  earlier chunks with the constant ``min(2c - 1, chunk_size)`` (inter-chunk).

A softmax over the union of disjoint key sets equals the log-sum-exp merge of the softmaxes over
each set (ChunkLlama's and flash-attn's merge of partial outputs); here the merge is done exactly
by computing, for a block of query rows at a time, each set's logits only where that set can hold
keys (its band of distances), choosing per key the logit of the set it belongs to, and taking one
float32 softmax. Memory is ``O(rows * t)`` per block, never the ``s x t`` logit matrix; the
result is the same as the papers' full-matrix code.

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

import torch

from ...functional.rotary import angles_cos_sin
from ...kernels.reference import apply_rotary_reference

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


def set_attention(
    sets: list[KeySet],
    v: torch.Tensor,
    q_pos: torch.Tensor,
    which: Which,
    keep: torch.Tensor | None,
    scale: float,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention in which each (query, key) pair takes its logit from the set ``which`` names.

    ``sets[0]`` must be unbounded (``max_distance=None``); the others are bounded bands. Keys
    later than the query (by position) and keys ``keep`` drops get no weight. ``softcap``:
    Gemma-2's ``cap * tanh(logit / cap)`` on each scaled logit before the mask (as transformers'
    eager attention), elementwise, so applying it to the chosen logits is applying it per set.
    Returns ``[b, h, s, d]`` in ``v``'s dtype.
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
        probs = torch.softmax(logits, dim=-1).to(v.dtype)  # [b, h, r, end]
        pg = probs.view(b, hk, (h // hk) * (r1 - r0), end)  # [b, hk, g r, end]
        pv = torch.matmul(pg, v[:, :, :end])  # [b, hk, g r, d]
        out[:, :, r0:r1] = pv.view(b, h, r1 - r0, -1)  # [b, h, r, d]
    return out


# --- the two methods ---------------------------------------------------------------------------


def self_extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    inv_freq: torch.Tensor,
    group_size: int,
    neighbor_window: int,
    scale: float,
    keep: torch.Tensor | None = None,
    attention_scaling: float = 1.0,
    layout: str = "half",
    softcap: float | None = None,
) -> torch.Tensor:
    """Self-Extend attention (see the module docstring): ``[b, h, s, d]`` from unrotated
    ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` and query positions ``q_pos [b, s]``."""
    g, w = group_size, neighbor_window
    k_pos = key_positions(q_pos, k.shape[2])  # [b, t]
    grouped_q = q_pos // g + (w - w // g)  # [b, s]: the paper's shift keeps distance w at w
    sets = [
        KeySet(
            rotate(q, grouped_q, inv_freq, attention_scaling, layout),
            rotate(k, k_pos // g, inv_freq, attention_scaling, layout),
            None,
        ),
        KeySet(
            rotate(q, q_pos, inv_freq, attention_scaling, layout),
            rotate(k, k_pos, inv_freq, attention_scaling, layout),
            w - 1,
        ),
    ]

    def which(dist: torch.Tensor, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        return (dist < w).long()  # 1: the neighbour window, 0: grouped

    return set_attention(sets, v, q_pos, which, keep, scale, softcap)


def dual_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    *,
    inv_freq: torch.Tensor,
    chunk_size: int,
    local_size: int,
    scale: float,
    keep: torch.Tensor | None = None,
    attention_scaling: float = 1.0,
    layout: str = "half",
    softcap: float | None = None,
) -> torch.Tensor:
    """Dual Chunk Attention (see the module docstring): ``[b, h, s, d]`` from unrotated
    ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` and query positions ``q_pos [b, s]``."""
    c = chunk_size - local_size  # the chunk length
    k_pos = key_positions(q_pos, k.shape[2])  # [b, t]
    keys = rotate(k, k_pos % c, inv_freq, attention_scaling, layout)  # [b, hk, t, d]
    inter = torch.full_like(q_pos, min(2 * c - 1, chunk_size))  # [b, s]: one position for all
    sets = [
        KeySet(rotate(q, inter, inv_freq, attention_scaling, layout), keys, None),
        KeySet(rotate(q, q_pos % c, inv_freq, attention_scaling, layout), keys, c - 1),
        KeySet(
            rotate(q, (q_pos % c + c).clamp(max=chunk_size), inv_freq, attention_scaling, layout),
            keys,
            2 * c - 1,
        ),
    ]

    def which(dist: torch.Tensor, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        apart = qp[:, :, None] // c - kp[:, None, :] // c  # [b, r, n]: chunks between them
        # 0 same chunk -> set 1 (intra); 1 -> set 2 (successive); >= 2 -> set 0 (inter)
        return torch.where(apart == 0, 1, torch.where(apart == 1, 2, 0))

    return set_attention(sets, v, q_pos, which, keep, scale, softcap)
