"""Every key-set method (:mod:`.keysets`) as fused attention calls over disjoint key sets,
merged once by their log-sum-exp.

A softmax over the union of disjoint key sets is the merge of the softmaxes over each set, each
partial output weighted by ``exp(lse_set - lse_union)`` (flash-attn's and ChunkLlama's
``merge_attn_outputs``; a learned sink is one more log-sum-exp with no output). Here each set is
one call of PyTorch's CPU flash kernel (``aten._scaled_dot_product_flash_attention_for_cpu``,
which returns the output and the log-sum-exp of the scaled logits, takes GQA key heads as they
are, a float additive mask, and ``is_causal`` aligned top-left) over a *contiguous slice of the
keys*, so that no set needs more than causality or one small mask. Three shapes of key sets:

* **a near and a far set by distance** (Self-Extend, STRING, ReRoPE, Leaky ReRoPE: near
  ``0 <= i - j < w``, far ``i - j >= w``), per block of query slots ``[q0, q1)`` (cut at ``w``,
  so a block lies either wholly before ``w``, where every key is near, or wholly after it):
  the near set, keys ``[q0 - w + 1, q1)``, with the band mask ``0 <= i - j < w`` (one
  ``[B, B + w - 1]`` mask) where ``w`` is at most the block's ``B`` rows, else (STRING's ``S``
  is a third of the trained length) as three calls that need no mask wider than ``B``: keys
  ``[q0, q1)`` with ``is_causal``, ``[q0 - w + 1, q1 - w + 1)`` with the ``[B, B]`` mask "row
  ``r`` sees column ``c >= r``", and ``[q1 - w + 1, q0)`` all visible; the far set, keys ``[0,
  q0 - w)`` (every row sees all of them) and keys ``[q0 - w, q1 - w)`` with ``is_causal`` (row
  ``i`` sees ``j <= i - w``).
* **sets by chunk** (Dual Chunk Attention: bands of ``i // c - j // c``), per chunk of query
  slots: a band ``[lo, hi)`` is the keys of chunks ``n - hi + 1 .. n - lo`` (all visible), and
  for ``lo = 0`` the query's own chunk up to the query (``is_causal``).
* **one set** (log-n alone): every key up to the query.

Every row of every call has at least one visible key (the kernel returns a log-sum-exp of 0,
not -inf, for a row with none, and fails on zero keys, so empty sets are never called).
Memory: the rotated queries and keys (as the explicit path), one block's partial outputs, and
the masks; never an ``s x t`` matrix.

:func:`keyset` chooses the path: the fused one where it applies (:func:`fused_refusal`), else
the explicit reference path of :mod:`posenc.extend.methods.explicit` (a soft cap, which the kernel
cannot take; a padding mask; keys at negative positions; a device other than the CPU).
:data:`PATH` forces one: ``"explicit"``, or ``"fused"`` (a refusal then raises).

Shapes as in :mod:`posenc.extend.methods.explicit`: unrotated ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``,
``q_pos [b, s]`` -> ``[b, h, s, d]``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from ...kernels.constants import CPU_KERNEL_DTYPES
from ...kernels.cpu_rope import cpu_kernel_status, rope_cpu
from ...kernels.reference import apply_rotary_reference
from ...rotary.table_cache import TableCache, grown
from . import explicit
from .explicit import key_positions
from .keysets import KeySets, Rule, positions, prepared
from .merge import Part, merge

#: ``"auto"`` (fused where it applies, else explicit), ``"fused"`` (raise where it does not),
#: ``"explicit"``, or ``"flex"`` (:mod:`posenc.extend.methods.flex`: one FlexAttention call per key set,
#: on any device, compiled on CUDA; chosen, not automatic, until a GPU run has timed it).
PATH = "auto"
PATHS = ("auto", "fused", "explicit", "flex")

#: Query rows per block of a near and a far set.
BLOCK = 512


def _call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    mask: torch.Tensor | None = None,
) -> Part:
    """One flash-kernel call: ``q [b, h, r, d]`` over ``k [b, hk, n, d]``, ``v [b, hk, n, dv]``
    (``n >= 1``) -> ``[b, h, r, dv]`` and its log-sum-exp."""
    d, dv = q.shape[-1], v.shape[-1]
    if d != dv:
        # The kernel takes one head size (MiMo-V2's values are narrower than its keys, MLA's
        # wider): zero channels add nothing to a dot product and come out as zero columns.
        width = max(d, dv)
        q, k, v = (torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in (q, k, v))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale
    )
    return out[..., :dv], lse


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


# --- the key sets --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """What a fused structure needs beside the queries, keys and positions of its batch rows."""

    v: torch.Tensor  # [b, hk, t, d]
    sets: KeySets
    scale: float
    sinks: torch.Tensor | None  # [h]
    rope: dict[str, Any]  # inv_freq, attention_scaling, layout


def _rope(rope: dict[str, Any], rule: Rule) -> dict[str, Any]:
    """``rope`` with the frequencies of ``rule`` (the model's, divided by ``rule.divide``)."""
    if rule.divide == 1:
        return rope
    return {**rope, "inv_freq": rope["inv_freq"] / rule.divide}


def _keys(rule: Rule, k: torch.Tensor, k_pos: torch.Tensor, rope: dict[str, Any]) -> torch.Tensor:
    """``k [b, hk, n, d]`` rotated by ``rule``'s key positions of ``k_pos [b, n]``."""
    return _rotate(k, positions(rule.key, k_pos), _rope(rope, rule))


def _band(rows: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[rows, rows + w - 1]`` mask of the near set: row ``r`` sees key column
    ``e`` (key slot ``q0 - w + 1 + e``) iff ``r <= e <= r + w - 1``."""
    e = torch.arange(rows + w - 1, device=device)[None]
    r = torch.arange(rows, device=device)[:, None]
    seen = (e >= r) & (e <= r + w - 1)
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))


def _cuts(p0: int, t: int, w: int, rows: int) -> list[tuple[int, int]]:
    """Blocks of query slots ``[p0, t)``, at most ``rows`` each, one boundary at ``w``."""
    edges = sorted({*range(p0, t, rows), t, *([w] if p0 < w < t else [])})
    return list(itertools.pairwise(edges))


def _near(
    q: torch.Tensor,
    kn: torch.Tensor,
    v: torch.Tensor,
    n0: int,
    block: tuple[int, int],
    w: int,
    mask: torch.Tensor | None,
    scale: float,
) -> list[Part]:
    """Query slots ``block = [q0, q1)`` (``q0 >= w``; ``q`` its rows) over their near keys
    ``[q0 - w + 1, q1)`` (``kn``: keys from slot ``n0``); ``mask``: the band (``w <= rows``) or
    the ``[rows, rows]`` upper triangle (module docstring)."""
    q0, q1 = block
    lo, r = q0 - w + 1, q1 - q0

    def call(a: int, b: int, causal: bool = False, m: torch.Tensor | None = None) -> Part:
        return _call(q, kn[:, :, a - n0 : b - n0], v[:, :, a:b], scale, causal, m)

    if r == 1 or mask is None:  # one query: every key of the window is seen
        return [call(lo, q1)]
    if w <= mask.shape[0]:  # the band, [r, r + w - 1]
        return [call(lo, q1, m=mask[None, None, :r, : q1 - lo])]
    parts = [call(q0, q1, causal=True), call(lo, lo + r, m=mask[None, None, :r, :r])]
    if lo + r < q0:
        parts.append(call(lo + r, q0))
    return parts


def _upper(rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive ``[rows, rows]`` mask: row ``r`` sees column ``c`` iff ``c >= r``."""
    seen = torch.ones(rows, rows, dtype=torch.bool, device=device).triu()
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))


def _two_sets(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, job: _Job) -> torch.Tensor:
    """A near and a far set by distance (module docstring)."""
    v, scale, sinks, rope = job.v, job.scale, job.sinks, job.rope
    far, near = job.sets.sets
    w = int(near.hi)  # type: ignore[arg-type]
    s, t = q.shape[2], k.shape[2]
    p0 = t - s  # the first query's slot
    k_pos = key_positions(q_pos, t)  # [b, t]
    # Each set's keys rotated where that set can reach them: near from slot n0 (the first
    # query's window), far below t - w (the last query's window); once where they share a rule.
    n0, f1 = max(0, p0 - w + 1), max(0, t - w)
    if (near.key, near.divide) == (far.key, far.divide):
        every = _keys(near, k, k_pos, rope)
        kn, kf = every[:, :, n0:], every[:, :, :f1]
    else:
        kn = _keys(near, k[:, :, n0:], k_pos[:, n0:], rope)
        kf = _keys(far, k[:, :, :f1], k_pos[:, :f1], rope) if f1 else k[:, :, :0]
    qn = _rotate(q, positions(near.query, q_pos), _rope(rope, near))
    qf = _rotate(q, positions(far.query, q_pos), _rope(rope, far))
    rows = min(BLOCK, s)
    mask = None
    if t > w and s > 1:
        mask = _band(rows, w, q.dtype, q.device) if w <= rows else _upper(rows, q.dtype, q.device)
    out = v.new_empty(*q.shape[:3], v.shape[-1])
    for q0, q1 in _cuts(p0, t, w, rows):
        r0, r1 = q0 - p0, q1 - p0
        if q0 < w:  # every key up to the query is near (and n0 is 0)
            parts = _until(qn[:, :, r0:r1], kn, v, 0, q0, q1, scale)
        else:
            parts = _near(qn[:, :, r0:r1], kn, v, n0, (q0, q1), w, mask, scale)
            parts += _until(qf[:, :, r0:r1], kf, v, 0, q0 - w, q1 - w, scale)
        out[:, :, r0:r1] = merge(parts, sinks)
    return out


def _chunks(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, job: _Job) -> torch.Tensor:
    """Sets by chunk (module docstring), for batch rows whose positions share one offset from
    their slots (:func:`keyset_fused` splits the others)."""
    v, scale, sinks, rope = job.v, job.scale, job.sinks, job.rope
    c = job.sets.unit
    s, t = q.shape[2], k.shape[2]
    p0 = t - s
    zero = t - 1 - int(q_pos[0, -1])  # the slot of position 0 (<= 0: keys have positions >= 0)
    k_pos = key_positions(q_pos, t)
    keys: dict[tuple[Any, int], torch.Tensor] = {}
    rotated = []
    for rule in job.sets.sets:
        if (rule.key, rule.divide) not in keys:
            keys[rule.key, rule.divide] = _keys(rule, k, k_pos, rope)
        qr = _rotate(q, positions(rule.query, q_pos), _rope(rope, rule))
        rotated.append((rule, qr, keys[rule.key, rule.divide]))
    out = v.new_empty(*q.shape[:3], v.shape[-1])
    for n in range((p0 - zero) // c, (t - 1 - zero) // c + 1):
        start = zero + n * c  # the chunk's first slot
        q0, q1 = max(p0, start), min(t, start + c)
        r0, r1 = q0 - p0, q1 - p0
        parts: list[Part] = []
        for rule, qr, kr in rotated:  # keys of chunks n - hi + 1 .. n - lo
            first = 0 if rule.hi is None else max(0, start - (rule.hi - 1) * c)
            if rule.lo == 0:  # the query's own chunk, causal
                parts += _until(qr[:, :, r0:r1], kr, v, first, q0, q1, scale)
                continue
            last = max(0, start - (rule.lo - 1) * c)
            if first < last:
                parts.append(
                    _call(qr[:, :, r0:r1], kr[:, :, first:last], v[:, :, first:last], scale)
                )
        out[:, :, r0:r1] = merge(parts, sinks)
    return out


def _one_set(q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, job: _Job) -> torch.Tensor:
    """One set: every key up to the query, by its rule's positions."""
    v, scale, rope = job.v, job.scale, job.rope
    rule, t = job.sets.sets[0], k.shape[2]
    qr = _rotate(q, positions(rule.query, q_pos), _rope(rope, rule))
    kr = _keys(rule, k, key_positions(q_pos, t), rope)
    # merged in float32 where a cache splits the keys: the output in v's dtype, as the others'
    return merge(_until(qr, kr, v, 0, t - q.shape[2], t, scale), job.sinks).to(v.dtype)


def fused_shape(sets: KeySets) -> str | None:
    """Which fused structure takes ``sets`` (``"two"``, ``"chunks"``, ``"one"``), or None."""
    rules = sets.sets
    if len(rules) == 1 and rules[0].lo == 0:
        return "one"
    if sets.unit > 1:
        return "chunks"
    if len(rules) == 2 and rules[1].lo == 0 and rules[0].lo == rules[1].hi and rules[0].lo > 0:
        return "two"
    return None


_SHAPES = {"two": _two_sets, "chunks": _chunks, "one": _one_set}


def keyset_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    scale: float,
    sets: KeySets,
    sinks: torch.Tensor | None = None,
    **rope: Any,
) -> torch.Tensor:
    """The method ``sets`` defines by fused calls (module docstring); ``rope``: ``inv_freq``
    and optionally ``attention_scaling``, ``layout``. Batch rows whose positions start at
    different slots run one at a time where the sets are by chunk."""
    q, scale = prepared(sets, q, q_pos, scale)
    shape = fused_shape(sets)
    if shape is None:
        raise ValueError(f"the fused calls take no key sets of the shape of {sets.method}")
    run = _SHAPES[shape]
    last = q_pos[:, -1]
    if shape != "chunks" or bool((last == last[0]).all()):
        return run(q, k, q_pos, _Job(v, sets, scale, sinks, rope))
    rows = [
        run(
            q[i : i + 1],
            k[i : i + 1],
            q_pos[i : i + 1],
            _Job(v[i : i + 1], sets, scale, sinks, rope),
        )
        for i in range(q.shape[0])
    ]
    return torch.cat(rows)


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
    if why is None and fused_shape(options["sets"]) is None:
        why = f"the fused calls take no key sets of the shape of {options['sets'].method}"
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


def keyset(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, **options: Any
) -> torch.Tensor:
    """:func:`posenc.extend.methods.explicit.keyset_attention`'s signature (``sets=`` the
    method); fused where it applies, FlexAttention where :data:`PATH` says."""
    if (flex := _flex()) is not None:
        return flex.keyset_flex(q, k, v, q_pos, **options)
    if _choose(q, k.shape[2], q_pos, options):
        return keyset_fused(q, k, v, q_pos, **options)
    return explicit.keyset_attention(q, k, v, q_pos, **options)
