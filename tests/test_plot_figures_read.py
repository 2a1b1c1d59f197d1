"""The lab's question figures read at a README's width: a labelled tick at every measured
fine-tune step, legends beside the data (never over it), few lines per panel, captions whose
claims are the drawn numbers', the passkey heatmaps of every RoPE rescaling reachable from the
command line and the reports, and one line naming the extra when matplotlib is missing.

The figures are checked through their matplotlib artists after a draw (tick labels, window
extents of legends and axes, lines per axes), on data built here."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from typer.testing import CliRunner

from posenc.cli import app
from posenc.plots.extend import draw_extend, extend_caption, extend_findings
from posenc.plots.lab import draw_length, variant_groups
from posenc.plots.passkey import draw_passkey, passkey_data

STEPS = [0, 1, 2, 5, 10]
#: label: (zero-shot by length, fine-tuned by length, loss at 4L after each of STEPS)
EXTEND = {
    "rope": ([2.89, 2.99, 3.32, 3.73], [2.93, 2.93, 2.98, 3.16], [3.32, 3.10, 3.05, 3.00, 2.98]),
    "rope + PI": ([3.86, 3.89, 3.91, 3.97], [3.39, 3.39, 3.39, 3.43], [3.91, 3.7, 3.6, 3.45, 3.39]),
    "rope + NTK": ([2.91, 2.92, 3.10, 3.48], [2.91, 2.90, 2.91, 3.09], [3.10, 3.0, 2.95, 2.92, 2.91]),
    "rope + YaRN": ([2.99, 3.00, 3.01, 3.25], [2.93, 2.91, 2.91, 3.07], [3.01, 2.95, 2.93, 2.92, 2.90]),
    "alibi": ([3.11, 3.11, 3.11, 3.11], [3.10, 3.09, 3.09, 3.09], [3.11, 3.10, 3.09, 3.09, 3.09]),
    "t5": ([3.32, 3.39, 3.49, 3.60], [3.33, 3.38, 3.46, 3.54], [3.49, 3.48, 3.47, 3.46, 3.46]),
}  # fmt: skip


def extend_data(
    curves: dict[str, tuple[list[float], list[float], list[float]]] = EXTEND,
    keys: bool = False,
    reference: float = 3.206,
) -> dict[str, Any]:
    """What :func:`posenc.lab.reports.extend_report.extend_data` returns, for these curves."""
    methods = [
        {"label": label, "steps": STEPS, "curve": curve, "zero_shot": zero, "tuned": tuned,
         "key_steps": STEPS if keys else [],
         "key_curve": [0.78 + 0.01 * k, 0.79, 0.81, 0.84, 0.88 - 0.01 * k] if keys else []}
        for k, (label, (zero, tuned, curve)) in enumerate(curves.items())
    ]  # fmt: skip
    return {
        "lengths": [64, 128, 256, 512], "train_len": 64, "target_len": 256, "unit": "byte",
        "tolerance": 0.02, "methods": methods,
        "reference": {"label": "rope @256 from scratch", "target_bits": reference,
                      "bits": [3.26, 3.22, reference, 3.29]},
    }  # fmt: skip


def drawn(fig: Any) -> Any:
    """``fig`` drawn on the Agg canvas (layout done, extents final); returns its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


def all_legends(fig: Any) -> list[Any]:
    """Every legend of ``fig``: its own, its subfigures', its axes'."""
    out = list(fig.legends)
    for sub in fig.subfigs:
        out += all_legends(sub)
    return out + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def overlap(a: Any, b: Any) -> float:
    """Area in pixels² shared by two window extents."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)


def assert_legends_outside_the_data(fig: Any) -> None:
    renderer = drawn(fig)
    legends = all_legends(fig)
    assert legends, "the figure has no legend"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            if ax.axison:
                shared = overlap(box, ax.get_window_extent(renderer))
                assert shared < 1.0, f"legend over {ax.get_title()!r} ({shared:.0f} px²)"


def data_lines(ax: Any) -> list[Any]:
    """The axes' lines that draw data (not the dotted L marker, not a reference rule)."""
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def tick_texts(ax: Any) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


# --------------------------------------------------------------------------------------------
# extend.png


@pytest.mark.parametrize("keys", [False, True])
def test_extend_labels_every_measured_step_and_keeps_its_legend_off_the_data(keys: bool) -> None:
    data = extend_data(keys=keys)
    data["methods"][0]["steps"] = [0, 1, 2, 5, 10, 20, 50]  # one line measured further
    data["methods"][0]["curve"] = [*data["methods"][0]["curve"], 2.9, 2.87]
    fig = draw_extend(data)
    assert_legends_outside_the_data(fig)
    steps_axes = [fig.axes[0]] + ([fig.axes[2]] if keys else [])
    for ax in steps_axes:
        assert tick_texts(ax) == ["0", "1", "2", "5", "10", "20", "50"]
        assert not ax.xaxis.get_minorticklocs().size  # no unlabelled ticks between them
    assert tick_texts(fig.axes[1]) == ["64", "128", "256", "512"]
    assert fig.get_figwidth() <= 10.5  # at ~800 px, 10 pt text stays ~10 px


def claims(caption: str) -> dict[str, Any]:
    """The caption's claims about the data, read back from its text."""
    band = re.search(r"at or under its top (.*?)\. Zero-shot", caption)
    in_band: dict[str, int | None] = {}
    for part in band.group(1).split("; ") if band else []:
        step = re.match(r"from step (\d+): (.*)", part)
        never = re.match(r"not within \d+ steps: (.*)", part)
        names, at = (step.group(2), int(step.group(1))) if step else (never.group(1), None)
        in_band.update(dict.fromkeys(names.split(", "), at))
    zero = re.search(r"worst (.+?) \(([\d.]+) bits\), best (.+?) \(([\d.]+)\)", caption)
    final = re.search(r"After (\d+) steps the best is (.+?) \(([\d.]+)\); the largest "
                      r"recovery is (.+?)'s \(([\d.]+) bits\)", caption)  # fmt: skip
    plain = re.search(r"Here plain (\S+) goes from ([\d.]+) to ([\d.]+) bits in (\d+) steps, "
                      r"(at or under the band's top from step (\d+)|never under)", caption)  # fmt: skip
    assert zero and final and plain, caption
    return {"in_band": in_band, "zero": zero.groups(), "final": final.groups(),
            "plain": plain.groups()}  # fmt: skip


@pytest.mark.parametrize("slow_rope", [False, True])
def test_extend_caption_claims_are_the_datas(slow_rope: bool) -> None:
    """Each claim the caption makes, read back from its text, holds in the data it was made
    from; with a plain RoPE that never reaches the band the caption says so (it must not claim
    what the curve does not show, either way)."""
    curves = dict(EXTEND)
    if slow_rope:
        zero, tuned, _ = curves["rope"]
        curves["rope"] = (zero, tuned, [3.32, 3.31, 3.30, 3.29, 3.28])
    data = extend_data(curves)
    text = extend_caption(data)
    got = claims(text)
    band = data["reference"]["target_bits"] + data["tolerance"]
    by_label = {m["label"]: m for m in data["methods"]}
    assert set(got["in_band"]) == set(by_label)
    for label, at in got["in_band"].items():
        curve = by_label[label]["curve"]
        first = next((s for s, b in zip(STEPS, curve, strict=True) if b <= band), None)
        assert at == first, (label, at, first)
    zero_shot = {label: m["curve"][0] for label, m in by_label.items()}
    worst, worst_v, best, best_v = got["zero"]
    assert worst == max(zero_shot, key=zero_shot.get) and best == min(zero_shot, key=zero_shot.get)
    assert float(worst_v) == pytest.approx(zero_shot[worst], abs=0.005)
    assert float(best_v) == pytest.approx(zero_shot[best], abs=0.005)
    last, top, top_v, most, most_v = got["final"]
    finals = {label: m["curve"][-1] for label, m in by_label.items()}
    drops = {label: zero_shot[label] - finals[label] for label in by_label}
    assert int(last) == STEPS[-1] and top == min(finals, key=finals.get)
    assert float(top_v) == pytest.approx(finals[top], abs=0.005)
    assert most == max(drops, key=drops.get)
    assert float(most_v) == pytest.approx(drops[most], abs=0.005)
    name, start, end, steps, state, step = got["plain"]
    assert name == "rope"  # the one model whose label others extend ("rope + PI")
    assert (float(start), float(end)) == pytest.approx(
        (zero_shot["rope"], finals["rope"]), abs=0.005
    )
    assert int(steps) == STEPS[-1]
    if slow_rope:
        assert state == "never under" and got["in_band"]["rope"] is None
    else:
        assert int(step) == got["in_band"]["rope"] == 1
    assert "recovers slowly" not in text  # the old fixed sentence, true or not


def test_extend_findings_without_a_reference_or_step_zero() -> None:
    data = extend_data()
    data["reference"]["target_bits"] = math.nan
    for m in data["methods"]:
        m["steps"], m["curve"] = m["steps"][1:], m["curve"][1:]
    found = extend_findings(data)
    assert found["band"] is None and found["worst_zero_shot"] is None
    assert all(f["in_band_at"] is None and f["recovered"] is None for f in found["methods"])
    text = extend_caption(data)
    assert "Grey band" not in text and "Zero-shot at" not in text and "Here plain" not in text


def test_extend_caption_of_the_passkey_panel_names_its_numbers() -> None:
    text = extend_caption(extend_data(keys=True))
    assert "Top right" in text and "plain rope from 0.78 (step 0) to 0.88 (step 10)" in text
    assert "all methods 0.78-0.83 first, 0.83-0.88 last" in text


# --------------------------------------------------------------------------------------------
# length.png

ENCODINGS = [
    "rope", "rope:positions=randomized", "rope:positions=pose", "alibi",
    "alibi:positions=randomized", "alibi:positions=pose", "cope", "rope:nope_every=2",
    "rope:nope_every=2:temperature=llama4",
]  # fmt: skip
RESCALINGS = ["PI", "NTK", "dyn-NTK", "YaRN"]


def length_data() -> dict[str, Any]:
    """:func:`posenc.plots.lab.lab_data`'s shape for the length grid: 9 encodings, 5 of them
    with 4 RoPE rescalings: 29 lines, as in the README's table."""
    lines, curves = [], []
    for k, enc in enumerate(ENCODINGS):
        base = 2.8 + 0.05 * k + np.array([0.0, 0.1, 0.3, 0.7])
        lines.append({"label": enc, "encoding": enc, "variant": "base", "bits": base,
                      "ci": np.full(4, 0.2)})  # fmt: skip
        pos = np.geomspace(1, 512, 12)
        curves.append({"label": enc, "encoding": enc, "variant": "base", "pos": pos,
                       "bits": 2.8 + 0.1 * k + 0.1 * (pos > 64)})  # fmt: skip
        if enc.startswith("rope"):
            for j, name in enumerate(RESCALINGS):
                lines.append({"label": f"{enc} + {name}", "encoding": enc, "variant": name.lower(),
                              "bits": base - 0.05 * j, "ci": np.full(4, 0.2)})  # fmt: skip
    return {"lengths": np.array([64, 128, 256, 512]), "train_len": 64, "unit": "byte",
            "group": "g", "lines": lines, "curves": {"length": 512, "lines": curves}}  # fmt: skip


def test_length_figure_is_small_multiples_with_legends_beside_them() -> None:
    data = length_data()
    assert len(data["lines"]) == 29
    fig = draw_length(data)
    assert_legends_outside_the_data(fig)
    groups = variant_groups(data)
    assert [g[0]["encoding"] for g in groups] == [e for e in ENCODINGS if e.startswith("rope")]
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 2 + len(groups)  # as trained (2), then one per encoding
    for ax in panels:
        assert 1 <= len(data_lines(ax)) <= len(ENCODINGS), ax.get_title()
    for ax, group in zip(panels[2:], groups, strict=True):
        assert ax.get_title() == group[0]["encoding"]
        assert [ln.get_label() for ln in data_lines(ax)] == ["as trained", *RESCALINGS]
        # the same rescaling has the same colour in every panel: one legend serves them all
        assert data_lines(ax)[1].get_color() == data_lines(panels[2])[1].get_color()
    for ax in [panels[0], *panels[2:]]:
        assert tick_texts(ax) == ["64", "128", "256", "512"]
    assert fig.get_figwidth() <= 10.5


# --------------------------------------------------------------------------------------------
# passkey.png and its variants, reachable from the command line and the reports

PASSKEY_LAB = [
    "lab", "-e", "rope,learned", "--task", "passkey", "-L", "16", "--eval-lens", "1x,2x",
    "--steps", "2", "--batch-size", "2", "--dim", "16", "--layers", "1", "--heads", "2",
    "--eval-tokens", "32", "--rope-scalings", "linear,yarn", "--threads", "1", "-j", "1", "-q",
]  # fmt: skip


@pytest.fixture(scope="module")
def passkey_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny passkey grid: RoPE with two rescalings, a learned table with its interpolation."""
    out = tmp_path_factory.mktemp("pk") / "lab"
    res = CliRunner().invoke(app, [*PASSKEY_LAB, "--no-plots", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def image_axes(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.get_images()]


def test_passkey_variants_from_the_command_line(passkey_store: Path, tmp_path: Path) -> None:
    from posenc.plots.figures import make_figure

    for flag, name in ((["--variants"], "variants.png"), ([], "passkey.png")):
        out = tmp_path / name
        args = ["plot", "passkey", "--results", str(passkey_store), "--out", str(out), *flag]
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        assert out.stat().st_size > 1000 and f"wrote {out}" in res.output
    fig = make_figure("passkey", results=str(passkey_store), variants=True)
    titles = sorted(ax.get_title() for ax in image_axes(fig))
    assert titles == ["learned", "learned + interp", "rope", "rope + PI", "rope + YaRN"]
    assert len(image_axes(make_figure("passkey", results=str(passkey_store)))) == 2
    drawn(fig)
    numbers = [t for ax in image_axes(fig) for t in ax.texts]
    assert numbers and min(t.get_fontsize() for t in numbers) >= 8


def test_passkey_variants_in_the_lab_report_and_the_page(
    passkey_store: Path, tmp_path: Path
) -> None:
    res = CliRunner().invoke(app, ["lab", "report", "--out", str(passkey_store)])
    assert res.exit_code == 0, res.output
    report = passkey_store / "report"
    assert (report / "passkey.png").exists() and (report / "passkey_variants.png").exists()
    assert "passkey_variants.png" in res.output
    from posenc.plots.report import build_report

    page = build_report(passkey_store, kinds=["passkey"])
    assert 'id="passkey-variants"' in page and page.count("data:image/png") == 2


def test_passkey_data_panels_cover_every_rescaling(passkey_store: Path) -> None:
    from posenc.plots.figures import lab_results

    data = passkey_data(lab_results("passkey", passkey_store))
    assert {p["label"] for p in data["panels"]} == {
        "rope", "rope + PI", "rope + YaRN", "learned", "learned + interp"
    }  # fmt: skip
    fig = draw_passkey(data)
    drawn(fig)
    assert fig.get_figwidth() <= 10.5


# --------------------------------------------------------------------------------------------
# Without matplotlib: one line naming the extra

WITHOUT_MATPLOTLIB = """
import json, sys
sys.modules["matplotlib"] = None  # as without the plots extra: `import matplotlib` fails
from typer.testing import CliRunner
from posenc.cli import app
out = {}
for name, args in json.loads(sys.argv[1]).items():
    res = CliRunner().invoke(app, args)
    out[name] = [res.exit_code, res.stdout, res.stderr]
print(json.dumps(out))
"""


def test_without_matplotlib_each_command_says_which_extra(
    passkey_store: Path, tmp_path: Path
) -> None:
    store = str(passkey_store)
    commands = {
        "lab": [*PASSKEY_LAB, "--out", store],  # finished cells: the report only
        "lab report": ["lab", "report", "--out", store],
        "plot": ["plot", "passkey", "--results", store, "--out", str(tmp_path / "p.png")],
        "report": ["report", "--results", store, "--out", str(tmp_path / "r.html")],
    }
    env = {**os.environ, "COLUMNS": "200"}
    res = subprocess.run(
        [sys.executable, "-c", WITHOUT_MATPLOTLIB, json.dumps(commands)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    hint = "pip install -e '.[plots]' in the posenc clone"
    for name in ("lab", "lab report"):
        code, _, err = got[name]
        notes = [line for line in err.splitlines() if "not drawn" in line]
        assert code == 0 and len(notes) == 1 and hint in notes[0], (name, err)
    code, _, err = got["plot"]
    assert code != 0 and len(err.strip().splitlines()) == 1 and hint in err
    code, out, _ = got["report"]
    assert code == 0 and f"no figures drawn: posenc plots need matplotlib: {hint}" in out
    page = (tmp_path / "r.html").read_text()
    assert "posenc.functional.rotary" not in page  # no figure blames another module
    assert "Not drawn: posenc plots need matplotlib" in page


def test_plots_ready_says_what_is_not_drawn_and_which_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check ``posenc lab report`` and ``posenc lab extend`` make before drawing."""
    from posenc.plots import common

    assert common.plots_ready("extend.png") and capsys.readouterr().err == ""

    def missing() -> None:
        raise ImportError("posenc plots need matplotlib: pip install -e '.[plots]'")

    monkeypatch.setattr(common, "require_matplotlib", missing)
    assert not common.plots_ready("extend.png")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "extend.png not drawn" in err and ".[plots]" in err
