"""Naive full-matrix references of the key-set methods, written from the papers' formulas and the
authors' code, independently of :mod:`posenc.extend.methods`: one ``[L, L]`` logit matrix per set,
``torch.where`` picking each (query, key)'s, one softmax (with a learned sink as one more column,
as transformers' gpt-oss eager attention), every rotation by the model's own transformers rotary
module and rotation function (``rot_at``).

Per method (query at ``i``, key at ``j``, ``d = i - j``), as the sources write them:

* Self-Extend (LongLM): ``d < W`` normal; else query ``i // G + W - W // G``, key ``j // G``.
* Dual Chunk Attention (ChunkLlama): chunks of ``c = C - l``, keys at ``j % c``; same chunk: query
  ``i % c``; previous chunk: ``min(i % c + c, C)``; earlier: ``min(2c - 1, C)``.
* STRING (HKUNLP/STRING, its decode's and figure's rule): ``d < S`` normal; else query
  ``i - S + W``, key ``j``; every logit times ``attention_factor ** 2``.
* ReRoPE (bojone/rerope ``rerope_patch.py``): ``d < w`` normal; else query at ``w``, key
  unrotated (position 0).
* Leaky ReRoPE (Su, kexue.fm 9708): ``d < w`` normal; else query at ``(i - w) / k + w`` and key at
  ``j / k`` with the model's frequencies (float positions: the blog's formula, not the code's
  ``θ / k`` tables).
* log n (Su's "log n†", the patches' ``query_states *= ((position_ids + 1).log() /
  np.log(training_length)).clip(1)``), on the queries before any rotation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

RotAt = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [b, h, L, d], positions [L])


def logn_factor(pos: torch.Tensor, length: int) -> torch.Tensor:
    """``max(1, ln(p + 1) / ln(length))`` in float64."""
    return torch.clamp(torch.log(pos.double() + 1) / math.log(length), min=1.0)


def naive_logits(
    q: torch.Tensor, k: torch.Tensor, rot_at: RotAt, method: str, o: dict[str, Any], scale: float
) -> torch.Tensor:
    """``[b, h, L, L]`` logits (causality not yet applied) of unrotated ``q``, ``k [b, h, L, d]``
    (key heads repeated), positions ``0 .. L-1``."""
    L = q.shape[2]
    pos = torch.arange(L)
    d = pos[:, None] - pos[None]  # [L, L]

    def logits(qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
        return rot_at(q, qp) @ rot_at(k, kp).transpose(-1, -2) * scale

    near = logits(pos, pos)
    if method == "self_extend":
        g, w = o["group_size"], o["neighbor_window"]
        return torch.where(d < w, near, logits(pos // g + w - w // g, pos // g))
    if method == "dual_chunk":
        size = o["chunk_size"]
        c = size - o["local_size"]
        kp = pos % c
        apart = pos[:, None] // c - pos[None] // c
        intra, succ = logits(pos % c, kp), logits((pos % c + c).clamp(max=size), kp)
        inter = logits(torch.full_like(pos, min(2 * c - 1, size)), kp)
        return torch.where(apart == 0, intra, torch.where(apart == 1, succ, inter))
    if method == "string":
        s, w = o["shifted_offset"], o["local_window"]
        picked = torch.where(d < s, near, logits(pos - s + w, pos))
        return picked * o.get("attention_factor", 1.0) ** 2
    if method == "rerope":
        w = o["window"]
        return torch.where(d < w, near, logits(torch.full_like(pos, w), torch.zeros_like(pos)))
    if method == "leaky_rerope":
        w, kf = o["window"], o["k"]
        return torch.where(d < w, near, logits((pos - w) / kf + w, pos / kf))
    assert method == "logn", method
    return near


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    rot_at: RotAt,
    method: str,
    options: dict[str, Any],
    scale: float,
    *,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """The method's attention over ``L`` queries and keys at positions ``0 .. L-1``: unrotated
    ``q [b, h, L, d]``, ``k, v [b, hk, L, d]`` -> ``[b, h, L, d]``. ``window``: a sliding window
    (only for checking that a method is *not* applied to such a layer)."""
    h, L = q.shape[1], q.shape[2]
    k, v = (x.repeat_interleave(h // x.shape[1], dim=1) for x in (k, v))
    length = options.get("logn") or (options["length"] if method == "logn" else None)
    if length:
        q = (q * logn_factor(torch.arange(L), length)[:, None].to(q.dtype)).to(q.dtype)
    w = naive_logits(q, k, rot_at, method, options, scale)
    if softcap:
        w = torch.tanh(w / softcap) * softcap
    d = torch.arange(L)[:, None] - torch.arange(L)[None]
    visible = (d >= 0) & (d < (window or L + 1))
    w = w.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        column = sinks.reshape(1, -1, 1, 1).expand(w.shape[0], -1, L, 1).to(w.dtype)
        return torch.softmax(torch.cat([w, column], -1), -1)[..., :-1] @ v
    return torch.softmax(w, dim=-1) @ v


# --- inside a transformers model ------------------------------------------------------------------


def rotation_of(model: Any) -> tuple[Any, str, Callable[..., Any]]:
    """``(modeling module, name of its rotation function, rot_at(x, positions, layer_type))``:
    ``x [b, h, L, d]`` rotated at ``positions [L]`` by the model's rotary module and transformers'
    own rotation function (read now, before a test replaces it)."""
    import sys

    layer = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
    modeling = sys.modules[type(layer).__module__]
    decoder = model.model if hasattr(model, "model") else model.get_decoder()  # GPT-NeoX, Falcon
    # the decoder's rotary module, by its class (LFM2-MoE names it pos_emb)
    rotary = getattr(decoder, "rotary_emb", None) or next(
        m for m in decoder.children() if type(m).__name__.endswith("RotaryEmbedding")
    )
    name = "apply_rotary_emb" if hasattr(modeling, "apply_rotary_emb") else "apply_rotary_pos_emb"
    stock = _inner(getattr(modeling, name))
    one_tensor = _stock_args(modeling, name)[0] == "x"  # Gemma-3n's f(x, cos, sin)

    def rot_at(x: torch.Tensor, p: torch.Tensor, layer_type: str | None = None) -> torch.Tensor:
        args = (x, p[None]) + ((layer_type,) if isinstance(rotary.rope_type, dict) else ())
        table = rotary(*args)
        if name == "apply_rotary_emb":  # Llama-4: [b, s, h, d] and a complex table
            xs = x.transpose(1, 2)
            return stock(xs, xs, table)[0].transpose(1, 2)
        cos, sin = table
        if one_tensor:
            return stock(x, cos, sin)
        try:
            return stock(x, x, cos, sin)[0]
        except RuntimeError:  # partial rotary (Phi, Persimmon, StableLM): the attention rotates
            r = cos.shape[-1]  # channels 0..r-1 and passes r.. through, as here
            return torch.cat((stock(x[..., :r], x[..., :r], cos, sin)[0], x[..., r:]), -1)

    return modeling, name, rot_at


def _inner(fn: Any) -> Any:
    """The Python function inside transformers' hub-kernel wrapper of a rotation, if any."""
    from posenc.hf.shadow import plain_function

    return plain_function(fn)


def reference_logits(
    model: Any, ids: torch.Tensor, method: str, options: dict[str, Any], monkeypatch: Any
) -> torch.Tensor:
    """transformers' own forward of ``model`` (positions ``0 .. L-1``, no cache) whose rotation is
    the identity and whose attention is this test's: on a full-attention layer with RoPE, the
    method by :func:`naive_attention` (the layer's softmax scale, soft cap and learned sinks); on
    any other layer transformers' eager attention as it is, after transformers' rotation where
    the layer rotates, with its causal, sliding or chunked mask written here."""
    from transformers import AttentionInterface

    modeling, name, rot_at = rotation_of(model)
    eager = modeling.eager_attention_forward
    text = model.config.get_text_config(decoder=True)
    types = getattr(text, "layer_types", None)

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        layer_type = types[module.layer_idx] if types else None
        rope = bool(getattr(module, "use_rope", True))
        L = query.shape[2]

        def at(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return rot_at(x, p, layer_type)

        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        sinks = getattr(module, "sinks", None)
        chunk = text.attention_chunk_size if layer_type == "chunked_attention" else None
        if rope and not kw.get("sliding_window") and not chunk:
            o = naive_attention(query, key, value, at, method, options, scale,
                                softcap=kw.get("softcap"), sinks=sinks)  # fmt: skip
            return o.transpose(1, 2).contiguous(), None
        i, j = torch.arange(L)[:, None], torch.arange(L)[None]
        visible = (i >= j) & (i - j < (kw.get("sliding_window") or L + 1))
        if chunk:
            visible &= i // chunk == j // chunk
        mask = torch.zeros(L, L).masked_fill(~visible, torch.finfo(torch.float32).min)
        if rope:
            query, key = at(query, torch.arange(L)), at(key, torch.arange(L))
        return eager(module, query, key, value, mask[None, None], scaling=scaling, **kw)

    AttentionInterface.register("posenc_test_keysets", attention)
    identity = (lambda x, *a, **k: x) if _stock_args(modeling, name)[0] == "x" else (
        lambda q, k, *a, **kw: (q, k))  # fmt: skip
    monkeypatch.setattr(modeling, name, identity)
    before = [(m, m.config._attn_implementation) for m in model.modules() if hasattr(m, "config")]
    for m, _ in before:
        m.config._attn_implementation = "posenc_test_keysets"
    try:
        with torch.no_grad():
            return model(ids, use_cache=False).logits
    finally:
        for m, impl in before:
            m.config._attn_implementation = impl
        monkeypatch.undo()


def _stock_args(modeling: Any, name: str) -> tuple[str, ...]:
    fn = _inner(getattr(modeling, name))
    return fn.__code__.co_varnames[: fn.__code__.co_argcount]


def prefill_and_decode(model: Any, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Logits of a whole prefill, then of a ``split``-token prefill and one-token decode steps
    through transformers' KV cache (the logits of positions ``split ..``)."""
    with torch.no_grad():
        whole = model(ids).logits
        out = model(ids[:, :split], use_cache=True)
        cache, steps = out.past_key_values, []
        for i in range(split, ids.shape[1]):
            out = model(ids[:, i : i + 1], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            steps.append(out.logits[:, -1])
    return torch.cat([whole, torch.stack(steps, 1)], 1)


def left_padded(vocab: int, seed: int = 4) -> tuple[torch.Tensor, ...]:
    """``(ids [2, 36], mask, positions, short [1, 29])``: a row of 36 tokens beside ``short``
    left-padded by 7, with transformers' mask and positions (each row from 0)."""
    g = torch.Generator().manual_seed(seed)
    long, short = (
        torch.randint(1, vocab, (1, 36), generator=g),
        torch.randint(1, vocab, (1, 29), generator=g),
    )
    ids = torch.cat((long, torch.cat((torch.zeros(1, 7, dtype=torch.long), short), 1)))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), short


def sweep_reference(model: Any, ids: torch.Tensor, method: str, options: dict[str, Any]) -> Any:
    """:func:`reference_logits` as :mod:`posenc.testing.coverage` calls it (no pytest fixture)."""
    from _pytest.monkeypatch import MonkeyPatch

    patcher = MonkeyPatch()
    try:
        return reference_logits(model, ids, method, options, patcher)
    finally:
        patcher.undo()
