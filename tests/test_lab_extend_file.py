"""``posenc lab extend --config extend.toml`` and ``--report-to tensorboard``: every extend option
a key (from its one flag table), unknown keys and wrong types refused in one line, options beside
--config override the file, a file runs the extend its options run (the same rows, bit for bit),
and each run the extend trains writes its metrics.jsonl and event file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from _tiny import tiny_lab_config
from posenc.cli import app
from posenc.lab import cli as lab_cli
from posenc.lab.extension.extend import run_extend
from posenc.lab.extension.plan import EXTEND_DIR, ExtendConfig
from posenc.lab.grid.experiment import RunOptions, run_grid
from posenc.lab.grid.grid_file import file_keys, read_grid_file, tomllib
from posenc.lab.reports.rows import EXTEND, REFERENCE
from posenc.runs.checkpoint import FINAL, read_checkpoint
from posenc.runs.metrics import KEYS, METRICS_FILE
from posenc.runs.store import RESULTS_FILE, ResultStore
from test_lab_config_file import resolved, untimed
from test_lab_metrics import strict_lines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "extend.toml"
EXTEND_FLAGS = lab_cli.EXTEND_FLAGS


def _extend_command():
    """The click command `posenc lab extend` is."""
    return typer.main.get_command(lab_cli.lab_app).commands["extend"]


def test_every_option_of_extend_is_a_key_and_nothing_else():
    """The keys against the options click itself builds for `posenc lab extend`."""
    longs = set()
    for param in _extend_command().params:
        names = [o for o in param.opts if o.startswith("--")]
        if names and names[0] not in ("--config", "--help"):
            longs.add(names[0].removeprefix("--"))
    assert set(file_keys(EXTEND_FLAGS)) == longs
    assert {"target", "methods", "curve", "report-to", "import"} <= longs


def _resolved(monkeypatch, args):
    """What `posenc lab extend ARGS` hands the run (``_run_extend``'s keyword arguments)."""
    return resolved(monkeypatch, args, ("lab", "extend"), "_run_extend")


FLAGS = ["-o", "o/x", "-g", "abc123", "--target", "2", "--steps", "7", "--lr", "0.001",
         "--methods", "none,yarn", "-e", "rope,alibi", "--reference", "none", "--curve", "1,2,5",
         "--resume", "--threads", "1", "--report-to", "none", "--import", "json",
         "--import", "math", "--device", "cpu", "-q", "--no-plots"]  # fmt: skip
TOML = """
out = "o/x"
group = "abc123"
target = 2
steps = 7
lr = 0.001
methods = ["none", "yarn"]
encodings = "rope,alibi"
reference = ["none"]
curve = [1, 2, 5]
resume = true
restart = false
threads = 1
report-to = "none"
import = ["json", "math"]
device = "cpu"
quiet = true
plots = false
"""


def test_a_file_resolves_to_what_the_same_options_give(monkeypatch, tmp_path):
    path = tmp_path / "extend.toml"
    path.write_text(TOML)
    assert set(tomllib.loads(TOML)) == set(file_keys(EXTEND_FLAGS))  # every key, once
    by_flags = _resolved(monkeypatch, FLAGS)
    by_file = _resolved(monkeypatch, ["--config", str(path)])
    assert by_file == by_flags
    assert {k: type(v) for k, v in by_file.items()} == {k: type(v) for k, v in by_flags.items()}
    assert lab_cli.extend_config(by_file) == lab_cli.extend_config(by_flags) == ExtendConfig(
        target=2.0, steps=7, lr=0.001, methods=("none", "yarn"), encodings=("rope", "alibi"),
        reference=(), curve=(1, 2, 5),
    )  # fmt: skip
    # an option beside --config wins over the file's key; the file fills the rest
    over = _resolved(monkeypatch, ["--config", str(path), "--steps", "9", "--plots"])
    assert over == {**by_flags, "steps": 9, "plots": True}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("targets = 2", "unknown key 'targets' (did you mean 'target'?); allowed keys: out, "
         "group, target, steps"),
        ("train-len = 16", "unknown key 'train-len'"),  # a key of posenc lab's, not of extend's
        ("colour = 1", "unknown key 'colour'; allowed keys: out, group"),
        ('steps = "3"', "key 'steps' takes an integer, got '3'"),
        ("steps = 0", "key 'steps' must be >= 1, got 0"),
        ("target = 'far'", "key 'target' takes a number, got 'far'"),
        ("threads = 1.5", "key 'threads' takes an integer, got 1.5"),
        ("curve = []", "key 'curve' takes a string or a non-empty list of strings"),
        ("methods = [true]", "key 'methods' takes a string or a non-empty list"),
        ("plots = 1", "key 'plots' takes true or false, got 1"),
        ("[extend]\nsteps = 3", "unknown key 'extend'"),
        ("steps = ", "not valid TOML"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_in_one_line(tmp_path, text, said):
    path = tmp_path / "extend.toml"
    path.write_text(text + "\n")
    res = CliRunner().invoke(app, ["lab", "extend", "--config", str(path), "-o", str(tmp_path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
    assert res.output.startswith(f"error: --config {path}: ") and said in res.output, res.output


def test_a_files_value_is_checked_as_its_option_is(tmp_path):
    """A well-typed value the option refuses is refused as the option's, before any grid is read."""
    path = tmp_path / "extend.toml"
    for text, said in (('methods = ["yarnn"]', "--methods: unknown method 'yarnn'; allowed:"),
                       ('report-to = "wandb"', "--report-to must be one of none, tensorboard"),
                       ("target = inf", "--target must be a finite multiple")):  # fmt: skip
        path.write_text(text + "\n")
        res = CliRunner().invoke(app, ["lab", "extend", "--config", str(path), "-o", str(tmp_path)])
        assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
        assert said in res.output, res.output
    res = CliRunner().invoke(app, ["lab", "extend", "--config", str(tmp_path / "no.toml")])
    assert res.exit_code == 2 and "error: --config: no file" in res.output, res.output


def test_the_documented_example_loads_and_is_in_the_docs():
    cfg = lab_cli.extend_config(read_grid_file(EXAMPLE, EXTEND_FLAGS))
    assert cfg.methods == ("none", "linear", "yarn") and cfg.encodings == ("rope", "alibi")
    assert (cfg.target, cfg.steps, cfg.reference, cfg.curve) == (4.0, 20, ("rope",), (1, 2, 5, 10))
    grid = read_grid_file(ROOT / "examples" / "grid.toml", lab_cli.LAB_FLAGS)
    assert read_grid_file(EXAMPLE, EXTEND_FLAGS)["out"] == grid["out"]  # it extends that grid
    page = (ROOT / "docs" / "lab.md").read_text()
    blocks = re.findall(r"^```toml\n(.*?)^```$", page, re.M | re.S)
    body = [ln for ln in EXAMPLE.read_text().splitlines() if ln and not ln.startswith("#")]
    assert "examples/extend.toml" in page and body in [b.splitlines() for b in blocks]


# --- a tiny grid, extended from a file and from flags -------------------------------------------


@pytest.fixture(scope="module")
def grid(tmp_path_factory, write_corpus):
    """A finished grid of RoPE and ALiBi cells (train length 16), the extends' base."""
    tmp = tmp_path_factory.mktemp("extend-file")
    mp = pytest.MonkeyPatch()
    mp.setenv("POSENC_CACHE", str(tmp / "cache"))
    corpus = write_corpus(tmp, limit=6)
    out = tmp / "grid"
    assert not run_grid(
        tiny_lab_config(corpus, ("rope", "alibi")), RunOptions(out=out, quiet=True, jobs=1)
    ).failed
    yield out
    mp.undo()


def _extend_rows(out: Path) -> list[dict]:
    rows = ResultStore(out / RESULTS_FILE).rows()
    return [untimed(r) for r in rows if r.get("kind") in (EXTEND, REFERENCE)]


def test_the_example_file_gives_the_rows_of_its_options(grid, tmp_path):
    """`--config examples/extend.toml` (with a shorter run beside it) against the same options
    spelled as flags: the same rows, every number compared exactly."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(grid, a)
    shutil.copytree(grid, b)
    short = ["--target", "2", "--steps", "3", "--curve", "1,2", "--threads", "1", "-q"]
    runner = CliRunner()
    res = runner.invoke(app, ["lab", "extend", "--config", str(EXAMPLE), *short, "-o", str(a)])
    assert res.exit_code == 0, res.output
    flags = ["--methods", "none,linear,yarn", "-e", "rope,alibi", "--reference", "rope",
             "--report-to", "none", "--no-plots"]  # fmt: skip
    res = runner.invoke(app, ["lab", "extend", *flags, *short, "-o", str(b)])
    assert res.exit_code == 0, res.output
    rows = _extend_rows(a)
    # rope: 3 methods x (step 0, curve 1 and 2, step 3) rows; alibi: 4; the reference: 1
    assert len(rows) == 3 * 4 + 4 + 1 and rows == _extend_rows(b)
    assert not list(a.glob("report/extend.png"))  # plots = false, from the file
    assert (a / "report" / "extend.md").exists()


def test_tensorboard_event_files_hold_each_runs_curve(grid, tmp_path):
    """`--report-to tensorboard`: every run the extend trains (a fine-tune, the reference) has
    an event file beside its metrics.jsonl whose scalars are that file's numbers, and whose
    loss is the run's loss curve (its final checkpoint's statistics)."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "out"
    shutil.copytree(grid, out)
    cfg = ExtendConfig(target=2.0, steps=3, methods=("none",), encodings=("rope",), curve=(1,))
    opts = RunOptions(out=out, quiet=True, threads=1, report_to="tensorboard")
    assert run_extend(cfg, opts).written == 3 + 1
    folders = sorted((out / EXTEND_DIR).iterdir())
    assert [f.name.split("-s0-")[0] for f in folders] == ["extend-reference-rope-none",
                                                          "extend-rope-none"]  # fmt: skip
    for folder in folders:
        assert list(folder.glob("events.out.tfevents.*")), folder
        events = EventAccumulator(str(folder))
        events.Reload()
        lines = strict_lines(folder / METRICS_FILE)
        for key in KEYS:
            got = [(e.step, e.value) for e in events.Scalars(f"train/{key}")]
            assert got == [(r["step"], float(np.float32(r[key]))) for r in lines], (folder, key)
        stats = read_checkpoint(folder / FINAL)["stats"]
        curve = [(e.step, e.value) for e in events.Scalars("train/loss_bits")]
        assert curve == [(s, float(np.float32(v))) for s, v in stats["loss_curve_bits"]]
        assert [s for s, _ in curve] == list(range(1, stats["steps"] + 1))
