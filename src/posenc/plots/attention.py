"""Attention maps of a trained model at its training length and at 4x that length.

A pure renderer: :func:`model_attention` reads the weights out of a given model and
:func:`draw_attention` draws them; the model (a lab checkpoint, or a tiny one trained on the
lag task) and the maps to draw come from :func:`posenc.lab.evaluation.probe.attention_data`.

The maps are each layer's own probabilities: the input each :class:`posenc.attention.Attention`
receives is captured with a forward pre-hook and run again through the module's explicit path
with ``return_probs`` (:meth:`~posenc.attention.Attention.attention_probs`), so every family
(rotary, bias, relative) is read the way it attends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from .._sizes import FIGURE_BYTES, check_fits
from ..attention import Attention, PositionContext
from ..model import TransformerLM
from .common import add_caption, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure


# --- attention weights from a model --------------------------------------------------------------


def attention_weights(
    attn: Attention,
    x: torch.Tensor,
    positions: torch.Tensor | None = None,
    context: PositionContext | None = None,
) -> torch.Tensor:
    """The attention probabilities of ``attn`` on its input ``x``, from the module's explicit
    path (:meth:`posenc.attention.Attention.attention_probs`: the same scores, bias and mask as
    its forward, whatever the family).

    Shapes: ``x [b, s, dim]``, ``positions [s]`` or ``[b, s]`` (default ``arange(s)``) ->
    ``[b, h, s, s]``; each row sums to 1 and is zero on masked (future) keys.
    """
    return attn.attention_probs(x, positions, context=context)


#: Bytes per attention weight of one layer: the float32 map kept, and while it is computed
#: the scores, the masked scores and the softmax (float32 each).
MAP_KEPT_BYTES = 4
MAP_WORK_BYTES = 12
#: Bytes per drawn weight (at most ``max_heads`` maps of each length): the numpy copy and
#: matplotlib's masked, normalized and resampled ones.
MAP_DRAW_BYTES = 32


def check_attention_size(length: int, num_heads: int, num_layers: int, batch: int = 1) -> None:
    """ValueError (one line) when the attention maps of every layer at ``length`` (``[batch,
    h, s, s]`` each) and their figure will not fit in memory."""
    per_layer = batch * num_heads * length * length
    need = per_layer * (num_layers * MAP_KEPT_BYTES + MAP_WORK_BYTES)
    need += min(num_heads, 4) * length * length * MAP_DRAW_BYTES + FIGURE_BYTES
    what = f"the attention figure at length {length} ({num_layers} layer(s) x {num_heads} heads)"
    check_fits(need, what, "--train-len or --factor")


@torch.no_grad()
def model_attention(model: TransformerLM, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Attention weights of every layer of ``model`` on ``tokens [b, s]`` -> list of ``[b, h, s, s]``.

    ValueError (one line) first when they will not fit in memory (:func:`check_attention_size`).
    """
    check_attention_size(
        tokens.shape[-1], model.cfg.num_heads, model.cfg.num_layers, tokens.shape[0]
    )
    captured: list[tuple[torch.Tensor, Any, Any]] = []

    def grab(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        positions = args[1] if len(args) > 1 else kwargs.get("positions")
        captured.append((args[0], positions, kwargs.get("context")))

    layers: list[Attention] = [block.attn for block in model.blocks]  # type: ignore[misc]
    handles = [attn.register_forward_pre_hook(grab, with_kwargs=True) for attn in layers]
    try:
        model.hidden(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return [
        attention_weights(attn, x, pos, ctx)
        for attn, (x, pos, ctx) in zip(layers, captured, strict=True)
    ]


def draw_attention(data: dict[str, Any], max_heads: int = 4) -> Figure:
    """Rows: training length, ``factor`` x length; columns: heads (at most ``max_heads``)."""
    from matplotlib.colors import PowerNorm

    maps = data["maps"]
    h = min(maps["train"].shape[0], max_heads)
    # Square maps: the height follows the width, or titles and labels collide between rows.
    fig, axes = new_figure(2, h, width=2.6 * h + 1.4, height=2 * 2.6 + 1.7)
    axes = np.asarray(axes).reshape(2, h)
    # A square-root colour scale: attention is mostly near-zero weights with a few large ones,
    # and the small ones carry the pattern (how far back a head still looks).
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    image = None
    for row, (name, n) in enumerate(zip(("train", "long"), data["lengths"], strict=True)):
        for head in range(h):
            ax = axes[row, head]
            image = ax.imshow(maps[name][head], cmap="viridis", norm=norm, interpolation="nearest")
            if name == "long":
                # Where training ended: everything right of / below these lines is new territory.
                edge = data["lengths"][0] - 0.5
                ax.axhline(edge, color="white", lw=0.6, ls="--")
                ax.axvline(edge, color="white", lw=0.6, ls="--")
            what = "train length" if name == "train" else f"{n // data['lengths'][0]}x length"
            ax.set_title(f"head {head}, {what} ({n})", fontsize=9)
            ax.set_xlabel("key position j")
            if head == 0:
                ax.set_ylabel("query position i")
    assert image is not None
    fig.colorbar(image, ax=list(axes.flat), label="attention weight (sqrt scale)", shrink=0.85)
    fig.suptitle(
        f"Attention maps, {data['encoding']}, layer {data['layer']}: train length vs "
        f"{data['lengths'][1] // data['lengths'][0]}x",
        fontsize=11,
    )
    add_caption(
        fig,
        f"Look at: does the pattern learned at the training length (stripes, locality) hold past "
        f"the dashed lines, at {data['lengths'][1] // data['lengths'][0]}x? Model: {data['source']}.",
    )
    return fig
