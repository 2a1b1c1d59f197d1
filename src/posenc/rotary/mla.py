"""Decoupled RoPE of Multi-head Latent Attention (DeepSeek-V2/V3) and its YaRN softmax scale.

MLA compresses keys and values through a low-rank latent, which a position-dependent rotation
would not commute with. So position is carried by a separate slice of each head::

    q = [q_nope (nope_dim) | q_rope (rope_dim)]        per query head, q_rope rotated
    k = [k_nope (nope_dim) | k_rope (rope_dim)]        k_nope per head from the latent;
                                                       k_rope ONE head shared by all heads, rotated
    score = (q_nope . k_nope + R(n) q_rope . R(m) k_rope) * softmax_scale

With YaRN, DeepSeek keeps the cos/sin multiplier at ``mscale(factor, mscale) /
mscale(factor, mscale_all_dim)`` (1 for the released configs) and moves the temperature into
the softmax scale: ``qk_head_dim ** -0.5 * mscale(factor, mscale_all_dim) ** 2`` with
``mscale(f, m) = 0.1 m ln f + 1`` (:func:`mla_softmax_scale`).

Recipe with :class:`posenc.Attention` (plain projections: every head gets its own ``k_rope``,
i.e. decoupled RoPE without the shared-key constraint)::

    yarn = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
    rope = DecoupledRoPE(rope_dim=64, nope_dim=128, scaling=yarn)
    attn = Attention(dim, num_heads, head_dim=192, encoding=rope,
                     scale=mla_softmax_scale(192, yarn))

Exact MLA (one shared rotary key head, latent keys/values) in a custom attention::

    q = q_proj(x).view(b, s, h, 192).transpose(1, 2)                  # [b, h, s, nope + rope]
    k_rope = kv_a(x)[..., -64:].view(b, 1, s, 64)                     # [b, 1, s, rope]: shared
    q, k_rope = rope(q, k_rope, positions)                            # rotates q's tail and k_rope
    k = expand_shared_key(k_nope, k_rope)                             # [b, h, t, nope + rope]
    out = sdpa(q, k, v, scale=mla_softmax_scale(192, yarn))

``layout="interleaved"`` matches DeepSeek's ``rope_interleave`` weights (pairs ``x[2i], x[2i+1]``).
transformers de-interleaves the rotated slice (it writes it back in half order), a permutation
applied to queries and keys alike, so scores and outputs are identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._checks import check_positive_int
from ..functional.rotary import yarn_mscale
from .base import RotaryEncoding
from .embedding import RopeTables, RotaryEmbedding


def mla_softmax_scale(qk_head_dim: int, scaling: Mapping[str, Any] | None = None) -> float:
    """Softmax scale of MLA: ``qk_head_dim ** -0.5``, times ``mscale(factor, mscale_all_dim) ** 2``
    when ``scaling`` is a scaled rope type with a non-zero ``mscale_all_dim`` (DeepSeek-V2/V3)."""
    check_positive_int("qk_head_dim", qk_head_dim)
    scale = qk_head_dim**-0.5
    if scaling:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        mscale_all_dim = scaling.get("mscale_all_dim") or 0
        if rope_type != "default" and mscale_all_dim:
            mscale = yarn_mscale(scaling["factor"], mscale_all_dim)
            scale = scale * mscale * mscale
    return scale


def expand_shared_key(k_nope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
    """Per-head keys from per-head ``k_nope`` and the one shared rotary key head.

    Shapes: ``k_nope [b, h, t, nope]``, ``k_rope [b, 1, t, rope]`` -> ``[b, h, t, nope + rope]``.
    """
    if k_nope.dim() != 4 or k_rope.dim() != 4 or k_rope.shape[1] != 1:
        raise ValueError(
            f"k_nope must be [b, h, t, nope] and k_rope [b, 1, t, rope], got {tuple(k_nope.shape)} "
            f"and {tuple(k_rope.shape)}"
        )
    k_rope = k_rope.expand(-1, k_nope.shape[1], -1, -1)  # [b, h, t, rope] (a view)
    return torch.cat((k_nope, k_rope), dim=-1)  # [b, h, t, nope + rope]


class DecoupledRoPE(RotaryEncoding):
    """RoPE on the last ``rope_dim`` channels of each head (MLA's decoupled rotary part).

    Args:
        rope_dim: rotated channels (``qk_rope_head_dim``), even.
        nope_dim: unrotated leading channels (``qk_nope_head_dim``).
        base, scaling, layout, angle_dtype, cache_len, backend: as for :class:`RotaryEmbedding`
            (applied to the ``rope_dim`` slice).
    """

    def __init__(
        self,
        rope_dim: int,
        nope_dim: int,
        base: float = 10000.0,
        scaling: Mapping[str, Any] | None = None,
        layout: str = "half",
        *,
        angle_dtype: torch.dtype | str = torch.float64,
        cache_len: int = 4096,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if isinstance(nope_dim, bool) or not isinstance(nope_dim, int) or nope_dim < 0:
            raise ValueError(f"nope_dim must be a non-negative integer, got {nope_dim!r}")
        self.rope = RotaryEmbedding(
            rope_dim,
            base,
            scaling,
            layout,
            angle_dtype=angle_dtype,
            cache_len=cache_len,
            backend=backend,
        )
        self.rope_dim, self.nope_dim = rope_dim, nope_dim
        self.head_dim = nope_dim + rope_dim

    def reset_parameters(self) -> None:
        """The rotary part's frequencies (:meth:`RotaryEmbedding.reset_parameters`)."""
        self.rope.reset_parameters()

    def _split(self, x: torch.Tensor, name: str) -> tuple[torch.Tensor | None, torch.Tensor]:
        if x.dim() == 4 and x.shape[-1] == self.head_dim:
            return x[..., : self.nope_dim], x[..., self.nope_dim :]  # [.., nope], [.., rope]
        if x.dim() == 4 and x.shape[-1] == self.rope_dim:
            return None, x
        raise ValueError(
            f"{name} must be [b, heads, seq, {self.head_dim}] (nope + rope) or [b, heads, seq, "
            f"{self.rope_dim}] (rope only), got {tuple(x.shape)}"
        )

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """``q [b, h, s, nope + rope]`` (or ``[b, h, s, rope]``); ``k [b, hk, t, nope + rope]``
        or the shared rotary key ``[b, 1, t, rope]``; the rope slices checked as RoPE's."""
        _, q_rot = self._split(q, "q")
        _, k_rot = self._split(k, "k")
        self.rope.check_inputs(q_rot, k_rot)

    def checks_position_values(self, q: torch.Tensor) -> bool:
        return self.rope.checks_position_values(q)

    def tables(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> RopeTables:
        """The rotary part's cos/sin (:meth:`RotaryEmbedding.tables`)."""
        return self.rope.tables(q, k, positions, k_positions)

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: RopeTables
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate the rope slice of queries and keys; returns ``(q', k')`` of the input shapes,
        the nope channels untouched."""
        q_pass, q_rot = self._split(q, "q")
        k_pass, k_rot = self._split(k, "k")
        q_rot, k_rot = self.rope.apply_tables(q_rot, k_rot, tables)
        q_out = (
            q_rot if q_pass is None else torch.cat((q_pass, q_rot), dim=-1)
        )  # [b, h, s, nope + rope]
        k_out = k_rot if k_pass is None else torch.cat((k_pass, k_rot), dim=-1)  # [b, hk, t, ...]
        return q_out, k_out

    def extra_repr(self) -> str:
        return f"rope_dim={self.rope_dim}, nope_dim={self.nope_dim}"
