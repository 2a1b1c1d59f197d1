"""The explorer page: one self-contained HTML file (plotly.js, the data and a small script inline)
that draws :func:`~posenc.explore.data.explorer_data`'s frames. Opens from a file, offline.

The data block (``<script type="application/json" id="posenc-explore-data">``) is
``explorer_data``'s result with each numpy array written as ``{"dtype": "f4", "shape": [...],
"bdata": <base64 of the little-endian float32 bytes>}`` (Plotly's typed-array form) and a few
presentation keys added to ``meta`` (initial state, styles, titles). The view templates (trace
styles and layouts, no data) are Plotly figures built here; ``app.js`` fills them in.
"""

from __future__ import annotations

import base64
import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from .data import explorer_data

INITIAL = {"enc": "rope", "d": "64", "scaling": "yarn", "factor": "4", "p": 40}
COLOURS = ("#1f77b4", "#d62728", "#2ca02c")
STYLES = {
    "p": {"color": "#111111", "width": 1.5},
    "train": {"color": "#e07b00", "width": 1.5, "dash": "dash"},
    "eval": {"color": "#7b3fa0", "width": 1.5, "dash": "dot"},
}
TEXT = {
    "sinusoidal": {
        "matrix_title": "Encoding table: sinusoidal_table(p, d)",
        "matrix_x": "dimension (sin, cos of pair i at 2i, 2i+1)",
        "similarity_title": "Similarity of p to every position: PE(p) · PE(n)",
        "similarity_y": "PE(p) · PE(n)",
        "rotation_title": "Pairs (cos, sin) as p moves",
    },
    "rope": {
        "matrix_title": "RoPE cos table: attention_factor · cos(p θᵢ)",
        "matrix_x": "rotated pair i (θᵢ falls with i)",
        "similarity_title": "Similarity of p to every position: ⟨R(p)q, R(n)q⟩",
        "similarity_y": "⟨R(p)q, R(n)q⟩, q = 1 in each pair",
        "rotation_title": "One pair of R(p)q turning as p moves",
    },
}
#: What to look at in each view, per encoding: the page shows the chosen encoding's (app.js
#: swaps them with the encoding control), so a sinusoidal view is never described as RoPE's.
CAPTIONS: dict[str, dict[str, str]] = {
    "sinusoidal": {
        "matrix": "Look at: each row is the vector added to the token embedding at position p; "
        "sin and cos of pair i sit at columns 2i, 2i+1. The left pairs turn fast, the right ones "
        "so slowly that they barely change below the train length (dashed). An absolute table "
        "has no scaling: every row past the train length is one the model never saw.",
        "similarity": "Look at: the peak at n = p and how fast it falls off. PE(p) · PE(n) is a "
        "sum of cos((p − n)ωᵢ), so it depends only on n − p; the model adds PE to the content "
        "vectors, so its logits mix this with content terms.",
        "rotation": "Look at: the (cos, sin) columns of three pairs of the table, drawn on "
        "circles one inside the other: the fastest (outer) turns one radian per position, the "
        "slowest (inner) only a short arc below the train length. These are the table's values, "
        "added to the embedding; no q or k is rotated.",
        "wavelengths": "Look at: the wavelengths 2π/ωᵢ of the table's pairs; those above the "
        "train length (dashed) never finished one turn in training. Nothing rescales them at "
        "the eval length (dotted): the scaling control applies to the rotary encoding only.",
    },
    "rope": {
        "matrix": "Look at: each column is one frequency; the left columns turn fast, the right "
        "ones so slowly that they barely change below the train length (dashed). Scaling "
        "stretches the slow columns so the eval length looks like the train length to them.",
        "similarity": "Look at: the peak at n = p and how fast it falls off; for RoPE the curve "
        "depends only on n − p. The grey curve is plain RoPE, to compare a scaling with.",
        "rotation": "Look at: the fastest pair (outer circle) turns about one radian per "
        "position; the slowest (inner) moves along a short arc. Scaling slows the slow pairs, "
        "so their arc at the eval length stays within the angles seen in training.",
        "wavelengths": "Look at: the pairs above the train length (dashed) never finished one "
        "turn in training. Each scaling type moves a different set of them (grey: plain RoPE) "
        "toward the eval length (dotted).",
    },
}
VIEWS = ("matrix", "similarity", "rotation", "wavelengths")

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "Noto Sans", sans-serif; color: #1d1d1f;
       max-width: 1400px; margin: 1.2rem auto; padding: 0 1rem; line-height: 1.45; }
h1 { margin: 0 0 0.2rem; font-size: 1.6rem; }
.meta { color: #555; margin: 0 0 0.8rem; }
.controls { display: flex; flex-wrap: wrap; gap: 0.6rem 1.4rem; align-items: center;
            background: #f5f6f8; border: 1px solid #dde; border-radius: 6px; padding: 0.7rem 1rem;
            position: sticky; top: 0; z-index: 10; }
.controls label { display: flex; gap: 0.4rem; align-items: center; font-weight: 600; }
.controls select { font-size: 0.95rem; padding: 0.1rem 0.3rem; }
.controls input[type=range] { width: 16rem; }
.controls .idle { opacity: 0.45; }
#p-value { display: inline-block; min-width: 2.2rem; font-variant-numeric: tabular-nums; }
.call { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.85rem;
        color: #333; margin: 0.5rem 0 0.2rem; word-break: break-all; }
.views { display: grid; grid-template-columns: repeat(auto-fit, minmax(560px, 1fr));
         gap: 1rem; margin-top: 0.6rem; }
figure { margin: 0; border: 1px solid #e2e2e2; border-radius: 6px; padding: 0.3rem; }
.view { height: 440px; }
figcaption { font-size: 0.9rem; color: #333; padding: 0.2rem 0.5rem 0.4rem; }
"""


def _array(a: np.ndarray) -> dict[str, Any]:
    data = np.ascontiguousarray(a, dtype="<f4")
    return {
        "dtype": "f4",
        "shape": list(data.shape),
        "bdata": base64.b64encode(data.tobytes()).decode("ascii"),
    }


def encode_arrays(obj: Any) -> Any:
    """``obj`` with every numpy array as Plotly's typed-array form (float32, base64)."""
    if isinstance(obj, np.ndarray):
        return _array(obj)
    if isinstance(obj, dict):
        return {k: encode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_arrays(v) for v in obj]
    return obj


def decode_arrays(obj: Any) -> Any:
    """The inverse of :func:`encode_arrays` (float32 numpy arrays), for reading a page back."""
    if isinstance(obj, dict):
        if set(obj) == {"dtype", "shape", "bdata"}:
            flat = np.frombuffer(base64.b64decode(obj["bdata"]), dtype="<f4")
            return flat.reshape(obj["shape"])
        return {k: decode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_arrays(v) for v in obj]
    return obj


def view_templates(train_len: int) -> dict[str, Any]:
    """The four views as Plotly figures with styles and layouts but no data (plain JSON)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    figures = {
        "matrix": _matrix_view(go),
        "similarity": _similarity_view(go),
        "rotation": _rotation_view(go),
        "wavelengths": _wavelength_view(go),
    }
    return {name: json.loads(pio.to_json(fig)) for name, fig in figures.items()}


def _layout(title: str, x: str, y: str, **more: Any) -> dict[str, Any]:
    return {
        "template": "plotly_white",
        "title": {"text": title, "x": 0.02, "font": {"size": 15}},
        "xaxis": {"title": {"text": x}},
        "yaxis": {"title": {"text": y}},
        "margin": {"l": 64, "r": 24, "t": 54, "b": 54},
        "legend": {"orientation": "h", "y": -0.18, "x": 0},
        **more,
    }


def _matrix_view(go: Any) -> Any:
    return go.Figure(
        go.Heatmap(
            colorscale="RdBu", zmid=0, colorbar={"title": {"text": "value"}},
            hovertemplate="p %{y}, column %{x}: %{z:.4f}<extra></extra>",
        ),
        _layout(
            "", "", "position p (every other row)",
            yaxis={"title": {"text": "position p (rows: every other position)"},
                   "autorange": "reversed"},
            margin={"l": 64, "r": 24, "t": 54, "b": 54},
        ),
    )  # fmt: skip


def _similarity_view(go: Any) -> Any:
    return go.Figure(
        [
            go.Scatter(mode="lines", line={"color": COLOURS[0], "width": 2},
                       hovertemplate="n %{x}: %{y:.4g}<extra></extra>"),
            go.Scatter(
                mode="lines", name="plain RoPE", line={"color": "#9a9a9a", "width": 1.5},
                opacity=0.8, hovertemplate="n %{x}: %{y:.4g}<extra></extra>",
            ),
        ],
        _layout("", "position n", ""),
    )  # fmt: skip


def _rotation_view(go: Any) -> Any:
    rotation_traces = []
    for colour in COLOURS:
        # Per pair: every position (faint dots), positions 0..p (dots), the hand to p.
        rotation_traces += [
            go.Scatter(mode="markers", marker={"color": colour, "size": 3, "opacity": 0.25},
                       showlegend=False, hoverinfo="skip"),
            go.Scatter(mode="markers", marker={"color": colour, "size": 4}, showlegend=False,
                       hovertemplate="(%{x:.3f}, %{y:.3f})<extra></extra>"),
            go.Scatter(mode="lines+markers", line={"color": colour, "width": 2.5},
                       marker={"size": [0, 12], "color": colour},
                       hovertemplate="(%{x:.3f}, %{y:.3f})<extra></extra>"),
        ]  # fmt: skip
    return go.Figure(
        rotation_traces,
        _layout(
            "", "first channel of the pair", "second channel",
            yaxis={"title": {"text": "second channel"}, "scaleanchor": "x", "range": [-1.3, 1.3]},
            xaxis={"title": {"text": "first channel of the pair"}, "range": [-1.3, 1.3],
                   "constrain": "domain"},
        ),
    )  # fmt: skip


def _wavelength_view(go: Any) -> Any:
    return go.Figure(
        [
            go.Scatter(mode="lines+markers", line={"color": COLOURS[0], "width": 2},
                       marker={"size": 5}, hovertemplate="pair %{x}: %{y:.4g}<extra></extra>"),
            go.Scatter(mode="lines", name="plain RoPE", line={"color": "#9a9a9a", "width": 1.5},
                       hovertemplate="pair %{x}: %{y:.4g}<extra></extra>"),
        ],
        _layout(
            "Wavelength 2π/θᵢ of each pair, in positions", "pair i", "wavelength (positions)",
            yaxis={"title": {"text": "wavelength (positions, log scale)"}, "type": "log",
                   "dtick": 1},
        ),
    )  # fmt: skip


def initial_state(meta: dict[str, Any]) -> dict[str, Any]:
    """:data:`INITIAL` where the grid has its values, else the grid's first value of each."""
    choices = {
        "enc": [e["id"] for e in meta["encodings"]],
        "d": [str(d) for d in meta["dims"]],
        "scaling": [s["id"] for s in meta["scalings"]],
        "factor": [str(f) for f in meta["factors"]],
    }
    state: dict[str, Any] = {
        k: v if v in choices[k] else choices[k][0] for k, v in INITIAL.items() if k != "p"
    }
    state["p"] = min(INITIAL["p"], meta["num_positions"] - 1)
    return state


def page_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with what the script needs to present it: the initial state, line styles,
    titles, the positions ``0 .. P-1`` and ``log10`` of the train and eval lengths (where a
    label on the log axis goes), and each encoding's captions of the views."""
    return {
        **meta,
        "initial": initial_state(meta),
        "styles": STYLES,
        "text": TEXT,
        "captions": CAPTIONS,
        "positions": list(range(meta["num_positions"])),
        "log_train_len": math.log10(meta["train_len"]),
        "log_eval_len": {k: math.log10(v) for k, v in meta["eval_len"].items()},
    }


def _json_script(element_id: str, value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def _select(key: str, label: str, options: list[tuple[str, str]], attrs: str = "") -> str:
    opts = "".join(
        f'<option value="{html.escape(v)}">{html.escape(text)}</option>' for v, text in options
    )
    return (
        f"<label {attrs}>{html.escape(label)} "
        f'<select id="control-{key}" {attrs}>{opts}</select></label>'
    )


def explorer_html(data: dict[str, Any] | None = None) -> str:
    """The page for ``data`` (default: :func:`explorer_data`'s default grid), as one string."""
    import plotly.offline

    data = explorer_data() if data is None else data
    meta = data["meta"]
    payload = {"meta": page_meta(meta), "frames": encode_arrays(data["frames"])}
    app = resources.files("posenc.explore").joinpath("app.js").read_text(encoding="utf-8")
    controls = "".join(
        [
            _select("enc", "encoding", [(e["id"], e["label"]) for e in meta["encodings"]]),
            _select("d", "d_model", [(str(d), str(d)) for d in meta["dims"]]),
            _select(
                "scaling", "RoPE scaling", [(s["id"], s["label"]) for s in meta["scalings"]],
                "data-rope-only",
            ),
            _select(
                "factor", "factor (eval length = train length × factor)",
                [(str(f), f"{f}  → {meta['eval_len'][str(f)]}") for f in meta["factors"]],
            ),
            f'<label>position p <input type="range" id="control-p" min="0" '
            f'max="{meta["num_positions"] - 1}" step="1"> <span id="p-value"></span></label>',
        ]
    )  # fmt: skip
    # The initial encoding's captions; app.js sets the chosen encoding's on every draw.
    captions = CAPTIONS[initial_state(meta)["enc"]]
    views = "".join(
        f'<figure><div class="view" id="view-{name}"></div>'
        f'<figcaption id="caption-{name}">{html.escape(captions[name])}</figcaption></figure>'
        for name in VIEWS
    )
    intro = (
        f"Every number on this page was computed by posenc {__version__} "
        f"(posenc.functional: sinusoidal_table, rope_inv_freq with posenc's table of scaling "
        f"types, apply_rotary) for a model trained on {meta['train_len']} positions, "
        f"base {meta['base']:g}, positions 0–{meta['num_positions'] - 1}. The page only picks "
        "among the precomputed arrays. The URL fragment keeps the controls, for sharing."
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>posenc explore</title><style>{_CSS}</style>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        "<h1>posenc explore: positional encodings, interactively</h1>"
        f'<p class="meta">{html.escape(intro)}</p>'
        f'<div class="controls">{controls}</div>'
        '<p class="call">calls: <span id="posenc-explore-call"></span></p>'
        f'<div class="views">{views}</div>'
        f"{_json_script('posenc-explore-data', payload)}"
        f"{_json_script('posenc-explore-views', view_templates(meta['train_len']))}"
        f"<script>{app}</script></body></html>"
    )


def write_explorer(out: Path | str, data: dict[str, Any] | None = None) -> Path:
    """Write :func:`explorer_html` to ``out`` (a ``.html`` path; folders are created)."""
    out = Path(out)
    if out.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"the explorer page must end in .html, got {out.name!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(explorer_html(data), encoding="utf-8")
    return out
