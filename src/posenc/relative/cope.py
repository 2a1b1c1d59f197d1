"""CoPE, Golovneva et al. (2024), "Contextual Position Encoding: Learning to Count What's Important".

Positions are counted by the content (Section 3). For query ``i`` and key ``j``::

    g_ij = sigmoid(q_i . k_j * scale)                       gate: does key j count for query i?
    p_ij = sum_{k = j .. i} g_ik                            contextual position (causal), <= npos_max - 1
    e[p] = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]      interpolated embedding
    a_ij = softmax_j((q_i . k_j + q_i . e[p_ij]) * scale)

with a learned table ``e [npos_max, d]`` shared by the heads of one layer (the authors' code folds
the heads into the batch; build one instance per layer). As in the paper, the position logits are
computed for the ``npos_max`` integer positions first, ``z_i[n] = q_i . e[n]``, and the scalar
logits interpolated, ``q_i . e[p] = (p - floor p) z_i[ceil p] + (1 - p + floor p) z_i[floor p]``:
O(s npos d) instead of O(s t d). The paper writes the formulas without ``1/sqrt(d)``; the authors'
code (facebookresearch/RAM, ``projects/cope``, default options) scales the gate logits and the sum
``q . k + q . e[p]`` by it, and so does this module (``scale``, default ``1/sqrt(d)``).

"Causal" comes from the mask: a masked key's gate is 0, so with Attention's causal mask the sum
runs over the keys ``j .. i`` the query sees (in a cached call, ``j .. t - s + i``), and without
a mask over every key from ``j`` on. Integer positions are not used: the position is the count.
Gates, positions and interpolation weights are float32 (float64 for float64 inputs) whatever the
input dtype: a bf16 cumulative sum is off by several positions past a few hundred.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import INIT_STD_MAX, check_int_at_most, check_number, check_positive_int
from .._context import ScoreContext
from ..functional.bias import MAX_TABLE_ROWS
from .common import RelativeEncoding

__all__ = ["CoPE", "cope_positions", "interpolate_logits"]


def cope_positions(
    gate_logits: torch.Tensor, mask: torch.Tensor | None, npos_max: int
) -> torch.Tensor:
    """Contextual positions ``p_ij = sum_{k >= j, kept} sigmoid(gate_logits_ik)``, clamped.

    Shapes: ``gate_logits [b, h, s, t]`` (already scaled), ``mask [s, t]|[b, 1|h, s, t]`` bool
    keep-mask or None -> ``[b, h, s, t]`` in at least float32, in ``[0, npos_max - 1]``.
    """
    dtype = torch.promote_types(gate_logits.dtype, torch.float32)
    gates = torch.sigmoid(gate_logits.to(dtype))  # [b, h, s, t]
    if mask is not None:
        gates = gates * mask  # a masked key does not count
    # Suffix sums over the keys: [g0 g1 g2 g3] -> [g0+g1+g2+g3, g1+g2+g3, g2+g3, g3]
    positions = gates.flip(-1).cumsum(-1).flip(-1)  # [b, h, s, t]
    return positions.clamp(max=npos_max - 1)


def interpolate_logits(int_logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``(p - floor p) z[ceil p] + (1 - p + floor p) z[floor p]`` of the integer-position logits.

    Shapes: ``int_logits [b, h, s, n]`` (``z_i[n] = q_i . e[n]``), ``positions [b, h, s, t]``
    float in ``[0, n - 1]`` -> ``[b, h, s, t]`` in ``positions``' dtype. The gradient reaches the
    positions through the weight ``p - floor p`` (floor and ceil are constants, as in the paper).
    """
    floor = positions.floor()  # [b, h, s, t]
    z = int_logits.to(positions.dtype)
    z_floor = z.gather(-1, floor.long())  # [b, h, s, t]
    z_ceil = z.gather(-1, positions.ceil().long())  # [b, h, s, t]
    w = positions - floor  # weight of ceil p, differentiable in p
    return z_ceil * w + z_floor * (1 - w)


class CoPE(RelativeEncoding):
    """Contextual Position Encoding (module docstring): ``Attention(..., encoding=CoPE(d, h))``.

    ``npos_max`` rows of position embeddings; contextual positions past ``npos_max - 1`` share the
    last row. A causal layer over ``L`` tokens reaches positions up to ``L``, so ``L + 1`` rows
    cover it (the authors' default); the paper shows far fewer often suffice. ``init_std = 0``
    (default) starts the table at zero, as the authors' code does: CoPE then starts as NoPE.
    ``num_heads`` is checked against the queries; the table is shared by the heads.
    """

    def __init__(
        self,
        head_dim: int,
        num_heads: int,
        npos_max: int = 64,
        init_std: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_positive_int("head_dim", head_dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        why = "it sizes the position embedding table"
        self.npos_max = check_int_at_most("npos_max", npos_max, MAX_TABLE_ROWS, why)
        init_std = check_number("init_std", init_std, low=0.0, high=INIT_STD_MAX)
        self.init_std = init_std
        self.pos_emb = nn.Parameter(torch.empty(npos_max, head_dim, device=device, dtype=dtype))
        self.reset_parameters()  # e [npos_max, d]

    def reset_parameters(self) -> None:
        """The table at zero (``init_std = 0``, CoPE starts as NoPE) or ``N(0, init_std**2)``."""
        if self.init_std > 0:
            nn.init.normal_(self.pos_emb, std=self.init_std)
        else:
            nn.init.zeros_(self.pos_emb)

    def check_heads(self, q: torch.Tensor) -> None:
        h, d = q.shape[1], q.shape[3]
        if d != self.head_dim or h != self.num_heads:
            raise ValueError(
                f"q must have {self.num_heads} heads of head_dim {self.head_dim}, got h={h}, d={d}"
            )

    def scores(self, q: torch.Tensor, k: torch.Tensor, call: ScoreContext) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k [b, h, t, d]`` -> ``[b, h, s, t]``; the mask decides
        which keys count. Positions are not used (the position is the count)."""
        self.check_heads(q)
        scale = call.scale
        content = q @ k.transpose(-1, -2)  # q_i . k_j: [b, h, s, t]
        pos = cope_positions(content * scale, call.mask, self.npos_max)  # [b, h, s, t]
        int_logits = q @ self.pos_emb.t()  # z_i[n] = q_i . e[n]: [b, h, s, npos_max]
        pos_logits = interpolate_logits(int_logits, pos).to(content.dtype)  # [b, h, s, t]
        return (content + pos_logits) * scale

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, num_heads={self.num_heads}, npos_max={self.npos_max}"
