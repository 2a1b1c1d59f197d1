"""KERPLE: kernelized relative positional biases (Chi et al., 2022)."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_choice, check_number
from ..functional.bias import kerple_log, kerple_power
from ..registry import BuildContext, register
from .common import PositionBias, Term, at_least_float32

KERPLE_VARIANTS = ("log", "power")


def _clamp_straight_through(p: torch.Tensor, lo: float, hi: float | None) -> torch.Tensor:
    """``clamp(p, lo, hi)`` in value, identity in gradient.

    The paper clamps the stored parameter in place on every forward (``p.data.clamp_``), so a
    parameter pushed past a bound sits on it and the next gradient can pull it back. A plain
    functional clamp would instead freeze it there (zero gradient outside the range). The
    straight-through clamp keeps the forward value of the paper without writing to parameters
    inside ``forward``; :meth:`KERPLE.clamp_parameters_` applies the paper's projection exactly,
    to be called after ``optimizer.step()`` where that matters.
    """
    # clamp's value plus an exact zero that carries p's gradient. (p + (clamp - p).detach() is
    # the same in exact arithmetic, but rounds: r2 = -3.5 clamped to 1e-4 came out 1e-4 +- 2e-7.)
    return p.clamp(lo, hi).detach() + (p - p.detach())


class KERPLE(PositionBias):
    """Per-head learnable kernel biases on the distance ``|i - j|``, one instance per layer.

    * ``variant="log"``: ``B = -r1 * log(1 + r2 * |i - j|)``, ``r1, r2 > 0``.
    * ``variant="power"``: ``B = -r1 * |i - j| ** r2``, ``r1 > 0``, ``0 < r2 <= 2``.

    Parameters ``r1, r2 [h]`` start as in the reference implementation: for ``log`` ``r1 ~ U(0,
    2)``, ``r2 ~ U(0, 1)``; for ``power`` ``r1 ~ U(0, 1)``, ``r2 ~ U(0, 2)``. They are used
    clamped to ``[eps, inf)`` (and ``r2 <= 2`` for power), ``eps = 1e-2`` as in the paper.
    """

    def __init__(
        self,
        num_heads: int,
        variant: str = "log",
        eps: float = 1e-2,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_heads)
        self.variant = check_choice("variant", variant, KERPLE_VARIANTS)
        # eps is the lower bound of r1 and r2 (1e-2 in the paper): a small positive number that
        # the parameters' dtype holds (below float16's smallest normal, 6e-5, it would clamp to
        # 0, and the power kernel's 0 ** 0 is 1).
        self.eps = check_number("eps", eps, low=1e-4, high=1.0)
        kw = {"device": device, "dtype": dtype}
        self.r1 = nn.Parameter(torch.empty(num_heads, **kw))  # type: ignore[arg-type]
        self.r2 = nn.Parameter(torch.empty(num_heads, **kw))  # type: ignore[arg-type]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw ``r1``, ``r2`` as the reference implementation does (class docstring)."""
        scale1, scale2 = (2.0, 1.0) if self.variant == "log" else (1.0, 2.0)
        nn.init.uniform_(self.r1, 0.0, scale1)  # the values of torch.rand(h) * scale1
        nn.init.uniform_(self.r2, 0.0, scale2)

    @property
    def _r2_max(self) -> float | None:
        return 2.0 if self.variant == "power" else None

    def constrained(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r1, r2)`` as used in the bias: clamped in value, straight-through in gradient.

        The one parametrization of every path: :meth:`term` (and so :meth:`bias` for SDPA and
        the explicit path, :meth:`score_mod` for FlexAttention) reads the parameters through it,
        so a parameter that training pushed out of its range gives the same bias on each path,
        whether or not :meth:`clamp_parameters_` was called."""
        r1 = _clamp_straight_through(self.r1, self.eps, None)
        r2 = _clamp_straight_through(self.r2, self.eps, self._r2_max)
        return r1, r2

    @torch.no_grad()
    def clamp_parameters_(self) -> None:
        """Project the stored parameters onto their ranges in place (the paper's update rule)."""
        self.r1.clamp_(min=self.eps)
        self.r2.clamp_(min=self.eps, max=self._r2_max)

    def term(self, device: torch.device) -> Term:
        r1, r2 = (at_least_float32(p) for p in self.constrained())  # [h] each
        kernel = kerple_log if self.variant == "log" else kerple_power

        def kerple(q_pos: torch.Tensor, k_pos: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
            return kernel(k_pos - q_pos, r1[head], r2[head])  # int64 j - i: exact

        return kerple

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, variant={self.variant!r}, eps={self.eps}"


@register("kerple", "bias", shared=False, description="KERPLE log/power kernel bias, per layer")
def _kerple(ctx: BuildContext, *, variant: str = "log", eps: float = 1e-2) -> KERPLE:
    return KERPLE(ctx.num_heads, variant=variant, eps=eps)
