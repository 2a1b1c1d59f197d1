"""``posenc lab extend``: the fine-tune jobs, their scaling dicts, rows, the table, and a kill -9
during a fine-tune followed by ``--resume`` (no row lost or duplicated, numbers bit for bit)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _cli_here import posenc_here
from posenc.lab.cells import presets as P
from posenc.lab.extension.extend import run_extend
from posenc.lab.extension.plan import (
    ExtendConfig,
    base_cells,
    default_curve,
    jobs,
    method_model,
    resolve,
)
from posenc.lab.grid.experiment import RunOptions, run_grid
from posenc.lab.reports.extend_report import (
    extend_lines,
    extend_rows,
    extend_table,
    steps_to_reference,
)
from posenc.lab.reports.report import load_rows
from posenc.lab.reports.rows import EXTEND, REFERENCE
from posenc.runs.store import RESULTS_FILE, ResultStore

ROOT = Path(__file__).resolve().parents[1]
EXT_ARGS = ["--target", "2", "--steps", "40", "--curve", "5,10,20", "--methods", "none,linear",
            "-e", "rope,alibi", "--threads", "1", "-q", "--no-plots"]  # fmt: skip


def test_default_curve_is_log_spaced_below_the_steps():
    assert default_curve(10) == (1, 2, 5)
    assert default_curve(11) == (1, 2, 5, 10)
    assert default_curve(1) == ()
    assert default_curve(100) == (1, 2, 5, 10, 20, 50)


def test_resolve_fills_defaults_from_the_grid_and_refuses_bad_values():
    base = P.TrainConfig(steps=500, lr=3e-3, min_lr_ratio=0.1)
    got = resolve(ExtendConfig(), base)
    assert got.steps == 10  # 2% of 500
    assert got.lr == pytest.approx(3e-4)  # where the grid's cosine ended
    assert got.curve == (1, 2, 5)
    for bad, match in (
        (ExtendConfig(target=1.0), "target"),
        (ExtendConfig(steps=0), "steps"),
        (ExtendConfig(methods=("pi",)), "RoPE methods must be some of"),
        (ExtendConfig(methods=("default",)), "RoPE methods must be some of"),  # = none
        (ExtendConfig(methods=()), "RoPE methods must be some of"),
        (ExtendConfig(encodings=()), "no encodings"),
        (ExtendConfig(encodings=("nope-such",)), "nope-such"),
        (ExtendConfig(encodings=("xpos",)), "'xpos' cannot be extended"),
        (ExtendConfig(encodings=("learned",)), "'learned' cannot be extended"),
        (ExtendConfig(encodings=("rope",), reference=("alibi",)), "must also be extended"),
        (ExtendConfig(target=float("inf")), "target"),
        (ExtendConfig(target=float("nan")), "target"),
        (ExtendConfig(target=1e9), "target"),
        (ExtendConfig(steps=10, curve=(10,)), "curve steps"),
        (ExtendConfig(lr=-1.0), "lr"),
    ):
        with pytest.raises(ValueError, match=match):
            resolve(bad, base)


# --- a tiny grid, extended -----------------------------------------------------------------


def _tiny(corpus: Path) -> P.LabConfig:
    return P.LabConfig(
        encodings=("rope", "alibi", "none"),
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=60, batch_size=4, warmup_steps=5),
        data=P.DataConfig(source="text", path=str(corpus)),
        eval=P.EvalConfig(lengths=("1x", "2x", "4x"), tokens=256, batch_tokens=128),
        ckpt_every=30,
        threads=1,
    )


@pytest.fixture(scope="module")
def grid(tmp_path_factory, write_corpus):
    tmp = tmp_path_factory.mktemp("extend")
    mp = pytest.MonkeyPatch()
    mp.setenv("POSENC_CACHE", str(tmp / "cache"))
    corpus = write_corpus(tmp, limit=6)
    out = tmp / "grid"
    run_grid(_tiny(corpus), RunOptions(out=out, quiet=True))
    yield tmp, out
    mp.undo()


def _extend_cli(out: Path, *extra: str, wait: bool = True) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "posenc", "lab", "extend", *EXT_ARGS, "--out", str(out), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    if wait:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output.decode()
    return proc


@pytest.fixture(scope="module")
def extended(grid):
    tmp, out = grid
    ext = tmp / "extended"
    shutil.copytree(out, ext)
    _extend_cli(ext)
    return ext


def test_jobs_scale_rope_by_the_target_factor_and_leave_biases_unchanged(grid):
    _, out = grid
    rows = load_rows(out)
    bases = base_cells(rows, ("rope", "alibi"))
    assert [b.label for b in bases] == ["rope", "alibi"]  # NoPE is not extendable
    cfg = resolve(ExtendConfig(target=4.0, steps=8), bases[0].train)
    todo = jobs(bases, cfg)
    kinds = [(j.kind, j.base.label, j.method) for j in todo]
    assert kinds == [(EXTEND, "rope", m) for m in cfg.methods] + [
        (EXTEND, "alibi", "none"),
        (REFERENCE, "rope", "none"),
    ]
    for job in todo:
        assert job.model.max_len == 64
        scaling = job.model.encoding_kwargs.get("scaling")
        if job.method == "none":
            assert scaling is None
        else:
            # The factor a user sets (T / L), for dynamic too (not eval length / L).
            assert scaling["rope_type"] == job.method and scaling["factor"] == 4.0
    longrope = method_model(bases[0], "longrope", 64).encoding_kwargs["scaling"]
    assert len(longrope["long_factor"]) == 8  # head_dim 16: 8 rotated pairs
    # The reference: the grid's steps and tokens per step, in sequences 4x as long.
    ref, grid_train = todo[-1].train, bases[0].train
    assert ref.batch_size == 1 and ref.steps == grid_train.steps and ref.lr == grid_train.lr
    assert ref.batch_size * 64 == grid_train.batch_size * 16


def test_extend_rows_and_table(extended):
    rows = extend_rows(extended)
    tuned = [r for r in rows if r["kind"] == EXTEND]
    labels = {r["label"] for r in tuned}
    assert labels == {"rope", "rope + PI", "alibi"}
    for label in labels:
        steps = sorted(r["step"] for r in tuned if r["label"] == label)
        assert steps == [0, 5, 10, 20, 40]
    # Zero-shot and final rows cover every eval length; curve rows the target only.
    for r in tuned:
        lengths = r["eval"]["lengths"]
        assert lengths == ([16, 32, 64] if r["step"] in (0, 40) else [32])
    # The grid's own report still reads the grid rows (the extend rows are another kind).
    assert {r["encoding"] for r in load_rows(extended)} == {"rope", "alibi", "none"}
    assert not any(r.get("kind") for r in load_rows(extended))  # newest rows are extend's
    header, body = extend_table(rows)
    assert header[0] == "extension" and header[-1].startswith("steps to scratch+0.02")
    assert header[-2].endswith("− scratch @2L")
    assert [b[0] for b in body][:3] == ["rope", "rope + PI", "alibi"]
    assert body[-1][0] == "rope @32 from scratch (60 steps x 2 x 32)"


def test_steps_to_reference_reads_the_first_step_within_tolerance(extended):
    lines = extend_lines(extend_rows(extended))
    ref = next(x for x in lines if x.kind == REFERENCE)
    line = next(x for x in lines if x.label == "rope + PI")
    ref_bits = ref.bits(ref.steps, ref.target_len)
    curve = line.curve()
    # Independent reading of the same rule on the curve itself.
    want = next((str(s) for s, b in curve if b <= ref_bits + 0.02), f"> {line.steps}")
    assert steps_to_reference(line, ref, 0.02) == want
    assert steps_to_reference(line, ref, 100.0) == "0"  # everything is within 100 bits
    assert steps_to_reference(line, None) == "n/a"


def test_rerun_skips_finished_jobs(extended):
    before = (extended / RESULTS_FILE).read_text()
    summary = run_extend(
        ExtendConfig(
            target=2.0,
            steps=40,
            curve=(5, 10, 20),
            methods=("none", "linear"),
            encodings=("rope", "alibi"),
        ),
        RunOptions(out=extended, quiet=True, threads=1),
    )
    assert summary.written == 0 and summary.skipped == 4
    assert (extended / RESULTS_FILE).read_text() == before


def _metrics(row):
    return {n: r["bits"] for n, r in row["eval"]["variants"]["base"]["results"].items()}


@pytest.mark.slow
def test_killed_extend_resumes_without_lost_or_duplicated_rows(grid, extended):
    tmp, out = grid
    ext = tmp / "killed"
    shutil.copytree(out, ext)
    store = ResultStore(ext / RESULTS_FILE)
    n_grid = len(store.rows())
    proc = _extend_cli(ext, wait=False)
    deadline = time.time() + 240
    # Kill inside the first fine-tune, after its zero-shot and a curve row are stored and a
    # checkpoint of a later step exists.
    while time.time() < deadline and proc.poll() is None:
        last = list((ext / "extend").glob("extend-rope-none-*/last.pt"))
        if last and len(store.rows()) >= n_grid + 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    partial = store.rows()
    assert n_grid < len(partial)

    # No --resume: refused, never a silent restart. This and the resume read the folder the
    # killed process left, in this process.
    assert "--resume" in posenc_here("lab", "extend", *EXT_ARGS, "--out", str(ext), code=2)
    posenc_here("lab", "extend", *EXT_ARGS, "--out", str(ext), "--resume")
    lines = [json.loads(x) for x in (ext / RESULTS_FILE).read_text().splitlines() if x.strip()]
    keys = [(r["encoding"], r["seed"], r["config_hash"]) for r in lines]
    assert len(keys) == len(set(keys))  # nothing written twice
    got = {(r["label"], r["step"]): r for r in extend_rows(ext)}
    want = {(r["label"], r["step"]): r for r in extend_rows(extended)}
    assert got.keys() == want.keys()  # nothing lost
    for key, row in want.items():
        assert row["config_hash"] == got[key]["config_hash"]
        assert _metrics(got[key]) == _metrics(row), key  # bit for bit


def test_extend_figure_and_report_section(extended, tmp_path):
    pytest.importorskip("matplotlib")
    from typer.testing import CliRunner

    from posenc.cli import app
    from posenc.plots.report import build_report

    png = tmp_path / "extend.png"
    r = CliRunner().invoke(app, ["plot", "extend", "--results", str(extended), "--out", str(png)])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 10_000
    from posenc.lab.reports.extend_report import extend_data
    from posenc.plots.extend import draw_extend

    data = extend_data(extend_rows(extended))
    assert not any(m["key_curve"] for m in data["methods"])  # a byte grid: no passkey panel
    assert len(draw_extend(data).axes) == 2
    page = build_report(extended, kinds=["extend", "length"])
    assert 'id="extend"' in page and 'id="extend-table"' in page and "<img" in page
    assert "rope + PI" in page
    assert "No length results" in page and "posenc lab --encodings length" in page


def test_lab_report_question_extend_writes_the_readme_block(extended, tmp_path):
    from typer.testing import CliRunner

    from posenc.cli import app

    readme = tmp_path / "R.md"
    readme.write_text("a\n<!-- lab:extend -->\n<!-- /lab:extend -->\nb\n")
    args = ["lab", "report", "--out", str(extended), "--no-plots", "--readme", str(readme)]
    r = CliRunner().invoke(app, [*args, "--question", "extend"])
    assert r.exit_code == 0, r.output
    text = readme.read_text()
    assert "| rope + PI |" in text and "Trained at L=16, fine-tuned at 32" in text
    r = CliRunner().invoke(app, [*args, "--question", "passkey"])
    assert r.exit_code == 2 and "no passkey results" in r.output
    r = CliRunner().invoke(app, [*args, "--question", "width"])
    assert r.exit_code == 2 and "--question must be one of" in r.output


def test_rows_of_an_older_configuration_stay_their_own_line(extended):
    import copy

    rows = extend_rows(extended)
    old = copy.deepcopy(next(r for r in rows if r["kind"] == REFERENCE))
    old["identity"]["train"]["batch_size"] = 99  # as if written before a change of the bar
    for result in old["eval"]["variants"]["base"]["results"].values():
        result["bits"] = 0.0
    lines = extend_lines([old, *rows])
    refs = [x for x in lines if x.kind == REFERENCE]
    assert len(refs) == 2  # not averaged together
    tuned = next(x for x in lines if x.label == "rope")
    from posenc.lab.reports.extend_report import reference_for

    assert reference_for(tuned, lines) is refs[-1]  # the newest is the bar
    assert refs[-1].bits(refs[-1].steps, refs[-1].target_len) != 0.0


def test_extend_a_passkey_grid_keeps_the_heatmap(tmp_path, monkeypatch):
    """A grid on the passkey task (its eval identity holds the heatmap settings) extends too,
    and the fine-tuned models get their length x depth heatmap."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    cfg = P.LabConfig(
        encodings=("rope",),
        train_len=16,
        model=P.ModelShape(dim=32, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=4, batch_size=4, warmup_steps=1),
        data=P.DataConfig(source="task", task="passkey"),
        eval=P.EvalConfig(lengths=("1x", "2x"), tokens=64, batch_tokens=64, rope_scalings=()),
        threads=1,
    )
    out = tmp_path / "pk"
    run_grid(cfg, RunOptions(out=out, quiet=True))
    ext = ExtendConfig(target=2.0, steps=2, methods=("none", "yarn"), encodings=("rope",),
                       reference=())  # fmt: skip
    summary = run_extend(ext, RunOptions(out=out, quiet=True))
    assert summary.written == 2 * 3  # zero-shot, step 1, step 2 for each method
    rows = extend_rows(out)
    for row in rows:
        heat = row["eval"]["variants"]["base"]["passkey"]
        assert len(heat["acc"]) == len(row["eval"]["lengths"])
        assert row["identity"]["model"]["max_len"] == 32
    header, body = extend_table(rows)
    assert header[-2:] == ["key acc 0-shot @2L", "key acc 2 steps @2L"]
    assert not any("scratch" in h for h in header)  # no reference: no columns against one
    final = next(r for r in rows if r["label"] == "rope + YaRN" and r["step"] == 2)
    heat = final["eval"]["variants"]["base"]["passkey"]
    want = sum(heat["acc"][heat["lengths"].index(32)]) / len(heat["depths"])
    yarn = next(cells for cells in body if cells[0] == "rope + YaRN")
    assert yarn[-1] == f"{want:.2f}"  # the mean over depths at 2L, recomputed here

    # The figure's third panel: key accuracy at 2L at every evaluated step (curve rows too).
    from posenc.lab.reports.extend_report import extend_data
    from posenc.plots.extend import draw_extend

    data = extend_data(rows)
    method = next(m for m in data["methods"] if m["label"] == "rope + YaRN")
    assert method["key_steps"] == [0, 1, 2]
    for step, got in zip(method["key_steps"], method["key_curve"], strict=True):
        row = next(r for r in rows if r["label"] == "rope + YaRN" and r["step"] == step)
        heat = row["eval"]["variants"]["base"]["passkey"]
        acc = heat["acc"][heat["lengths"].index(32)]
        assert got == pytest.approx(sum(acc) / len(acc))
    if importlib.util.find_spec("matplotlib") is not None:
        fig = draw_extend(data)
        assert len(fig.axes) == 3 and "Passkey at 32 tokens" in fig.axes[2].get_title()


def test_reference_needs_whole_sequences_and_a_plain_cell(grid):
    from dataclasses import replace as _replace

    from posenc.lab.extension.plan import same_tokens

    train = P.TrainConfig(batch_size=6)
    with pytest.raises(ValueError, match="whole sequences"):
        same_tokens(train, 16, 64)  # 6 x 16 = 96 tokens are not whole sequences of 64
    assert same_tokens(train, 16, 48).batch_size == 2
    _, out = grid
    bases = base_cells(load_rows(out), ("rope", "alibi"))
    cfg = resolve(ExtendConfig(target=4.0, steps=4), bases[0].train)
    # A rope cell with options is extended but is not the bar for plain RoPE.
    tuned = _replace(bases[0], row=_replace(bases[0].row, encoding="rope:base=500"))
    kinds = [(j.kind, j.base.label) for j in jobs([tuned, bases[1]], cfg)]
    assert (REFERENCE, "rope:base=500") not in kinds and kinds[0] == (EXTEND, "rope:base=500")


def test_new_methods_and_curve_points_join_the_same_table(grid, tmp_path):
    """A rerun with another method adds its lines to the table; one with another curve
    measures the new points (training again, deterministically) instead of skipping."""
    _, out = grid
    ext = tmp_path / "more"
    shutil.copytree(out, ext)
    base = dict(target=2.0, steps=6, encodings=("rope",), reference=("rope",))
    opts = RunOptions(out=ext, quiet=True, threads=1)
    first = run_extend(ExtendConfig(**base, methods=("none",), curve=(2,)), opts)
    second = run_extend(ExtendConfig(**base, methods=("none", "linear"), curve=(2,)), opts)
    assert second.group == first.group
    labels = [x.label for x in extend_lines(extend_rows(ext))]
    assert labels == ["rope", "rope @32 from scratch", "rope + PI"]
    _, body = extend_table(extend_rows(ext))
    assert all(cells[-1] != "n/a" for cells in body if "scratch" not in cells[0])
    third = run_extend(ExtendConfig(**base, methods=("none",), curve=(2, 3)), opts)
    assert third.written == 1  # the step-3 row of `rope`, nothing else
    steps = sorted(r["step"] for r in extend_rows(ext) if r["label"] == "rope")
    assert steps == [0, 2, 3, 6]


def test_a_seed_that_stopped_early_is_not_averaged(extended):
    import copy

    rows = extend_rows(extended)
    line = next(x for x in extend_lines(rows) if x.label == "rope + PI")
    want = line.bits(0, 16)
    # Seed 1 of the same line stopped after its zero-shot row: the line stays seed 0's.
    extra = copy.deepcopy(next(r for r in rows if r["label"] == "rope + PI" and r["step"] == 0))
    extra["seed"] = 1
    for result in extra["eval"]["variants"]["base"]["results"].values():
        result["bits"] += 1.0
    again = next(x for x in extend_lines([*rows, extra]) if x.label == "rope + PI")
    assert again.seeds == {0} and again.bits(0, 16) == want
