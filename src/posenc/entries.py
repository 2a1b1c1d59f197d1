"""The registry's entries, one section per family. Import-time registration only."""

from __future__ import annotations

from torch import nn

from .registry import BuildContext, register

# --- none / absolute ---------------------------------------------------------------------------


@register("none", "none", description="NoPE: no position information")
def _none(ctx: BuildContext) -> nn.Module:
    from .absolute import NoPE

    return NoPE()


@register("sinusoidal", "absolute", description="Vaswani et al. sin/cos table added to embeddings")
def _sinusoidal(
    ctx: BuildContext,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    scale_input: bool = False,
) -> nn.Module:
    from .absolute import SinusoidalEncoding

    return SinusoidalEncoding(ctx.dim, base=base, layout=layout, scale_input=scale_input)


@register("learned", "absolute", description="learned table (GPT-2/BERT), max_len positions")
def _learned(
    ctx: BuildContext, *, max_positions: int | None = None, init_std: float = 0.02
) -> nn.Module:
    from .absolute import LearnedEncoding

    return LearnedEncoding(max_positions or ctx.max_len, ctx.dim, init_std=init_std)


# --- rotary ------------------------------------------------------------------------------------

# --- bias --------------------------------------------------------------------------------------

# --- relative ----------------------------------------------------------------------------------
