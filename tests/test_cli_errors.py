"""The command line's edges: a user's mistake is one line, ``error: ...``, exit code 2, never a
traceback, and a bad lab option is refused before anything trains; ``--version``; flags shown
as flags; preset defaults in ``posenc lab --help``; ``posenc list PATTERN``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posenc import __version__
from posenc.cli import app
from posenc.lab.cells.presets import PRESETS
from posenc.lab.grid import experiment

WIDE = {"COLUMNS": "250", "NO_COLOR": "1"}  # help tables on one line per option


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), env=WIDE)
    return res.exit_code, res.output


def assert_one_line_error(code: int, output: str, *needles: str) -> str:
    lines = output.strip().splitlines()
    assert code == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the lab gets as far as running its grid."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the grid started: the mistake was not caught before training")

    monkeypatch.setattr(experiment, "run_grid", refuse)


def test_version() -> None:
    code, out = invoke("--version")
    assert code == 0 and out.strip() == f"posenc {__version__}"


@pytest.mark.parametrize(
    "args",
    [["--help"], ["lab", "--help"], ["plot", "bias", "--help"], ["bench", "rope", "--help"]],
)
def test_flags_show_no_bool_metavar(args: list[str]) -> None:
    code, out = invoke(*args)
    assert code == 0, out
    assert "<bool>" not in out and "BOOLEAN" not in out
    assert "--help" in out


def test_lab_help_shows_each_presets_defaults() -> None:
    code, out = invoke("lab", "--help")
    assert code == 0, out
    steps = ", ".join(f"{name} {cfg.train.steps}" for name, cfg in PRESETS.items())
    dims = ", ".join(f"{name} {cfg.model.dim}" for name, cfg in PRESETS.items())
    lens = ", ".join(f"{name} {cfg.train_len}" for name, cfg in PRESETS.items())
    flat = " ".join(out.split())  # the help table may still wrap a long default
    for shown in (steps, dims, lens):
        assert shown in flat, (shown, out)


def test_list_filters_names() -> None:
    code, out = invoke("list", "ROPE")
    names = [line.split()[1] for line in out.splitlines() if line.startswith("│ ")]
    assert code == 0 and names == ["rope", "mrope"], out
    code, out = invoke("list", "t*")
    names = [line.split()[1] for line in out.splitlines() if line.startswith("│ ")]
    assert code == 0 and names == ["t5", "transformer-xl"], out
    assert_one_line_error(*invoke("list", "rpoe"), "did you mean 'rope'")


def test_demo_order_names() -> None:
    assert_one_line_error(
        *invoke("demo", "order", "--encodings", "none,foo"), "unknown encoding 'foo'", "registered:"
    )
    assert_one_line_error(*invoke("demo", "order", "--encodings", "alibbi"), "did you mean 'alibi'")
    assert_one_line_error(*invoke("demo", "order", "--a", "x y"), "give both --a and --b")
    assert_one_line_error(*invoke("demo", "order", "--a", "x y", "--b", "x z"), "same tokens")
    code, out = invoke("demo", "order", "--a", "x y z", "--b", "z y x", "--encodings", "ALiBi,none")
    assert code == 0 and "alibi" in out, out


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--dim", "-8"], ["'--dim'"]),
        (["--heads", "0"], ["'--heads'"]),
        (["--steps", "0"], ["'--steps'"]),
        (["--threads", "0"], ["'--threads'"]),
        (["--train-len", "1"], ["'--train-len'"]),
        (["--dim", "abc"], ["'--dim'"]),
        (["--lr", "-1"], ["--lr must be a positive finite number", "-1.0"]),
        (["--dim", "100", "--heads", "3"], ["--dim (100) must be divisible by --heads (3)"]),
        (["--dim", "12", "--heads", "4", "-e", "rope"], ["'rope'", "head_dim must be even"]),
        (["-e", "kerple:eps=null"], ["'kerple:eps=null'", "option 'eps'", "must be float"]),
        (["-e", "rpoe"], ["unknown encoding 'rpoe'", "did you mean 'rope'"]),
        (["--device", "nonsense"], ["--device must be one of auto, cpu, cuda", "nonsense"]),
        (["--preset", "tiny"], ["unknown preset 'tiny'"]),
        (["--nosuch"], ["No such option: --nosuch"]),
    ],
)
@pytest.mark.usefixtures("no_training")
def test_lab_mistakes_are_one_line_before_training(
    args: list[str], needles: list[str], tmp_path: Path
) -> None:
    assert_one_line_error(*invoke("lab", "-q", "-o", str(tmp_path), *args), *needles)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.usefixtures("no_training")
def test_lab_cuda_without_cuda(tmp_path: Path) -> None:
    assert_one_line_error(
        *invoke("lab", "-q", "-o", str(tmp_path), "--device", "cuda"), "CUDA is not available"
    )


def test_lab_text_missing_or_unreadable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = str(tmp_path / "out")
    missing = str(tmp_path / "missing.txt")
    assert_one_line_error(*invoke("lab", "-q", "-o", out, "--text", missing), "names no file")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("x" * 10_000)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.name == "corpus.txt":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    args = ("lab", "-q", "-o", out, "-e", "none", "--text", str(corpus))
    assert_one_line_error(*invoke(*args), "Permission denied", "corpus.txt")


def test_plot_into_an_unwritable_place(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert_one_line_error(*invoke("plot", "bias", "-o", str(blocker / "b.png")), "cannot write")
    assert_one_line_error(*invoke("plot", "all", "--out-dir", str(blocker / "d")), "cannot create")
    assert_one_line_error(*invoke("report", "-o", str(blocker / "r.html")), "cannot create")


def test_bad_numbers_in_plots_are_one_line() -> None:
    assert_one_line_error(*invoke("plot", "bias", "--heads", "0"), "'--heads'")
    assert_one_line_error(*invoke("plot", "wavelengths", "--factor", "0.5"), "factor must be > 1")
    assert_one_line_error(*invoke("nosuch"), "No such command 'nosuch'")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["plot", "table"],
            "posenc plots need matplotlib: pip install -e '.[plots]' in the posenc clone",
        ),
        (["plot", "bias"], "the package 'matplotlib', which is not installed"),
    ],
)
def test_missing_matplotlib_is_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    """In a fresh process where ``import matplotlib`` fails, as without the plots extra."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from posenc.cli import main\n"
        f"sys.argv = ['posenc', *{args!r}, '-o', 'fig.png']\n"
        "main()\n"
    )
    env = {**os.environ, **WIDE}
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert_one_line_error(res.returncode, res.stdout + res.stderr, needle)


def test_lab_labels_take_the_registry_spelling() -> None:
    """Names are case-insensitive, labels key the preset's options and the results: one spelling."""
    from posenc.lab.cells.presets import model_config
    from posenc.lab.cli import Overrides, build_config

    cfg = build_config("cpu-small", Overrides(encodings="Sinusoidal,ALiBi:x=1,rope"))
    assert cfg.encodings == ("sinusoidal", "alibi:x=1", "rope")
    # the preset's sinusoidal options (scale_input) still apply to the spelling given
    assert model_config(cfg, cfg.encodings[0], 256).encoding_kwargs == {"scale_input": True}


def test_a_full_disk_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check_can_write`` (every ``--out``) refuses a disk with less than 16 MiB free, naming
    the option, the folder and the space, before anything is written."""
    import shutil
    from collections import namedtuple

    from posenc import cli_errors

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 2**20, 2**20))
    with pytest.raises(ValueError, match=r"--out .*new: its disk has 1\.0 MiB free, under the 16"):
        cli_errors.check_can_write(tmp_path / "new", "--out")
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 0, 10**9))
    cli_errors.check_can_write(tmp_path / "new", "--out")
