"""One multi-head attention for every positional-encoding family.

Where position enters (DESIGN.md): an ``encoding`` module declares its ``family``:

* ``"rotary"``: ``encoding(q, k, positions, k_positions=None) -> (q, k)`` rotates queries and
  keys before the scores (and before keys enter the KV cache).
* ``"bias"``: ``encoding.bias(positions, k_positions) -> [h, s, t]`` or ``[b, h, s, t]``
  (float32) is added to the logits. Content-free, so it can be fused into SDPA's float mask;
  ``encoding.score_mod(positions, k_positions)`` gives the same bias entry by entry as a
  FlexAttention ``score_mod(score, b, h, q_idx, kv_idx)`` (see :mod:`posenc.bias`).
* ``"relative"``: content-dependent schemes own the score computation:
  ``encoding.attend(q, k, v, positions=, k_positions=, mask=, scale=, dropout_p=, attention=)``
  returns ``[b, h, s, d]``; ``attention`` is this module (DeBERTa reuses its projections).
  Both positions are None when every key sits at its index (the index layout of
  :mod:`posenc.relative`), which Transformer-XL's rel-shift needs and nobody has to read
  position values to know.
* ``"none"``: nothing happens here. ``"absolute"`` encodings are refused (a ValueError saying
  where they go): they add to the token embeddings before the first layer, as
  :class:`posenc.model.TransformerLM` does, and inside attention they would silently do nothing.

DeepSeek's decoupled RoPE (MLA) splits each head into a rotated and an unrotated part with one
shared rotary key head, and changes the softmax scale under YaRN: the recipe, with
``DecoupledRoPE``, ``expand_shared_key`` and ``mla_softmax_scale``, is in :mod:`posenc.rotary.mla`
(pass its scale as ``Attention(..., scale=mla_softmax_scale(...))``).

Positions are integer ``[s]`` or ``[b, s]`` (Hugging Face ``position_ids``); every family names
the queries' ``positions`` and the keys' ``k_positions``. Causality is by index (query ``i`` of
``s`` sees key ``j`` of ``t`` when ``j <= t - s + i``), so left padding, packing and cache offsets
change positions without changing the mask.

Capture-safe: no forward path reads tensor values back to the host (no ``.item()``, ``.any()``,
``bool(t)``), so a forward traces into one graph under ``torch.compile(fullgraph=True)`` and a
decode step can be captured in a CUDA graph. Value checks (non-negative positions) run only where
they are free (eager CPU) or as device assertions (:func:`posenc._checks.check_values`).

Execution paths (``Attention(backend=...)``):

* ``"sdpa"``: ``F.scaled_dot_product_attention``; a bias family's ``[h, s, t]`` bias is
  materialized and fused into the float mask.
* ``"flex"``: FlexAttention (``torch.nn.attention.flex_attention``), compiled; a bias family adds
  its bias entry by entry in a ``score_mod`` (never materialized) and causality is a block mask
  that skips fully masked blocks. Causal block masks come from a :class:`BlockMaskCache` shared
  by all layers. Forward everywhere; backward on GPU only (PyTorch has no FlexAttention backward
  on CPU), and no dropout.
* ``"explicit"``: ``softmax(q k^T * scale + bias) v`` written out; the only path of the
  content-dependent ``relative`` family (its ``attend``), and a reference for the others.
* ``"auto"`` (default): ``explicit`` for the relative family; for the bias family ``flex`` when
  FlexAttention can run the call (available for the device, no gradient needed on CPU, no
  dropout, float32/16/bf16), the problem is large (``s * t >= FLEX_MIN_SCORES``, where a
  materialized bias costs more than a kernel compile) and the encoding's ``score_mod`` is cheap
  for these positions (Sandwich's is, in the index layout only: ``flex_any_positions``);
  ``sdpa`` otherwise.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (
    check_choice,
    check_positions,
    check_positive_int,
    default_positions,
    resolve_head_dim,
)
from .functional.bias import bias_in_dtype

ENCODING_FAMILIES = ("none", "absolute", "rotary", "bias", "relative")
ATTENTION_BACKENDS = ("auto", "sdpa", "flex", "explicit")
# "auto" takes FlexAttention for a bias family from this many scores (s * t) up. Measured on CPU
# (2 threads, h = 8, d = 64, inference): the compiled ALiBi kernel is 4.6x faster than SDPA with
# a materialized bias at s = 512 and 11x at s = 2048; whole Attention layers at s = 2048 are
# 3.6x (Sandwich, default positions) to 5.8x (ALiBi) faster. But each new (s, t) costs a kernel compile (seconds),
# so short and decode-sized calls stay on SDPA.
FLEX_MIN_SCORES = 1024 * 1024


class DeviceConstants(nn.Module):
    """Constant tensors of an encoding (frequencies, slopes, distance tables): non-persistent
    buffers that move with the module and keep their dtype.

    ``module.to(bfloat16)`` (or ``.half()``, ``.float()``) casts every floating buffer, and a
    rounded ``inv_freq`` or slope shifts every position (the classic ``inv_freq`` bug); these
    take the device of such a conversion and never its dtype. Being on the module's device, they
    cost no host-to-device copy per call (a stall, and forbidden in CUDA-graph capture), and as
    buffers ``torch.compile`` sizes them statically. ``state_dict`` does not hold them.
    """

    def __init__(self, **tensors: torch.Tensor) -> None:
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor, persistent=False)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Any:
        for name, buf in self._buffers.items():
            if buf is not None:
                moved = fn(buf)  # [x] -> [x] on the new device, maybe in a new dtype
                self._buffers[name] = moved if moved.dtype == buf.dtype else buf.to(moved.device)
        return self

    def reset_(self, **tensors: torch.Tensor) -> None:
        """Set the constants to ``tensors`` (recomputed by the owner's ``reset_parameters``), on
        the device each one is on now and in the dtype given: after ``to_empty()`` the buffers
        hold uninitialized memory (or, on the meta device, none)."""
        for name, tensor in tensors.items():
            old = self._buffers[name]
            self._buffers[name] = tensor.to(old.device if old is not None else tensor.device)

    def get(self, name: str, device: torch.device) -> torch.Tensor:
        """The constant ``name`` on ``device``: a copy only when the module was not moved there."""
        tensor = self._buffers[name]
        assert tensor is not None
        return tensor if tensor.device == device else tensor.to(device)


class KVCache:
    """Keys (already rotated), values and key positions of one attention layer.

    Shapes: ``k, v [b, hk, t, d]``; ``positions [t]`` or ``[b, t]``. ``index_layout`` (a Python
    bool, known without reading positions) is True while every key sits at its index: all
    positions so far were the defaults ``arange(length, length + s)``.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.index_layout = True

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        *,
        index_layout: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append and return the whole cache ``(k, v, positions)``.

        ``index_layout``: the caller promises ``positions`` are ``arange(length, length + s)``.
        """
        self.index_layout = self.index_layout and index_layout
        if self.k is None or self.v is None or self.positions is None:
            # Copies laid out as every later torch.cat result is, so that a compiled decode step
            # sees the same strides at every length (a transposed view, even one contiguous but
            # for the stride of a size-1 dim, or a view of the caller's positions, would
            # recompile it once).
            fmt = torch.contiguous_format
            k, v = k.clone(memory_format=fmt), v.clone(memory_format=fmt)  # [b, hk, s, d]
            self.k, self.v, self.positions = k, v, positions.clone(memory_format=fmt)
        else:
            self.k = torch.cat((self.k, k), dim=2)  # [b, hk, t + s, d]
            self.v = torch.cat((self.v, v), dim=2)
            self.positions = cat_positions(self.positions, positions, k.shape[0])
        return self.k, self.v, self.positions


def cat_positions(a: torch.Tensor, b: torch.Tensor, batch: int) -> torch.Tensor:
    """Concatenate position tensors along the sequence, broadcasting ``[s]`` to ``[b, s]`` if needed."""
    if a.dim() == b.dim() == 1:
        return torch.cat((a, b))
    a = a.expand(batch, -1) if a.dim() == 1 else a
    b = b.expand(batch, -1) if b.dim() == 1 else b
    return torch.cat((a, b), dim=1)


class BiasFamily(Protocol):
    """What Attention calls on a ``family = "bias"`` encoding (see ``posenc.bias``)."""

    def bias(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor: ...

    def score_mod(
        self, positions: torch.Tensor, k_positions: torch.Tensor, *, index_layout: bool = False
    ) -> Callable[..., torch.Tensor]: ...


class RelativeFamily(Protocol):
    """What Attention calls on a ``family = "relative"`` encoding (see ``posenc.relative``)."""

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        positions: torch.Tensor | None,
        k_positions: torch.Tensor | None,
        index_layout: bool,
        mask: torch.Tensor | None,
        scale: float | None,
        dropout_p: float,
        attention: nn.Module | None,
    ) -> torch.Tensor: ...


def causal_block_mask(s: int, t: int, device: torch.device, block: int = 128) -> Any:
    """The causal FlexAttention ``BlockMask`` of ``s`` queries over ``t`` keys, from block indices.

    ``create_block_mask`` evaluates the mask entry by entry, an ``[s, t]`` tensor (10 GiB at
    32k); causality by index is known per block in closed form instead. Query block ``qb``
    (rows ``qb*B .. min(qb*B+B, s) - 1``) sees key ``j`` when ``j <= row + (t - s)``, so key
    block ``kb`` is *full* when its last key is visible to the block's first row, *partial* when
    its first key is visible to the block's last row, and skipped otherwise (a ragged last
    block is never full)::

        s = t = 4 blocks:   F . . .      F full (no mask_mod call), P partial, . skipped
                            F P . .      (diagonal blocks are partial)
                            F F P .
                            F F F P
    """
    from torch.nn.attention.flex_attention import BlockMask

    offset = t - s
    nq, nk = -(-s // block), -(-t // block)
    first_row = torch.arange(nq, device=device) * block  # [nq]
    last_row = torch.clamp(first_row + block, max=s) - 1
    kb = torch.arange(nk, device=device)  # [nk]
    first_key, last_key = kb * block, torch.clamp(kb * block + block, max=t) - 1
    full = last_key[None, :] <= first_row[:, None] + offset  # [nq, nk]
    # A ragged last block stays partial, as create_block_mask has it: its padding is masked.
    full &= ((last_row - first_row + 1) == block)[:, None] & ((last_key - first_key + 1) == block)
    partial = (first_key[None, :] <= last_row[:, None] + offset) & ~full  # [nq, nk]

    def indices(sel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Selected key blocks first, in ascending order: [1, 1, nq] counts, [1, 1, nq, nk] indices.
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
        return sel.sum(-1).to(torch.int32)[None, None], order.to(torch.int32)[None, None]

    def causal(
        b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
    ) -> torch.Tensor:
        return ki <= qi + offset

    kv_num, kv_idx = indices(partial)
    full_num, full_idx = indices(full)
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=causal, seq_lengths=(s, t)
    )


class BlockMaskCache:
    """Causal FlexAttention block masks keyed by ``(s, t, device)``; least recently used goes first.

    A causal block mask depends on nothing but the query and key lengths (causality is by index:
    query ``i`` of ``s`` sees key ``j`` of ``t`` when ``j <= t - s + i``) and the device, which
    make the key, so an entry can never be stale. Masks that depend on data (``attn_mask``) are
    built per call and never cached. Every :class:`Attention` shares one module-level cache
    unless given its own, so the layers of a model build each mask once.
    """

    def __init__(self, maxsize: int = 8) -> None:
        self.maxsize = check_positive_int("maxsize", maxsize)
        self._masks: OrderedDict[tuple[int, int, str], Any] = OrderedDict()

    def causal(self, s: int, t: int, device: torch.device) -> Any:
        """The ``BlockMask`` of the causal mask of ``s`` queries over ``t`` keys."""
        key = (s, t, str(torch.device(device)))
        mask = self._masks.get(key)
        if mask is None:
            mask = causal_block_mask(s, t, device)
            self._masks[key] = mask
            if len(self._masks) > self.maxsize:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        return mask

    def clear(self) -> None:
        self._masks.clear()

    def __len__(self) -> int:
        return len(self._masks)


DEFAULT_BLOCK_MASK_CACHE = BlockMaskCache()


@functools.cache
def flex_available(device_type: str) -> bool:
    """Whether compiled FlexAttention can run on this device type in this PyTorch.

    CUDA: when ``torch.nn.attention.flex_attention`` exists. CPU: also needs a C++ compiler
    (inductor builds the kernel). Cached: neither changes within a process.
    """
    try:
        import torch.nn.attention.flex_attention
    except ImportError:
        return False
    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "cpu":
        return any(
            shutil.which(c) for c in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if c
        )
    return False


@functools.cache
def flex_attention_fn(compiled: bool = True) -> Callable[..., torch.Tensor]:
    """``flex_attention``, compiled or not (the eager one materializes scores: tests and debugging).

    ``dynamic=False``: each ``(s, t)`` compiles its own kernel once. Dynamic shapes do not build
    on CPU in torch 2.13 (inductor emits C++ with an undeclared ``cur_kvSplitSize``), and past
    dynamo's recompile limit a new shape runs the eager, materializing version (with a warning).
    """
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention  # type: ignore[return-value]
    return torch.compile(flex_attention, dynamic=False)  # type: ignore[return-value]


def _check_attn_mask(attn_mask: torch.Tensor, batch: int, s: int, t: int) -> None:
    if attn_mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be bool (True = attend), got {attn_mask.dtype}")
    if attn_mask.dim() == 2:
        if tuple(attn_mask.shape) != (batch, t):
            raise ValueError(
                f"a 2-D attn_mask must be a key padding mask [batch, keys]={[batch, t]}, "
                f"got {list(attn_mask.shape)}"
            )
    elif attn_mask.dim() == 4:
        if attn_mask.shape[-2:] != (s, t):
            raise ValueError(
                f"a 4-D attn_mask must end in [s, t]={[s, t]}, got {list(attn_mask.shape)}"
            )
    else:
        raise ValueError(
            f"attn_mask must be [b, t] or [b, 1|h, s, t], got shape {tuple(attn_mask.shape)}"
        )


def flex_block_mask(
    s: int,
    t: int,
    causal: bool,
    attn_mask: torch.Tensor | None,
    batch: int,
    device: torch.device,
    cache: BlockMaskCache,
) -> Any:
    """The FlexAttention ``BlockMask`` (or None: attend everywhere) equal to :func:`build_mask`.

    Without ``attn_mask`` the causal mask comes from ``cache``. With one the mask depends on data,
    so it is built per call (a boolean pass over ``[b, s, t]``, never a float bias), and rows
    that would see no key are opened to every key, as :func:`build_mask` does, so both paths
    give the same output on them too (FlexAttention alone would give zeros there).
    """
    if attn_mask is None:
        return cache.causal(s, t, device) if causal else None
    from torch.nn.attention.flex_attention import create_block_mask

    _check_attn_mask(attn_mask, batch, s, t)
    heads: int | None = None
    if attn_mask.dim() == 2:
        mask_mod = _padding_mask_mod(attn_mask.to(device), s, t, causal)
    else:
        # A dense user mask exists already: combine it with causality once, densely.
        dense = build_mask(s, t, causal, attn_mask, batch, device)
        assert dense is not None
        dense = dense.expand(batch, -1, s, t)  # [b, 1|h, s, t]
        if dense.shape[1] == 1:
            flat = dense[:, 0]  # [b, s, t]

            def dense_mod(
                b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
            ) -> torch.Tensor:
                return flat[b, qi, ki]

            mask_mod = dense_mod
        else:
            heads = dense.shape[1]

            def dense_head_mod(
                b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
            ) -> torch.Tensor:
                return dense[b, h, qi, ki]

            mask_mod = dense_head_mod
    return create_block_mask(mask_mod, batch, heads, s, t, device=device)


def _padding_mask_mod(pad: torch.Tensor, s: int, t: int, causal: bool) -> Callable[..., Any]:
    """The ``mask_mod`` of a key padding mask ``pad [b, t]`` (and causality), with rows that see
    no key opened to every key as :func:`build_mask` does."""
    offset = t - s
    if causal:
        # Query i sees keys 0 .. i + offset: it sees some key iff one of those is kept.
        seen = pad.long().cumsum(dim=1) > 0  # [b, t]: any kept key at or before j
        last = (torch.arange(s, device=pad.device) + offset).clamp(0, t - 1)  # [s]
        row_open = ~seen[:, last]  # [b, s]
    else:
        row_open = (~pad.any(dim=1, keepdim=True)).expand(pad.shape[0], s)  # [b, s]

    def keep_mod(
        b: torch.Tensor, h: torch.Tensor, qi: torch.Tensor, ki: torch.Tensor
    ) -> torch.Tensor:
        keep = pad[b, ki]
        if causal:
            keep = keep & (ki <= qi + offset)
        return keep | row_open[b, qi]

    return keep_mod


def masked_softmax(
    scores: torch.Tensor, mask: torch.Tensor | None, dropout_p: float
) -> torch.Tensor:
    """``dropout(softmax(scores with ~mask at -inf))``, softmax in at least float32, in ``scores``' dtype.

    Shapes: ``scores [b, h, s, t]`` (already scaled), ``mask [s, t]`` or ``[b, 1|h, s, t]``.
    """
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    probs = probs.to(scores.dtype)
    if dropout_p > 0.0:
        probs = F.dropout(probs, p=dropout_p)
    return probs


def build_mask(
    s: int,
    t: int,
    causal: bool,
    attn_mask: torch.Tensor | None,
    batch: int,
    device: torch.device,
) -> torch.Tensor | None:
    """Boolean keep-mask ``[s, t]`` or ``[b, 1|h, s, t]`` (True = attend), or None for no mask.

    ``attn_mask`` is a key padding mask ``[b, t]`` or a full mask ``[b, 1|h, s, t]``, bool.
    Rows that would see no key at all (a left-padding query under a causal mask) are opened to
    every key: their output is ignored, and a fully masked row would give NaN that leaks into
    the next layer through ``0 * NaN``.
    """
    keep: torch.Tensor | None = None
    if causal:
        i = torch.arange(s, device=device)[:, None]
        j = torch.arange(t, device=device)[None, :]
        keep = j <= i + (t - s)  # [s, t]
    if attn_mask is not None:
        _check_attn_mask(attn_mask, batch, s, t)
        user = (
            attn_mask[:, None, None, :] if attn_mask.dim() == 2 else attn_mask
        )  # [b, 1|h, s|1, t]
        keep = user if keep is None else (keep & user)  # [b, 1|h, s, t]
        keep = keep | ~keep.any(dim=-1, keepdim=True)
    return keep


class Attention(nn.Module):
    """Multi-head (optionally grouped-query) self-attention with a pluggable position encoding.

    Args:
        dim: model width.
        num_heads: query heads ``h``.
        num_kv_heads: key/value heads ``hk`` (grouped-query attention); ``h % hk == 0``.
        head_dim: ``d``; default ``dim // num_heads``.
        causal: mask future keys (by index).
        encoding: a rotary, bias or relative encoding (a module with a ``family`` attribute,
            module docstring), or None (NoPE); absolute encodings belong on the embeddings.
        qkv_bias, out_bias: biases on the projections.
        dropout: attention-probability dropout while training.
        scale: softmax scale; default ``1 / sqrt(d)``.
        backend: execution path, one of ``ATTENTION_BACKENDS`` (module docstring): ``"auto"``
            picks per call; ``"sdpa"``, ``"flex"``, ``"explicit"`` force one (the relative family
            runs ``"explicit"`` only).
        compile_flex: run FlexAttention compiled (the fast path). ``False`` runs the eager
            reference, which materializes the scores: for tests and debugging.
        block_mask_cache: where causal FlexAttention block masks are kept; default one cache
            shared by every Attention.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        *,
        causal: bool = True,
        encoding: nn.Module | None = None,
        qkv_bias: bool = False,
        out_bias: bool = False,
        dropout: float = 0.0,
        scale: float | None = None,
        backend: str = "auto",
        compile_flex: bool = True,
        block_mask_cache: BlockMaskCache | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = check_positive_int(
            "num_kv_heads", num_heads if num_kv_heads is None else num_kv_heads
        )
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        self.head_dim = head_dim = resolve_head_dim(dim, num_heads, head_dim)
        self.family: str = _encoding_family(encoding, backend)
        self.encoding = encoding
        heads = getattr(encoding, "num_heads", None)
        if isinstance(heads, int) and heads != num_heads:
            raise ValueError(
                f"encoding {type(encoding).__name__} was built for num_heads={heads}, but this "
                f"Attention has num_heads={num_heads}: build it with num_heads={num_heads}"
            )
        self.backend = backend
        self.compile_flex = bool(compile_flex)
        self.block_mask_cache = (
            block_mask_cache if block_mask_cache is not None else DEFAULT_BLOCK_MASK_CACHE
        )
        self.causal = causal
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.dropout = float(dropout)
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        kw = {"device": device, "dtype": dtype}
        hd = self.head_dim
        self.q_proj = nn.Linear(dim, num_heads * hd, bias=qkv_bias, **kw)
        self.k_proj = nn.Linear(dim, self.num_kv_heads * hd, bias=qkv_bias, **kw)
        self.v_proj = nn.Linear(dim, self.num_kv_heads * hd, bias=qkv_bias, **kw)
        self.o_proj = nn.Linear(num_heads * hd, dim, bias=out_bias, **kw)

    def reset_parameters(self) -> None:
        """Reset the encoding and the projections, in the order they were built (after
        ``to_empty()`` on a meta-built module: :mod:`posenc.deferred`)."""
        self._reset_tree({id(self)})

    def _reset_tree(self, seen: set[int]) -> None:
        from .deferred import reset_submodules  # posenc.deferred imports nothing of posenc

        reset_submodules(self, seen)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, causal={self.causal}, backend={self.backend!r}"
        )

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int) -> torch.Tensor:
        b, s, _ = x.shape
        return proj(x).view(b, s, n, self.head_dim).transpose(1, 2)  # [b, n, s, d]

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        memory: torch.Tensor | None = None,
        memory_positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]`` -> ``[b, s, dim]``.

        ``positions [s]`` or ``[b, s]`` default to ``arange(past, past + s)`` where ``past`` is
        the cache (or memory) length. ``cache`` is updated in place. ``memory [b, m, dim]`` are
        Transformer-XL style hidden states of the previous segment, prepended to the keys and
        values (detached: no gradient flows into them); their positions default to
        ``arange(m)``. ``attn_mask``: bool ``[b, t]`` key padding or ``[b, 1|h, s, t]``, where
        ``t`` counts cache/memory keys too.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, seq, {self.dim}], got shape {tuple(x.shape)}")
        if cache is not None and memory is not None:
            raise ValueError(
                "pass either cache (decoding) or memory (Transformer-XL segments), not both"
            )
        b, s, _ = x.shape
        kv_input, positions, k_positions, index_layout = self._positions(
            x, positions, cache, memory, memory_positions
        )
        q = self._heads(x, self.q_proj, self.num_heads)  # [b, h, s, d]
        k = self._heads(kv_input, self.k_proj, self.num_kv_heads)  # [b, hk, t, d]
        v = self._heads(kv_input, self.v_proj, self.num_kv_heads)  # [b, hk, t, d]

        if self.family == "rotary":
            assert self.encoding is not None
            q, k = self.encoding(q, k, positions, k_positions=k_positions)
        if cache is not None:
            k, v, k_positions = cache.update(k, v, k_positions, index_layout=index_layout)
            index_layout = cache.index_layout
        out = self._attend(q, k, v, positions, k_positions, attn_mask, index_layout)
        out = out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)  # [b, s, h*d]
        return self.o_proj(out)

    def _positions(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None,
        cache: KVCache | None,
        memory: torch.Tensor | None,
        memory_positions: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        """``(kv_input [b, m + s, dim], positions, k_positions, index_layout)`` of a call.

        ``index_layout`` (known from which arguments were given, never from their values): every
        key of this call sits at its index, as when all positions are defaults.
        """
        b, s, _ = x.shape
        past = cache.length if cache is not None else (memory.shape[1] if memory is not None else 0)
        index_layout = positions is None
        if positions is None:
            positions = default_positions(s, x.device, offset=past)
        else:
            positions = _check_seq_positions(positions, "positions", b, s, x.device)
        if memory is None:
            return x, positions, positions, index_layout
        if memory.dim() != 3 or memory.shape[0] != b or memory.shape[2] != self.dim:
            raise ValueError(f"memory must be [{b}, m, {self.dim}], got {tuple(memory.shape)}")
        if memory.device != x.device:
            raise ValueError(f"memory must be on the device of x ({x.device}), got {memory.device}")
        m = memory.shape[1]
        if memory_positions is None:
            memory_positions = default_positions(m, x.device)
        else:
            memory_positions = _check_seq_positions(
                memory_positions, "memory_positions", b, m, x.device
            )
            index_layout = False
        kv_input = torch.cat((memory.detach(), x), dim=1)  # [b, m + s, dim]
        return kv_input, positions, cat_positions(memory_positions, positions, b), index_layout

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor,
        attn_mask: torch.Tensor | None,
        index_layout: bool,
    ) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` -> ``[b, h, s, d]`` on the chosen path."""
        b, s, t = q.shape[0], q.shape[2], k.shape[2]
        path = self.choose_backend(q, k, v, index_layout=index_layout)
        if path == "flex":
            return self._flex(q, k, v, positions, k_positions, attn_mask, index_layout)
        plain_causal = (
            self.causal and s == t and attn_mask is None and path == "sdpa"
            and self.family not in ("bias", "relative")
        )  # fmt: skip
        # The plain causal case goes to SDPA's is_causal kernel: no [s, t] mask is built.
        keep = None if plain_causal else build_mask(s, t, self.causal, attn_mask, b, q.device)
        if self.family == "relative":
            assert self.encoding is not None
            return cast(RelativeFamily, self.encoding).attend(
                q,
                k,
                v,
                positions=positions,
                k_positions=k_positions,
                index_layout=index_layout,
                mask=keep,
                scale=self.scale,
                dropout_p=self.dropout if self.training else 0.0,
                attention=self,
            )
        if path == "explicit":
            return self._explicit(q, k, v, positions, k_positions, keep)
        return self._sdpa(q, k, v, positions, k_positions, keep, s, t)

    def _needs_grad(self, *tensors: torch.Tensor) -> bool:
        if not torch.is_grad_enabled():
            return False
        if any(x.requires_grad for x in tensors):
            return True
        return self.encoding is not None and any(
            p.requires_grad for p in self.encoding.parameters()
        )

    def choose_backend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, index_layout: bool = True
    ) -> str:
        """The path this call takes: ``"sdpa"``, ``"flex"`` or ``"explicit"`` (module docstring).

        Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``. ``index_layout``: the call's keys sit
        at their indices (default positions). Raises if a forced ``"flex"`` cannot run this call.
        """
        if self.family == "relative":
            return "explicit"
        dropout_on = self.training and self.dropout > 0.0
        grad_on_cpu = q.device.type == "cpu" and self._needs_grad(q, k, v)
        if self.backend == "flex":
            if dropout_on:
                raise ValueError(
                    "backend='flex' has no attention dropout: use dropout=0, eval(), or 'auto'"
                )
            if grad_on_cpu:
                raise RuntimeError(
                    "backend='flex' cannot backpropagate on CPU (PyTorch has no FlexAttention "
                    "backward there): run under torch.no_grad(), or use backend='auto'/'sdpa'"
                )
            return "flex"
        if self.backend != "auto":
            return self.backend
        s, t = q.shape[2], k.shape[2]
        if (
            self.family != "bias"
            or s * t < FLEX_MIN_SCORES
            or dropout_on
            or grad_on_cpu
            or q.dtype not in (torch.float32, torch.float16, torch.bfloat16)
            or not (index_layout or getattr(self.encoding, "flex_any_positions", True))
            or not flex_available(q.device.type)
        ):
            return "sdpa"
        return "flex"

    def _flex(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor,
        attn_mask: torch.Tensor | None,
        index_layout: bool,
    ) -> torch.Tensor:
        """FlexAttention: the bias (if any) as a ``score_mod``, the mask as a block mask."""
        s, t = q.shape[2], k.shape[2]
        score_mod = None
        if self.family == "bias":
            assert self.encoding is not None
            score_mod = cast(BiasFamily, self.encoding).score_mod(
                positions, k_positions, index_layout=index_layout
            )
        block_mask = flex_block_mask(
            s, t, self.causal, attn_mask, q.shape[0], q.device, self.block_mask_cache
        )
        flex = flex_attention_fn(self.compile_flex)
        return flex(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=self.scale,
            enable_gqa=k.shape[1] != q.shape[1],
        )

    def _explicit(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor,
        keep: torch.Tensor | None,
    ) -> torch.Tensor:
        """``softmax(q k^T * scale + bias) v`` written out (a reference for the other paths)."""
        k, v = repeat_kv(k, self.num_heads), repeat_kv(v, self.num_heads)  # [b, h, t, d]
        scores = (q @ k.transpose(-1, -2)) * self.scale  # [b, h, s, t]
        if self.family == "bias":
            assert self.encoding is not None
            bias = cast(BiasFamily, self.encoding).bias(positions, k_positions)  # [(b,) h, s, t]
            scores = scores + bias_in_dtype(bias, scores.dtype, keep)
        probs = masked_softmax(scores, keep, self.dropout if self.training else 0.0)
        return probs @ v  # [b, h, s, d]

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        k_positions: torch.Tensor,
        keep: torch.Tensor | None,
        s: int,
        t: int,
    ) -> torch.Tensor:
        """Scaled dot-product attention, with the bias (if any) fused into a float mask."""
        k, v = repeat_kv(k, self.num_heads), repeat_kv(v, self.num_heads)  # [b, h, t, d]
        dropout_p = self.dropout if self.training else 0.0
        if self.family == "bias":
            assert self.encoding is not None
            bias = cast(BiasFamily, self.encoding).bias(positions, k_positions)  # [(b,) h, s, t]
            mask = bias_in_dtype(bias, q.dtype, keep)  # finite far rows in float16 too
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=self.scale
            )
        if keep is None and self.causal and s == t:
            # The plain causal mask: SDPA's fused causal kernel, no mask tensor.
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout_p, scale=self.scale
            )
        if keep is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=self.scale
        )


def _encoding_family(encoding: nn.Module | None, backend: str) -> str:
    """The family of ``encoding`` ("none" for None), checked against the backend."""
    check_choice("backend", backend, ATTENTION_BACKENDS)
    if encoding is not None and not hasattr(encoding, "family"):
        raise TypeError(
            f"encoding must be a posenc encoding with a 'family' attribute (one of "
            f"{ENCODING_FAMILIES}), or None for NoPE; got {type(encoding).__name__}"
        )
    family = getattr(encoding, "family", "none") if encoding is not None else "none"
    if family not in ENCODING_FAMILIES:
        raise ValueError(f"encoding.family must be one of {ENCODING_FAMILIES}, got {family!r}")
    if family == "absolute":
        # Attention would ignore it and run as NoPE: an absolute encoding adds to the tokens.
        raise ValueError(
            f"{type(encoding).__name__} is an absolute encoding: it adds position to the token "
            "embeddings (x = encoding(x, positions)) before the first layer, not inside "
            "attention; TransformerLM applies it there (ModelConfig(encoding=...)). Attention "
            "takes a rotary, bias or relative encoding, or None"
        )
    if family == "relative" and backend in ("sdpa", "flex"):
        raise ValueError(
            f"backend {backend!r} cannot run a relative-family encoding (its position term "
            "depends on the content, so it computes its own scores): use 'auto' or 'explicit'"
        )
    return str(family)


def _check_seq_positions(
    p: torch.Tensor, name: str, b: int, n: int, device: torch.device
) -> torch.Tensor:
    """Check ``p`` is integer ``[n]`` or ``[1|b, n]`` on x's ``device`` (values only where free)."""
    p = check_positions(p, name, ranks=(1, 2), device=device, device_of="x")
    if p.shape[-1] != n or (p.dim() == 2 and p.shape[0] not in (1, b)):
        raise ValueError(f"{name} must be [{n}] or [{b}, {n}], got {list(p.shape)}")
    return p


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Shapes: ``[b, hk, t, d]`` -> ``[b, h, t, d]``, each kv head serving ``h // hk`` query heads."""
    hk = x.shape[1]
    if hk == num_heads:
        return x
    return x.repeat_interleave(num_heads // hk, dim=1)
