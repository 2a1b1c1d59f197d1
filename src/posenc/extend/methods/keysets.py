"""Training-free long-context methods as definitions of key sets.

Each method keeps the model's RoPE and splits the keys of a query into disjoint *sets*; a set
says which keys it holds and by which positions (and frequencies) its queries and keys are
rotated. One softmax spans the union of the sets (the log-sum-exp merge of each set's softmax):
the explicit, fused and FlexAttention paths (:mod:`.explicit`, :mod:`.fused`, :mod:`.flex`)
consume these definitions and none of them knows a method by name.

A set holds the keys whose ``band = i // unit - j // unit`` (query position ``i``, key position
``j``, floor division) is in ``[lo, hi)``; with ``unit`` 1 the band is the distance ``d = i - j``.
Per method (``L`` the trained length):

==============  ====  ============  =================================  ===================  =====
method          unit  set (band)    query position                     key position         freq
==============  ====  ============  =================================  ===================  =====
self_extend     1     near [0, W)   ``i``                              ``j``                θ
                      far [W, ∞)    ``i // G + W - W // G``            ``j // G``           θ
dual_chunk      c     intra [0, 1)  ``i % c``                          ``j % c``            θ
                      succ [1, 2)   ``min(i % c + c, C)``              ``j % c``            θ
                      inter [2, ∞)  ``min(2c - 1, C)``                 ``j % c``            θ
string          1     near [0, S)   ``i``                              ``j``                θ
                      far [S, ∞)    ``max(i - S + W, 0)``              ``j``                θ
rerope          1     near [0, w)   ``i``                              ``j``                θ
                      far [w, ∞)    ``w``                              ``0``                θ
leaky_rerope    1     near [0, w)   ``i``                              ``j``                θ
                      far [w, ∞)    ``i + w (k - 1)``                  ``j``                θ / k
logn            1     all [0, ∞)    ``i``                              ``j``                θ
==============  ====  ============  =================================  ===================  =====

(Dual Chunk Attention: ``C`` = ``chunk_size``, ``c = chunk_size - local_size``.) The relative
distance each key is seen at is :func:`relative_positions`: Self-Extend ``i // G - j // G + W -
W // G`` past the window; STRING ``d - S + W`` past ``S`` (its rarely trained largest distances
never used, ``[W, S)`` reused); ReRoPE ``min(d, w)``; Leaky ReRoPE ``w + (d - w) / k`` past ``w``.

Two more ingredients act on every set alike:

* ``logit_factor``: every logit times it (STRING's ``attention_factor ** 2``: the authors'
  code multiplies the cos/sin tables of query and key by ``1 + 0.1 ln 2``);
* ``logn``: Su's inference-time log-length query scale ``max(1, ln(p + 1) / ln(L))`` at the
  query's position id ``p`` (:mod:`posenc.rotary.temperature`, kind ``"logn"``), applied to the
  queries before any rotation (a scalar per query: it commutes with every set's rotation).

Sources: LongLM (Self-Extend), ChunkLlama and vLLM's ``DualChunkRotaryEmbedding`` (DCA),
HKUNLP/STRING's ``string_for_llama.py`` (its decode's disjoint rule: a key at distance exactly
``S`` is far; the authors' flash-attention prefill counts that one key in both sets), bojone/rerope's
``rerope_patch.py`` and ``leaky_rerope_patch.py`` (and their log-n query scale).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

#: ``positions [b, n] -> positions [b, n]`` (integers), or None: the positions as they are.
PositionRule = Callable[[torch.Tensor], torch.Tensor] | None


@dataclass(frozen=True)
class Rule:
    """One key set: the keys whose band is in ``[lo, hi)`` (``hi`` None: unbounded), the
    positions its queries (``query``) and keys (``key``) are rotated by, and ``divide``: its
    frequencies are the model's divided by this (Leaky ReRoPE's ``k``)."""

    lo: int
    hi: int | None
    query: PositionRule = None
    key: PositionRule = None
    divide: int = 1

    def max_distance(self, unit: int) -> int | None:
        """The largest distance ``i - j`` a key of this set can have (None: unbounded)."""
        return None if self.hi is None else unit * self.hi - 1


@dataclass(frozen=True)
class KeySets:
    """A method as key sets (module docstring). ``sets[0]`` is the unbounded set; the others
    are bounded bands; together they cover every band ``>= 0`` once."""

    method: str
    unit: int
    sets: tuple[Rule, ...]
    logit_factor: float = 1.0
    logn: int | None = None  # the trained length of the log-n query scale, or None

    def which(self, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        """The set of each (query, key): ``qp [b, r]``, ``kp [b, n]`` positions -> ``[b, r, n]``
        indices into :attr:`sets` (long)."""
        u = self.unit
        band = qp[:, :, None] // u - kp[:, None, :] // u  # [b, r, n]
        chosen = torch.zeros_like(band)
        for index, rule in enumerate(self.sets[1:], start=1):
            inside = (band >= rule.lo) & (band < rule.hi)  # type: ignore[operator]
            chosen = torch.where(inside, index, chosen)
        return chosen


def positions(rule: PositionRule, pos: torch.Tensor) -> torch.Tensor:
    """``rule`` applied to ``pos`` (None: ``pos`` itself)."""
    return pos if rule is None else rule(pos)


def prepared(
    sets: KeySets, q: torch.Tensor, q_pos: torch.Tensor, scale: float
) -> tuple[torch.Tensor, float]:
    """``(q, scale)`` with the method's log-n query scale and logit factor applied: what every
    path does first. ``q [b, h, s, d]``, ``q_pos [b, s]``."""
    if sets.logn is not None:
        from ...rotary.temperature import logn_scale

        factor = logn_scale(q_pos, sets.logn)  # [b, s] float32
        q = q * factor[:, None, :, None].to(q.dtype)  # the authors' cast, then the product
    return q, scale * sets.logit_factor


def relative_positions(sets: KeySets, n: int) -> torch.Tensor:
    """The relative distance at which each query of positions ``0 .. n-1`` sees each earlier key:
    float64 ``[n, n]``, NaN above the diagonal (the picture of a method)."""
    pos = torch.arange(n, dtype=torch.long)[None]  # [1, n]
    chosen = sets.which(pos, pos)[0]  # [n, n]
    out = torch.full((n, n), math.nan, dtype=torch.float64)
    for index, rule in enumerate(sets.sets):
        qp = positions(rule.query, pos)[0].double()[:, None]  # [n, 1]
        kp = positions(rule.key, pos)[0].double()[None, :]  # [1, n]
        out = torch.where(chosen == index, (qp - kp) / rule.divide, out)
    visible = torch.ones(n, n, dtype=torch.bool).tril()
    return out.masked_fill(~visible, math.nan)


# --- the methods --------------------------------------------------------------------------------


def _self_extend(group_size: int, neighbor_window: int) -> tuple[int, tuple[Rule, ...]]:
    g, w = group_size, neighbor_window
    far = Rule(w, None, lambda p: p // g + (w - w // g), lambda p: p // g)  # keeps d = w at w
    return 1, (far, Rule(0, w))


def _dual_chunk(chunk_size: int, local_size: int) -> tuple[int, tuple[Rule, ...]]:
    c = chunk_size - local_size  # the chunk length

    def key(p: torch.Tensor) -> torch.Tensor:  # one rule object: every set shares its keys
        return p % c

    inter = Rule(2, None, lambda p: torch.full_like(p, min(2 * c - 1, chunk_size)), key)
    intra = Rule(0, 1, lambda p: p % c, key)
    successive = Rule(1, 2, lambda p: (p % c + c).clamp(max=chunk_size), key)
    return c, (inter, intra, successive)


def _string(shifted_offset: int, local_window: int) -> tuple[int, tuple[Rule, ...]]:
    s, w = shifted_offset, local_window
    # Rows before S - W would sit at negative positions; they have no far key (d >= S needs
    # i >= S), so the clamp changes nothing they see and keeps the positions table-indexable.
    far = Rule(s, None, lambda p: (p - s + w).clamp(min=0))
    return 1, (far, Rule(0, s))


def _rerope(window: int) -> tuple[int, tuple[Rule, ...]]:
    w = window
    far = Rule(w, None, lambda p: torch.full_like(p, w), torch.zeros_like)  # key unrotated
    return 1, (far, Rule(0, w))


def _leaky_rerope(window: int, k: int) -> tuple[int, tuple[Rule, ...]]:
    w = window
    far = Rule(w, None, lambda p: p + w * (k - 1), None, divide=k)  # (i - w) / k + w vs j / k
    return 1, (far, Rule(0, w))


def _logn(length: int) -> tuple[int, tuple[Rule, ...]]:
    return 1, (Rule(0, None),)


#: method -> builder of ``(unit, sets)`` from the method's own options.
BUILDERS: dict[str, Callable[..., tuple[int, tuple[Rule, ...]]]] = {
    "self_extend": _self_extend,
    "dual_chunk": _dual_chunk,
    "string": _string,
    "rerope": _rerope,
    "leaky_rerope": _leaky_rerope,
    "logn": _logn,
}


# --- the defaults ``posenc extend`` fills in ---------------------------------------------------------


def smallest_group(trained_len: int, target_len: int, window: int) -> int:
    """Self-Extend's default group: the smallest ``G >= 2`` whose largest grouped query position,
    ``(target - 1) // G + W - W // G``, is a position the model was trained on (``<= trained -
    1``); when none is (a window as long as training), the group that comes nearest."""
    for g in range(2, max(3, target_len + 1)):
        if (target_len - 1) // g + window - window // g <= trained_len - 1:
            return g
    return max(2, target_len)


def _self_extend_defaults(o: dict[str, Any], trained: int, target: int) -> dict[str, Any]:
    window = o.get("neighbor_window", max(1, trained // 4))
    group = o.get("group_size")
    if group is None:
        group = smallest_group(trained, target, window)
    return {"group_size": group, "neighbor_window": window}


def _dual_chunk_defaults(o: dict[str, Any], trained: int, target: int) -> dict[str, Any]:
    chunk = o.get("chunk_size", trained * 3 // 4)  # ChunkLlama: 3/4 of the trained length
    return {"chunk_size": chunk, "local_size": o.get("local_size", max(1, chunk // 32))}


def _string_defaults(o: dict[str, Any], trained: int, target: int) -> dict[str, Any]:
    # The authors' README: shifted_offset = int(0.33 * L), small_local_value 128 (to 512).
    shifted = o.get("shifted_offset", int(0.33 * trained))
    return {"shifted_offset": shifted, "local_window": o.get("local_window", min(128, shifted - 1))}


def _rerope_defaults(o: dict[str, Any], trained: int, target: int) -> dict[str, Any]:
    return {"window": o.get("window", max(1, trained // 4))}  # Su: 1/4 to 1/2 of training


def _leaky_rerope_defaults(o: dict[str, Any], trained: int, target: int) -> dict[str, Any]:
    window = o.get("window", max(1, trained // 4))
    k = o.get("k")
    if k is None:  # Su (9728): the smallest k with w + (N - 1 - w) / k <= L / 2; else his code's 16
        room = trained / 2 - window
        k = max(1, math.ceil((target - 1 - window) / room)) if room > 0 else 16
    return {"window": window, "k": k}


#: method -> ``(options given, trained length, target length) -> its options with the defaults
#: filled in`` (the options given checked one by one already, kept as given): the authors'
#: defaults where they give one, else chosen so the largest position a query sees stays inside
#: the trained length (Self-Extend's group).
DEFAULTS: dict[str, Callable[[dict[str, Any], int, int], dict[str, Any]]] = {
    "self_extend": _self_extend_defaults,
    "dual_chunk": _dual_chunk_defaults,
    "string": _string_defaults,
    "rerope": _rerope_defaults,
    "leaky_rerope": _leaky_rerope_defaults,
    "logn": lambda o, trained, target: {"length": o.get("length", trained)},
}


def key_sets(method: str, options: Mapping[str, Any]) -> KeySets:
    """The key sets of ``method`` with ``options`` as :func:`posenc.hf.normalize_extension`
    returns them (checked there): the method's own options, and ``logn`` (every method) and
    ``attention_factor`` (``string``) where given."""
    return _key_sets(method, tuple(sorted(options.items())))


def by_method(run: Callable[..., torch.Tensor], method: str) -> Callable[..., torch.Tensor]:
    """A key-set path ``run`` (``keyset_attention``, ``keyset_flex``, ``keyset``) for ``method``,
    taking the method's own options as keywords beside the path's:
    ``by_method(keyset_attention, "self_extend")(q, k, v, q_pos, group_size=4,
    neighbor_window=64, inv_freq=..., scale=...)``."""
    own = {*inspect.signature(BUILDERS[method]).parameters, "logn", "attention_factor"}

    def call(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, **options: Any
    ) -> torch.Tensor:
        mine = {n: options.pop(n) for n in list(options) if n in own}
        return run(q, k, v, q_pos, sets=key_sets(method, mine), **options)

    call.__name__ = f"{method}_{getattr(run, '__name__', 'attention')}"
    return call


@functools.lru_cache(maxsize=256)
def _key_sets(method: str, items: tuple[tuple[str, Any], ...]) -> KeySets:
    options = dict(items)
    logn = options.pop("logn", None) or (options["length"] if method == "logn" else None)
    factor = float(options.pop("attention_factor", 1.0))
    unit, sets = BUILDERS[method](**options)
    return KeySets(method, unit, sets, factor * factor, logn)
