"""The absolute family's registry entries (and NoPE's): importing this module registers them."""

from __future__ import annotations

from torch import nn

from ..registry import BuildContext, register
from .learned import LearnedEncoding
from .none import NoPE
from .sinusoidal import SinusoidalEncoding


@register("none", "none", description="NoPE: no position information", reads_positions=False)
def _none(ctx: BuildContext) -> nn.Module:
    return NoPE()


@register("sinusoidal", "absolute", description="Vaswani et al. sin/cos table added to embeddings")
def _sinusoidal(
    ctx: BuildContext,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    scale_input: bool = False,
) -> nn.Module:
    return SinusoidalEncoding(ctx.dim, base=base, layout=layout, scale_input=scale_input)


@register("learned", "absolute", description="learned table (GPT-2/BERT), max_len positions")
def _learned(
    ctx: BuildContext, *, max_positions: int | None = None, init_std: float = 0.02
) -> nn.Module:
    return LearnedEncoding(max_positions or ctx.max_len, ctx.dim, init_std=init_std)
