"""``posenc extend`` on folders it did not write: nothing in a results or model folder runs code
(a pickle payload in the PoSE checkpoint, a model folder's own Python), one study per results
folder (another model or other settings refused in one line; ``export`` checks the model it
loads against the rows), a row of a known kind with missing or ill-typed fields skipped with a
warning, and atomic exports and PoSE saves (an interrupted one never blocks a rerun), the
fine-tune under the folder lock. Tiny transformers models in temporary folders."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from _cli_here import cli, one_line_error
from _tiny import tiny_folder
from posenc.extend.measures.perplexity import default_documents
from posenc.extend.methods.export import export_model
from posenc.extend.methods.names import parse_method, parse_methods
from posenc.extend.model.load import load_model, resolve_source
from posenc.extend.study.config import StudyConfig
from posenc.extend.study.run import run_study, study_rows
from posenc.runs.lock import folder_lock

TRAINED = 128
STUDY = ["--methods", "none", "--lengths", "64,256", "--bin-size", "32"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("llama"), TRAINED)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another model (three layers): the same tokenizer, a different config."""
    return tiny_folder(tmp_path_factory.mktemp("llama3l"), TRAINED, num_hidden_layers=3)


class _Payload:
    """A pickle that creates ``marker`` when it is loaded (``os.system`` in ``__reduce__``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


# --- nothing from a folder runs code -------------------------------------------------------------


def test_a_pose_checkpoint_whose_pickle_runs_code_never_runs(folder: Path, tmp_path: Path) -> None:
    out, marker = tmp_path / "run", tmp_path / "pwned"
    (out / "pose").mkdir(parents=True)
    torch.save({"config": {}, "model": _Payload(marker)}, out / "pose" / "checkpoint.pt")
    result = cli("extend", str(folder), "--finetune", "pose", "--steps", "2", "--train-len",
                  "64", *STUDY, "--out", str(out))  # fmt: skip
    one_line_error(result, "checkpoint.pt")
    assert not marker.exists()
    assert not (out / "pose-model").exists() and not (out / "results.jsonl").exists()


def test_a_pose_checkpoint_of_another_base_model_is_refused(
    folder: Path, other: Path, tmp_path: Path
) -> None:
    """The checkpoint is tied to the model it fine-tunes, not only to the settings."""
    out = tmp_path / "run"
    args = ["--finetune", "pose", "--steps", "2", "--train-len", "64", *STUDY, "--out", str(out)]
    first = cli("extend", str(folder), *args)
    assert first.exit_code == 0, (first.output, first.exception)
    checkpoint = (out / "pose" / "checkpoint.pt").read_bytes()
    one_line_error(cli("extend", str(other), *args), "checkpoint.pt", "model.")
    assert (out / "pose" / "checkpoint.pt").read_bytes() == checkpoint


def _remote_code_folder(path: Path, marker: Path, *, in_tokenizer: bool = False) -> Path:
    """A model folder whose config names its own Python (``auto_map``), which creates ``marker``
    when it is imported; ``in_tokenizer``: a known model type, the tokenizer's config names it."""
    path.mkdir()
    code = (
        f"open({str(marker)!r}, 'w').close()\nfrom transformers import LlamaConfig as EvilConfig\n"
    )
    (path / "evil.py").write_text(code)
    auto = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
            "AutoTokenizer": ["evil.EvilTokenizer", None]}  # fmt: skip
    config: dict[str, Any] = {"model_type": "llama" if in_tokenizer else "posenc_evil"}
    if not in_tokenizer:
        config["auto_map"] = auto
    (path / "config.json").write_text(json.dumps(config))
    if in_tokenizer:
        (path / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto}))
    return path


@pytest.fixture
def answer_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user at a terminal who answers transformers' "run the custom code? [y/N]" with y."""
    monkeypatch.setattr(builtins, "input", lambda *a, **k: "y")


@pytest.mark.usefixtures("answer_yes")
@pytest.mark.parametrize("in_tokenizer", [False, True])
def test_a_model_folder_that_needs_its_own_code_is_refused(
    tmp_path: Path, in_tokenizer: bool
) -> None:
    marker = tmp_path / "pwned"
    path = _remote_code_folder(tmp_path / "m", marker, in_tokenizer=in_tokenizer)
    with pytest.raises(ValueError, match=r"evil\.py") as err:
        load_model(resolve_source(str(path)))
    assert "\n" not in str(err.value) and not marker.exists()
    result = cli("extend", str(path), *STUDY, "--out", str(tmp_path / "out"))
    one_line_error(result, "evil.py", "auto_map")
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.usefixtures("answer_yes")
def test_transformers_is_never_allowed_remote_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past posenc's own check too (switched off here), transformers is told
    ``trust_remote_code=False``: it refuses, and never asks."""
    import posenc.extend.model.load as M

    monkeypatch.setattr(M, "refuse_folder_code", lambda path: None)
    marker = tmp_path / "pwned"
    path = _remote_code_folder(tmp_path / "m", marker)
    with pytest.raises(ValueError):
        load_model(resolve_source(str(path)))
    assert not marker.exists()


def test_an_unknown_model_type_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "posenc_unheard_of"}))
    with pytest.raises(ValueError, match="posenc_unheard_of"):
        load_model(resolve_source(str(path)))


# --- one study per folder ------------------------------------------------------------------------


def _study(folder: Path, out: Path, *extra: str) -> Any:
    return cli("extend", str(folder), *STUDY, *extra, "--out", str(out))


@pytest.fixture(scope="module")
def study(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("study")
    result = _study(folder, out)
    assert result.exit_code == 0, result.output
    return out


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and "lock" not in p.name}


def test_a_second_study_with_another_model_is_refused(
    folder: Path, other: Path, study: Path
) -> None:
    before = _snapshot(study)
    line = one_line_error(_study(other, study), "another study", "model")
    assert "--out" in line
    assert _snapshot(study) == before
    # The same model and settings again: resumed, nothing written.
    again = _study(folder, study)
    assert again.exit_code == 0, again.output
    assert _snapshot(study) == before


@pytest.mark.parametrize(
    ("extra", "named"),
    [("--bin-size 16", "bin_size"), ("--lengths 64,128", "target"),
     ("--text topics.py", "document topics.py: other contents")],
)  # fmt: skip
def test_a_second_study_with_other_settings_is_refused(
    folder: Path, study: Path, extra: str, named: str, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:  # fmt: skip
    """Another bin size, other lengths (and so another target), or a document of the same name
    with other contents (``topics.py``, here the text of another file)."""
    import posenc.extend.model.load as M

    before = _snapshot(study)
    (tmp_path / "topics.py").write_text(default_documents(2)[1].read_text())
    args = [*STUDY, *(str(tmp_path / a) if a == "topics.py" else a for a in extra.split())]

    def never(*a: Any, **k: Any) -> Any:
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(M, "load_model", never)
    result = cli("extend", str(folder), *args, "--out", str(study))
    one_line_error(result, "another study", named)
    assert _snapshot(study) == before


def test_more_methods_and_documents_in_the_same_study_are_added(
    folder: Path, tmp_path: Path
) -> None:
    """A method or a document added to the same study (same model, lengths, target) is measured
    like the others: kept; and a run of the first settings again still resumes."""
    out = tmp_path / "s"
    assert _study(folder, out).exit_code == 0
    args = ["extend", str(folder), "--methods", "none,linear", "--lengths", "64,256",
            "--bin-size", "32", "--documents", "2", "--out", str(out)]  # fmt: skip
    result = cli(*args)
    assert result.exit_code == 0, result.output
    rows = study_rows(out)
    assert sorted((r["method"], r["document"]) for r in rows) == sorted(
        (m, d.name) for m in ("linear", "none") for d in default_documents(2)
    )
    assert _study(folder, out).exit_code == 0 and len(study_rows(out)) == 4
    names = [d["name"] for d in json.loads((out / "run.json").read_text())["settings"]["documents"]]
    assert names == [d.name for d in default_documents(2)]  # the folder's documents, all of them


def test_the_api_refuses_another_model_in_a_study_folder(
    folder: Path, other: Path, study: Path
) -> None:
    cfg = StudyConfig(tuple(parse_methods("none")), (64, 256), (str(default_documents(1)[0]),), 32)
    source = resolve_source(str(other))
    model, tok = load_model(source)
    with pytest.raises(ValueError, match="another study"):
        run_study(model, tok, source, cfg, study)


def test_a_folder_with_the_rows_of_two_models_is_not_reported_as_one_table(
    study: Path, tmp_path: Path
) -> None:
    """A folder into which an older posenc wrote a second study of another model."""
    run = tmp_path / "run"
    run.mkdir()
    (row,) = [json.loads(line) for line in (study / "results.jsonl").read_text().splitlines()]
    model = {**row["model"], "config_hash": "0" * 12, "source": "/elsewhere/other-model"}
    other = {**row, "model": model, "config_hash": "f" * 12}
    (run / "results.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(other) + "\n")
    for args in ([], ["--markdown"]):
        result = cli("extend", "report", str(run), *args)
        one_line_error(result, "2 models", "config_hash")


def test_export_refuses_a_run_json_that_the_rows_do_not_match(
    study: Path, other: Path, tmp_path: Path
) -> None:
    """A ``run.json`` naming another model than its rows (as an older posenc overwrote it)."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("results.jsonl", "run.json"):
        (run / name).write_bytes((study / name).read_bytes())
    spec = json.loads((run / "run.json").read_text())
    spec["source"]["path"] = str(other)
    spec["model"] = {**spec["model"], "source": str(other), "config_hash": "0" * 12}
    (run / "run.json").write_text(json.dumps(spec))
    out = tmp_path / "exported"
    result = cli("extend", "export", str(run), "--method", "yarn", "--out", str(out))
    one_line_error(result, "model")
    assert not out.exists()


def test_export_refuses_a_model_folder_changed_since_the_study(
    folder: Path, tmp_path: Path
) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    for p in folder.iterdir():
        (model_dir / p.name).write_bytes(p.read_bytes())
    run = tmp_path / "run"
    assert _study(model_dir, run).exit_code == 0
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-3}))
    out = tmp_path / "exported"
    result = cli("extend", "export", str(run), "--method", "yarn", "--out", str(out))
    one_line_error(result, "changed since")
    assert not out.exists()


# --- rows read by one schema ---------------------------------------------------------------------


def test_a_row_of_a_known_kind_with_bad_fields_is_skipped_with_a_warning(
    study: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    good = (study / "results.jsonl").read_text()
    row = json.loads(good.splitlines()[0])
    missing = {k: v for k, v in row.items() if k != "ppl"} | {"config_hash": "a" * 12}
    typed = {**row, "ppl": {"64": "high"}, "config_hash": "b" * 12}
    seconds = {**row, "seconds": "slow", "config_hash": "c" * 12}
    passkey = {**row, "kind": "passkey", "config_hash": "d" * 12}  # no length, depth, ranks...
    bad = [missing, typed, seconds, passkey]
    (run / "results.jsonl").write_text(good + "".join(json.dumps(r) + "\n" for r in bad))
    (run / "run.json").write_bytes((study / "run.json").read_bytes())
    with pytest.warns(UserWarning) as caught:
        rows = study_rows(run)
    assert len(rows) == 1
    texts = [str(w.message) for w in caught]
    for line in (2, 3, 4, 5):
        assert any(f"results.jsonl:{line}:" in t for t in texts), texts
    assert any("ppl" in t for t in texts)
    for args in ([], ["--markdown"]):
        result = cli("extend", "report", str(run), *args)
        assert result.exit_code == 0, (result.output, result.exception)
        assert "none" in result.output


def test_a_rerun_recomputes_a_cell_whose_row_cannot_be_read(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert _study(folder, out).exit_code == 0
    path = out / "results.jsonl"
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text(json.dumps({k: v for k, v in row.items() if k != "ppl"}) + "\n")
    with pytest.warns(UserWarning, match="ppl"):
        result = _study(folder, out)
    assert result.exit_code == 0, result.output
    (again,) = study_rows(out)
    assert again["ppl"] == row["ppl"]


# --- atomic saves and exports --------------------------------------------------------------------


def _interrupt_after_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """``save_pretrained`` killed after it wrote ``config.json``, before any weights."""
    real = transformers.PreTrainedModel.save_pretrained

    def killed(self: Any, path: Any, *a: Any, **k: Any) -> None:
        self.config.save_pretrained(path)
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", killed)
    assert real is not killed


def test_an_interrupted_export_never_blocks_a_rerun(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, tok = load_model(resolve_source(str(folder)))
    out = tmp_path / "exported"
    with monkeypatch.context() as m:
        _interrupt_after_config(m)
        with pytest.raises(KeyboardInterrupt):
            export_model(model, tok, parse_method("yarn"), 256, out)
    assert not out.exists()
    assert export_model(model, tok, parse_method("yarn"), 256, out) == out
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exported"]  # no temporary left


def test_an_interrupted_pose_save_never_blocks_a_rerun(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = ["extend", str(folder), "--finetune", "pose", "--steps", "2", "--train-len", "64",
            *STUDY, "--out", str(out)]  # fmt: skip
    with monkeypatch.context() as m:
        _interrupt_after_config(m)
        first = cli(*args)
    assert first.exit_code != 0 and "resumed" not in first.output, first.output  # interrupted
    assert not (out / "pose-model").exists()
    killed = out / ".pose-model.0123456789ab.partial"  # what a kill -9 mid-save leaves
    killed.mkdir()
    (killed / "config.json").write_text("{}")
    result = cli(*args)
    assert result.exit_code == 0, (result.output, result.exception)
    assert "resumed PoSE at step 2 of 2" in result.output
    assert (out / "pose-model" / "model.safetensors").is_file()
    assert not killed.exists()  # removed under the folder's lock


def test_the_pose_fine_tune_runs_under_the_folder_lock(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    with folder_lock(out, command="posenc extend"):
        result = cli("extend", str(folder), "--finetune", "pose", "--steps", "2", "--train-len",
                      "64", *STUDY, "--out", str(out))  # fmt: skip
    # The refusal names the command whose folder it is, not the lab's.
    one_line_error(result, "in use by another posenc extend run")
    assert not (out / "pose").exists()
