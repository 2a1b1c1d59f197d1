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


@register(
    "rope",
    "rotary",
    description="RoPE: half/interleaved, partial, PI/NTK/dynamic NTK/YaRN/LongRoPE/Llama-3 scaling",
)
def _rope(
    ctx: BuildContext,
    *,
    base: float = 10000.0,
    scaling: dict | None = None,
    layout: str = "half",
    rotary_dim: int | None = None,
    partial_rotary_factor: float | None = None,
    angle_dtype: str = "float64",
    cache_len: int | None = None,
) -> nn.Module:
    from .rotary import RotaryEmbedding

    if partial_rotary_factor is not None:
        if rotary_dim is not None:
            raise ValueError("pass rotary_dim or partial_rotary_factor, not both")
        if not 0 < partial_rotary_factor <= 1:
            raise ValueError(
                f"partial_rotary_factor must be in (0, 1], got {partial_rotary_factor}"
            )
        rotary_dim = int(ctx.head_dim * partial_rotary_factor)
    return RotaryEmbedding(
        ctx.head_dim,
        base=base,
        scaling=scaling,
        layout=layout,
        rotary_dim=rotary_dim,
        angle_dtype=angle_dtype,
        cache_len=cache_len or max(ctx.max_len, 4096),
    )


@register("xpos", "rotary", description="xPos: RoPE whose scores decay exponentially with distance")
def _xpos(
    ctx: BuildContext,
    *,
    base: float = 10000.0,
    scale_base: float = 512.0,
    gamma: float = 0.4,
    layout: str = "interleaved",
    center: int | None = None,
) -> nn.Module:
    from .rotary import XPos

    # A fixed center in the middle of the training length keeps the scales near 1.
    center = ctx.max_len // 2 if center is None else center
    return XPos(
        ctx.head_dim, base=base, scale_base=scale_base, gamma=gamma, layout=layout, center=center
    )


# --- bias --------------------------------------------------------------------------------------

# --- relative ----------------------------------------------------------------------------------
