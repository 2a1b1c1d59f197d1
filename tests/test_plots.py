"""posenc.plots: the data behind every figure against independent formulas, and every
`posenc plot` command producing a real (non-blank) image."""

from __future__ import annotations

import importlib.util
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("matplotlib")

from posenc import ModelConfig, TransformerLM, names
from posenc.attention import repeat_kv
from posenc.cli import app
from posenc.plots import caption, make_figure, save_figure
from posenc.plots.common import check_figure_path

runner = CliRunner()


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


needs_rotary = pytest.mark.skipif(
    not _has("posenc.functional.rotary"), reason="posenc.functional.rotary is not installed yet"
)
needs_lab = pytest.mark.skipif(
    not _has("posenc.lab.grid.experiment"), reason="posenc.lab (run_grid) is not installed yet"
)


def _bias_kinds_present() -> list[str]:
    from posenc.plots.bias import available_bias_kinds

    return available_bias_kinds()


def assert_image(path: Path) -> None:
    """A real picture: not tiny, and (PNG) many colours / (SVG) many drawn elements + caption."""
    assert path.exists(), path
    assert path.stat().st_size > 5_000, f"{path} is only {path.stat().st_size} bytes"
    if path.suffix == ".png":
        from matplotlib.image import imread

        pixels = imread(path)  # [H, W, 3|4] floats in 0..1
        assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 200
        flat = pixels[..., :3].reshape(-1, 3)
        assert flat.std(axis=0).max() > 0.05, "the image is (nearly) one colour"
        assert len(np.unique(flat[:: max(1, len(flat) // 20000)], axis=0)) > 20
    else:
        root = ET.parse(path).getroot()
        assert root.tag.endswith("svg")
        drawn = [e for e in root.iter() if e.tag.split("}")[-1] in ("path", "image", "use")]
        assert len(drawn) > 20
        assert any(e.get("id") == "posenc-caption" for e in root.iter())


# --- common ------------------------------------------------------------------------------


def test_figure_path_allows_png_and_svg_only(tmp_path: Path) -> None:
    assert check_figure_path(tmp_path / "a.PNG").suffix == ".PNG"
    assert check_figure_path("b.svg").name == "b.svg"
    for bad in ("c.pdf", "d", "e.png.txt"):
        with pytest.raises(ValueError, match=r"must end in \.png or \.svg"):
            check_figure_path(bad)


def test_save_figure_writes_png_and_svg_without_dates_or_versions(tmp_path: Path) -> None:
    from PIL import Image

    from posenc.plots.common import add_caption, new_figure

    fig, ax = new_figure()
    ax.plot([0, 1, 2], [1, 0, 1])
    ax.set_title("t")
    add_caption(fig, "Look at: the dip.")
    assert caption(fig) == "Look at: the dip."
    png = save_figure(fig, tmp_path / "sub" / "a.png")  # creates the folder
    svg = save_figure(fig, tmp_path / "a.svg")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Software" not in Image.open(png).info
    text = svg.read_text()
    assert "<dc:date>" not in text and "Matplotlib v" not in text
    assert "Look at: the dip." in text  # text kept as text (svg.fonttype none)


# --- table -------------------------------------------------------------------------------


def test_sinusoidal_table_data_is_the_paper_formula() -> None:
    from posenc.plots.table import table_data

    d = table_data("sinusoidal", num_positions=50, dim=16, base=10000.0)
    p = np.arange(50)[:, None]
    i = np.arange(8)[None, :]
    angle = p / 10000.0 ** (2 * i / 16)
    expected = np.empty((50, 16))
    expected[:, 0::2], expected[:, 1::2] = np.sin(angle), np.cos(angle)
    np.testing.assert_allclose(d["table"], expected, atol=1e-6)  # float32 table


@needs_rotary
def test_rope_cos_table_data_is_cos_of_p_theta_in_both_halves() -> None:
    from posenc.plots.table import table_data

    d = table_data("rope", num_positions=40, dim=12, base=500.0)
    theta = 500.0 ** (-np.arange(6) * 2 / 12)
    cos = np.cos(np.arange(40)[:, None] * theta[None, :])
    np.testing.assert_allclose(d["table"], np.concatenate([cos, cos], axis=1), atol=1e-6)


def test_table_rejects_unknown_encoding_and_odd_dim() -> None:
    from posenc.plots.table import table_data

    with pytest.raises(ValueError, match="encoding must be one of"):
        table_data("alibi")
    with pytest.raises(ValueError, match="even"):
        table_data("sinusoidal", dim=7)


# --- similarity ----------------------------------------------------------------------------


def test_sinusoidal_similarity_is_sum_of_cosines_and_shift_invariant() -> None:
    from posenc.plots.similarity import sinusoidal_similarity_data

    dim, bases = 32, (100.0, 10000.0)
    a = sinusoidal_similarity_data(dim, max_offset=60, start=0, bases=bases)
    b = sinusoidal_similarity_data(dim, max_offset=60, start=1234, bases=bases)
    k = np.arange(61)[:, None]
    for row, base in enumerate(bases):
        w = base ** (-2 * np.arange(dim // 2) / dim)
        dot = np.cos(k * w[None, :]).sum(axis=1)  # PE(p).PE(p+k) = sum_i cos(k w_i)
        np.testing.assert_allclose(a["dot"][row], dot, atol=1e-9)
        np.testing.assert_allclose(a["cosine"][row], dot / (dim / 2), atol=1e-9)
        np.testing.assert_allclose(b["dot"][row], dot, atol=1e-9)  # independent of p


@needs_rotary
def test_rope_decay_is_roformer_relative_upper_bound() -> None:
    from posenc.plots.similarity import rope_decay_data

    d = 16
    data = rope_decay_data(head_dim=d, max_distance=40, bases=(10000.0, 50.0))
    for row, base in enumerate((10000.0, 50.0)):
        theta = [base ** (-2 * k / d) for k in range(d // 2)]
        for r in (0, 1, 7, 40):
            # (1/(d/2)) sum_{j=1}^{d/2} |S_j|, S_j = sum_{k=0}^{j-1} e^{i r theta_k}
            partial = [
                sum(complex(math.cos(r * t), math.sin(r * t)) for t in theta[:j])
                for j in range(1, d // 2 + 1)
            ]
            bound = sum(abs(s) for s in partial) / (d // 2)
            assert data["bound"][row, r] == pytest.approx(bound, abs=1e-10)
    assert data["bound"][0, 0] == pytest.approx((d // 2 + 1) / 2)  # every term is 1 at r = 0


# --- wavelengths ---------------------------------------------------------------------------


@needs_rotary
def test_wavelengths_equal_rope_inv_freq_and_closed_forms() -> None:
    from posenc.functional.rotary import rope_inv_freq
    from posenc.plots.wavelengths import scaling_for, wavelength_data

    d, base, L, f = 32, 10000.0, 256, 4.0
    data = wavelength_data(d, base, L, f)
    assert data["methods"] == ["none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"]
    n = d // 2
    for m, method in enumerate(data["methods"]):
        inv, _ = rope_inv_freq(
            d, base, scaling_for(method, f, L, n), seq_len=int(f * L), dtype=torch.float64
        )
        np.testing.assert_allclose(data["wavelength"][m], 2 * np.pi / inv.numpy(), rtol=1e-12)
    i = np.arange(n)
    plain = 2 * np.pi * base ** (2 * i / d)
    wave = dict(zip(data["methods"], data["wavelength"], strict=True))
    np.testing.assert_allclose(wave["none"], plain, rtol=1e-12)
    np.testing.assert_allclose(wave["linear"], f * plain, rtol=1e-12)
    ntk_base = base * f ** (d / (d - 2))
    np.testing.assert_allclose(wave["ntk"], 2 * np.pi * ntk_base ** (2 * i / d), rtol=1e-10)
    # Llama-3: kept below L/high, divided by factor above L/low, smooth blend between.
    lo, hi = L / 1.0, L / 4.0
    smooth = (L / plain - 1.0) / (4.0 - 1.0)
    blend = 1 / ((1 - smooth) / (f * plain) + smooth / plain)
    llama = np.where(plain < hi, plain, np.where(plain > lo, f * plain, blend))
    np.testing.assert_allclose(wave["llama3"], llama, rtol=1e-10)
    np.testing.assert_allclose(data["ratio"], data["wavelength"] / plain, rtol=1e-12)


@needs_rotary
def test_wavelengths_reject_bad_method_and_factor() -> None:
    from posenc.plots.wavelengths import wavelength_data

    with pytest.raises(ValueError, match="unknown scaling method 'pi'"):
        wavelength_data(methods=("pi",))
    with pytest.raises(ValueError, match="factor must be > 1"):
        wavelength_data(factor=1.0)


# --- bias ----------------------------------------------------------------------------------


def _t5_bucket_causal(rel: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5 (Raffel et al.) decoder buckets of key - query: exact below n/2, log-spaced above."""
    n = num_buckets
    dist = np.maximum(-rel, 0)
    exact = n // 2
    with np.errstate(divide="ignore"):
        large = exact + (
            np.log(np.maximum(dist, 1) / exact) / math.log(max_distance / exact) * (n - exact)
        ).astype(np.int64)
    return np.where(dist < exact, dist, np.minimum(large, n - 1))


@pytest.mark.skipif(
    len(_bias_kinds_present()) < 5, reason="not every bias encoding is registered yet"
)
def test_bias_maps_equal_each_papers_formula() -> None:
    from posenc.plots.bias import bias_data

    H, S = 4, 40
    data = bias_data(num_heads=H, length=S, causal=True, seed=3)
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    past = j <= i
    b = data["bias"]
    for kind in data["kinds"]:
        assert b[kind].shape == (H, S, S)
        assert np.isnan(b[kind][:, ~past]).all()  # future keys masked (drawn grey)
    # ALiBi: -m_h (i - j), m_h = 2^(-8h/H), h = 1..H.
    slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
    np.testing.assert_allclose(
        b["alibi"][:, past], (-slopes[:, None, None] * (i - j))[:, past], atol=1e-5
    )
    # T5: the learned value of the bucket of (j - i).
    t5 = data["modules"]["t5"]
    table = t5.relative_attention_bias.weight.detach().double().numpy()  # [buckets, h]
    buckets = _t5_bucket_causal(j - i, t5.num_buckets, t5.max_distance)
    np.testing.assert_allclose(
        b["t5"][:, past], table[buckets].transpose(2, 0, 1)[:, past], atol=1e-6
    )
    # KERPLE (log): -r1 log(1 + r2 |i - j|), parameters clamped at eps.
    kp = data["modules"]["kerple"]
    r1 = kp.r1.detach().double().clamp(min=kp.eps).numpy()[:, None, None]
    r2 = kp.r2.detach().double().clamp(min=kp.eps).numpy()[:, None, None]
    np.testing.assert_allclose(
        b["kerple"][:, past], (-r1 * np.log1p(r2 * abs(i - j)))[:, past], rtol=1e-5, atol=1e-6
    )
    # Sandwich: (sum_{k=1}^{d'/2} cos((i-j) / base^(2k/d')) - d'/2) / (8h/H).
    sw = data["modules"]["sandwich"]
    dp = sw.d_prime
    w = sw.base ** (-2.0 * np.arange(1, dp // 2 + 1) / dp)
    shared = np.cos((i - j)[..., None] * w).sum(-1) - dp / 2
    ratio = 8.0 * np.arange(1, H + 1) / H
    np.testing.assert_allclose(
        b["sandwich"][:, past], (shared[None] / ratio[:, None, None])[:, past], rtol=1e-5, atol=1e-4
    )
    # FIRE: MLP(psi(i - j) / psi(max(L, i))), psi(x) = log(|c x| + 1).
    fire = data["modules"]["fire"]
    c, thr = float(fire.c.detach()), float(fire.threshold().detach())
    x = np.log(np.abs(c * (i - j)) + 1) / (np.log(np.abs(c * np.maximum(i, thr)) + 1) + fire.eps)
    w1, b1 = (
        fire.mlp[0].weight.detach().double().numpy()[:, 0],
        fire.mlp[0].bias.detach().double().numpy(),
    )
    w2, b2 = (
        fire.mlp[2].weight.detach().double().numpy(),
        fire.mlp[2].bias.detach().double().numpy(),
    )
    hidden = np.maximum(x[..., None] * w1 + b1, 0)  # [s, t, width]
    expected = (hidden @ w2.T + b2).transpose(2, 0, 1)  # [h, s, t]
    np.testing.assert_allclose(b["fire"][:, past], expected[:, past], rtol=1e-4, atol=1e-5)


def test_bias_data_rejects_unknown_kind() -> None:
    from posenc.plots.bias import bias_data

    with pytest.raises(ValueError, match="unknown bias encoding"):
        bias_data(kinds=("rope",))


# --- attention -----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", [n for n in names() if n != "learned"] + ["learned"])
def test_attention_weights_reproduce_the_attention_output(encoding: str) -> None:
    """weights @ v through o_proj equals what each Attention module returned (float64)."""
    from posenc.plots.attention import model_attention

    cfg = ModelConfig(
        vocab_size=11,
        dim=16,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_len=24,
        encoding=encoding,
    )
    model = TransformerLM(cfg).double().eval()
    tokens = torch.randint(0, 11, (1, 12))
    ins: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    hooks = [b.attn.register_forward_pre_hook(lambda m, a: ins.append(a[0])) for b in model.blocks]
    hooks += [b.attn.register_forward_hook(lambda m, a, o: outs.append(o)) for b in model.blocks]
    with torch.no_grad():
        model.hidden(tokens)
    for h in hooks:
        h.remove()
    weights = model_attention(model, tokens)
    for block, w, x, out in zip(model.blocks, weights, ins, outs, strict=True):
        attn = block.attn
        assert w.shape == (1, 4, 12, 12)
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 4, 12, dtype=w.dtype))
        assert float(w.triu(1).abs().max()) == 0.0  # causal
        v = attn.v_proj(x).view(1, 12, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        mixed = w @ repeat_kv(v, attn.num_heads)  # [1, h, s, d]
        extra = torch.zeros_like(out)
        if encoding == "shaw":
            # Shaw adds a relative *value* term sum_j w_ij r^V(i-j), the part not from v: with
            # v_proj zeroed the layer returns o_proj of that term alone (o_proj is affine).
            saved = [p.detach().clone() for p in attn.v_proj.parameters()]
            with torch.no_grad():
                for p in attn.v_proj.parameters():
                    p.zero_()
                extra = attn(x) - attn.o_proj(torch.zeros_like(x))
                for p, old in zip(attn.v_proj.parameters(), saved, strict=True):
                    p.copy_(old)
        rebuilt = attn.o_proj(mixed.transpose(1, 2).reshape(1, 12, -1)) + extra
        torch.testing.assert_close(rebuilt, out, rtol=1e-9, atol=1e-12)


def test_tiny_model_learns_the_lag_and_maps_have_the_right_shapes() -> None:
    from posenc.lab.evaluation.probe import TINY_LAG, attention_data

    data = attention_data(encoding="rope", train_len=24, factor=2, steps=120, seed=0)
    train, long = data["maps"]["train"], data["maps"]["long"]
    assert train.shape == (4, 24, 24) and long.shape == (4, 48, 48)
    assert data["info"]["final_loss_bits"] < 1.0, data["info"]  # log2(32) = 5 bits at chance
    # The chosen layer looks TINY_LAG tokens back at the training length.
    lag = np.mean([train[:, i, i - TINY_LAG].mean() for i in range(TINY_LAG, 24)])
    assert lag > 0.5
    assert "trained here for 120 steps" in data["source"]


def test_attention_rejects_bad_layer_and_short_tokens() -> None:
    from posenc.lab.evaluation.probe import attention_data

    with pytest.raises(ValueError, match="layer must be in"):
        attention_data(encoding="none", train_len=8, steps=1, layer=5)
    with pytest.raises(ValueError, match="tokens must be"):
        attention_data(
            encoding="none", train_len=8, steps=1, tokens=torch.zeros(1, 10, dtype=torch.long)
        )


# --- lab (a real tiny lab run: results store and checkpoints) -------------------------------


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _has("posenc.lab.grid.experiment"):
        pytest.skip("posenc.lab (run_grid) is not installed yet")
    from posenc.lab.cells.presets import DataConfig, EvalConfig, LabConfig, ModelShape, TrainConfig
    from posenc.lab.grid.experiment import RunOptions, run_grid

    out = tmp_path_factory.mktemp("lab")
    cfg = LabConfig(
        preset="test",
        encodings=("rope", "alibi"),
        seeds=(0, 1),
        train_len=16,
        model=ModelShape(dim=32, num_layers=2, num_heads=4),
        train=TrainConfig(steps=2, batch_size=4, warmup_steps=1),
        data=DataConfig(source="task", task="copy"),
        eval=EvalConfig(lengths=("1x", "2x"), tokens=64, batch_tokens=64, rope_scalings=("linear",), curve_points=8),
    )  # fmt: skip
    summary = run_grid(cfg, RunOptions(out=out, quiet=True))
    assert not summary.failed, summary.failed
    return out


def test_lab_data_means_match_the_store(lab_run: Path) -> None:
    import json

    from posenc.lab.reports.results import load_rows
    from posenc.plots.lab import lab_data

    raw = [
        json.loads(line)
        for line in (lab_run / "results.jsonl").read_text().splitlines()
        if line.strip()
    ]
    data = lab_data(load_rows(lab_run))
    assert list(data["lengths"]) == [16, 32] and data["train_len"] == 16
    lines = {(x["encoding"], x["variant"]): x for x in data["lines"]}
    assert set(lines) == {("rope", "base"), ("rope", "linear"), ("alibi", "base")}
    for (enc, variant), line in lines.items():
        for n, got in zip((16, 32), line["bits"], strict=True):
            seeds = [
                r["eval"]["variants"][variant]["results"][str(n)]["bits"]
                for r in raw
                if r["encoding"] == enc
            ]
            assert len(seeds) == 2
            assert got == pytest.approx(sum(seeds) / 2, rel=1e-12)
    assert data["curves"]["length"] == 32 and data["curves"]["lines"]


def test_lab_data_without_results_says_how_to_get_them(tmp_path: Path) -> None:
    from posenc.lab.reports.results import load_rows
    from posenc.plots.lab import lab_data

    with pytest.raises(ValueError, match="run `posenc lab` first"):
        lab_data(load_rows(tmp_path))
    with pytest.raises(TypeError, match="load_rows"):  # a renderer: it reads no store
        lab_data(tmp_path)  # type: ignore[arg-type]


def test_attention_from_a_lab_checkpoint(lab_run: Path) -> None:
    from posenc.lab.evaluation.probe import attention_data, load_checkpoint_model

    ckpt = next((lab_run / "ckpt").glob("rope-s0-*/final.pt"))
    model, info = load_checkpoint_model(ckpt.parent)  # a cell folder works too
    assert model.cfg.encoding == "rope" and info["data"]["task"] == "copy"
    data = attention_data(ckpt, factor=4)
    assert data["lengths"] == (16, 64) and data["layer"] == 1
    assert data["maps"]["long"].shape == (4, 64, 64)
    np.testing.assert_allclose(data["maps"]["long"].sum(-1), 1.0, atol=1e-5)
    from posenc.lab.training.train import CheckpointError

    with pytest.raises(CheckpointError, match="not a posenc lab checkpoint"):
        bad = lab_run / "bad.pt"
        torch.save({"model": {}}, bad)
        load_checkpoint_model(bad)


def test_plot_attention_with_a_bad_checkpoint_is_a_one_line_error(
    lab_run: Path, tmp_path: Path
) -> None:
    """Garbage, a missing file, and a real checkpoint with one flipped byte inside a tensor: each
    a single ``error: ...`` line naming the file, exit code 2, no traceback, no figure."""
    import shutil

    from _checkpoint_helpers import flip_tensor_byte

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    flipped = tmp_path / "flipped.pt"
    shutil.copy(next((lab_run / "ckpt").glob("rope-s0-*/final.pt")), flipped)
    flip_tensor_byte(flipped)
    for path, why in (
        (garbage, "unreadable or corrupt"),
        (tmp_path / "missing.pt", "does not exist"),
        (flipped, "do not match the SHA-256 digest"),
    ):
        out = tmp_path / "a.png"
        r = runner.invoke(app, ["plot", "attention", "--checkpoint", str(path), "--out", str(out)])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.output
        assert str(path) in lines[0] and why in lines[0] and "Traceback" not in r.output
        assert not out.exists()


# --- the command line: every kind writes a non-blank image --------------------------------


def _cli(*args: str) -> None:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    assert "Look at:" in result.output  # the caption is printed too


@needs_rotary
def test_plot_table_similarity_wavelengths(tmp_path: Path) -> None:
    _cli("plot", "table", "--out", str(tmp_path / "t.png"), "--positions", "48", "--dim", "16")
    _cli("plot", "table", "--out", str(tmp_path / "t.svg"), "--positions", "48", "--dim", "16")
    _cli(
        "plot", "similarity", "--out", str(tmp_path / "s.png"), "--dim", "32", "--max-offset", "64"
    )
    _cli(
        "plot",
        "wavelengths",
        "--out",
        str(tmp_path / "w.png"),
        "--head-dim",
        "32",
        "--train-len",
        "512",
    )
    for name in ("t.png", "t.svg", "s.png", "w.png"):
        assert_image(tmp_path / name)


def test_plot_attention_trains_a_tiny_model(tmp_path: Path) -> None:
    _cli(
        "plot",
        "attention",
        "--out",
        str(tmp_path / "a.png"),
        "--steps",
        "3",
        "--train-len",
        "8",
        "--encoding",
        "alibi",
    )
    assert_image(tmp_path / "a.png")


def test_plot_lab_and_attention_checkpoint(lab_run: Path, tmp_path: Path) -> None:
    _cli("plot", "lab", "--results", str(lab_run), "--out", str(tmp_path / "l.png"))
    assert_image(tmp_path / "l.png")
    ckpt = next((lab_run / "ckpt").glob("alibi-s1-*"))
    _cli(
        "plot",
        "attention",
        "--checkpoint",
        str(ckpt),
        "--out",
        str(tmp_path / "a.svg"),
        "--factor",
        "2",
    )
    assert_image(tmp_path / "a.svg")


def test_plot_errors_are_clear(tmp_path: Path) -> None:
    r = runner.invoke(app, ["plot", "table", "--out", str(tmp_path / "x.pdf")])
    assert r.exit_code == 2 and "must end in .png or .svg" in r.output
    assert not (tmp_path / "x.pdf").exists()
    r = runner.invoke(app, ["plot", "heatmap"])
    assert r.exit_code == 2 and "No such command" in r.output
    r = runner.invoke(
        app, ["plot", "table", "--encodings", "alibi", "--out", str(tmp_path / "x.png")]
    )
    assert r.exit_code == 2 and "encoding must be one of" in r.output
    r = runner.invoke(app, ["plot", "bias", "--kinds", "nope", "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "unknown bias encoding" in r.output
    r = runner.invoke(
        app, ["plot", "similarity", "--bases", "1e4,x", "--out", str(tmp_path / "x.png")]
    )
    assert r.exit_code == 2 and "comma-separated numbers" in r.output
    r = runner.invoke(
        app, ["plot", "lab", "--results", str(tmp_path), "--out", str(tmp_path / "x.png")]
    )
    assert r.exit_code == 2 and "posenc lab" in r.output


def test_every_plot_command_has_help() -> None:
    from posenc.plots.figures import FIGURES

    for kind in [*FIGURES, "all"]:
        r = runner.invoke(app, ["plot", kind, "--help"])
        assert r.exit_code == 0 and "--out" in r.output, kind
    r = runner.invoke(app, ["report", "--help"])
    assert r.exit_code == 0 and "--out" in r.output


def test_make_figure_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown plot kind 'heat'"):
        make_figure("heat")


def test_plot_all_writes_every_figure(lab_run: Path, tmp_path: Path) -> None:
    """Every kind through the CLI with its defaults (bias included), into one folder."""
    from posenc.plots.figures import FIGURES

    r = runner.invoke(app, ["plot", "all", "--out-dir", str(tmp_path), "--format", "gif"])
    assert r.exit_code == 2 and "png or svg" in r.output
    args = ["--out-dir", str(tmp_path), "--results", str(lab_run), "--attention-steps", "2"]
    r = runner.invoke(app, ["plot", "all", *args])
    assert r.exit_code == 0, r.output
    for kind, spec in FIGURES.items():
        if spec.question in (None, "extrapolation"):  # the lab run is an extrapolation grid
            assert_image(tmp_path / f"{kind}.png")
        else:  # skipped, saying which command writes its results
            assert f"skip {kind}: no {spec.question} results" in r.output
            assert f"`{spec.command}`" in r.output and not (tmp_path / f"{kind}.png").exists()


def test_importing_plots_does_not_import_matplotlib() -> None:
    """matplotlib is the optional `plots` extra: the CLI and the data functions work without it."""
    import subprocess
    import sys

    code = (
        "import sys, posenc.cli, posenc.plots\n"
        "from posenc.plots import table, similarity, wavelengths, bias, attention, lab, report\n"
        "table.table_data('sinusoidal', 8, 8)\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- captions, the lab figure's styles, the tiny model's training -------------------------


def test_bias_caption_describes_only_the_kinds_drawn() -> None:
    kinds = _bias_kinds_present()
    if len(kinds) < 2:
        pytest.skip("needs two registered bias encodings")
    one = caption(make_figure("bias", kinds=kinds[:1], length=8, num_heads=2))
    two = caption(make_figure("bias", kinds=kinds[:2], length=8, num_heads=2))
    from posenc.plots.bias import GROWTH

    assert GROWTH[kinds[0]] in one and GROWTH[kinds[1]] not in one
    assert GROWTH[kinds[0]] in two and GROWTH[kinds[1]] in two
    for other in set(GROWTH) - set(kinds[:2]):
        assert GROWTH[other] not in two


@needs_rotary
@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_wavelengths_explain_dynamic_ntks_effective_factor(factor: float) -> None:
    """At the drawn length s = f L transformers' dynamic NTK acts as NTK with factor
    f * s / L - (f - 1) = f^2 - f + 1: the figure reads it off the frequencies and says it."""
    from posenc.plots.wavelengths import wavelength_data

    data = wavelength_data(head_dim=64, train_len=512, factor=factor)
    want = factor * factor - factor + 1
    assert data["dynamic_factor"] == pytest.approx(want, rel=1e-9)
    fig = make_figure("wavelengths", head_dim=64, train_len=512, factor=factor)
    text = caption(fig)
    assert f"that is {want:.3g}" in text and "f·s/L − (f − 1)" in text
    legend = [t.get_text() for t in fig.axes[1].get_legend().get_texts()]
    assert f"dynamic NTK (= NTK {want:.3g}x at {int(512 * factor)})" in legend
    no_dynamic = wavelength_data(head_dim=64, train_len=512, methods=("none", "ntk"))
    assert no_dynamic["dynamic_factor"] is None


def test_lab_figure_tells_variants_apart_by_colour(lab_run: Path) -> None:
    """Every line of a panel has its own colour: the encodings as trained (left), and the RoPE
    rescalings beside their base model (right), not only a dash pattern apart."""
    from matplotlib.colors import to_hex

    fig = make_figure("lab", results=str(lab_run))
    axes = fig.axes
    assert len(axes) == 4 and "Look at:" in caption(fig)
    for ax in axes:
        lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        colours = [to_hex(ln.get_color()) for ln in lines]
        assert lines and len(set(colours)) == len(colours), (ax.get_title(), colours)
        assert ax.get_xscale() == "log"
    right = {ln.get_label() for ln in axes[1].get_lines()}
    assert {"rope", "rope + PI"} <= right and "alibi" not in right
    left = {ln.get_label() for ln in axes[0].get_lines()}
    assert {"rope", "alibi"} <= left and "rope + PI" not in left


def test_lab_report_and_plot_lab_draw_the_same_figure(lab_run: Path, tmp_path: Path) -> None:
    from posenc.lab.reports.report import write_report

    _cli("plot", "lab", "--results", str(lab_run), "--out", str(tmp_path / "plot.png"))
    written = write_report(lab_run)
    assert written["plot"].read_bytes() == (tmp_path / "plot.png").read_bytes()


def test_tiny_model_trains_through_the_lab_loop_with_a_progress_bar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from posenc.lab.evaluation import probe as lab_train
    from posenc.lab.evaluation import probe as progress_module

    calls: list[dict] = []
    steps_seen: list[int] = []
    shown: list[bool] = []
    real_train, real_bars, real_task = (
        lab_train.train_model, progress_module.progress_bars, progress_module.step_task
    )  # fmt: skip

    def spy_train(*args, **kwargs):
        calls.append(kwargs)
        return real_train(*args, **kwargs)

    def spy_bars(enabled, **kw):
        shown.append(enabled)
        return real_bars(enabled, **kw)

    def spy_task(progress, description, total):
        on_step, finish = real_task(progress, description, total)

        def counted(done, bits, tps):
            steps_seen.append(done)
            on_step(done, bits, tps)

        return counted, finish

    monkeypatch.setattr(lab_train, "train_model", spy_train)
    monkeypatch.setattr(progress_module, "progress_bars", spy_bars)
    monkeypatch.setattr(progress_module, "step_task", spy_task)
    out = tmp_path / "a.png"
    args = ["--out", str(out), "--steps", "4", "--train-len", "8", "--encoding", "none"]
    _cli("plot", "attention", *args)
    assert len(calls) == 1 and calls[0]["ckpt_dir"] is None  # the lab's loop, no checkpoint
    assert shown == [True] and steps_seen == [1, 2, 3, 4]
