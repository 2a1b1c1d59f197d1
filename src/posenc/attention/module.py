"""The :class:`Attention` module: project, position context, family hook, cache, path, output."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._checks import check_choice, check_positive_int, resolve_head_dim
from .cache import KVCache
from .context import PositionContext, ScoreContext, position_context
from .hooks import FamilyHook, resolve_hook
from .masks import DEFAULT_BLOCK_MASK_CACHE, BlockMaskCache, build_mask, flex_block_mask
from .paths import explicit_path, flex_path, sdpa_path
from .policy import ATTENTION_BACKENDS, choose_backend

#: ``hook(q [b, h, s, d], call) -> q'``: a query transform after any rotation and the cache
#: update, before the scores (the query temperature of Llama-4 and Ministral-3).
QueryHook = Callable[[torch.Tensor, ScoreContext], torch.Tensor]


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
        query_hook: ``hook(q, call) -> q`` applied to the queries after any rotation and the
            cache update, before the scores (:class:`~posenc.rotary.QueryTemperature`'s
            ``scale_queries``), or None.
    """

    _hook: FamilyHook  # resolved from the encoding when it is set (__setattr__)
    family: str  # the encoding's family, for reading (the hook is what runs)

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
        query_hook: QueryHook | None = None,
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
        self.backend = check_choice("backend", backend, ATTENTION_BACKENDS)
        self.encoding = encoding  # resolves the family hook (__setattr__)
        heads = getattr(encoding, "num_heads", None)
        if isinstance(heads, int) and heads != num_heads:
            raise ValueError(
                f"encoding {type(encoding).__name__} was built for num_heads={heads}, but this "
                f"Attention has num_heads={num_heads}: build it with num_heads={num_heads}"
            )
        self.query_hook = query_hook
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
        from ..deferred import reset_submodules  # posenc.deferred imports nothing of posenc

        reset_submodules(self, seen)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, causal={self.causal}, backend={self.backend!r}"
        )

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int) -> torch.Tensor:
        b, s, _ = x.shape
        return proj(x).view(b, s, n, self.head_dim).transpose(1, 2)  # [b, n, s, d]

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "encoding":
            # The hook is resolved once per encoding, here: forward never tests the family.
            hook = resolve_hook(value, self.backend)
            object.__setattr__(self, "_hook", hook)
            object.__setattr__(self, "family", hook.kind)

    def context(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        memory: torch.Tensor | None = None,
        memory_positions: torch.Tensor | None = None,
    ) -> PositionContext:
        """The :class:`~posenc.attention.PositionContext` of a call on ``x [b, s, dim]`` (what
        ``forward`` builds when given none): positions checked once, defaults after the cache's
        (or memory's) length."""
        b, s, _ = x.shape
        past = cache.length if cache is not None else (memory.shape[1] if memory is not None else 0)
        m = memory.shape[1] if memory is not None else None
        return position_context(
            positions, batch=b, seq=s, device=x.device, past=past, memory=m,
            memory_positions=memory_positions,
        )  # fmt: skip

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        memory: torch.Tensor | None = None,
        memory_positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        context: PositionContext | None = None,
    ) -> torch.Tensor:
        """Shapes: ``x [b, s, dim]`` -> ``[b, s, dim]``.

        ``positions [s]`` or ``[b, s]`` default to ``arange(past, past + s)`` where ``past`` is
        the cache (or memory) length. ``cache`` is updated in place. ``memory [b, m, dim]`` are
        Transformer-XL style hidden states of the previous segment, prepended to the keys and
        values (detached: no gradient flows into them); their positions default to
        ``arange(m)``. ``attn_mask``: bool ``[b, t]`` key padding or ``[b, 1|h, s, t]``, where
        ``t`` counts cache/memory keys too. ``context``: the forward's position context (built by
        a model once for all its layers, :meth:`context`) instead of ``positions`` and
        ``memory_positions``.
        """
        out, _ = self._run(x, positions, cache, memory, memory_positions, attn_mask, context)
        return out

    def attention_probs(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        attn_mask: torch.Tensor | None = None,
        context: PositionContext | None = None,
    ) -> torch.Tensor:
        """The attention probabilities of a call on ``x [b, s, dim]``: ``[b, h, s, s]``, each row
        summing to 1 and zero on masked keys, from the explicit path (the same scores, bias and
        mask as ``forward``; no dropout, no cache)."""
        _, probs = self._run(x, positions, None, None, None, attn_mask, context, probs=True)
        assert probs is not None
        return probs

    def _run(
        self,
        x: torch.Tensor,
        positions: torch.Tensor | None,
        cache: KVCache | None,
        memory: torch.Tensor | None,
        memory_positions: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        ctx: PositionContext | None,
        probs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """project -> position context -> family hook -> cache -> path -> output."""
        kv_input = self._kv_input(x, cache, memory)
        if ctx is None:
            ctx = self.context(
                x, positions, cache=cache, memory=memory, memory_positions=memory_positions
            )
        elif positions is not None or memory_positions is not None:
            raise ValueError("pass positions (and memory_positions) or context, not both")
        b, s, _ = x.shape
        q = self._heads(x, self.q_proj, self.num_heads)  # [b, h, s, d]
        k = self._heads(kv_input, self.k_proj, self.num_kv_heads)  # [b, hk, t, d]
        v = self._heads(kv_input, self.v_proj, self.num_kv_heads)  # [b, hk, t, d]
        q, k = self._hook.prepare(q, k, ctx)
        k_positions, index_layout = ctx.k_positions, ctx.index_layout
        if cache is not None:
            k, v, k_positions = cache.update(k, v, k_positions, index_layout=index_layout)
            index_layout = cache.index_layout
        call = ScoreContext(
            ctx.positions, k_positions, index_layout, self.scale, self.causal,
            q_proj=self.q_proj, k_proj=self.k_proj,
        )  # fmt: skip
        if self.query_hook is not None:
            q = self.query_hook(q, call)
        out, weights = self._attend(q, k, v, ctx, call, attn_mask, probs)
        out = out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)  # [b, s, h*d]
        return self.o_proj(out), weights

    def _kv_input(
        self, x: torch.Tensor, cache: KVCache | None, memory: torch.Tensor | None
    ) -> torch.Tensor:
        """``x [b, s, dim]``, with the memory ``[b, m, dim]`` (if any) first: ``[b, m + s, dim]``."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be [batch, seq, {self.dim}], got shape {tuple(x.shape)}")
        if cache is not None and memory is not None:
            raise ValueError(
                "pass either cache (decoding) or memory (Transformer-XL segments), not both"
            )
        if memory is None:
            return x
        b = x.shape[0]
        if memory.dim() != 3 or memory.shape[0] != b or memory.shape[2] != self.dim:
            raise ValueError(f"memory must be [{b}, m, {self.dim}], got {tuple(memory.shape)}")
        if memory.device != x.device:
            raise ValueError(f"memory must be on the device of x ({x.device}), got {memory.device}")
        return torch.cat((memory.detach(), x), dim=1)  # [b, m + s, dim]

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        ctx: PositionContext,
        call: ScoreContext,
        attn_mask: torch.Tensor | None,
        probs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` -> ``[b, h, s, d]`` on the chosen
        path (and the probabilities ``[b, h, s, t]`` when ``probs``: the explicit path)."""
        b, s, t = q.shape[0], q.shape[2], k.shape[2]
        hook = self._hook
        path = "explicit" if probs else self.choose_backend(q, k, v, index_layout=call.index_layout)
        dropout_p = self.dropout if self.training and not probs else 0.0
        if path == "flex":
            block_mask = flex_block_mask(
                s, t, self.causal, attn_mask, b, q.device, self.block_mask_cache
            )
            out = flex_path(
                q, k, v, scale=self.scale, score_mod=hook.score_mod(ctx, call),
                block_mask=block_mask, compiled=self.compile_flex,
            )  # fmt: skip
            return out, None
        plain_causal = (
            self.causal and s == t and attn_mask is None and path == "sdpa" and hook.plain_logits
        )
        # The plain causal case goes to SDPA's is_causal kernel: no [s, t] mask is built.
        keep = None if plain_causal else build_mask(s, t, self.causal, attn_mask, b, q.device)
        call.mask = keep
        bias = hook.bias(ctx, call)
        if path == "sdpa":
            out = sdpa_path(
                q, k, v, scale=self.scale, mask=keep, causal=self.causal, bias=bias,
                dropout_p=dropout_p,
            )  # fmt: skip
            return out, None
        got = explicit_path(
            q, k, v, scale=self.scale, mask=keep, bias=bias, scores=hook.scores(call),
            values=hook.values(call), dropout_p=dropout_p, return_probs=True,
        )  # fmt: skip
        assert isinstance(got, tuple)
        return got

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
        """The path this call takes: ``"sdpa"``, ``"flex"`` or ``"explicit"``
        (:func:`~posenc.attention.choose_backend` with this layer's settings).

        Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]``. ``index_layout``: the call's keys sit
        at their indices (default positions). Raises if a forced ``"flex"`` cannot run this call.
        """
        hook: FamilyHook = self._hook
        return choose_backend(
            self.backend,
            hook.kind,
            q,
            k,
            dropout_on=self.training and self.dropout > 0.0,
            needs_grad=q.device.type == "cpu" and self._needs_grad(q, k, v),
            index_layout=index_layout,
            flex_any_positions=hook.flex_any_positions,
        )
