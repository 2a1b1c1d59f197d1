"""The real-model study's figure (``posenc extend``): perplexity against length, one line per
method, the trained length marked; beside it the passkey grid of each method (depth x length,
coloured by the key's log-probability, each cell marked with its mean rank).

A pure renderer: it takes the numbers as plain data (:func:`posenc.extend.reports.tables.figure_data`).
"""

from __future__ import annotations

from typing import Any

from .common import add_caption, blank_figure


def draw_real_study(data: dict[str, Any]) -> Any:
    """``data``: ``{"model": str, "trained": int, "ppl": {method: {length: ppl}},
    "passkey": {method: {(depth, length): (logprob, mean rank, exact)}}}`` -> a Figure."""
    methods = list(data["ppl"])
    keyed = [m for m in methods if data["passkey"].get(m)]
    fig = blank_figure(11.0 if keyed else 7.5, 4.6)
    figs: Any = fig.subfigures(1, 2, width_ratios=[3, 2]) if keyed else [fig]
    ax = figs[0].subplots()
    for i, method in enumerate(methods):
        points = sorted((int(n), v) for n, v in data["ppl"][method].items())
        style = "-" if i < 10 else "--"
        ax.plot([n for n, _ in points], [v for _, v in points], style, marker="o", ms=3,
                label=method, color=f"C{i % 10}")  # fmt: skip
    ax.axvline(data["trained"], color="0.4", lw=1, ls=":")
    ax.text(data["trained"], ax.get_ylim()[1], " trained length", va="top", fontsize=8, color="0.3")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("perplexity of the last bin")
    ax.set_yscale("log")
    ax.set_title(data["model"], fontsize=10)
    ax.legend(fontsize=7, ncols=2)
    if keyed:
        depths = sorted({d for m in keyed for d, _ in data["passkey"][m]})
        lengths = sorted({n for m in keyed for _, n in data["passkey"][m]})
        axes = figs[1].subplots(len(keyed), 1, squeeze=False)[:, 0]
        for ax2, method in zip(axes, keyed, strict=True):
            grid = [[data["passkey"][method].get((d, n), (float("nan"), 0, False))[0] for n in lengths]
                    for d in depths]  # fmt: skip
            ax2.imshow(grid, vmin=-25, vmax=0, cmap="viridis", aspect="auto")
            for y, d in enumerate(depths):
                for x, n in enumerate(lengths):
                    lp, rank, exact = data["passkey"][method].get((d, n), (float("nan"), 0, False))
                    ax2.text(x, y, f"{lp:.1f}\nrank {rank:.1f}{' ✓' if exact else ''}",
                             ha="center", va="center", fontsize=7, color="k" if lp > -12 else "w")  # fmt: skip
            ax2.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths], fontsize=7)
            ax2.set_xticks(range(len(lengths)), [str(n) for n in lengths], fontsize=7)
            ax2.set_ylabel(method, fontsize=7)
        axes[0].set_title("passkey: key log-prob (depth x length)", fontsize=9)
    add_caption(
        fig,
        "Perplexity of the last 1k tokens before each length, given all before them; past the "
        "dotted line the model runs beyond its training. Passkey: higher log-prob and rank 1 = "
        "retrieved.",
    )
    return fig
