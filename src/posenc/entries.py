"""The registry's entries, one section per family. Import-time registration only."""

from __future__ import annotations

from torch import nn

from .registry import BuildContext, register

# --- none / absolute ---------------------------------------------------------------------------


@register("none", "none", description="NoPE: no position information", reads_positions=False)
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
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(
                f"partial_rotary_factor={partial_rotary_factor} of head_dim {ctx.head_dim} "
                f"rotates {rotary_dim} channels; RoPE needs an even number >= 2"
            )
    return RotaryEmbedding(
        ctx.head_dim,
        base=base,
        scaling=scaling,
        layout=layout,
        rotary_dim=rotary_dim,
        angle_dtype=angle_dtype,
        cache_len=cache_len or max(ctx.max_len, 4096),
    )


def default_mrope_section(pairs: int) -> list[int]:
    """Qwen2-VL's split of the rotated pairs over (temporal, height, width): 1/4, 3/8, 3/8
    (``[16, 24, 24]`` of 64 pairs), the temporal axis taking what rounding leaves."""
    spatial = 3 * pairs // 8
    return [pairs - 2 * spatial, spatial, spatial]


@register(
    "mrope",
    "rotary",
    description="M-RoPE (Qwen2-VL/Qwen3-VL): T/H/W sections of pairs; on text, plain RoPE",
)
def _mrope(
    ctx: BuildContext,
    *,
    base: float = 10000.0,
    mrope_section: list[int] | None = None,
    interleaved: bool = False,
    scaling: dict | None = None,
    angle_dtype: str = "float64",
) -> nn.Module:
    from .rotary import MRoPE

    # Text positions ([s] or [b, s], as the model passes) are the same on all three axes, so the
    # sections only matter for [3, b, s] multimodal positions passed to the module directly.
    if mrope_section is None:
        mrope_section = default_mrope_section(ctx.head_dim // 2)
    return MRoPE(
        ctx.head_dim,
        mrope_section,
        base=base,
        scaling=scaling,
        interleaved=interleaved,
        angle_dtype=angle_dtype,
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


@register(
    "alibi", "bias", description="ALiBi: -m_h * distance, paper slopes; symmetric when not causal"
)
def _alibi(ctx: BuildContext) -> nn.Module:
    from .bias import ALiBi

    return ALiBi(ctx.num_heads, causal=ctx.causal)


@register("t5", "bias", description="T5 bucketed relative bias, one table shared by all layers")
def _t5(
    ctx: BuildContext,
    *,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool | None = None,
) -> nn.Module:
    from .bias import T5RelativeBias

    # T5's encoder buckets both directions, its decoder only the past.
    bidirectional = not ctx.causal if bidirectional is None else bidirectional
    return T5RelativeBias(ctx.num_heads, num_buckets, max_distance, bidirectional=bidirectional)


@register("kerple", "bias", shared=False, description="KERPLE log/power kernel bias, per layer")
def _kerple(ctx: BuildContext, *, variant: str = "log", eps: float = 1e-2) -> nn.Module:
    from .bias import KERPLE

    return KERPLE(ctx.num_heads, variant=variant, eps=eps)


@register("fire", "bias", description="FIRE: MLP over progressively interpolated distance, shared")
def _fire(
    ctx: BuildContext,
    *,
    mlp_width: int = 32,
    init_c: float = 0.1,
    init_threshold: float = 512.0,
) -> nn.Module:
    from .bias import FIRE

    return FIRE(ctx.num_heads, mlp_width=mlp_width, init_c=init_c, init_threshold=init_threshold)


@register("sandwich", "bias", description="Sandwich: sinusoidal dot-product bias, per-head ratios")
def _sandwich(ctx: BuildContext, *, d_prime: int = 128, base: float = 10000.0) -> nn.Module:
    from .bias import Sandwich

    return Sandwich(ctx.num_heads, d_prime=d_prime, base=base)


# --- relative ----------------------------------------------------------------------------------


@register(
    "shaw",
    "relative",
    shared=False,
    description="Shaw et al.: clipped relative key/value embeddings",
)
def _shaw(
    ctx: BuildContext, *, max_distance: int = 16, values: bool = True, per_head: bool = False
) -> nn.Module:
    from .relative import ShawRelative

    heads = ctx.num_heads if per_head else None  # per_head: one table per head
    return ShawRelative(
        ctx.head_dim, max_distance=max_distance, values=values, per_head=per_head, num_heads=heads
    )


@register(
    "transformer-xl",
    "relative",
    shared=False,
    description="Transformer-XL: sinusoidal R, u/v biases, rel-shift, segment memory",
)
def _transformer_xl(ctx: BuildContext, *, base: float = 10000.0) -> nn.Module:
    from .relative import TransformerXLRelative

    return TransformerXLRelative(ctx.dim, ctx.num_heads, ctx.head_dim, base=base)


@register(
    "deberta", "relative", description="DeBERTa-v3 disentangled c2p/p2c, log buckets, shared table"
)
def _deberta(
    ctx: BuildContext,
    *,
    position_buckets: int = 256,
    max_relative_positions: int = 512,
    pos_att_type: str = "c2p|p2c",
    norm_rel_ebd: bool = True,
) -> nn.Module:
    from .relative import DeBERTaRelative

    # One relative table for all layers with each layer's own q/k projections (share_att_key),
    # as DeBERTa-v3; separate position projections would be shared by every layer here.
    return DeBERTaRelative(
        ctx.dim,
        ctx.num_heads,
        ctx.head_dim,
        position_buckets=position_buckets,
        max_relative_positions=max_relative_positions,
        pos_att_type=pos_att_type,
        share_att_key=True,
        norm_rel_ebd=norm_rel_ebd,
    )


@register(
    "cope",
    "relative",
    shared=False,
    description="CoPE: contextual positions from gated counts (Golovneva et al. 2024)",
    reads_positions=False,
)
def _cope(ctx: BuildContext, *, npos_max: int | None = None, init_std: float = 0.02) -> nn.Module:
    from .relative import CoPE

    # npos_max: the authors' default, max_len + 1. init_std 0.02, not their 0: a zero table
    # starts as NoPE, order-blind until trained (cope:init_std=0 gives their start).
    return CoPE(
        ctx.head_dim, ctx.num_heads, npos_max=npos_max or ctx.max_len + 1, init_std=init_std
    )
