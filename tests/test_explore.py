"""`posenc explore`: the numbers of the page against the formulas (float64, written out here),
transformers' own rotary class for the scaling types it has, and posenc's functions; the page
embeds exactly ``explorer_data``; and, where Debian's `chromium` is installed, the page loads with
the network off, without errors, draws each view, and redraws when a control moves."""

from __future__ import annotations

import html
import io
import json
import math
import re
import shutil
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("plotly")

from _cdp import Chromium
from posenc.cli import app
from posenc.explore import explorer_data, explorer_html
from posenc.explore.data import RADII
from posenc.explore.page import decode_arrays
from posenc.functional import (
    extension_scaling,
    rope_cos_sin,
    rope_inv_freq,
    sinusoidal_table,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None or shutil.which("bash") is None,
    reason="chromium is not installed (Debian: apt-get install -y chromium)",
)

SMALL = {"dims": (8, 16), "num_positions": 24, "train_len": 4, "factors": (2, 4), "stride": 2}
SCALED = ("linear", "ntk", "yarn", "llama3", "longrope")


@pytest.fixture(scope="module")
def small() -> dict[str, Any]:
    return explorer_data(**SMALL)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default page, written by the command."""
    out = tmp_path_factory.mktemp("explore") / "explore.html"
    result = CliRunner().invoke(app, ["explore", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "MB" in result.output
    return out


def embedded(text: str, element_id: str) -> Any:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', text, re.S)
    assert m, element_id
    return json.loads(m.group(1))


def frames_of(data: dict[str, Any]) -> list[tuple[str, int, str, str, dict[str, Any]]]:
    return [
        (enc, int(d), s, f, frame)
        for enc, by_d in data["frames"].items()
        for d, by_s in by_d.items()
        for s, by_f in by_s.items()
        for f, frame in by_f.items()
    ]


# --- the numbers -----------------------------------------------------------------------------


def _paper_table(positions: np.ndarray, dim: int, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al.: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(same), float64."""
    i = np.arange(dim // 2)
    angle = positions[:, None] / base ** (2 * i / dim)  # [P, d/2]
    out = np.empty((len(positions), dim))
    out[:, 0::2], out[:, 1::2] = np.sin(angle), np.cos(angle)
    return out


def test_grid_has_every_frame(small: dict[str, Any]) -> None:
    keys = {(enc, d, s, f) for enc, d, s, f, _ in frames_of(small)}
    want = {("sinusoidal", d, "none", "1") for d in SMALL["dims"]}
    want |= {("rope", d, "none", "1") for d in SMALL["dims"]}
    want |= {
        ("rope", d, s, str(f)) for d in SMALL["dims"] for s in SCALED for f in SMALL["factors"]
    }
    assert keys == want
    assert small["meta"]["eval_len"] == {"2": 8, "4": 16}
    assert small["meta"]["matrix_positions"] == list(range(0, 24, 2))


def test_sinusoidal_frames_are_the_paper_formula(small: dict[str, Any]) -> None:
    P, stride = SMALL["num_positions"], SMALL["stride"]
    for d in SMALL["dims"]:
        f = small["frames"]["sinusoidal"][str(d)]["none"]["1"]
        table = _paper_table(np.arange(P, dtype=np.float64), d)  # [P, d]
        assert np.abs(f["matrix"] - table[::stride]).max() < 1e-6
        gram = table @ table.T  # [P, P]
        for p in (0, 5, P - 1):
            window = f["similarity"][P - 1 - p : 2 * P - 1 - p]
            assert np.abs(window - gram[p]).max() < 1e-5
        for radius, i, (x, y) in zip(RADII, f["rotation_pairs"], f["rotation"], strict=True):
            assert np.abs(x - radius * table[:, 2 * i + 1]).max() < 1e-6
            assert np.abs(y - radius * table[:, 2 * i]).max() < 1e-6
        wl = 2 * math.pi * 10000.0 ** (2 * np.arange(d // 2) / d)
        np.testing.assert_allclose(f["wavelengths"], wl, rtol=1e-6)


def test_plain_rope_frames_are_the_formula(small: dict[str, Any]) -> None:
    """Plain RoPE: cos(p theta_i), theta_i = base^(-2i/d); <R(p)q, R(n)q> = sum_i cos((p-n) theta_i)
    for q = 1 in every pair; pair i at p is radius * (cos, sin)(p theta_i)."""
    P, stride = SMALL["num_positions"], SMALL["stride"]
    for d in SMALL["dims"]:
        f = small["frames"]["rope"][str(d)]["none"]["1"]
        theta = 10000.0 ** (-2 * np.arange(d // 2) / d)  # [n]
        angle = np.arange(P)[:, None] * theta  # [P, n]
        assert np.abs(f["matrix"] - np.cos(angle)[::stride]).max() < 1e-5
        for p in (0, 7, P - 1):
            window = f["similarity"][P - 1 - p : 2 * P - 1 - p]
            ref = np.cos((p - np.arange(P))[:, None] * theta).sum(-1)
            assert np.abs(window - ref).max() < 1e-4
        for radius, i, (x, y) in zip(RADII, f["rotation_pairs"], f["rotation"], strict=True):
            assert np.abs(x - radius * np.cos(angle[:, i])).max() < 1e-5
            assert np.abs(y - radius * np.sin(angle[:, i])).max() < 1e-5
        np.testing.assert_allclose(f["wavelengths"], 2 * math.pi / theta, rtol=1e-6)
        assert f["rotation_pairs"] == [0, d // 4, d // 2 - 1]


def test_scaled_rope_frames_are_posencs_functions(small: dict[str, Any]) -> None:
    """Each scaled frame is rope_inv_freq on extension_scaling's dict (posenc's one scaling
    table), at the eval length; its similarity is the attention_factor-squared cosine sum."""
    P, stride, L = SMALL["num_positions"], SMALL["stride"], SMALL["train_len"]
    for d in SMALL["dims"]:
        for name in SCALED:
            for factor in SMALL["factors"]:
                f = small["frames"]["rope"][str(d)][name][str(factor)]
                scaling = extension_scaling(name, float(factor), L, d // 2)
                assert f["scaling"] == scaling and f["eval_len"] == L * factor
                inv_freq, af = rope_inv_freq(d, 10000.0, scaling, seq_len=L * factor)
                assert f["attention_factor"] == af
                cos, _ = rope_cos_sin(torch.arange(P), inv_freq, af)
                assert np.array_equal(f["matrix"], cos[::stride].numpy())
                theta = inv_freq.double().numpy()
                np.testing.assert_allclose(f["wavelengths"], 2 * math.pi / theta, rtol=1e-6)
                p = P // 3
                window = f["similarity"][P - 1 - p : 2 * P - 1 - p]
                ref = af**2 * np.cos((p - np.arange(P))[:, None] * theta).sum(-1)
                assert np.abs(window - ref).max() < 1e-4 * af**2 * d
                x = f["rotation"][2][0]  # the slowest pair, radius RADII[2]
                i = d // 2 - 1
                assert np.abs(x - RADII[2] * af * np.cos(np.arange(P) * theta[i])).max() < 1e-5
                assert str(factor) in f["label"] and "rope_inv_freq(" in f["call"]


def test_scaled_frames_match_transformers_rotary() -> None:
    """The page's cos tables equal transformers' LlamaRotaryEmbedding for each scaling type it
    implements (posenc's own NTK has no transformers counterpart), on the page's default train
    length and factors."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    d, P, L = 32, 256, 32
    data = explorer_data(dims=(d,), num_positions=P, train_len=L, factors=(4,), stride=1)
    for name in ("none", "linear", "yarn", "llama3", "longrope"):
        factor = "1" if name == "none" else "4"
        frame = data["frames"]["rope"][str(d)][name][factor]
        kw: dict[str, Any] = {
            "hidden_size": d,
            "num_attention_heads": 1,
            "head_dim": d,
            "rope_theta": 10000.0,
            # transformers' YaRN takes its factor from max_position_embeddings / original.
            "max_position_embeddings": L * 4,
        }
        if name != "none":
            kw["rope_scaling"] = dict(frame["scaling"])
        rotary = LlamaRotaryEmbedding(LlamaConfig(**kw))
        cos, _ = rotary(torch.zeros(1), torch.arange(P)[None])  # [1, P, d] = cat(c, c)
        err = np.abs(frame["matrix"] - cos[0, :, : d // 2].numpy()).max()
        assert err < 1e-6, (name, err)


def test_page_embeds_exactly_explorer_data(small: dict[str, Any]) -> None:
    text = explorer_html(small)
    data = embedded(text, "posenc-explore-data")
    assert {k: data["meta"][k] for k in small["meta"]} == json.loads(json.dumps(small["meta"]))
    frames = decode_arrays(data["frames"])
    for enc, d, s, f, frame in frames_of(small):
        got = frames[enc][str(d)][s][f]
        assert set(got) == set(frame)
        for key, value in frame.items():
            if isinstance(value, np.ndarray):
                assert got[key].dtype == np.float32 and np.array_equal(got[key], value), key
            else:
                assert got[key] == json.loads(json.dumps(value)), key
    # The initial controls exist on this grid (d_model 64 is not in it: its first, 8).
    assert data["meta"]["initial"] == {
        "enc": "rope",
        "d": "8",
        "scaling": "yarn",
        "factor": "4",
        "p": 23,
    }
    views = embedded(text, "posenc-explore-views")
    assert set(views) == {"matrix", "similarity", "rotation", "wavelengths"}


def test_each_encoding_has_its_own_captions(small: dict[str, Any]) -> None:
    """The page carries each view's caption per encoding (app.js shows the chosen one's): the
    sinusoidal ones describe the table, not RoPE (no R(p)q, no grey plain-RoPE curve, which the
    page never shows for it), and the page opens with its initial encoding's captions."""
    text = explorer_html(small)
    meta = embedded(text, "posenc-explore-data")["meta"]
    views = embedded(text, "posenc-explore-views")
    captions = meta["captions"]
    assert sorted(captions) == sorted(e["id"] for e in small["meta"]["encodings"])
    for enc, by_view in captions.items():
        assert set(by_view) == set(views), enc
    for view in views:
        assert captions["sinusoidal"][view] != captions["rope"][view], view
        assert not re.search(r"RoPE|R\(p\)|grey", captions["sinusoidal"][view]), view
        shown = captions[meta["initial"]["enc"]][view]
        assert f'<figcaption id="caption-{view}">{html.escape(shown)}</figcaption>' in text


def test_command_writes_the_default_grid(page: Path) -> None:
    """The page the command writes: its size, nothing fetched from outside, and a few frames of
    the default grid against posenc's functions."""
    size = page.stat().st_size
    assert size < 8e6, size
    text = page.read_text(encoding="utf-8")
    assert "<script src" not in text and "<link" not in text
    data = embedded(text, "posenc-explore-data")
    meta = data["meta"]
    assert meta["dims"] == [16, 32, 64, 128] and meta["factors"] == [2, 4, 8]
    assert meta["num_positions"] == 256 and meta["train_len"] == 32
    frames = decode_arrays(data["frames"])
    for d, name, factor in ((64, "yarn", 4), (128, "llama3", 8), (16, "longrope", 2)):
        f = frames["rope"][str(d)][name][str(factor)]
        scaling = extension_scaling(name, float(factor), 32, d // 2)
        inv_freq, af = rope_inv_freq(d, 10000.0, scaling, seq_len=32 * factor)
        assert np.array_equal(
            f["matrix"], rope_cos_sin(torch.arange(256), inv_freq, af)[0][::2].numpy()
        )
    table = sinusoidal_table(torch.arange(256), 128)
    assert np.array_equal(frames["sinusoidal"]["128"]["none"]["1"]["matrix"], table[::2].numpy())


def test_command_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url) or True)
    monkeypatch.setattr("posenc.explore.page.explorer_data", lambda: explorer_data(**SMALL))
    out = tmp_path / "sub" / "e.html"
    r = CliRunner().invoke(app, ["explore", "--out", str(out), "--open"])
    assert r.exit_code == 0, r.output
    assert opened == [out.resolve().as_uri()]
    r = CliRunner().invoke(app, ["explore", "--out", str(tmp_path / "e.png")])
    assert r.exit_code == 2 and "must end in .html" in r.output


def test_command_without_plotly_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "plotly", None)
    r = CliRunner().invoke(app, ["explore", "--out", str(tmp_path / "e.html")])
    assert r.exit_code == 2, r.output
    assert (
        "pip install -e '.[explore]' in the posenc clone" in r.output
        and "Traceback" not in r.output
    )
    assert not (tmp_path / "e.html").exists()


# --- in Chromium -----------------------------------------------------------------------------

VIEWS = ("matrix", "similarity", "rotation", "wavelengths")

# Runs in the page: each view's box and what Plotly drew there (trace paths, heatmap images).
PROBE = """
(() => {
  const out = {};
  for (const id of VIEWS_JSON) {
    const el = document.getElementById("view-" + id);
    const r = el.getBoundingClientRect();
    const paths = Array.from(el.querySelectorAll(".scatterlayer path"))
      .map((p) => p.getAttribute("d") || "").filter((d) => d.length > 10);
    const images = Array.from(el.querySelectorAll(".heatmaplayer image"))
      .map((i) => i.getAttribute("href") || "");
    const titles = Array.from(el.querySelectorAll(".gtitle")).map((t) => t.textContent);
    out[id] = {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height,
               paths, images, titles};
  }
  return JSON.stringify(out);
})()
""".replace("VIEWS_JSON", json.dumps(list(VIEWS)))


class Page:
    """One page open in headless Chromium (the network off), driven over the DevTools pipe."""

    def __init__(self, browser: Chromium, path: Path, fragment: str = "") -> None:
        self.browser = browser
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.send(f"{domain}.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 1300, "deviceScaleFactor": 1, "mobile": False},
        )
        self.send("Page.navigate", {"url": path.resolve().as_uri() + fragment})
        browser.wait_for("Page.loadEventFired")

    def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.send(method, params, session=self.session)

    def eval(self, expression: str) -> Any:
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def wait_drawn(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while int(self.eval("document.body.dataset.drawn || 0")) < count:
            assert time.monotonic() < deadline, "the page did not draw"
            time.sleep(0.05)

    def probe(self) -> dict[str, Any]:
        return json.loads(self.eval(PROBE))

    def shot(self, box: dict[str, float]) -> np.ndarray:
        from PIL import Image

        clip = {"x": box["x"], "y": box["y"], "width": box["w"], "height": box["h"], "scale": 1}
        png = self.send(
            "Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True}
        )["data"]
        import base64

        return np.asarray(Image.open(io.BytesIO(base64.b64decode(png))).convert("RGB"))


def errors_of(events: list[dict[str, Any]]) -> list[str]:
    errors = []
    for e in events:
        method, params = e.get("method"), e.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            errors.append(f"exception: {details.get('text')} {details.get('exception', {})}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append(f"console.{params['type']}: {params.get('args')}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            errors.append(f"log: {params['entry'].get('text')}")
    return errors


def requests_of(events: list[dict[str, Any]]) -> list[str]:
    return [
        e["params"]["request"]["url"]
        for e in events
        if e.get("method") == "Network.requestWillBeSent"
    ]


def _colours(pixels: np.ndarray) -> int:
    return len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))


@needs_chromium
def test_page_in_chromium_offline_draws_and_follows_the_controls(
    page: Path, tmp_path: Path
) -> None:
    pytest.importorskip("PIL")
    assert CHROMIUM is not None
    browser = Chromium(
        CHROMIUM, tmp_path / "profile", extra_args=["--host-resolver-rules=MAP * ~NOTFOUND"]
    )
    try:
        view = Page(browser, page, "#enc=rope&d=64&scaling=yarn&factor=4&p=40")
        view.wait_drawn(1)
        state = json.loads(view.eval("document.body.dataset.state"))
        assert state == {"enc": "rope", "d": "64", "scaling": "yarn", "factor": "4", "p": 40}
        before = view.probe()
        shots = {name: view.shot(before[name]) for name in VIEWS}
        for name, box in before.items():  # each view laid out and drawn, not blank
            assert box["w"] > 400 and box["h"] > 300, (name, box)
            assert _colours(shots[name]) > 20, name
        assert len(before["matrix"]["images"]) == 1 and len(before["matrix"]["images"][0]) > 1000
        assert len(before["similarity"]["paths"]) >= 2  # YaRN and plain RoPE
        assert len(before["rotation"]["paths"]) >= 3 * 256  # a dot per pair and position
        assert len(before["wavelengths"]["paths"]) >= 2
        assert "p = 40" in before["rotation"]["titles"][0]

        # Move controls as a user does (set the value, fire the event the page listens to).
        view.eval(
            "(() => { const s = document.getElementById('control-scaling');"
            " s.value = 'linear'; s.dispatchEvent(new Event('change'));"
            " const p = document.getElementById('control-p');"
            " p.value = '200'; p.dispatchEvent(new Event('input')); })()"
        )
        view.wait_drawn(3)
        after = view.probe()
        assert view.eval("location.hash") == "#enc=rope&d=64&scaling=linear&factor=4&p=200"
        assert after["matrix"]["images"] != before["matrix"]["images"]
        for name in ("similarity", "rotation", "wavelengths"):
            assert after[name]["paths"] != before[name]["paths"], name
        assert not np.array_equal(view.shot(after["rotation"]), shots["rotation"])
        assert "p = 200" in after["rotation"]["titles"][0]

        # The encoding control: sinusoidal disables the scaling control and draws its table.
        view.eval(
            "(() => { const s = document.getElementById('control-enc');"
            " s.value = 'sinusoidal'; s.dispatchEvent(new Event('change')); })()"
        )
        view.wait_drawn(4)
        sinus = view.probe()
        assert view.eval("document.getElementById('control-scaling').disabled") is True
        assert sinus["matrix"]["images"] != after["matrix"]["images"]
        assert "sinusoidal_table" in sinus["matrix"]["titles"][0]
        captions = embedded(page.read_text(encoding="utf-8"), "posenc-explore-data")["meta"][
            "captions"
        ]
        for name in VIEWS:  # each caption now the sinusoidal table's, not RoPE's
            shown = view.eval(f"document.getElementById('caption-{name}').textContent")
            assert shown == captions["sinusoidal"][name], name
    finally:
        browser.close()
    assert errors_of(browser.events) == []
    requests = requests_of(browser.events)
    assert requests and all(u.startswith(("file:", "data:")) for u in requests), requests


@needs_chromium
def test_chromium_check_sees_a_broken_page(tmp_path: Path) -> None:
    """The check is not vacuous: a page whose script fails shows the error and draws nothing."""
    assert CHROMIUM is not None
    text = explorer_html(explorer_data(**SMALL))
    assert text.count("Plotly.react(") == 1
    text = text.replace("Plotly.react(", "Plotly.reakt(")
    bad = tmp_path / "bad.html"
    bad.write_text(text, encoding="utf-8")
    browser = Chromium(CHROMIUM, tmp_path / "profile")
    try:
        view = Page(browser, bad)
        time.sleep(0.5)
        probe = view.probe()
        assert view.eval("document.body.dataset.drawn || ''") == ""
    finally:
        browser.close()
    assert any("reakt" in e for e in errors_of(browser.events))
    assert all(not v["paths"] and not v["images"] for v in probe.values())
