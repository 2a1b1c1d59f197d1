"""RoPE on the trailing channels of each head, and its inverse (DeepSeek-V4).

DeepSeek-V4 lays each head out as ``[nope | rope]`` and rotates the last ``r`` channels in
interleaved pairs. Its keys double as values (one shared key/value head), so the attention output
carries the keys' rotation on its rope slice; the model undoes it at the query's position, a
rotation by minus the angle::

    q   = rotate_trailing(q, cos, sin, "interleaved")                  # [b, h, s, d]
    kv  = rotate_trailing(kv, cos, sin, "interleaved")                 # [b, 1, t, d], keys = values
    out = sdpa(q, kv, kv)                                              # [b, h, s, d]
    out = rotate_trailing(out, cos, sin, "interleaved", conj=True)     # R(-theta) on the rope slice

``cos``, ``sin`` are a rotary module's (``rope.cos_sin(positions)``, ``[s, r/2]``, or
``[b, 1, s, r/2]`` for batched positions); :func:`posenc.hf.rope_from_hf` builds the module of
each DeepSeek-V4 rope set (``"main"``, ``"compress"``) as a :class:`TrailingRotaryEmbedding`: the
whole head in, the trailing slice rotated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .._checks import check_choice
from ..functional.rotary import _rotary_dim
from ..kernels.constants import ROTARY_LAYOUTS
from ..kernels.reference import apply_rotary_reference
from .embedding import RopeTables, RotaryEmbedding


def rotate_trailing(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    *,
    conj: bool = False,
) -> torch.Tensor:
    """Rotate the last ``r = 2 * cos.shape[-1]`` channels of ``x``; the leading ``d - r`` pass.

    Shapes: ``x [..., d]`` (``[b, h, s, d]``); ``cos``, ``sin [..., r/2]`` broadcastable against
    ``x[..., :r/2]`` (``[s, r/2]`` or ``[b, 1, s, r/2]``). ``layout``: ``"half"`` pairs
    ``(x[d-r+i], x[d-r+i+r/2])``, ``"interleaved"`` pairs ``(x[d-r+2i], x[d-r+2i+1])``::

        d=6, r=4, interleaved: [n0 n1 | x0 x1 x2 x3] -> [n0 n1 | x0 c0 - x1 s0, x1 c0 + x0 s0,
                                                               x2 c1 - x3 s1, x3 c1 + x2 s1]

    ``conj=True`` rotates by minus the angles (``sin -> -sin``): the inverse, so
    ``rotate_trailing(rotate_trailing(x, c, s), c, s, conj=True)`` is ``x`` up to rounding.
    The one reference rotation (:func:`posenc.kernels.apply_rotary_reference`), in float32
    (float64 for float64 input); returns a new tensor of ``x``'s shape and dtype.
    """
    check_choice("layout", layout, ROTARY_LAYOUTS)
    r = _rotary_dim(x, cos, sin, None)  # checks x, cos, sin and r <= d
    d = x.shape[-1]
    if r == d:
        return apply_rotary_reference(x, cos, sin, layout, r, conj)
    nope, rope = x[..., : d - r], x[..., d - r :]  # [..., d - r], [..., r]
    rotated = apply_rotary_reference(rope, cos, sin, layout, r, conj)  # [..., r]
    return torch.cat((nope, rotated), dim=-1)  # [..., d]: untouched head, rotated tail


class TrailingRotaryEmbedding(RotaryEmbedding):
    """:class:`RotaryEmbedding` of heads laid out ``[nope | rope]``: takes the whole head
    (``head_dim``) and rotates its *trailing* ``rotary_dim`` channels (DeepSeek-V4), where the
    plain module rotates the leading ones::

        d=6, r=4: [n0 n1 | x0 x1 x2 x3] -> [n0 n1 | R(x0 x1 x2 x3)]

    Same arguments, tables and ``cos_sin`` as :class:`RotaryEmbedding` (frequencies over
    ``rotary_dim``); ``forward(q [b, h, s, d], k [b, hk, t, d], positions)``.
    """

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: RopeTables
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cut = self.head_dim - self.rotary_dim
        if cut == 0:
            return super().apply_tables(q, k, tables)
        q_rope, k_rope = super().apply_tables(q[..., cut:], k[..., cut:], tables)  # [.., r]
        return (
            torch.cat((q[..., :cut], q_rope), dim=-1),  # [b, h, s, d]: nope passes, rope rotated
            torch.cat((k[..., :cut], k_rope), dim=-1),  # [b, hk, t, d]
        )

    def with_scaling(self, scaling: Mapping[str, Any] | None) -> TrailingRotaryEmbedding:
        return TrailingRotaryEmbedding(
            self.head_dim, self.base, scaling, self.layout, self.rotary_dim,
            angle_dtype=self.angle_dtype, cache_len=self.cache_len,
            max_cache_len=self.max_cache_len, backend=self.backend,
        )  # fmt: skip
