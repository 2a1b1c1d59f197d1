"""The plots refuse, in one line and before allocating, sizes that will not fit in memory, and the
bias figure more heads than its columns can show; :mod:`posenc._sizes` reads the memory
available (``MemAvailable``, a cgroup's limit) and can be switched off."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posenc import _sizes
from posenc.cli import app
from posenc.model import ModelConfig, TransformerLM
from posenc.plots.attention import model_attention
from posenc.plots.table import TABLE_ENTRY_BYTES, table_data

GB = 10**9


@pytest.fixture
def twenty_gb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_sizes.NO_CHECK_ENV, raising=False)
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": 20 * GB)


def _plot(args: list[str]) -> tuple[int, list[str]]:
    res = CliRunner().invoke(app, ["plot", *args])
    return res.exit_code, res.output.strip().splitlines()


@pytest.mark.parametrize(
    ("args", "what", "shrink"),
    [
        (["table", "--dim", "100000", "--positions", "100000"],
         "the sinusoidal table of --positions 100000 x --dim 100000 needs about 640.1 GB",
         "lower --dim or --positions"),
        (["similarity", "--dim", "100000", "--max-offset", "100000"],
         "the sinusoidal curve of --dim 100000 x --max-offset 100000 needs about 320.1 GB",
         "lower --dim or --max-offset"),
        (["wavelengths", "--head-dim", "1000000000"],
         "the wavelength figure of --head-dim 1000000000 needs about",
         "lower --head-dim or --methods"),
        (["bias", "--length", "100000", "--heads", "2"], "the bias figure of", "lower --length"),
        (["attention", "--train-len", "100000", "--steps", "1"],
         "the tiny model at --train-len 100000 needs about", "lower --train-len"),
    ],
)  # fmt: skip
def test_cli_refuses_in_one_line_and_writes_nothing(
    tmp_path: Path, twenty_gb, args: list[str], what: str, shrink: str
) -> None:
    out = tmp_path / "fig.png"
    t0 = time.perf_counter()
    code, lines = _plot([*args, "-o", str(out)])
    assert time.perf_counter() - t0 < 20  # refused before anything is allocated
    assert code == 2 and len(lines) == 1, lines
    assert what in lines[0] and "20.0 GB is available" in lines[0] and shrink in lines[0]
    assert not out.exists()


def test_the_estimate_follows_the_shape(twenty_gb) -> None:
    """Exactly the memory available fits, a byte more does not; the table's estimate grows
    with positions x dim (refused at 4e8 entries, 25.6 GB, before it is built)."""
    _sizes.check_fits(20 * GB, "x", "y")
    with pytest.raises(ValueError, match=r"x needs about 20\.0 GB; 20\.0 GB is available; lower y"):
        _sizes.check_fits(20 * GB + 1, "x", "y")
    assert 50000 * 8000 * TABLE_ENTRY_BYTES > 20 * GB
    with pytest.raises(ValueError, match=r"--positions 50000 x --dim 8000 needs about 25\.7 GB"):
        table_data("rope", 50000, 8000)
    assert table_data("rope", 16, 8)["table"].shape == (16, 8)


def test_bias_figure_caps_heads(tmp_path: Path) -> None:
    code, lines = _plot(["bias", "--heads", "64", "-o", str(tmp_path / "b.png")])
    assert code == 2 and len(lines) == 1 and "at most 16 heads, got 64" in lines[0], lines


def test_model_attention_refuses_maps_that_do_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_sizes.NO_CHECK_ENV, raising=False)
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": 10**6)
    model = TransformerLM(ModelConfig(dim=16, num_heads=2, num_layers=1, max_len=256))
    with pytest.raises(ValueError, match=r"attention figure at length 256 \(1 layer\(s\) x 2"):
        model_attention(model, torch.zeros(1, 256, dtype=torch.long))
    monkeypatch.setenv(_sizes.NO_CHECK_ENV, "1")
    assert model_attention(model, torch.zeros(1, 256, dtype=torch.long))[0].shape == (
        1,
        2,
        256,
        256,
    )


def test_available_memory_reads_meminfo_and_cgroup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   21000000 kB\n")
    assert _sizes._meminfo_available(str(meminfo)) == 21000000 * 1024
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text("8000000000\n")
    usage.write_text("3000000000\n")
    monkeypatch.setattr(_sizes, "_CGROUP_FILES", ((str(limit), str(usage)),))
    assert _sizes._cgroup_available() == 5 * GB
    limit.write_text("max\n")  # cgroup v2 without a limit
    assert _sizes._cgroup_available() is None
    limit.write_text("8000000000\n")
    monkeypatch.setattr(_sizes, "_meminfo_available", lambda path="": 21 * GB)
    assert _sizes.host_available() == 5 * GB  # the lower of the two


def test_unknown_memory_and_the_override_let_it_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_sizes.NO_CHECK_ENV, raising=False)
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": None)
    _sizes.check_fits(10**15, "x", "y")
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": 1)
    with pytest.raises(ValueError, match="POSENC_NO_MEMORY_CHECK=1"):
        _sizes.check_fits(10**15, "x", "y")
    monkeypatch.setenv(_sizes.NO_CHECK_ENV, "1")
    _sizes.check_fits(10**15, "x", "y")
