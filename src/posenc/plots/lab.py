"""The lab's extrapolation plots, drawn from its results store (``<out>/results.jsonl``).

Left: test loss against evaluation length, one line per encoding (inference-time variants such
as RoPE rescalings dashed), the training length marked: "train short, test long" (the ALiBi
paper's figure 1). Right: loss by position inside the longest evaluation window, which shows
*where* an encoding breaks: a curve that rises right after the training length has not
extrapolated.

Rows are read with :func:`posenc.lab.report.load_rows` (by default the group of the newest row),
the lab's own reader; :func:`lab_data` takes ``rows`` directly as well.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .common import add_caption, label_axes, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_LAB_OUT = Path("runs/lab")

CAPTION = (
    "Look at: lines that stay flat past the dotted training length extrapolate; "
    "a curve that climbs after it (right) shows where an encoding breaks."
)


def load_lab_rows(
    out: str | Path = DEFAULT_LAB_OUT, group: str | None = None
) -> list[dict[str, Any]]:
    """Result rows of one group from the lab's store (empty list when there is no store)."""
    from ..lab.report import load_rows
    from ..lab.store import RESULTS_FILE

    if not (Path(out) / RESULTS_FILE).exists():
        return []
    return load_rows(out, group)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def lab_data(
    out: str | Path = DEFAULT_LAB_OUT,
    group: str | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Mean test loss per (encoding, variant) and eval length, and the loss-by-position curves.

    Returns ``lengths [N]`` (sorted eval lengths), ``train_len``, ``unit``, ``group``,
    ``lines``: a list of ``{"label", "encoding", "variant", "bits": [N]}`` (mean over seeds, NaN
    where a length was not applicable), and ``curves``: ``{"length", "lines": [{"label",
    "variant", "pos": [P], "bits": [P]}]}`` at the longest length (mean over seeds).
    """
    if rows is None:
        rows = load_lab_rows(out, group)
    if not rows:
        raise FileNotFoundError(
            f"no lab results in {Path(out) / 'results.jsonl'}; run `posenc lab` first "
            "(or pass --results to the folder of a lab run)"
        )
    lengths = sorted({int(n) for r in rows for n in r["eval"]["lengths"]})
    longest = str(lengths[-1])
    bits: dict[tuple[str, str], dict[int, list[float]]] = {}
    labels: dict[tuple[str, str], str] = {}
    curves: dict[tuple[str, str], list[dict[str, list[float]]]] = {}
    for r in rows:
        for vname, v in r["eval"]["variants"].items():
            key = (r["encoding"], vname)
            labels.setdefault(
                key, r["encoding"] if vname == "base" else f"{r['encoding']} + {v['label']}"
            )
            per_len = bits.setdefault(key, {})
            for n, res in v["results"].items():
                if res.get("bits") is not None and math.isfinite(res["bits"]):
                    per_len.setdefault(int(n), []).append(float(res["bits"]))
            res = v["results"].get(longest)
            # Variants identical to the base model at this length add nothing to the curves.
            if (
                res
                and res.get("curve")
                and res.get("bits") is not None
                and "same as base" not in (res.get("note") or "")
            ):
                curves.setdefault(key, []).append(res["curve"])
    lines = [
        {
            "label": labels[key],
            "encoding": key[0],
            "variant": key[1],
            "bits": np.array([_mean(per_len.get(n, [])) for n in lengths]),
        }
        for key, per_len in bits.items()
    ]
    curve_lines = []
    for key, group_curves in curves.items():
        pos = group_curves[0]["pos"]
        # Seeds of one cell share the binning (same length, same curve_points), so bins align.
        mean = [statistics.fmean(c["bits"][i] for c in group_curves) for i in range(len(pos))]
        curve_lines.append(
            {
                "label": labels[key],
                "variant": key[1],
                "pos": np.asarray(pos),
                "bits": np.asarray(mean),
            }
        )
    return {
        "lengths": np.asarray(lengths),
        "train_len": int(rows[0]["train_len"]),
        "unit": rows[0]["eval"].get("unit", "byte"),
        "group": rows[0].get("group", ""),
        "lines": lines,
        "curves": {"length": int(longest), "lines": curve_lines},
    }


def draw_lab(data: dict[str, Any]) -> Figure:
    """Two panels: loss vs eval length (log2 x); loss by position at the longest length."""
    import matplotlib

    fig, (ax1, ax2) = new_figure(1, 2, width=13, height=5.2)
    L, unit = data["train_len"], data["unit"]
    # One colour per encoding (tab20: the default grid has 13), one line style per variant.
    cmap = matplotlib.colormaps["tab20"]
    palette = [cmap(k) for k in range(20)]
    encodings = list(dict.fromkeys(line["encoding"] for line in data["lines"]))
    colors = {
        e: palette[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20] for k, e in enumerate(encodings)
    }
    variant_styles = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]
    variants = list(dict.fromkeys(line["variant"] for line in data["lines"]))
    variants = ["base", *[v for v in variants if v != "base"]]
    styles = {v: variant_styles[k % len(variant_styles)] for k, v in enumerate(variants)}
    for line in data["lines"]:
        ok = np.isfinite(line["bits"])
        if not ok.any():
            continue
        ax1.plot(
            data["lengths"][ok], line["bits"][ok], linestyle=styles[line["variant"]], marker="o",
            ms=3, lw=1.3, color=colors[line["encoding"]], label=line["label"],
        )  # fmt: skip
    ax1.axvline(L, color="0.4", ls=":", lw=1)
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(data["lengths"], [str(n) for n in data["lengths"]])
    label_axes(
        ax1,
        f"Train short, test long (trained at L={L})",
        "evaluation length (tokens, log2)",
        f"test loss (bits per {unit})",
    )
    ax1.grid(True, alpha=0.3)
    for line in data["curves"]["lines"]:
        enc = line["label"].split(" + ")[0]
        ax2.plot(
            line["pos"], line["bits"], linestyle=styles.get(line["variant"], "-"), lw=1.0,
            color=colors.get(enc), label=line["label"],
        )  # fmt: skip
    ax2.axvline(L, color="0.4", ls=":", lw=1)
    label_axes(
        ax2,
        f"Loss by position in a {data['curves']['length']}-token window",
        "position in the window",
        f"loss (bits per {unit})",
    )
    ax2.grid(True, alpha=0.3)
    handles, names = ax1.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside right upper", fontsize=7)
    add_caption(fig, CAPTION)
    return fig
