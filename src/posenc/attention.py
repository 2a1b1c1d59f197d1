"""One multi-head attention for every positional-encoding family.

Where position enters (DESIGN.md): an ``encoding`` module declares its ``family``:

* ``"rotary"``: ``encoding(q, k, positions, k_positions=None) -> (q, k)`` rotates queries and
  keys before the scores (and before keys enter the KV cache).
* ``"bias"``: ``encoding.bias(q_positions, k_positions) -> [h, s, t]`` or ``[b, h, s, t]``
  (float32) is added to the logits. Content-free, so it can be fused into SDPA's float mask.
* ``"relative"``: content-dependent schemes own the score computation:
  ``encoding.attend(q, k, v, q_positions=, k_positions=, mask=, scale=, dropout_p=, attention=)``
  returns ``[b, h, s, d]``; ``attention`` is this module (DeBERTa reuses its projections).
* ``"absolute"`` and ``"none"``: nothing happens here; absolute encodings are added to the token
  embeddings by the model.

Positions are integer ``[s]`` or ``[b, s]`` (Hugging Face ``position_ids``). Causality is by index
(query ``i`` of ``s`` sees key ``j`` of ``t`` when ``j <= t - s + i``), so left padding, packing and
cache offsets change positions without changing the mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_positions, check_positive_int, default_positions

ENCODING_FAMILIES = ("none", "absolute", "rotary", "bias", "relative")


class KVCache:
    """Keys (already rotated), values and key positions of one attention layer.

    Shapes: ``k, v [b, hk, t, d]``; ``positions [t]`` or ``[b, t]``.
    """

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def update(
        self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append and return the whole cache ``(k, v, positions)``."""
        if self.k is None or self.v is None or self.positions is None:
            self.k, self.v, self.positions = k, v, positions
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
        if attn_mask.dtype != torch.bool:
            raise TypeError(f"attn_mask must be bool (True = attend), got {attn_mask.dtype}")
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (batch, t):
                raise ValueError(
                    f"a 2-D attn_mask must be a key padding mask [batch, keys]={[batch, t]}, "
                    f"got {list(attn_mask.shape)}"
                )
            user = attn_mask[:, None, None, :]  # [b, 1, 1, t]
        elif attn_mask.dim() == 4:
            if attn_mask.shape[-2:] != (s, t):
                raise ValueError(
                    f"a 4-D attn_mask must end in [s, t]={[s, t]}, got {list(attn_mask.shape)}"
                )
            user = attn_mask
        else:
            raise ValueError(
                f"attn_mask must be [b, t] or [b, 1|h, s, t], got shape {tuple(attn_mask.shape)}"
            )
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
        encoding: a module with a ``family`` attribute (module docstring), or None (NoPE).
        qkv_bias, out_bias: biases on the projections.
        dropout: attention-probability dropout while training.
        scale: softmax scale; default ``1 / sqrt(d)``.
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
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.num_kv_heads = check_positive_int("num_kv_heads", num_kv_heads or num_heads)
        if num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(
                    f"dim ({dim}) must be divisible by num_heads ({num_heads}), or pass head_dim"
                )
            head_dim = dim // num_heads
        self.head_dim = check_positive_int("head_dim", head_dim)
        family = getattr(encoding, "family", "none") if encoding is not None else "none"
        if family not in ENCODING_FAMILIES:
            raise ValueError(f"encoding.family must be one of {ENCODING_FAMILIES}, got {family!r}")
        self.family: str = family
        self.encoding = encoding
        self.causal = causal
        self.dropout = float(dropout)
        self.scale = 1.0 / math.sqrt(self.head_dim) if scale is None else float(scale)
        kw = {"device": device, "dtype": dtype}
        hd = self.head_dim
        self.q_proj = nn.Linear(dim, num_heads * hd, bias=qkv_bias, **kw)
        self.k_proj = nn.Linear(dim, self.num_kv_heads * hd, bias=qkv_bias, **kw)
        self.v_proj = nn.Linear(dim, self.num_kv_heads * hd, bias=qkv_bias, **kw)
        self.o_proj = nn.Linear(num_heads * hd, dim, bias=out_bias, **kw)

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
        past = cache.length if cache is not None else (memory.shape[1] if memory is not None else 0)
        if positions is None:
            positions = default_positions(s, x.device, offset=past)
        else:
            positions = check_positions(positions, ranks=(1, 2))
            if positions.shape[-1] != s or (
                positions.dim() == 2 and positions.shape[0] not in (1, b)
            ):
                raise ValueError(
                    f"positions must be [{s}] or [{b}, {s}], got {list(positions.shape)}"
                )

        kv_input, k_positions = x, positions
        if memory is not None:
            if memory.dim() != 3 or memory.shape[0] != b or memory.shape[2] != self.dim:
                raise ValueError(f"memory must be [{b}, m, {self.dim}], got {tuple(memory.shape)}")
            if memory_positions is None:
                memory_positions = default_positions(memory.shape[1], x.device)
            kv_input = torch.cat((memory.detach(), x), dim=1)  # [b, m + s, dim]
            k_positions = cat_positions(memory_positions, positions, b)

        q = self._heads(x, self.q_proj, self.num_heads)  # [b, h, s, d]
        k = self._heads(kv_input, self.k_proj, self.num_kv_heads)  # [b, hk, t, d]
        v = self._heads(kv_input, self.v_proj, self.num_kv_heads)  # [b, hk, t, d]

        if self.family == "rotary":
            assert self.encoding is not None
            q, k = self.encoding(q, k, positions, k_positions=k_positions)
        if cache is not None:
            k, v, k_positions = cache.update(k, v, k_positions)
        t = k.shape[2]
        keep = build_mask(s, t, self.causal, attn_mask, b, x.device)

        if self.family == "relative":
            assert self.encoding is not None
            out = self.encoding.attend(
                q,
                k,
                v,
                q_positions=positions,
                k_positions=k_positions,
                mask=keep,
                scale=self.scale,
                dropout_p=self.dropout if self.training else 0.0,
                attention=self,
            )
        else:
            out = self._sdpa(q, k, v, positions, k_positions, keep, s, t)
        out = out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)  # [b, s, h*d]
        return self.o_proj(out)

    def _sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_positions: torch.Tensor,
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
            bias = self.encoding.bias(q_positions, k_positions)  # [h, s, t] or [b, h, s, t]
            if keep is not None:
                bias = bias.masked_fill(~keep, float("-inf"))
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p, scale=self.scale
            )
        if keep is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=self.scale)
        if self.causal and s == t and keep.dim() == 2:
            # The plain causal mask: let SDPA pick its fused causal kernel.
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout_p, scale=self.scale
            )
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=dropout_p, scale=self.scale
        )


def repeat_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Shapes: ``[b, hk, t, d]`` -> ``[b, h, t, d]``, each kv head serving ``h // hk`` query heads."""
    hk = x.shape[1]
    if hk == num_heads:
        return x
    return x.repeat_interleave(num_heads // hk, dim=1)
