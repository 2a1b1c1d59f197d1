"""The lab's plumbing: one label parser, a resolved cell, the CLI generated from one flag table,
result rows written from dataclasses and read by one reader (old folders too), and plots that
render without importing the lab."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from pathlib import Path

import pytest

from posenc.lab.cells import cell as C
from posenc.lab.cells import labels as Lb
from posenc.lab.cells import presets as P
from posenc.lab.reports import rows as Rw

ROOT = Path(__file__).resolve().parents[1]
PLOTS = ROOT / "src" / "posenc" / "plots"
RENDERERS = ("lab.py", "extend.py", "passkey.py", "attention.py")


def _posenc_imports(path: Path) -> set[str]:
    """Every posenc module ``path`` imports, wherever the import stands (relative ones resolved
    against ``posenc.plots``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = ["posenc", "plots"][: 3 - node.level]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("posenc")}


@pytest.mark.parametrize("name", RENDERERS)
def test_plots_render_without_importing_the_lab(name: str) -> None:
    lab = sorted(m for m in _posenc_imports(PLOTS / name) if m.startswith("posenc.lab"))
    assert lab == [], f"plots/{name} imports {lab}"


def test_the_import_reader_resolves_relative_imports(tmp_path: Path) -> None:
    """The check above can fail: a renderer that reads the store is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ..lab.reports.results import load_rows\n")
    assert _posenc_imports(bad) == {"posenc.lab.reports.results"}


def test_passkey_chance_is_one_over_the_digit_symbols() -> None:
    from posenc.lab.evaluation.tasks import DIGITS
    from posenc.plots.passkey import CHANCE

    assert 1 / len(DIGITS) == CHANCE


def test_a_label_is_parsed_once_per_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving a grid parses each label string once; its cells read the parsed label."""
    calls: list[str] = []
    real = Lb.parse_encoding

    def counting(spec: str):
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(Lb, "parse_encoding", counting)
    cfg = P.preset("cpu-small")
    labels = C.resolve_labels(("rope:positions=pose", "alibi"))
    assert calls == ["rope:positions=pose", "alibi"]
    cells = [C.resolve_cell(cfg, label, seed, 256, "fp") for seed in (0, 1) for label in labels]
    assert calls == ["rope:positions=pose", "alibi"]  # no second parse
    assert cells[0].positions is not None and cells[0].positions.method == "pose"
    assert cells[0].model.encoding == "rope" and cells[1].model.encoding == "alibi"
    assert cells[2].title == "rope:positions=pose (seed 1)"


def test_the_cell_is_what_the_label_functions_give() -> None:
    cfg = P.preset("cpu-small")
    for label in ("sinusoidal", "rope:nope_every=2:temperature=llama4", "alibi:positions=pose"):
        cell = C.resolve_cell(cfg, label, 3, 256, "fp")
        assert cell.model == P.model_config(cfg, label, 256)
        assert cell.train_id == json.loads(json.dumps(P.train_identity(cfg, label, 3, 256, "fp")))
        assert cell.options == P.lab_options(cfg, label)
        assert cell.config_hash == P.stable_hash(P.cell_identity(cell.train_id, cell.eval_id))


def test_model_identity_is_the_labs_version_1() -> None:
    """How a model config enters a hash is the lab's rule (version 1), not the model's."""
    from posenc.lab.cells.identity import IDENTITY_VERSION, MODEL_FIELDS_WHEN_SET, model_identity
    from posenc.model import ModelConfig

    # version 2 added the code, version 3 posenc's own source; the model rule is version 1
    assert IDENTITY_VERSION == 3
    plain = model_identity(ModelConfig())
    assert not set(MODEL_FIELDS_WHEN_SET) & set(plain)
    assert model_identity(ModelConfig(nope_every=2))["nope_every"] == 2


def test_overrides_and_commands_come_from_the_flag_table() -> None:
    import inspect

    from posenc.lab.cells.flags import LAB_FLAGS, Overrides
    from posenc.lab.cli import extend, lab
    from posenc.lab.extension.flags import EXTEND_FLAGS

    assert [f.name for f in fields(Overrides)] == [f.field for f in LAB_FLAGS if f.grid]
    assert list(inspect.signature(lab).parameters) == ["ctx", *(f.field for f in LAB_FLAGS)]
    assert list(inspect.signature(extend).parameters) == ["ctx", *(f.field for f in EXTEND_FLAGS)]
    every = [d for f in LAB_FLAGS for d in f.decls]
    assert len(every) == len(set(every))  # one spelling per option


def test_build_config_applies_each_knob_to_its_path() -> None:
    from posenc.lab.cells.flags import LAB_FLAGS, Overrides, build_config

    given = {"train_len": 32, "steps": 7, "batch_size": 8, "lr": 0.01, "dim": 64, "layers": 3,
             "heads": 2, "eval_tokens": 4096, "sliding": 16, "ckpt_every": 5,
             "compile_model": True, "include_tests": True, "eval_lens": "1x,128",
             "rope_scalings": "none"}  # fmt: skip
    cfg = build_config("cpu-small", Overrides(**given))
    for flag in LAB_FLAGS:
        if flag.field in given and flag.path:
            got = cfg
            for part in flag.path.split("."):
                got = getattr(got, part)
            want = flag.convert(given[flag.field]) if flag.convert else given[flag.field]
            assert got == want, flag.field
    assert cfg.eval.lengths == ("1x", 128) and cfg.eval.rope_scalings == ()
    assert cfg.train.warmup_steps == 1  # 40 >= 7 steps: a tenth of them


def test_a_row_is_written_from_its_dataclass_in_the_stored_order(tmp_path: Path) -> None:
    from posenc.lab.grid.experiment import RunOptions, run_grid
    from posenc.lab.reports.results import grid_store_rows

    cfg = P.LabConfig(
        preset="test", encodings=("rope",), train_len=8,
        model=P.ModelShape(dim=16, num_layers=1, num_heads=2),
        train=P.TrainConfig(steps=2, batch_size=2, warmup_steps=1),
        data=P.DataConfig(source="task", task="copy"),
        eval=P.EvalConfig(lengths=("1x",), tokens=16, batch_tokens=16, rope_scalings=()),
    )  # fmt: skip
    run_grid(cfg, RunOptions(out=tmp_path, quiet=True))
    (stored,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert list(stored) == [f.name for f in fields(Rw.GridRow)]
    assert list(stored["runtime"]) == [f.name for f in fields(Rw.GridRuntime)]
    assert grid_store_rows(tmp_path) == [stored]
    assert Rw.GridRow.from_dict(stored).to_dict() == stored


def test_an_old_row_reads_with_the_fields_it_lacks(tmp_path: Path) -> None:
    """Rows written before lab options existed have no lab_options/length_method/preset."""
    from posenc.lab.reports.results import grid_store_rows, question_of
    from posenc.runs.store import ResultStore

    old = {"schema": 1, "encoding": "rope", "seed": 0, "config_hash": "c", "group": "g"}
    ResultStore(tmp_path / "results.jsonl").append(old)
    (row,) = grid_store_rows(tmp_path)
    assert row == {**old, **Rw.GRID_ROW_DEFAULTS}
    with pytest.raises(KeyError, match="encoding_name"):
        Rw.GridRow.from_dict(old)  # too old to be a whole row: the field it lacks is named
    assert question_of(row) == "extrapolation"


def test_a_row_of_another_schema_is_refused_with_what_to_do(tmp_path: Path) -> None:
    from posenc.lab.reports.results import load_rows
    from posenc.runs.store import ResultStore

    row = {"schema": 99, "encoding": "rope", "seed": 0, "config_hash": "c", "group": "g"}
    ResultStore(tmp_path / "results.jsonl").append(row)
    with pytest.raises(ValueError, match=r"schema 99.*reads schema 1.*new --out"):
        load_rows(tmp_path)
