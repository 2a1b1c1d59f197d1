"""The figure of ``posenc lab extend`` (``report/extend.png``).

Left: loss at the target length against fine-tune steps, one line per extension method (step 0
is zero-shot: the rescaling alone; a labelled tick at every measured step), the model trained at
the target length from scratch as a dashed line with the tolerance band over it: the PI paper's
figure of recovery by fine-tuning. Right: loss against evaluation length, zero-shot (dashed) and
fine-tuned (solid), one colour per method; the train and target lengths dotted. On a passkey grid
a third panel: the key's accuracy at the target length against fine-tune steps (the retrieval
side of the same recovery). One legend for all panels, beside them, never over a line.

The caption is written from the numbers drawn (:func:`extend_findings`, :func:`extend_caption`):
which method is in the band at which step, the best and worst zero-shot and after the
fine-tune, how far plain RoPE moves; next to it, the PI paper's finding it is compared with.

A pure renderer of :func:`posenc.lab.reports.extend_report.extend_data`'s lines.
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

PUBLISHED = (
    "Published (PI paper): interpolation starts poor zero-shot and recovers within a short "
    "fine-tune; fine-tuning plain RoPE at the longer length extended it slowly."
)


def _at(steps: list[int], values: list[float], step: int) -> float | None:
    """The value measured at ``step``, None where that step was not measured or is NaN."""
    if step not in steps:
        return None
    v = values[steps.index(step)]
    return v if math.isfinite(v) else None


def extend_findings(data: dict[str, Any]) -> dict[str, Any]:
    """What the figure of ``data`` (:func:`posenc.lab.reports.extend_report.extend_data`) shows, as
    numbers: the caption (:func:`extend_caption`) is written from these and nothing else.

    Per method (``"methods"``, in data order): ``label``, ``zero_shot`` (loss at the target
    length at step 0, None if not measured), ``final`` and ``last_step`` (at the last measured
    step), ``recovered`` (zero-shot minus final), ``in_band_at`` (the first measured step whose
    loss is at most the from-scratch reference + ``tolerance``, the grey band's top; None when
    none is, or without a reference), ``plain`` (a model some other method rescales: its label
    prefixes theirs, ``"rope"`` for ``"rope + PI"``). Also ``band`` (reference + tolerance, None without a finite reference),
    ``best_zero_shot``/``worst_zero_shot``/``best_final``/``most_recovered``: labels (None
    with fewer than two methods measured)."""
    ref = data.get("reference")
    ref_bits = ref["target_bits"] if ref is not None else math.nan
    band = ref_bits + data["tolerance"] if math.isfinite(ref_bits) else None
    labels = [m["label"] for m in data["methods"]]
    found = []
    for m in data["methods"]:
        finite = [(s, b) for s, b in zip(m["steps"], m["curve"], strict=True) if math.isfinite(b)]
        found.append({
            "label": m["label"],
            "zero_shot": _at(m["steps"], m["curve"], 0),
            "final": finite[-1][1] if finite else None,
            "last_step": finite[-1][0] if finite else None,
            "in_band_at": next((s for s, b in finite if band is not None and b <= band), None),
            "plain": any(x.startswith(m["label"] + " + ") for x in labels),
        })  # fmt: skip

    def pick(key: str, best: bool) -> str | None:
        have = [f for f in found if f[key] is not None]
        if len(have) < 2:
            return None
        chosen = (min if best else max)(have, key=lambda f: f[key])
        return str(chosen["label"])

    for f in found:
        has_both = f["zero_shot"] is not None and f["final"] is not None
        f["recovered"] = f["zero_shot"] - f["final"] if has_both else None
    return {
        "methods": found,
        "band": band,
        "reference": ref_bits if band is not None else None,
        "best_zero_shot": pick("zero_shot", best=True),
        "worst_zero_shot": pick("zero_shot", best=False),
        "best_final": pick("final", best=True),
        "most_recovered": pick("recovered", best=False),
    }


def _band_sentence(found: dict[str, Any], data: dict[str, Any]) -> str:
    """Which methods are in the band, at which step; which never are."""
    by_step: dict[int, list[str]] = {}
    never = []
    for f in found["methods"]:
        if f["in_band_at"] is None:
            never.append(f["label"])
        else:
            by_step.setdefault(int(f["in_band_at"]), []).append(f["label"])
    parts = [f"from step {s}: {', '.join(names)}" for s, names in sorted(by_step.items())]
    last = max((f["last_step"] for f in found["methods"] if f["last_step"] is not None), default=0)
    if never:
        parts.append(f"not within {last} steps: {', '.join(never)}")
    ref = data["reference"]
    return (
        f"Grey band: up to {data['tolerance']:g} bits above {ref['label']} "
        f"({found['reference']:.2f}); at or under its top {'; '.join(parts)}."
    )


def extend_caption(data: dict[str, Any]) -> str:
    """The figure's caption, every claim about "here" read from :func:`extend_findings` of
    ``data`` (a test checks each against the data); the published finding it is compared
    with is the PI paper's."""
    found = extend_findings(data)
    by_label = {f["label"]: f for f in found["methods"]}
    T = data["target_len"]
    out = ["Look at: how fast each line of the left panel falls."]
    if found["band"] is not None:
        out = ["Look at: where each line of the left panel enters the grey band.",
               _band_sentence(found, data)]  # fmt: skip
    if found["worst_zero_shot"] is not None:
        worst, best = by_label[found["worst_zero_shot"]], by_label[str(found["best_zero_shot"])]
        out.append(f"Zero-shot at {T}: worst {worst['label']} ({worst['zero_shot']:.2f} bits), "
                   f"best {best['label']} ({best['zero_shot']:.2f}).")  # fmt: skip
    if found["best_final"] is not None:
        top = by_label[found["best_final"]]
        text = f"After {top['last_step']} steps the best is {top['label']} ({top['final']:.2f})"
        if found["most_recovered"] is not None:
            most = by_label[found["most_recovered"]]
            text += f"; the largest recovery is {most['label']}'s ({most['recovered']:.2f} bits)"
        out.append(text + ".")
    out.append(PUBLISHED)
    for f in (f for f in found["methods"] if f["plain"] and f["recovered"] is not None):
        when = (f"at or under the band's top from step {f['in_band_at']}"
                if f["in_band_at"] is not None
                else "never under the band's top" if found["band"] is not None else "")  # fmt: skip
        out.append(f"Here plain {f['label']} goes from {f['zero_shot']:.2f} to {f['final']:.2f} "
                   f"bits in {f['last_step']} steps" + (f", {when}." if when else "."))  # fmt: skip
    if any(m["key_curve"] for m in data["methods"]):
        out.append(_key_sentence(data))
    return " ".join(out)


def _key_sentence(data: dict[str, Any]) -> str:
    """The passkey panel's part of the caption: plain models' key accuracy first and last, the
    others' range at the first and at the last step."""
    with_keys = [m for m in data["methods"] if m["key_curve"]]
    labels = [m["label"] for m in data["methods"]]
    parts = []
    for m in with_keys:
        if any(x.startswith(m["label"] + " + ") for x in labels):
            parts.append(f"plain {m['label']} from {m['key_curve'][0]:.2f} (step "
                         f"{m['key_steps'][0]}) to {m['key_curve'][-1]:.2f} (step "
                         f"{m['key_steps'][-1]})")  # fmt: skip
    first = [m["key_curve"][0] for m in with_keys]
    last = [m["key_curve"][-1] for m in with_keys]
    parts.append(f"all methods {_span(first)} first, {_span(last)} last")
    return (
        f"Top right: the key's accuracy at {data['target_len']} while fine-tuning (chance "
        f"{CHANCE:g} per digit): {'; '.join(parts)}. The PI and YaRN papers report retrieval "
        "recovered by a short fine-tune."
    )


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def measured_steps(data: dict[str, Any]) -> list[int]:
    """Every fine-tune step some line of ``data`` was measured at, ascending: the step axes'
    ticks (each labelled)."""
    steps = {int(s) for m in data["methods"] for s in (*m["steps"], *m["key_steps"])}
    return sorted(steps)


def draw_extend(data: dict[str, Any]) -> Figure:
    """Two panels and a legend beside them; on a passkey grid four cells: loss and key
    accuracy against steps (top), loss by length and the legend (bottom)."""
    keys = any(m["key_curve"] for m in data["methods"])
    fig, (left, right) = new_figure(1, 2, width=10.0, height=4.6)
    if keys:  # a 2 x 2 grid: steps on top (loss, key), loss by length and the legend below
        fig.set_size_inches(10.0, 8.0)
        grid = fig.add_gridspec(2, 2)
        for ax, cell in ((left, grid[0, 0]), (right, grid[1, 0])):
            ax.set_subplotspec(cell)
        key_ax = fig.add_subplot(grid[0, 1])
    colors = _colors(len(data["methods"]))
    ref = data["reference"]
    unit, L, T = data["unit"], data["train_len"], data["target_len"]
    for color, m in zip(colors, data["methods"], strict=True):
        left.plot(m["steps"], m["curve"], marker="o", ms=4, lw=1.5, color=color, label=m["label"])
        x = np.asarray(data["lengths"], dtype=float)
        right.plot(x, m["zero_shot"], ls="--", lw=1.0, color=color, alpha=0.8)
        right.plot(x, m["tuned"], marker="o", ms=3.5, lw=1.5, color=color, label=m["label"])
    if ref is not None and math.isfinite(ref["target_bits"]):
        y = ref["target_bits"]
        left.axhline(y, color="0.2", ls="--", lw=1.2, label=ref["label"])
        left.axhspan(y - 1e-9, y + data["tolerance"], color="0.6", alpha=0.3, lw=0)
        right.plot(data["lengths"], ref["bits"], color="0.2", ls="--", lw=1.2, label=ref["label"])
    steps = measured_steps(data)
    _steps_axis(left, steps, f"Recovery by fine-tuning at {T}", f"test loss at {T} (bits/{unit})")
    right.set_xscale("log", base=2)
    right.set_xticks(data["lengths"], [str(v) for v in data["lengths"]])
    right.minorticks_off()
    for v in (L, T):
        right.axvline(v, color="0.4", ls=":", lw=1)
    label_axes(right, "Zero-shot (dashed), fine-tuned (solid)", "evaluation length (tokens, log2)",
               f"test loss (bits/{unit})")  # fmt: skip
    axes = [left, right]
    if keys:
        _draw_key_panel(key_ax, data, colors, steps)
        axes.append(key_ax)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    handles, labels = left.get_legend_handles_labels()
    if keys:  # the empty fourth cell holds the legend: beside the data, never on it
        fig.add_subfigure(grid[1, 1]).legend(
            handles, labels, loc="center", fontsize=9, title="method"
        )
    else:
        fig.legend(handles, labels, loc="outside right upper", fontsize=9, title="method")
    add_caption(fig, extend_caption(data))
    return fig


def _draw_key_panel(ax: Axes, data: dict[str, Any], colors: list[Any], steps: list[int]) -> None:
    """Key accuracy at the target length against fine-tune steps, one line per method."""
    for color, m in zip(colors, data["methods"], strict=True):
        if m["key_curve"]:
            ax.plot(m["key_steps"], m["key_curve"], marker="o", ms=4, lw=1.5, color=color,
                    label=m["label"])  # fmt: skip
    ax.axhline(CHANCE, color="0.4", ls=":", lw=1)
    ax.text(steps[-1] if steps else 1, CHANCE, "chance", ha="right", va="bottom", fontsize=8,
            color="0.3")  # fmt: skip
    ax.set_ylim(-0.02, 1.02)
    _steps_axis(ax, steps, f"Passkey at {data['target_len']} tokens while fine-tuning",
                "key accuracy per digit (mean over depths)")  # fmt: skip


def _steps_axis(ax: Axes, steps: list[int], title: str, ylabel: str) -> None:
    """Fine-tune steps on x, symlog so that step 0 (zero-shot) has its place; a labelled tick
    at every measured step and no other."""
    ax.set_xscale("symlog", linthresh=1, linscale=0.6)
    ax.set_xticks(steps, [str(s) for s in steps])
    ax.minorticks_off()
    label_axes(ax, title, "fine-tune steps (0 = zero-shot; symlog)", ylabel)


def _colors(n: int) -> list[Any]:
    """One colour per method: tab10's ten hues first (tab20's dark shades), then their light
    shades, so that no two of the first ten lines share a hue."""
    from matplotlib import colormaps

    tab20 = colormaps["tab20"]
    return [tab20((2 * k) % 20 if k < 10 else (2 * (k - 10) + 1) % 20) for k in range(n)]
