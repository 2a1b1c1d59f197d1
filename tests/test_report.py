"""`posenc report`: a self-contained HTML page, checked as HTML and (where Debian's `chromium`
is installed) loaded in headless Chromium: no console errors, no exceptions, no request that
leaves the file, and every image decoded and not blank."""

from __future__ import annotations

import base64
import html.parser
import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("matplotlib")

from _cdp import Chromium
from posenc.cli import app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BASH = shutil.which("bash")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or BASH is None,
    reason="chromium is not installed (Debian: apt-get install -y chromium)",
)

# Runs in the page: every <img> decoded, drawn to a canvas, and summarized (no pixel data
# leaves the page, only counts). data: images do not taint the canvas, so pixels are readable.
IMAGE_PROBE = """
(async () => {
  const out = [];
  for (const img of Array.from(document.images)) {
    let decoded = true;
    try { await img.decode(); } catch (e) { decoded = false; }
    const r = {src: img.src.slice(0, 40), decoded, w: img.naturalWidth, h: img.naturalHeight,
               shownW: img.getBoundingClientRect().width};
    if (decoded && img.naturalWidth > 0) {
      const c = document.createElement('canvas');
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      const ctx = c.getContext('2d');
      ctx.drawImage(img, 0, 0);
      const d = ctx.getImageData(0, 0, c.width, c.height).data;
      const colours = new Set();
      let dark = 0;
      for (let i = 0; i < d.length; i += 4 * 97) {
        colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
        if (d[i] + d[i + 1] + d[i + 2] < 384) dark++;
      }
      r.colours = colours.size; r.dark = dark;
    }
    out.push(r);
  }
  return JSON.stringify(out);
})()
"""


def load_page(path: Path, profile: Path) -> dict[str, Any]:
    """Open ``path`` in headless Chromium; return its errors, requests and image summaries."""
    assert CHROMIUM is not None
    browser = Chromium(CHROMIUM, profile)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page", "Network"):
            browser.send(f"{domain}.enable", session=session)
        browser.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        browser.wait_for("Page.loadEventFired")
        probe = browser.send(
            "Runtime.evaluate",
            {"expression": IMAGE_PROBE, "awaitPromise": True, "returnByValue": True},
            session=session,
        )
        title = browser.send(
            "Runtime.evaluate",
            {"expression": "document.title", "returnByValue": True},
            session=session,
        )
        shot = browser.send("Page.captureScreenshot", {"format": "png"}, session=session)
    finally:
        browser.close()
    errors = []
    for e in browser.events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            what = (details.get("exception") or {}).get("description", "")
            errors.append(f"exception: {details.get('text')} {what}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
    requests = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    if "exceptionDetails" in probe:
        errors.append(f"probe failed: {probe['exceptionDetails']}")
    return {
        "errors": errors,
        "requests": requests,
        "images": json.loads(probe["result"]["value"]) if "result" in probe else [],
        "title": title["result"]["value"],
        "screenshot": base64.b64decode(shot["data"]),
    }


# --- the report ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A report from a real tiny lab run (so the lab plot and table are in it)."""
    out = tmp_path_factory.mktemp("report")
    results = out / "lab"
    try:
        from posenc.lab.cells.presets import (
            DataConfig,
            EvalConfig,
            LabConfig,
            ModelShape,
            TrainConfig,
        )
        from posenc.lab.grid.experiment import RunOptions, run_grid
    except ImportError:
        pass
    else:
        cfg = LabConfig(
            preset="test",
            encodings=("none", "rope"),
            train_len=16,
            model=ModelShape(dim=32, num_layers=1, num_heads=2),
            train=TrainConfig(steps=2, batch_size=4, warmup_steps=1),
            data=DataConfig(source="task", task="copy"),
            eval=EvalConfig(lengths=("1x", "2x"), tokens=64, batch_tokens=64, rope_scalings=(), curve_points=8),
        )  # fmt: skip
        run_grid(cfg, RunOptions(out=results, quiet=True))
    page = out / "report.html"
    result = CliRunner().invoke(
        app, ["report", "--out", str(page), "--results", str(results), "--attention-steps", "3"]
    )
    assert result.exit_code == 0, result.output
    return page


class _Collector(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_report_is_self_contained_html(report: Path) -> None:
    from posenc.plots.figures import FIGURES

    text = report.read_text(encoding="utf-8")
    parser = _Collector()
    parser.feed(text)
    tags = parser.tags
    images = [a for t, a in tags if t == "img"]
    assert not [t for t, _ in tags if t in ("script", "link", "iframe")]
    for _, attrs in tags:
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not value or value.startswith(("data:image/png;base64,", "#")), value[:60]
    assert "http://" not in text and "https://" not in text
    sections = {a.get("id") for t, a in tags if t == "section"}
    assert set(FIGURES) | {"lab-table"} <= sections
    from matplotlib.image import imread

    drawn = len(images)
    notes = text.count('class="note"')
    assert drawn + notes >= len(FIGURES)
    assert drawn >= 4, "table, similarity, wavelengths and attention need only what is installed"
    for attrs in images:
        png = base64.b64decode((attrs["src"] or "").split(",", 1)[1])
        pixels = imread(io.BytesIO(png), format="png")
        assert pixels.shape[0] > 200 and pixels[..., :3].std() > 0.05
    if (report.parent / "lab" / "results.jsonl").exists():  # the lab's latest table
        table = text[text.index('id="lab-table"') :]
        assert "<table>" in table and "<td>none</td>" in table and "<td>rope</td>" in table
    else:
        assert "No lab results yet" in text


def test_report_rejects_a_non_html_out(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["report", "--out", str(tmp_path / "r.png")])
    assert r.exit_code == 2 and "must end in .html" in r.output


@needs_chromium
def test_report_loads_in_headless_chromium_without_errors(report: Path, tmp_path: Path) -> None:
    page = load_page(report, tmp_path / "profile")
    assert page["errors"] == []
    assert page["title"] == "posenc report"
    assert all(u.startswith(("file:", "data:")) for u in page["requests"]), page["requests"]
    images = page["images"]
    assert len(images) >= 4
    for img in images:
        assert img["decoded"] and img["w"] > 200 and img["h"] > 200, img
        assert img["shownW"] > 100, img  # laid out, not collapsed
        assert img["colours"] > 20 and img["dark"] > 0, img  # not blank
    from matplotlib.image import imread

    shot = imread(io.BytesIO(page["screenshot"]), format="png")
    assert shot[..., :3].std() > 0.05  # the rendered page itself is not blank
    assert len(np.unique(shot[..., :3].reshape(-1, 3)[::50], axis=0)) > 20


@needs_chromium
def test_chromium_check_catches_errors_and_broken_images(tmp_path: Path) -> None:
    """The checker is not vacuous: a script error, a console error and a broken image are seen."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!doctype html><html><head><title>bad</title></head><body>"
        '<img src="data:image/png;base64,AAAA">'
        "<script>console.error('boom'); undefinedFunction();</script></body></html>"
    )
    page = load_page(bad, tmp_path / "profile")
    text = " ".join(page["errors"])
    assert "boom" in text and "undefinedFunction" in text
    assert page["images"] and not page["images"][0]["decoded"]


def test_report_reads_once_with_units_and_no_markdown_left(report: Path, tmp_path: Path) -> None:
    """Each caption is printed once, under its image (not also inside the PNG: the drawing the
    report embeds has no caption text, checked on the same figure drawn as SVG, which keeps text
    as text); the lab table names its units and counts seeds; no Markdown backtick is left."""
    import re

    from posenc.plots import make_figure, save_figure
    from posenc.plots.common import caption, take_caption

    text = report.read_text(encoding="utf-8")
    assert "`" not in text
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", text)
    assert len(captions) >= 4 and all(c.startswith("Look at:") for c in captions)
    for c in captions:
        assert text.count(c) == 1
    fig = make_figure("table", num_positions=16, dim=8)
    said = caption(fig)
    assert take_caption(fig) == said and said
    save_figure(fig, tmp_path / "t.svg")
    assert said.split(":")[0] not in (tmp_path / "t.svg").read_text()  # "Look at" not drawn
    if (report.parent / "lab" / "results.jsonl").exists():
        table = text[text.index('id="lab-table"') :]
        assert "bits per token at each eval length" in table and "tokens per second" in table
        assert "<th>seeds</th>" in table and "<td>1</td>" in table  # a count of one seed


def test_report_notes_render_code_not_backticks(tmp_path: Path) -> None:
    from posenc.lab import DEFAULT_RUN_TIME
    from posenc.plots.report import build_report, text_html

    page = build_report(results=tmp_path / "none-here", kinds=["lab"])
    assert "`" not in page and "<code>posenc lab</code>" in page
    assert DEFAULT_RUN_TIME in page  # the one measured run time
    assert text_html("run `posenc lab` <now>") == "run <code>posenc lab</code> &lt;now&gt;"
