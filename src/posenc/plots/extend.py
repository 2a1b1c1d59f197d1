"""The figure of ``posenc lab extend`` (``report/extend.png``).

Left: loss at the target length against fine-tune steps, one line per extension method (step 0
is zero-shot: the rescaling alone), the model trained at the target length from scratch as a
dashed line with the tolerance band under it: the PI paper's figure of recovery by fine-tuning.
Middle: loss against evaluation length, zero-shot (dashed) and fine-tuned (solid), one colour per
method; the train and target lengths dotted. Right, on a passkey grid only: the key's accuracy at
the target length against fine-tune steps (the retrieval side of the same recovery).

A pure renderer of :func:`posenc.lab.extend_report.extend_data`'s lines.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .common import add_caption, label_axes, new_figure
from .passkey import CHANCE

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CAPTION = (
    "Look at: where each line of the left panel reaches the grey band (within 0.02 bits of a "
    "model trained at the target length from scratch). The PI paper: interpolation starts poor "
    "zero-shot and recovers within a short fine-tune; extrapolation with plain RoPE recovers "
    "slowly."
)
KEY_CAPTION = (
    " Right: whether the model still finds the passkey at the target length as it fine-tunes "
    "(chance {chance:g} per digit); the PI and YaRN papers report retrieval recovered by a "
    "short fine-tune."
)


def draw_extend(data: dict[str, Any]) -> Figure:
    """Two panels, three when the rows carry passkey heatmaps (module docstring)."""
    keys = any(m["key_curve"] for m in data["methods"])
    fig, axes = new_figure(1, 3 if keys else 2, width=19.0 if keys else 13.0, height=4.8)
    left, right = axes[0], axes[1]
    colors = _colors(len(data["methods"]))
    ref = data["reference"]
    unit, L, T = data["unit"], data["train_len"], data["target_len"]
    for color, m in zip(colors, data["methods"], strict=True):
        left.plot(m["steps"], m["curve"], marker="o", ms=3.5, lw=1.3, color=color, label=m["label"])
        x = np.asarray(data["lengths"], dtype=float)
        right.plot(x, m["zero_shot"], ls="--", lw=1.0, color=color, alpha=0.8)
        right.plot(x, m["tuned"], marker="o", ms=3, lw=1.3, color=color, label=m["label"])
    if ref is not None and math.isfinite(ref["target_bits"]):
        y = ref["target_bits"]
        left.axhline(y, color="0.2", ls="--", lw=1.2, label=ref["label"])
        left.axhspan(y - 1e-9, y + data["tolerance"], color="0.6", alpha=0.3, lw=0)
        right.plot(data["lengths"], ref["bits"], color="0.2", ls="--", lw=1.2, label=ref["label"])
    _steps_axis(
        left, f"Recovery by fine-tuning at {T} tokens", f"test loss at {T} (bits per {unit})"
    )
    right.set_xscale("log", base=2)
    right.set_xticks(data["lengths"], [str(v) for v in data["lengths"]])
    for v in (L, T):
        right.axvline(v, color="0.4", ls=":", lw=1)
    label_axes(
        right,
        "Zero-shot (dashed) and fine-tuned (solid) by length",
        "evaluation length (tokens, log2)",
        f"test loss (bits per {unit})",
    )
    if keys:
        _draw_key_panel(axes[2], data, colors)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=7, loc="upper right")
    add_caption(fig, CAPTION + (KEY_CAPTION.format(chance=CHANCE) if keys else ""))
    return fig


def _draw_key_panel(ax: Axes, data: dict[str, Any], colors: list[Any]) -> None:
    """Key accuracy at the target length against fine-tune steps, one line per method."""
    for color, m in zip(colors, data["methods"], strict=True):
        if m["key_curve"]:
            ax.plot(m["key_steps"], m["key_curve"], marker="o", ms=3.5, lw=1.3, color=color,
                    label=m["label"])  # fmt: skip
    ax.axhline(CHANCE, color="0.4", ls=":", lw=1, label="chance")
    ax.set_ylim(-0.02, 1.02)
    _steps_axis(
        ax,
        f"Passkey at {data['target_len']} tokens while fine-tuning",
        "key accuracy per digit (mean over depths)",
    )


def _steps_axis(ax: Axes, title: str, ylabel: str) -> None:
    """Fine-tune steps on x, symlog so that step 0 (zero-shot) has its place."""
    ax.set_xscale("symlog", linthresh=1)
    ax.xaxis.set_major_formatter("{x:g}")
    label_axes(ax, title, "fine-tune steps (0 = zero-shot; symlog)", ylabel)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]
