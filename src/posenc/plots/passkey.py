"""Passkey retrieval as a length x depth heatmap, one panel per encoding (and per RoPE rescaling).

Drawn from lab result rows whose evaluation has a ``"passkey"`` heatmap (a grid run with
``posenc lab --task passkey``, :mod:`posenc.lab.evaluation.tasks`): x is the evaluation length, y the depth
at which the key hides in the filler (0: the start of the sequence, the furthest back; 1: right
before the question), colour and number the answer-digit accuracy (mean over seeds). The training
length's column is outlined. Chance is one over the number of digit symbols (0.1).

Published finding: models fail at the passkey beyond their training length unless the context
is extended (Landmark Attention, Mohtashami & Jaggi 2023; LongLoRA, Chen et al. 2023); position
interpolation (Chen et al. 2023) and YaRN (Peng et al. 2024) recover it after a short
fine-tuning. The rescalings here are applied at inference only, without that fine-tuning.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .common import add_caption, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CAPTION = (
    "Look at: each panel is one model; a column that stays bright finds the key at that length "
    "whatever its depth, and the outlined column is the training length L (numbers: accuracy "
    "per key digit, 1 = all right; chance: {chance:g}; y: the key's depth, 0 = the start). Published: models lose the passkey beyond their training length unless the "
    "context is extended (Landmark Attention; LongLoRA); PI and YaRN recover it after "
    "fine-tuning. The RoPE rescalings here are inference-only, without that fine-tuning."
)

#: Accuracy of a guess: one over the passkey's ten digit symbols
#: (:data:`posenc.lab.evaluation.tasks.DIGITS`; a test holds the two together).
CHANCE = 0.1


def _matrix(cells: list[list[float | None] | None], n_depths: int) -> np.ndarray:
    """``[length][depth]`` with Nones -> ``[depth, length]`` float, NaN where missing."""
    out = np.full((n_depths, len(cells)), np.nan)
    for j, row in enumerate(cells):
        for i, v in enumerate(row or ()):
            if v is not None and math.isfinite(v):
                out[i, j] = float(v)
    return out


def passkey_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Passkey heatmaps of result rows, averaged over seeds.

    Rows without a passkey heatmap are left out. Returns ``lengths [N]``, ``depths [D]``,
    ``train_len``, and ``panels``: a list (row order: encodings in the order they first appear,
    base first) of ``{"label", "encoding", "variant", "acc" [D, N], "exact" [D, N], "seeds"}``,
    NaN where a length was not applicable. Raises ``ValueError`` when no row has one.
    """
    found = [r for r in rows if any("passkey" in v for v in r["eval"]["variants"].values())]
    if not found:
        raise ValueError(
            "no passkey heatmaps in these results; run `posenc lab --task passkey` first"
        )
    lengths = sorted({int(n) for r in found for n in r["eval"]["lengths"]})
    depths = [float(d) for d in next(
        v["passkey"]["depths"] for r in found for v in r["eval"]["variants"].values()
        if "passkey" in v
    )]  # fmt: skip
    stacks: dict[tuple[str, str], dict[str, list[np.ndarray]]] = {}
    labels: dict[tuple[str, str], str] = {}
    for r in found:
        for vname, v in r["eval"]["variants"].items():
            pk = v.get("passkey")
            if pk is None:
                continue
            if [float(d) for d in pk["depths"]] != depths:
                raise ValueError(f"rows disagree on the passkey depths: {pk['depths']} vs {depths}")
            key = (r["encoding"], vname)
            label = r["encoding"] if vname == "base" else f"{r['encoding']} + {v['label']}"
            labels.setdefault(key, label)
            # Place each row's lengths in the common axis.
            at = {int(n): i for i, n in enumerate(pk["lengths"])}
            entry = stacks.setdefault(key, {"acc": [], "exact": []})
            for metric in ("acc", "exact"):
                cells = [pk[metric][at[n]] if n in at else None for n in lengths]
                entry[metric].append(_matrix(cells, len(depths)))
    panels = []
    for key, entry in stacks.items():
        means = {}
        for metric, mats in entry.items():
            stack = np.stack(mats)  # [seeds, D, N]
            with np.errstate(invalid="ignore"):
                ok = np.isfinite(stack).sum(0)
                means[metric] = np.where(ok > 0, np.nansum(stack, 0) / np.maximum(ok, 1), np.nan)
        panels.append({"label": labels[key], "encoding": key[0], "variant": key[1],
                       "acc": means["acc"], "exact": means["exact"],
                       "seeds": len(entry["acc"])})  # fmt: skip
    order = list(dict.fromkeys(p["encoding"] for p in panels))
    panels.sort(key=lambda p: (order.index(p["encoding"]), p["variant"] != "base"))
    return {
        "lengths": np.asarray(lengths),
        "depths": np.asarray(depths),
        "train_len": int(found[0]["train_len"]),
        "panels": panels,
    }


def passkey_lost_at(data: dict[str, Any], threshold: float = 0.9) -> list[dict[str, Any]]:
    """Where each panel of :func:`passkey_data` loses the passkey, for a table or a sentence.

    Per panel: ``{"label", "encoding", "variant", "mean" [N]`` (accuracy averaged over depths,
    NaN where not applicable), ``"learned"`` (mean at the train length >= ``threshold``),
    ``"lost_at"`` (the first eval length whose mean is below ``threshold`` or not applicable;
    None if it holds at every length)}``.
    """
    lengths = [int(n) for n in data["lengths"]]
    out = []
    for p in data["panels"]:
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(p["acc"]).all(0)  # [N] every depth measured
            mean = np.where(ok, np.nanmean(np.where(ok, p["acc"], 0.0), 0), np.nan)
        held = [bool(np.isfinite(m) and m >= threshold) for m in mean]
        at_l = lengths.index(data["train_len"]) if data["train_len"] in lengths else 0
        lost = next((n for n, h in zip(lengths, held, strict=True) if not h), None)
        out.append({"label": p["label"], "encoding": p["encoding"], "variant": p["variant"],
                    "mean": mean, "learned": held[at_l], "lost_at": lost})  # fmt: skip
    return out


def _cell_text(v: float) -> str:
    """A cell's number, short enough to read at a page's width: ``1`` (at least 0.995),
    ``.94``, or ``n/a`` where the length did not apply."""
    if not np.isfinite(v):
        return "n/a"
    return "1" if v >= 0.995 else f"{v:.2f}".lstrip("0")


def _heatmap(ax: Axes, panel: dict[str, Any], data: dict[str, Any]) -> Any:
    """One panel: accuracy [depth, length] with its numbers, L's column outlined; the x ticks
    in multiples of L (``1L``, ``2L``), the y ticks the key's depth."""
    from matplotlib.patches import Rectangle

    acc = panel["acc"]
    lengths, depths, L = data["lengths"], data["depths"], data["train_len"]
    im = ax.imshow(
        np.ma.masked_invalid(acc), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
        interpolation="nearest",
    )  # fmt: skip
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            v = acc[i, j]
            colour = "black" if np.isfinite(v) and v > 0.6 else "white"
            ax.text(j, i, _cell_text(v), ha="center", va="center", fontsize=8, color=colour)
    ax.set_facecolor("0.55")  # where a length was not applicable
    ax.set_xticks(range(len(lengths)), [f"{n / L:g}L" for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.tick_params(labelsize=8, length=2, pad=1.5)
    if L in set(lengths.tolist()):
        j = lengths.tolist().index(L)
        box = Rectangle((j - 0.5, -0.5), 1, len(depths), fill=False, ec="red", lw=1.8, ls="--")
        ax.add_patch(box)
    title = panel["label"] + (f" ({panel['seeds']} seeds)" if panel["seeds"] > 1 else "")
    ax.set_title(title, fontsize=9, pad=3)
    return im


def _passkey_grid(
    panels: list[dict[str, Any]], variants: bool, ncols: int
) -> list[list[dict[str, Any] | None]]:
    """The panels in rows: per encoding with variants its model then its variants
    (``variants``), or the models as trained ``ncols`` to a row; None pads a row."""
    if variants:
        with_variants = {p["encoding"] for p in panels if p["variant"] != "base"}
        groups = [[p for p in panels if p["encoding"] == e]
                  for e in dict.fromkeys(p["encoding"] for p in panels) if e in with_variants]  # fmt: skip
        ncols = max((len(g) for g in groups), default=1)
        return [g + [None] * (ncols - len(g)) for g in groups] or [[None]]
    shown = [p for p in panels if p["variant"] == "base"]
    rows = max(1, -(-len(shown) // ncols))
    ncols = max(1, -(-len(shown) // rows))  # as few rows, then as even ones, as will do
    grid: list[list[dict[str, Any] | None]] = [
        list(shown[i : i + ncols]) for i in range(0, len(shown), ncols)
    ] or [[None]]
    grid[-1] = grid[-1] + [None] * (ncols - len(grid[-1]))
    return grid


def draw_passkey(data: dict[str, Any], variants: bool = False, ncols: int = 6) -> Figure:
    """Small multiples of :func:`passkey_data`'s heatmaps, 10 inches wide (legible at a
    README's ~800 pixels: 8-point numbers, ticks only on the outer panels).

    ``variants=False``: one panel per encoding as trained. ``variants=True``: each encoding that
    has inference-time variants (RoPE rescalings, an interpolated learned table) gets a row: its
    base model, then each variant. One colour bar (accuracy 0..1) for all panels.
    """
    grid = _passkey_grid(data["panels"], variants, ncols)
    nrows, ncols = len(grid), len(grid[0])
    width = min(10.0, 1.75 * ncols + 1.4)
    fig, axes = new_figure(nrows, ncols, width=width, height=1.75 * nrows + 1.5)
    axes = np.asarray(axes, dtype=object).reshape(nrows, ncols)  # [rows, cols], even for 1 x 1
    im = None
    for r, line in enumerate(grid):
        for c, panel in enumerate(line):
            ax = axes[r, c]
            if panel is None:
                ax.set_axis_off()
                continue
            im = _heatmap(ax, panel, data)
            if c > 0:
                ax.tick_params(labelleft=False)
            if r + 1 < nrows and grid[r + 1][c] is not None:
                ax.tick_params(labelbottom=False)
    if im is None:
        note = "no inference-time variants in these results" if variants else "no passkey rows"
        axes[0, 0].text(0.5, 0.5, note, ha="center", va="center", transform=axes[0, 0].transAxes)
    else:
        fig.colorbar(im, ax=axes, shrink=0.8, label="passkey accuracy (per digit)")
    what = "inference-time variants beside each model" if variants else "each model as trained"
    L = data["train_len"]
    title = f"Passkey retrieval by key depth and eval length (L = {L} tokens): {what}"
    fig.suptitle(textwrap.fill(title, int(width * 12)), fontsize=10)
    fig.supylabel("key depth (0 = the start)", fontsize=9)
    add_caption(fig, CAPTION.format(chance=CHANCE))
    return fig


def write_passkey_figure(
    rows: list[dict[str, Any]], path: str | Path, variants: bool = False
) -> Path:
    """Draw :func:`draw_passkey` from result rows and save it (``.png`` or ``.svg``)."""
    fig = draw_passkey(passkey_data(rows), variants=variants)
    return save_figure(fig, path)


def write_passkey_figures(rows: list[dict[str, Any]], folder: str | Path) -> dict[str, Path]:
    """The passkey report's figures in ``folder``: ``passkey.png`` (one heatmap per encoding)
    and, where some model has inference-time variants (RoPE rescalings), ``passkey_variants.png``
    (one per variant beside its model). Returns the paths written, by name."""
    data = passkey_data(rows)
    folder = Path(folder)
    written = {"passkey": save_figure(draw_passkey(data), folder / "passkey.png")}
    if any(p["variant"] != "base" for p in data["panels"]):
        fig = draw_passkey(data, variants=True)
        written["passkey variants"] = save_figure(fig, folder / "passkey_variants.png")
    return written


def passkey_table(
    rows: list[dict[str, Any]], threshold: float = 0.9
) -> tuple[list[str], list[list[str]], str]:
    """Header, body and a note: per encoding (and variant), passkey accuracy averaged over
    depths at each eval length, and the first length where it falls below ``threshold``
    (:func:`passkey_lost_at`)."""
    data = passkey_data(rows)
    L = data["train_len"]
    lengths = [int(n) for n in data["lengths"]]
    header = ["encoding"] + [f"{n} ({n / L:g}L)" for n in lengths] + [f"below {threshold:g} at"]
    body = []
    for p in passkey_lost_at(data, threshold):
        cells = [p["label"]] + [f"{m:.2f}" if np.isfinite(m) else "n/a" for m in p["mean"]]
        if not p["learned"]:
            cells.append("not learned at L")
        else:
            cells.append("—" if p["lost_at"] is None else str(p["lost_at"]))
        body.append(cells)
    note = (
        f"Accuracy per key digit (chance {CHANCE:.2f}), averaged over the key's depths "
        f"{', '.join(f'{d:g}' for d in data['depths'])}; trained at L = {L}."
    )
    return header, body, note
