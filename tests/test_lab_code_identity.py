"""A cell's identity includes the code that defines its encoding: edit a custom encoding's
module (one character) and its cell trains again; leave it alone and the rerun skips it. Rows
written before the code entered the identity are still read and reported, in their group."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc import registry
from posenc.lab.cells import presets as P
from posenc.lab.cells.identity import code_identity, group_identity
from posenc.lab.grid.experiment import RunOptions, run_grid
from posenc.lab.reports.results import load_rows
from posenc.runs.identity import stable_hash

MODULE = "posenc_test_code_enc"
NAME = "code-penalty"

# One file: a bias and its registration. SLOPE is the character the test edits.
SOURCE = """
import torch
from torch import nn

from posenc.bias import PositionBias
from posenc.registry import BuildContext, register

SLOPE = 0.5


class CodePenalty(PositionBias):
    def __init__(self, num_heads: int) -> None:
        super().__init__(num_heads)
        self.slope = nn.Parameter(torch.full((num_heads,), SLOPE))

    def term(self, device):
        slope = self.slope

        def code_penalty(q_pos, k_pos, head):
            return -slope[head] * (q_pos - k_pos).abs().to(torch.float32)

        return code_penalty


@register("code-penalty", "bias", description="a learned linear distance penalty")
def _build(ctx: BuildContext) -> CodePenalty:
    return CodePenalty(ctx.num_heads)
"""


def tiny_grid() -> P.LabConfig:
    return P.LabConfig(
        preset="test", encodings=(NAME,), train_len=8, seeds=(0,),
        model=P.ModelShape(dim=16, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=2, batch_size=2, warmup_steps=1),
        data=P.DataConfig(source="task", task="copy"),
        eval=P.EvalConfig(lengths=("1x",), tokens=16, batch_tokens=16, rope_scalings=()),
    )  # fmt: skip


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``load(source)`` writes the module and imports it afresh (as a new process would)."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # an edit within a second reads fresh

    def load(source: str) -> Path:
        if NAME in registry.names():
            registry.unregister(NAME)
        sys.modules.pop(MODULE, None)
        path = folder / f"{MODULE}.py"
        path.write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        importlib.import_module(MODULE)
        return path

    yield load
    if NAME in registry.names():
        registry.unregister(NAME)
    sys.modules.pop(MODULE, None)


def run(out: Path):
    return run_grid(tiny_grid(), RunOptions(out=out, quiet=True))


def test_an_edited_module_trains_again_and_an_unchanged_one_skips(plugin, tmp_path: Path) -> None:
    out = tmp_path / "run"
    plugin(SOURCE)
    first = run(out)
    assert len(first.trained) == 1 and not first.skipped
    again = run(out)
    assert again.skipped and not again.trained  # unchanged: finished already

    plugin(SOURCE.replace("SLOPE = 0.5", "SLOPE = 0.6"))  # one character of code
    edited = run(out)
    assert len(edited.trained) == 1 and not edited.skipped, "edited code must rerun"
    assert edited.group == first.group  # the grid's identity holds no code
    assert run(out).skipped  # and the edited code, unchanged since, skips

    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["config_hash"] != rows[1]["config_hash"]
    codes = [r["identity"]["train"]["code"] for r in rows]
    assert codes[0]["module"] == codes[1]["module"] == MODULE
    assert codes[0]["source"] != codes[1]["source"]
    (shown,) = load_rows(out)  # the report shows the cell once: its newest row
    assert shown["config_hash"] == rows[1]["config_hash"]


def test_a_comment_edit_is_an_edit_too(plugin) -> None:
    """The module's source is hashed as a file: any character moves it."""
    plugin(SOURCE)
    before = code_identity(NAME)
    plugin(SOURCE + "# a comment\n")
    after = code_identity(NAME)
    assert before["module"] == after["module"] == MODULE and before != after
    assert "posenc" not in after  # a plugin is its module alone


def test_posenc_encodings_carry_the_version_and_their_module() -> None:
    import posenc
    import posenc.rotary.entries as entries

    code = code_identity("rope")
    assert code["module"] == "posenc.rotary.entries" and code["posenc"] == posenc.__version__
    import hashlib

    want = hashlib.sha256(Path(entries.__file__).read_bytes()).hexdigest()[:16]
    assert code["source"] == want
    # a class registered by register_class is its class's module (FIRE: posenc.bias.fire)
    assert code_identity("fire")["module"] == "posenc.bias.fire"


def test_code_is_not_in_the_group() -> None:
    blob = json.dumps(group_identity(tiny_grid(), "fp"))
    assert '"code"' not in blob and stable_hash(group_identity(tiny_grid(), "fp"))


def test_a_row_without_code_is_reported_and_rerun(plugin, tmp_path: Path) -> None:
    """A row written before the code entered the identity (version 1: no ``code``) is read and
    reported; the skip test does not find it, so the cell trains again, and the report then
    shows the new row in its place (same group)."""
    out = tmp_path / "run"
    plugin(SOURCE)
    run(out)
    path = out / "results.jsonl"
    (row,) = [json.loads(x) for x in path.read_text().splitlines()]
    del row["identity"]["train"]["code"]
    row["config_hash"] = stable_hash(row["identity"])
    row["train_hash"] = stable_hash(row["identity"]["train"])
    path.write_text(json.dumps(row) + "\n")

    res = CliRunner().invoke(
        __import__("posenc.cli", fromlist=["app"]).app,
        ["lab", "report", "--out", str(out), "--no-plots"],
        env={"COLUMNS": "200", "NO_COLOR": "1"},
    )
    assert res.exit_code == 0, res.output
    assert NAME in res.output
    assert [r["config_hash"] for r in load_rows(out)] == [row["config_hash"]]

    rerun = run(out)
    assert len(rerun.trained) == 1 and not rerun.skipped  # not "finished" for the skip test
    (shown,) = load_rows(out)
    assert shown["config_hash"] != row["config_hash"] and "code" in shown["identity"]["train"]


@pytest.fixture
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of posenc's source that the code identity hashes in place of the package (a
    checkout whose files the test may edit); the hash is computed afresh before and after."""
    import shutil

    from posenc.runs import identity

    copy = tmp_path / "posenc"
    shutil.copytree(identity.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "PACKAGE_ROOT", copy)
    identity.package_source_hash.cache_clear()
    yield copy
    identity.package_source_hash.cache_clear()


def test_an_edit_of_posencs_own_source_trains_again(plugin, package_copy, tmp_path) -> None:
    """An edit of ``functional/`` (which computes RoPE, registered in ``rotary/entries.py``)
    moves the identity of posenc's encodings and of a plugin's alike, and the cell trains again;
    an edit outside the source (a bytecode cache) moves nothing."""
    from posenc.runs import identity

    out = tmp_path / "run"
    plugin(SOURCE)
    assert len(run(out).trained) == 1
    before = {name: code_identity(name) for name in ("rope", NAME)}
    (package_copy / "__pycache__").mkdir(exist_ok=True)
    (package_copy / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    identity.package_source_hash.cache_clear()
    assert {name: code_identity(name) for name in ("rope", NAME)} == before
    assert run(out).skipped

    target = sorted((package_copy / "functional").glob("*.py"))[0]
    target.write_text(target.read_text() + "\n# an edit\n")
    identity.package_source_hash.cache_clear()
    after = {name: code_identity(name) for name in ("rope", NAME)}
    for name in ("rope", NAME):
        assert after[name]["package"] != before[name]["package"], name
        assert (
            after[name]["source"] == before[name]["source"]
        )  # the registering module is as it was
    edited = run(out)
    assert len(edited.trained) == 1 and not edited.skipped, "an edit of posenc must rerun"


def test_the_package_hash_covers_every_source_file_once(package_copy: Path) -> None:
    """The hashed set is every .py and .c file of the package (against a walk of the folder
    written here), so a new file or a rename moves the hash too."""
    import os

    from posenc.runs import identity

    walked = sorted(
        Path(d, f).relative_to(package_copy).as_posix()
        for d, _, files in os.walk(package_copy)
        for f in files
        if f.endswith((".py", ".c"))
    )
    got = [p.relative_to(package_copy).as_posix() for p in identity.package_files(package_copy)]
    assert got == walked and any(p.startswith("functional/") for p in got)
    first = identity.package_source_hash()
    (package_copy / "functional" / "new_helper.py").write_text("")
    identity.package_source_hash.cache_clear()
    added = identity.package_source_hash()
    (package_copy / "functional" / "new_helper.py").rename(package_copy / "functional" / "other.py")
    identity.package_source_hash.cache_clear()
    assert len({first, added, identity.package_source_hash()}) == 3
