"""The relative family's registry entries: importing this module registers them."""

from __future__ import annotations

from torch import nn

from ..registry import BuildContext, register
from .cope import CoPE
from .deberta import DeBERTaRelative
from .shaw import ShawRelative
from .transformer_xl import TransformerXLRelative


@register(
    "shaw",
    "relative",
    shared=False,
    description="Shaw et al.: clipped relative key/value embeddings",
)
def _shaw(
    ctx: BuildContext, *, max_distance: int = 16, values: bool = True, per_head: bool = False
) -> nn.Module:
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
    # npos_max: the authors' default, max_len + 1. init_std 0.02, not their 0: a zero table
    # starts as NoPE, order-blind until trained (cope:init_std=0 gives their start).
    return CoPE(
        ctx.head_dim, ctx.num_heads, npos_max=npos_max or ctx.max_len + 1, init_std=init_std
    )
