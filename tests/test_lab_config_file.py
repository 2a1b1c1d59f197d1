"""``posenc lab --config grid.toml``: every flag a key (from the one flag table), unknown keys
and wrong types refused in one line, flags beside --config override the file, and a file runs
the grid its flags run, bit for bit."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from posenc.cli import app
from posenc.lab import cli as lab_cli
from posenc.lab.cells.flags import LAB_FLAGS, Overrides, build_config
from posenc.lab.grid import grid_file
from posenc.lab.grid.grid_file import file_keys, read_grid_file
from posenc.runs.store import RESULTS_FILE, ResultStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "grid.toml"


def _lab_command():
    """The click command `posenc lab` is (its group's callback takes the options)."""
    return typer.main.get_command(lab_cli.lab_app)


def test_the_file_is_read_by_tomllib_or_on_python_3_10_by_tomli():
    """Python 3.11+ reads the file with the standard library's tomllib; 3.10 (which
    requires-python admits) with its backport tomli, a dependency there only: so on 3.10 every
    test here reads through tomli, its refusal of a file that is not TOML included."""
    want = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    assert grid_file.tomllib.__name__ == want


def test_every_option_of_the_command_is_a_key_and_nothing_else():
    """The keys against the options click itself builds for `posenc lab`."""
    longs = set()
    for param in _lab_command().params:
        names = [o for o in param.opts if o.startswith("--")]
        if names and names[0] not in (
            "--config",
            "--help",
            "--install-completion",
            "--show-completion",
        ):
            longs.add(names[0].removeprefix("--"))
    assert set(file_keys(LAB_FLAGS)) == longs


class _Captured(Exception):
    pass


def resolved(monkeypatch, args, command=("lab",), run="_run_lab"):
    """What `posenc COMMAND ARGS` hands the run (the keyword arguments of ``posenc.lab.cli``'s
    ``run`` function: ``_run_lab``, or ``_run_extend`` for ``lab extend``), not run."""
    seen = {}

    def capture(**kw):
        seen.update(kw)
        raise _Captured

    monkeypatch.setattr(lab_cli, run, capture)
    res = CliRunner().invoke(app, [*command, *args])
    assert isinstance(res.exception, _Captured), res.output
    return seen


FLAGS = ["-e", "none,rope:base=500", "-p", "cpu", "-L", "24", "--eval-lens", "1x,40",
         "--seeds", "2", "--seed", "3", "--steps", "7", "--batch-size", "3", "--lr", "2",
         "--dim", "16", "--layers", "1", "--heads", "2", "--eval-tokens", "200", "--sliding", "8",
         "--rope-scalings", "yarn,ntk", "--task", "copy", "--no-include-tests", "--out", "o/x",
         "--resume", "--threads", "1", "--jobs", "1", "--force", "none", "--report-to", "none",
         "--import", "json", "--import", "math", "--device", "cpu", "--ckpt-every", "5",
         "--compile", "-q", "--no-plots", "--dry-run"]  # fmt: skip
TOML = """
encodings = ["none", "rope:base=500"]
preset = "cpu"
train-len = 24
eval-lens = ["1x", 40]
seeds = 2
seed = 3
steps = 7
batch-size = 3
lr = 2
dim = 16
layers = 1
heads = 2
eval-tokens = 200
sliding = 8
rope-scalings = "yarn,ntk"
task = "copy"
include-tests = false
out = "o/x"
resume = true
threads = 1
jobs = 1
force = ["none"]
report-to = "none"
import = ["json", "math"]
device = "cpu"
ckpt-every = 5
compile = true
quiet = true
plots = false
dry-run = true
"""


def test_a_file_resolves_to_what_the_same_flags_give(monkeypatch, tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(TOML)
    by_flags = resolved(monkeypatch, FLAGS)
    by_file = resolved(monkeypatch, ["--config", str(path)])
    assert by_file == by_flags
    grid = {k: v for k, v in by_file.items() if k in Overrides.__dataclass_fields__}
    assert build_config("cpu", Overrides(**grid)) == build_config(
        "cpu", Overrides(**{k: by_flags[k] for k in grid})
    )
    # a flag beside --config wins over the file's key; the file fills the rest
    over = resolved(monkeypatch, ["--config", str(path), "--steps", "9", "--plots"])
    assert over == {**by_flags, "steps": 9, "plots": True}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("train_len = 16", "unknown key 'train_len' (did you mean 'train-len'?); allowed keys: "
         "encodings, preset, train-len"),
        ("colour = 1", "unknown key 'colour'; allowed keys: encodings"),
        ('steps = "3"', "key 'steps' takes an integer, got '3'"),
        ("steps = true", "key 'steps' takes an integer, got true"),
        ("steps = [3]", "key 'steps' takes an integer, got a list"),
        ("steps = 0", "key 'steps' must be >= 1, got 0"),
        ("lr = 'fast'", "key 'lr' takes a number, got 'fast'"),
        ("plots = 1", "key 'plots' takes true or false, got 1"),
        ("encodings = []", "key 'encodings' takes a string or a non-empty list of strings"),
        ("encodings = [true]", "key 'encodings' takes a string or a non-empty list"),
        ("[train]\nsteps = 3", "unknown key 'train'"),
        ("steps = ", "not valid TOML"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_in_one_line(tmp_path, text, said):
    path = tmp_path / "grid.toml"
    path.write_text(text + "\n")
    res = CliRunner().invoke(app, ["lab", "--config", str(path), "--dry-run"])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert res.output.startswith(f"error: --config {path}: ") and said in res.output, res.output


def test_a_missing_file_is_one_line(tmp_path):
    res = CliRunner().invoke(app, ["lab", "--config", str(tmp_path / "no.toml")])
    assert res.exit_code == 2 and "error: --config: no file" in res.output, res.output


def test_the_documented_example_loads_and_is_in_the_docs():
    given = read_grid_file(EXAMPLE, LAB_FLAGS)
    grid = {k: v for k, v in given.items() if k in Overrides.__dataclass_fields__}
    cfg = build_config(given.get("preset", "cpu-small"), Overrides(**grid))
    assert cfg.encodings == ("rope", "alibi", "t5") and cfg.train_len == 64
    page = (ROOT / "docs" / "lab.md").read_text()
    blocks = re.findall(r"^```toml\n(.*?)^```$", page, re.M | re.S)  # extend.toml's too
    body = [ln for ln in EXAMPLE.read_text().splitlines() if ln and not ln.startswith("#")]
    assert "examples/grid.toml" in page and body in [b.splitlines() for b in blocks]


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch, write_corpus):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    return write_corpus(tmp_path)


def test_a_tiny_grid_from_a_file_gives_the_rows_of_its_flags(corpus_dir, tmp_path):
    args = ["-e", "none", "--text", str(corpus_dir), "-L", "16", "--dim", "32", "--layers", "1",
            "--heads", "2", "--steps", "4", "--batch-size", "4", "--eval-tokens", "128",
            "--eval-lens", "1x,32", "--jobs", "1", "--threads", "1", "-q", "--no-plots"]  # fmt: skip
    runner = CliRunner()
    res = runner.invoke(app, ["lab", *args, "--out", str(tmp_path / "a")])
    assert res.exit_code == 0, res.output
    path = tmp_path / "grid.toml"
    path.write_text(
        f'encodings = ["none"]\ntext = "{corpus_dir}"\ntrain-len = 16\ndim = 32\nlayers = 1\n'
        'heads = 2\nsteps = 4\nbatch-size = 4\neval-tokens = 128\neval-lens = ["1x", 32]\n'
        f'jobs = 1\nthreads = 1\nquiet = true\nplots = false\nout = "{tmp_path / "b"}"\n'
    )
    res = runner.invoke(app, ["lab", "--config", str(path)])
    assert res.exit_code == 0, res.output
    (a,) = ResultStore(tmp_path / "a" / RESULTS_FILE).rows()
    (b,) = ResultStore(tmp_path / "b" / RESULTS_FILE).rows()
    assert untimed(a) == untimed(b) and a["train"]["loss_curve_bits"]


def untimed(row):
    """``row`` less what the clock decides (runtime, finish time, seconds, throughput): every
    number of the run itself is kept, and compared exactly."""
    clock = ("runtime", "finished_at", "seconds", "train_seconds", "tokens_per_s",
             "tokens_per_s_fast", "tokens_per_cpu_s")  # fmt: skip
    if isinstance(row, dict):
        return {k: untimed(v) for k, v in row.items() if k not in clock}
    return row
