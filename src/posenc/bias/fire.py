"""FIRE: functional interpolation for relative positions (Li et al., 2024)."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_int_at_most, check_number
from ..functional.bias import fire_normalized_distance, relative_distances
from ..registry import register_class
from .common import PositionBias, Term, at_least_float32

# Hidden units of f_theta; the paper uses 32.
MAX_MLP_WIDTH = 1024


class FIRE(PositionBias):
    """``B[h, i, j] = f_theta(psi(i - j) / psi(max(L, i)))[h]`` with ``psi(x) = log(|c x| + 1)``.

    ``f_theta`` is an MLP ``1 -> mlp_width -> h`` with ReLU; ``c`` (init ``init_c``) and the
    threshold ``L = |L_multiplier * init_threshold|`` (``L_multiplier`` init 1) are learned, as
    in the paper's reference code. Dividing by ``psi`` of the query position maps every distance
    into ``[0, 1]`` (progressive interpolation), which is what lets it run past the training
    length; the threshold keeps short prefixes from being stretched. The absolute value makes
    the non-causal form symmetric.
    """

    def __init__(
        self,
        num_heads: int,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_threshold: float = 512.0,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_heads)
        why = "a FlexAttention score_mod unrolls one term per hidden unit"
        self.mlp_width = check_int_at_most("mlp_width", mlp_width, MAX_MLP_WIDTH, why)
        # Scales of distances: c * |i - j| and L stay finite in float32 for any int64 position.
        init_c = check_number("init_c", init_c, low=-1e6, high=1e6)
        init_threshold = check_number(
            "init_threshold", init_threshold, low=0.0, low_open=True, high=2.0**63
        )
        # eps keeps psi's denominator > 0 (c = 0 would give 0 / 0): it must survive float32.
        eps = check_number("eps", eps, low=1e-30, high=1.0)
        kw = {"device": device, "dtype": dtype}
        self.mlp = nn.Sequential(
            nn.Linear(1, mlp_width, **kw),  # type: ignore[arg-type]
            nn.ReLU(),
            nn.Linear(mlp_width, num_heads, **kw),  # type: ignore[arg-type]
        )
        self.c = nn.Parameter(torch.tensor(float(init_c), **kw))  # type: ignore[arg-type]
        self.L_multiplier = nn.Parameter(torch.tensor(1.0, **kw))  # type: ignore[arg-type]
        self.init_c = float(init_c)
        self.init_threshold = float(init_threshold)  # a constant, not learned (the multiplier is)
        self.eps = float(eps)

    def reset_parameters(self) -> None:
        """Redraw the MLP as ``nn.Linear`` draws it; ``c = init_c``, ``L_multiplier = 1``."""
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        nn.init.constant_(self.c, self.init_c)
        nn.init.constant_(self.L_multiplier, 1.0)

    def threshold(self) -> torch.Tensor:
        """The learned threshold ``L`` (a scalar tensor)."""
        return torch.abs(self.L_multiplier * self.init_threshold)

    def term(self, device: torch.device) -> Term:
        lin1, lin2 = self.mlp[0], self.mlp[2]
        assert isinstance(lin1, nn.Linear) and isinstance(lin2, nn.Linear)
        f = at_least_float32
        w1, b1 = f(lin1.weight[:, 0]), f(lin1.bias)  # [w], [w]
        # w2 by hidden unit, [w, h]: w2_by_unit[u][head] indexes by a tensor alone (torch 2.5's
        # FlexAttention cannot trace w2[head, u], a tensor and an int).
        w2_by_unit, b2 = f(lin2.weight).t(), f(lin2.bias)  # [w, h], [h]
        c, threshold, eps = f(self.c), f(self.threshold()), self.eps
        width = self.mlp_width

        def fire(q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
            dist = (q_pos - k_pos).to(c.dtype)  # i - j in int64 first: exact
            x = fire_normalized_distance(q_pos.to(c.dtype), dist, c, threshold, eps)
            # The MLP unrolled over its hidden units: score_mod sees one scalar entry at a
            # time, and a fused kernel can only load scalars (no [w]-vector intermediates).
            acc = b2[head]
            for u in range(width):
                acc = acc + w2_by_unit[u][head] * torch.relu(w1[u] * x + b1[u])
            return acc

        return fire

    def materialized(self, positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The term with its MLP as matrix products over ``[(b,) s, t]`` (one pass, not one per
        hidden unit). Shapes: ``[s]|[b, s]``, ``[t]|[b, t]`` -> ``[(b,) h, s, t]``."""
        dtype = torch.promote_types(self.c.dtype, torch.float32)
        dist = -relative_distances(positions, k_positions).to(dtype)  # [(b,) s, t]: i - j
        qpos = positions.to(dtype)[..., :, None]  # [(b,) s, 1]
        x = fire_normalized_distance(qpos, dist, self.c, self.threshold(), self.eps)  # [(b,) s, t]
        out = self.mlp(x.unsqueeze(-1).to(self.c.dtype))  # [(b,) s, t, h]
        return out.movedim(-1, -3).to(dtype)  # [(b,) h, s, t]

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, mlp_width={self.mlp_width}, "
            f"init_threshold={self.init_threshold}, eps={self.eps}"
        )


register_class(
    "fire",
    "bias",
    FIRE,
    args=lambda ctx: (ctx.num_heads,),
    options=("mlp_width", "init_c", "init_threshold"),
    description="FIRE: MLP over progressively interpolated distance, shared",
)
