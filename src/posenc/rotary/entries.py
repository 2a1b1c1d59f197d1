"""The rotary family's registry entries: importing this module registers them."""

from __future__ import annotations

from torch import nn

from ..registry import BuildContext, register
from .embedding import RotaryEmbedding
from .mrope import MRoPE
from .xpos import XPos


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
    # A fixed center in the middle of the training length keeps the scales near 1.
    center = ctx.max_len // 2 if center is None else center
    return XPos(
        ctx.head_dim, base=base, scale_base=scale_base, gamma=gamma, layout=layout, center=center
    )
