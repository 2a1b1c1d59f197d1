"""The lab's figure, drawn from its results store (``<out>/results.jsonl``): the one drawing that
``posenc plot lab``, ``posenc lab report`` (``report/lab.png``) and ``posenc report`` show.

Top: test loss against evaluation length, the training length dotted: "train short, test long"
(the ALiBi paper's figure 1); with two or more seeds, an error bar at each point spans the 95%
confidence interval of the mean over seeds. Bottom: loss by position inside the longest
evaluation window, which shows *where* an encoding breaks: a curve that rises right after the
training length has not extrapolated. Left: every encoding as trained, one colour each. Right: the inference-time
variants (RoPE rescalings, an interpolated learned table) beside their base model (drawn as on the
left), each variant its own colour, dash pattern and marker: no two lines of the figure share a
colour and a line style, so the lines stay apart in grey too.

A pure renderer: :func:`lab_data` folds result rows (as :func:`posenc.lab.reports.results.load_rows`
reads them from a store) into the arrays :func:`draw_lab` draws; nothing here reads a store.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .._stats import mean_ci
from .common import add_caption, blank_figure, label_axes, new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CAPTION = (
    "Look at: lines that stay flat past the dotted training length extrapolate; a curve that "
    "climbs after it (bottom) shows where an encoding breaks. Right: the inference-time "
    "variants beside their base model, without retraining. Published (ALiBi paper, "
    "WikiText-103): sinusoidal breaks hardest past L, RoPE degrades, ALiBi stays flat."
)

#: The caption of the same drawing for the training-time length methods (``posenc plot length``).
LENGTH_CAPTION = (
    "Look at: each method's line against its plain encoding's past the dotted training length. "
    "Published: randomized positions let models trained on short inputs solve longer ones "
    "(Ruoss et al. 2023, algorithmic tasks); PoSE extends a model to the length its positions "
    "covered with training at the original length (Zhu et al. 2024); Llama-4 interleaves NoPE "
    "layers with a query temperature for long inputs."
)

#: Added to :data:`LENGTH_CAPTION` where the figure has small multiples of variants.
LENGTH_VARIANTS_CAPTION = (
    "Below: each encoding's inference-time RoPE rescalings, one panel per encoding, its model as "
    "trained in black."
)

#: Added to :data:`CAPTION` when the figure draws intervals (two or more seeds of some line).
CI_CAPTION = (
    "Error bars (top): the 95% confidence interval of the mean over seeds (Student t); "
    "points whose bars overlap are not shown to differ."
)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _ci(values: list[float]) -> float:
    """Half-width of the 95% interval of the mean over seeds; NaN below two seeds."""
    half = mean_ci(values)[1] if values else None
    return math.nan if half is None else half


def _label(row: dict[str, Any], vname: str, variant: dict[str, Any]) -> str:
    return row["encoding"] if vname == "base" else f"{row['encoding']} + {variant['label']}"


def _curve(group_curves: list[dict[str, list[Any]]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds of one line's binned curve: ``(x, bits)``, ``x`` each bin's geometric
    middle in 1-based positions (bins are log-spaced; a log axis has no 0)."""
    c0 = group_curves[0]
    # Seeds of one cell share the binning (same length, same curve_points), so bins align.
    x = [math.sqrt((a + 1) * b) for a, b in zip(c0["pos"], c0.get("end", c0["pos"]), strict=True)]
    bits = [statistics.fmean(c["bits"][i] for c in group_curves) for i in range(len(x))]
    return np.asarray(x), np.asarray(bits)


def lab_data(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean test loss per (encoding, variant) and eval length, and the loss-by-position curves,
    from the result rows of one group (:func:`posenc.lab.reports.results.load_rows`).

    Returns ``lengths [N]`` (sorted eval lengths), ``train_len``, ``unit``, ``group``,
    ``lines``: a list of ``{"label", "encoding", "variant", "bits": [N], "ci": [N]}`` (mean over
    seeds, NaN where a length was not applicable; half-width of the mean's 95% interval over the
    same seeds, NaN below two seeds), and ``curves``: ``{"length", "lines": [{"label",
    "encoding", "variant", "pos": [P], "bits": [P]}]}`` at the longest length (mean over seeds;
    ``pos`` is each position bin's geometric middle, 1-based). Raises ValueError without rows.
    """
    if isinstance(rows, (str, Path)):
        raise TypeError(
            "lab_data takes result rows; read a store's with posenc.lab.reports.results.load_rows(out)"
        )
    if not rows:
        raise ValueError("no lab results to draw; run `posenc lab` first")
    lengths = sorted({int(n) for r in rows for n in r["eval"]["lengths"]})
    longest = str(lengths[-1])
    bits: dict[tuple[str, str], dict[int, list[float]]] = {}
    labels: dict[tuple[str, str], str] = {}
    curves: dict[tuple[str, str], list[dict[str, list[float]]]] = {}
    for r in rows:
        for vname, v in r["eval"]["variants"].items():
            key = (r["encoding"], vname)
            labels.setdefault(key, _label(r, vname, v))
            per_len = bits.setdefault(key, {})
            for n, res in v["results"].items():
                if res.get("bits") is not None and math.isfinite(res["bits"]):
                    per_len.setdefault(int(n), []).append(float(res["bits"]))
            res = v["results"].get(longest) or {}
            # Variants identical to the base model at this length add nothing to the curves.
            same = "same as base" in (res.get("note") or "")
            if res.get("curve") and res.get("bits") is not None and not same:
                curves.setdefault(key, []).append(res["curve"])
    lines = [
        {"label": labels[k], "encoding": k[0], "variant": k[1],
         "bits": np.array([_mean(per_len.get(n, [])) for n in lengths]),
         "ci": np.array([_ci(per_len.get(n, [])) for n in lengths])}
        for k, per_len in bits.items()
    ]  # fmt: skip
    curve_lines = []
    for k, group_curves in curves.items():
        pos, mean = _curve(group_curves)
        curve_lines.append(
            {"label": labels[k], "encoding": k[0], "variant": k[1], "pos": pos, "bits": mean}
        )
    return {
        "lengths": np.asarray(lengths),
        "train_len": int(rows[0]["train_len"]),
        "unit": rows[0]["eval"].get("unit", "byte"),
        "group": rows[0].get("group", ""),
        "lines": lines,
        "curves": {"length": int(longest), "lines": curve_lines},
    }


_MARKERS = "osD^vP*Xhp<>"
_DASHES: list[Any] = ["--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]


#: Line styles of the encodings as trained past the 20 colours of tab20 (a grid of more).
_BASE_LINESTYLES: list[Any] = ["-", (0, (1, 1)), (0, (4, 2, 1, 2))]


def lab_styles(lines: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Line styles by label: ``(as_trained, variants)``; one style per label in the whole
    figure, and no two labels with the same ``(color, linestyle)``.

    As trained: one colour per encoding (tab20, dark shades first: the default grid has 13),
    solid, each its own marker; past 20 encodings the colours come round again in another
    line style. Variants (the lines of every encoding that has an inference-time variant): a
    base model as it is on the left (the same line in both panels), each variant its own
    colour from Dark2 (none of tab20's, so a variant never takes an encoding's colour) and its
    own dash pattern, never solid."""
    import matplotlib

    tab20, dark2 = matplotlib.colormaps["tab20"], matplotlib.colormaps["Dark2"]
    encodings = list(dict.fromkeys(line["encoding"] for line in lines))
    base = {
        e: {"color": tab20((2 * k) % 20 if k % 20 < 10 else (2 * k + 1) % 20),
            "linestyle": _BASE_LINESTYLES[(k // 20) % len(_BASE_LINESTYLES)],
            "marker": _MARKERS[k % len(_MARKERS)]}
        for k, e in enumerate(encodings)
    }  # fmt: skip
    as_trained = {line["label"]: base[line["encoding"]] for line in lines}
    with_variants = {line["encoding"] for line in lines if line["variant"] != "base"}
    variants: dict[str, Any] = {}
    j = 0  # the variant lines so far: (j mod 8, j mod 5) is a new pair for j < 40
    for line in (x for x in lines if x["encoding"] in with_variants):
        if line["variant"] == "base":
            variants[line["label"]] = as_trained[line["label"]]
            continue
        variants[line["label"]] = {
            "color": dark2(j % 8),
            "linestyle": _DASHES[j % len(_DASHES)],
            "marker": _MARKERS[(j + len(encodings)) % len(_MARKERS)],
        }
        j += 1
    return as_trained, variants


def _panel(
    ax: Axes,
    curves: list[tuple[np.ndarray, np.ndarray, str]],
    styles: dict[str, Any],
    L: int,
    bands: list[np.ndarray] | None = None,
) -> None:
    """One panel's lines (``(x, y, label)``, NaNs dropped) on a log2 x axis, L dotted; with
    ``bands`` (a half-width per point, one array per line), an error bar ``y ± band`` at each
    point whose band is finite.

    Error bars, not a shaded band: a band between two points vanishes at a lone point (a learned
    table has one length), and the bars are a ``LineCollection``, so ``ax.get_lines()`` still
    holds one line per encoding."""
    for k, (x, y, label) in enumerate(curves):
        ok = np.isfinite(y)
        if ok.any():
            ax.plot(x[ok], y[ok], ms=3.5, lw=1.3, label=label, **styles[label])
        half = bands[k] if bands is not None else None
        if half is None:
            continue
        bar = ok & np.isfinite(half)
        if bar.any():
            ax.errorbar(x[bar], y[bar], yerr=half[bar], fmt="none", ecolor=styles[label]["color"],
                        elinewidth=1.0, capsize=0, alpha=0.7)  # fmt: skip
    ax.axvline(L, color="0.4", ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter("{x:g}")  # 16, not 2^4
    ax.grid(True, alpha=0.3)


def draw_lab(data: dict[str, Any], caption: str = CAPTION) -> Figure:
    """Four panels (module docstring): loss vs eval length and loss by position (rows), as
    trained and inference-time variants (columns); one legend per column. ``caption``: the
    first part of the caption (the interval note follows where intervals are drawn)."""
    fig, axes = new_figure(2, 2, width=13.5, height=9.0)
    L, unit, n = data["train_len"], data["unit"], data["curves"]["length"]
    base_style, variant_style = lab_styles(data["lines"])
    lengths = data["lengths"]
    for col, styles in enumerate((base_style, variant_style)):
        top, bottom = axes[0, col], axes[1, col]
        shown = [x for x in data["lines"] if x["label"] in styles]
        if col == 0:
            shown = [x for x in shown if x["variant"] == "base"]
        if not shown:
            for ax in (top, bottom):
                ax.set_axis_off()
                note = "no inference-time variants in these results"
                ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
            continue
        labels = {x["label"] for x in shown}
        bands = [x.get("ci") for x in shown]
        _panel(top, [(lengths, x["bits"], x["label"]) for x in shown], styles, L, bands)
        top.set_xticks(lengths, [str(v) for v in lengths])
        curves = [c for c in data["curves"]["lines"] if c["label"] in labels]
        _panel(bottom, [(c["pos"], c["bits"], c["label"]) for c in curves], styles, L)
        what = "as trained" if col == 0 else "inference-time variants"
        top_title = f"Train short, test long: {what} (trained at L={L})"
        label_axes(
            top, top_title, "evaluation length (tokens, log2)", f"test loss (bits per {unit})"
        )
        bottom_title = f"Loss by position in a {n}-token window: {what}"
        label_axes(bottom, bottom_title, "position in the window (log2)", f"loss (bits per {unit})")
        top.legend(fontsize=7, loc="best", ncol=2 if len(shown) > 8 else 1)
    intervals = any(np.isfinite(x.get("ci", [])).any() for x in data["lines"])
    add_caption(fig, caption + (" " + CI_CAPTION if intervals else ""))
    return fig


#: Line styles of the length figure's small multiples, by variant name (the same name, the same
#: style in every panel, so one legend serves them all); the model as trained is black.
_AS_TRAINED: dict[str, Any] = {"color": "black", "linestyle": "-", "marker": "o"}


def _variant_name(line: dict[str, Any]) -> str:
    """``"rope + PI"`` -> ``"PI"``; the model as trained -> ``"as trained"``."""
    if line["variant"] == "base":
        return "as trained"
    return str(line["label"]).split(" + ", 1)[-1]


def variant_groups(data: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """:func:`lab_data`'s lines of each encoding that has inference-time variants: its model as
    trained first, then its variants (one small multiple each in :func:`draw_length`)."""
    with_variants = {x["encoding"] for x in data["lines"] if x["variant"] != "base"}
    order = list(dict.fromkeys(x["encoding"] for x in data["lines"]))
    return [
        sorted(
            (x for x in data["lines"] if x["encoding"] == e), key=lambda x: x["variant"] != "base"
        )
        for e in order
        if e in with_variants
    ]


def _variant_styles(groups: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Style by variant name: as trained black and solid, each rescaling its own colour, dash
    and marker."""
    import matplotlib

    tab10 = matplotlib.colormaps["tab10"]
    names = list(
        dict.fromkeys(_variant_name(x) for g in groups for x in g if x["variant"] != "base")
    )
    styles: dict[str, dict[str, Any]] = {"as trained": _AS_TRAINED}
    for k, name in enumerate(names):
        styles[name] = {"color": tab10(k % 10), "linestyle": _DASHES[k % len(_DASHES)],
                        "marker": _MARKERS[(k + 1) % len(_MARKERS)]}  # fmt: skip
    return styles


def draw_length(data: dict[str, Any], caption: str = LENGTH_CAPTION, ncols: int = 3) -> Figure:
    """The training-for-length figure (``posenc plot length``), legible at a page's width.

    Top: every encoding as trained, loss against eval length (left) and by position in the
    longest window (right), one legend beside them. Below: one small panel per encoding that has
    inference-time variants (RoPE rescalings), its model as trained in black and each rescaling
    in the colour it has in every panel; shared y axis, one legend. No panel holds more lines
    than one encoding's variants, and no legend sits on a panel."""
    groups = variant_groups(data)
    rows = -(-len(groups) // ncols)
    fig = blank_figure(10.0, 5.0 + 2.7 * rows)
    top, bottom = np.asarray(fig.subfigures(2, 1, height_ratios=[5.0, 2.7 * max(rows, 1)]))
    _draw_as_trained(top, data)
    if groups:
        _draw_variant_panels(bottom, data, groups, rows, ncols)
    intervals = any(np.isfinite(x.get("ci", [])).any() for x in data["lines"])
    text = caption + (" " + LENGTH_VARIANTS_CAPTION if groups else "")
    add_caption(fig, text + (" " + CI_CAPTION.replace(" (top)", "") if intervals else ""))
    return fig


def _draw_as_trained(sub: Any, data: dict[str, Any]) -> None:
    """The top row of :func:`draw_length`: the models as trained, legend beside the panels."""
    styles, _ = lab_styles(data["lines"])
    L, unit, lengths = data["train_len"], data["unit"], data["lengths"]
    shown = [x for x in data["lines"] if x["variant"] == "base"]
    left, right = sub.subplots(1, 2)
    _panel(left, [(lengths, x["bits"], x["label"]) for x in shown], styles, L,
           [x.get("ci") for x in shown])  # fmt: skip
    left.set_xticks(lengths, [str(v) for v in lengths])
    left.minorticks_off()
    label_axes(left, f"As trained (L={L})", "evaluation length (tokens, log2)",
               f"test loss (bits/{unit})")  # fmt: skip
    labels = {x["label"] for x in shown}
    curves = [c for c in data["curves"]["lines"] if c["label"] in labels]
    _panel(right, [(c["pos"], c["bits"], c["label"]) for c in curves], styles, L)
    label_axes(right, f"Loss by position, {data['curves']['length']}-token window",
               "position in the window (log2)", f"loss (bits/{unit})")  # fmt: skip
    handles, names = left.get_legend_handles_labels()
    sub.legend(handles, names, loc="outside lower center", fontsize=8.5, ncol=3)


def _draw_variant_panels(
    sub: Any, data: dict[str, Any], groups: list[list[dict[str, Any]]], rows: int, ncols: int
) -> None:
    """The small multiples of :func:`draw_length`: one encoding and its variants each."""
    styles = _variant_styles(groups)
    L, unit, lengths = data["train_len"], data["unit"], data["lengths"]
    axes = np.asarray(sub.subplots(rows, ncols, sharey=True, squeeze=False), dtype=object)
    handles: dict[str, Any] = {}
    for k, ax in enumerate(axes.flat):
        if k >= len(groups):
            ax.set_axis_off()
            continue
        group = groups[k]
        by_name = {_variant_name(x): styles[_variant_name(x)] for x in group}
        bands: list[Any] = [x.get("ci") for x in group]
        _panel(ax, [(lengths, x["bits"], _variant_name(x)) for x in group], by_name, L, bands)
        ax.set_xticks(lengths, [str(v) for v in lengths])
        ax.minorticks_off()
        ax.set_title(group[0]["encoding"], fontsize=9.5)
        if k % ncols == 0:
            ax.set_ylabel(f"test loss (bits/{unit})")
        if k + ncols >= len(groups):
            ax.set_xlabel("eval length (tokens)")
        for h, name in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(name, h)
    sub.suptitle("Inference-time rescalings of each encoding, without retraining", fontsize=10)
    sub.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8.5,
               title="variant")  # fmt: skip
