"""``posenc lab`` refuses a bad option in one line, naming the option, what was wrong and what
is allowed, before anything trains: RoPE rescalings, empty lists, the device, huge integers,
eval lengths, an output folder that cannot be written; a full disk mid-run is one line too."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

import posenc.cli_errors as cli_errors
import posenc.runs.checkpoint as checkpoint
from posenc.cli import app
from posenc.lab.cells.cell import resolve_cell
from posenc.lab.cells.flags import INT_CAPS, Overrides, build_config
from posenc.lab.grid import experiment

HUGE = "1" + "0" * 400
#: A grid that trains in about a second: what a refusal must stop before.
TINY = ("-e", "rope", "--steps", "2", "--dim", "16", "--layers", "1", "--heads", "2",
        "--train-len", "8", "--eval-lens", "8,16", "--eval-tokens", "64", "--seeds", "1",
        "--task", "copy", "--no-plots")  # fmt: skip


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "250", "NO_COLOR": "1"})
    return res.exit_code, res.output


def one_line(code: int, output: str, *needles: str) -> str:
    lines = output.strip().splitlines()
    assert code != 0, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "Traceback" not in output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def nothing_written(out: Path) -> None:
    assert not (out / "results.jsonl").exists()
    assert not list(out.glob("ckpt/*/*.pt")), list(out.rglob("*"))


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the grid started: the mistake was not caught before training")

    monkeypatch.setattr(experiment, "run_grid", refuse)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--rope-scalings", "yarnn"], ["--rope-scalings", "'yarnn'", "allowed: linear, ntk"]),
        (["--rope-scalings", "none,yarn"], ["--rope-scalings", "stands alone", "yarn"]),
        (["--rope-scalings", ""], ["--rope-scalings is empty", "none alone"]),
        (["-e", ""], ["--encodings is empty", "posenc list"]),
        (["-e", "rope,,alibi"], ["--encodings 'rope,,alibi' has an empty item", "posenc list"]),
        (["-e", "rope,"], ["--encodings 'rope,' has an empty item"]),
        (["--device", "tpu"], ["--device must be one of auto, cpu, cuda", "'tpu'"]),
        (["--device", "cpu:1"], ["--device must be one of", "'cpu:1'"]),
        (["--steps", HUGE], ["--steps must be at most", "more than 30 digits"]),
        (["--steps", str(INT_CAPS["steps"] + 1)], ["--steps must be at most 1000000000"]),
        (["--batch-size", HUGE], ["--batch-size must be at most"]),
        (["--dim", HUGE], ["--dim must be at most"]),
        (["--seeds", HUGE], ["--seeds must be at most 1000"]),
        (["--train-len", HUGE], ["--train-len must be at most"]),
        (["--eval-lens", ""], ["--eval-lens is empty", "4x"]),
        (["--eval-lens", "2x,,4x"], ["--eval-lens '2x,,4x' has an empty item"]),
        (["--eval-lens", "0"], ["--eval-lens '0'", "positive"]),
        (["--eval-lens", "-4"], ["--eval-lens '-4'", "positive"]),
        (["--eval-lens", "abc"], ["--eval-lens 'abc'", "positive integer", "'4x'"]),
        (["--eval-lens", "0x"], ["--eval-lens '0x'", "positive multiple"]),
        (["--eval-lens", HUGE], ["--eval-lens", "at most 16777216 tokens"]),
        (["--threads", HUGE], ["--threads must be at most 4096"]),
        (["--seed", HUGE], ["--seed must be at most"]),
        (["--lr", HUGE], ["--lr must be a positive finite number", "inf"]),
    ],
)
@pytest.mark.usefixtures("no_training")
def test_refused_before_training(args: list[str], needles: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    one_line(*invoke("lab", "-q", "-o", str(out), *args), *needles)
    nothing_written(out)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--steps", HUGE], ["--steps must be at most"]),
        (["--threads", HUGE], ["--threads must be at most"]),
        (["--target", HUGE], ["--target must be a finite multiple", "inf"]),
        (["--methods", ""], ["--methods is empty", "some of none, linear"]),
        (["--methods", "yarnn"], ["--methods", "'yarnn'", "allowed: none, linear"]),
        (["--methods", "ntk,,yarn"], ["--methods 'ntk,,yarn' has an empty item"]),
        (["-e", ""], ["--encodings is empty"]),
        (["--reference", "rope,"], ["--reference 'rope,' has an empty item", "or none"]),
        (["--curve", "1,,2"], ["--curve '1,,2' has an empty item", "integers"]),
        (["--device", "tpu"], ["--device must be one of auto, cpu, cuda"]),
    ],
)
def test_extend_refusals(args: list[str], needles: list[str], tmp_path: Path) -> None:
    """``posenc lab extend``: its options refused before the grid's results are read."""
    out = tmp_path / "out"
    one_line(*invoke("lab", "extend", "-q", "-o", str(out), *args), *needles)
    nothing_written(out)


def test_bad_rescaling_is_refused_by_a_real_process(tmp_path: Path) -> None:
    """The original bug: the cell trained and failed afterwards. Here nothing is patched."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "posenc", "lab", "-q", "-o", str(out), *TINY]
    res = subprocess.run([*cmd, "--rope-scalings", "yarnn"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    one_line(res.returncode, res.stderr, "--rope-scalings", "'yarnn'", "allowed:")
    nothing_written(out)


def test_python_api_gets_the_same_refusals() -> None:
    """A grid built without the command line is refused where its cells are resolved."""
    cfg = build_config("cpu-small", Overrides(encodings="rope"))
    for bad, needle in (
        (replace(cfg, eval=replace(cfg.eval, rope_scalings=("yarnn",))), "'yarnn'"),
        (replace(cfg, eval=replace(cfg.eval, rope_scalings=("none", "yarn"))), "stands alone"),
        (replace(cfg, eval=replace(cfg.eval, lengths=(0,))), "--eval-lens"),
        (replace(cfg, train=replace(cfg.train, steps=10**400)), "--steps must be at most"),
    ):
        with pytest.raises(ValueError, match=needle):
            resolve_cell(bad, "rope", 0, 256, "x")


@pytest.mark.parametrize(
    ("err", "needle"),
    [
        (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
        (OSError(errno.EROFS, "Read-only file system"), "read-only file system"),
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    ],
)
@pytest.mark.usefixtures("no_training")
def test_unwritable_out_is_refused(
    err: OSError, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only --out (simulated: the tests may run as root, which writes anywhere), for
    ``posenc lab`` and ``posenc lab report``."""

    def probe(folder: Path) -> None:
        raise err

    monkeypatch.setattr(cli_errors, "_probe", probe)
    out = tmp_path / "ro"
    out.mkdir()
    for args in (("lab", "-q", "-o", str(out), *TINY), ("lab", "report", "-o", str(out))):
        one_line(*invoke(*args), f"--out {out}: cannot write there", needle, "writable folder")
    nothing_written(out)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
@pytest.mark.usefixtures("no_training")
def test_read_only_out_for_real(tmp_path: Path) -> None:
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        one_line(*invoke("lab", "-q", "-o", str(out / "run"), *TINY), "--out", "cannot write")
        one_line(*invoke("lab", "report", "-o", str(out)), "--out", "cannot write")
    finally:
        out.chmod(0o700)


@pytest.mark.usefixtures("no_training")
def test_out_that_is_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line(*invoke("lab", "-q", "-o", str(blocker), *TINY), f"--out {blocker}: not a folder")
    one_line(*invoke("lab", "-q", "-o", str(blocker / "sub"), *TINY), "--out", "cannot write")


def test_full_disk_while_writing_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's write fails as a full disk does: one line naming it, not a failed
    cell's exception text or a torch internal error, and no result row."""

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    out = tmp_path / "out"
    line = one_line(*invoke("lab", "-q", "-o", str(out), *TINY), "no space left on device writing")
    assert str(out) in line and "Errno" not in line
    nothing_written(out)


def test_os_error_message() -> None:
    msg = cli_errors.os_error_message
    full = OSError(errno.ENOSPC, "No space left on device", "runs/lab/results.jsonl")
    assert msg(full) == "no space left on device writing runs/lab/results.jsonl"
    assert msg(OSError(errno.ENOSPC, "x"), "under runs/lab") == (
        "no space left on device writing under runs/lab"
    )
    denied = PermissionError(errno.EACCES, "Permission denied", "corpus.txt")
    assert msg(denied) == "Permission denied: corpus.txt"
