"""Every file ``posenc extend`` reads, checked as a stranger's would be: a row with values no
study writes (no sample, a length of -768 or 0, a depth of 7.5, an unknown task or metric)
skipped with a warning naming the file and the line; two rows of one cell refused in one line
naming both; a ``run.json`` of wrong types, a ``results.jsonl`` that is a symbolic link, an
export that runs out of disk, ``export --method none`` and an option given twice in a method,
each one ``error:`` line and nothing written. The rows are real ones (the packaged SmolLM2
study's), edited as a careless hand would."""

from __future__ import annotations

import errno
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import transformers

from _cli_here import cli, one_line_error
from _tiny import tiny_folder
from posenc.extend.methods.export import export_model
from posenc.extend.methods.names import parse_method
from posenc.extend.model.load import load_model, resolve_source
from posenc.extend.study.run import study_rows

REAL = Path(__file__).parents[1] / "benchmarks" / "studies" / "smollm2-135m" / "results.jsonl"
TRAINED = 128


def _task_rows() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in REAL.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["kind"] == "task"]


def _folder(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ({"scores": [], "outputs": [], "references": [], "target_logprobs": [],
          "new_tokens": [], "digests": [], "n": 0}, "row.n is 0"),
        ({"length": -768}, "row.length is -768"),
        ({"length": 0}, "row.length is 0"),
        ({"depth": 7.5}, "row.depth is 7.5"),
        ({"task": "niah_single_9"}, "row.task is 'niah_single_9'"),
        ({"metric": "exact_match"}, "row.metric is 'exact_match'"),
        ({"scores": [1.5, 0.0]}, "outside [0, 1]"),
        ({"digests": ["a"]}, "row.digests holds 1 entries, not n = 2"),
    ],
)  # fmt: skip
def test_a_row_with_values_no_study_writes_is_skipped_naming_file_and_line(
    tmp_path: Path, edit: dict[str, Any], why: str
) -> None:
    good, bad = _task_rows()[:2]
    assert good["n"] == 2  # the edits above are of a real 2-sample cell
    run = _folder(tmp_path, [good, {**bad, **edit}])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = study_rows(run)
    assert rows == [good]  # the other row is kept, read as written
    said = [str(w.message) for w in caught]
    assert any(f"{run / 'results.jsonl'}:2:" in s and why in s for s in said), said
    report = cli("extend", "report", str(run))  # no division by zero, no traceback
    assert report.exit_code == 0, report.output


def test_two_rows_of_one_cell_are_refused_naming_both_lines(tmp_path: Path) -> None:
    row = _task_rows()[0]
    other = {**row, "scores": [1.0] * row["n"], "score": 1.0}  # the same cell, another answer
    run = _folder(tmp_path, [row, _task_rows()[1], other])
    result = cli("extend", "report", str(run))
    one_line_error(result, "results.jsonl:1 and", "results.jsonl:3", row["task"], "two answers")
    # the same cell under another key (a hand-edited hash) is refused the same way
    (run / "results.jsonl").write_text(
        json.dumps(row) + "\n" + json.dumps({**other, "config_hash": "0" * 16}) + "\n"
    )
    one_line_error(cli("extend", "summary", str(run)), "results.jsonl:2", "two answers")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("llama"), TRAINED)


@pytest.fixture(scope="module")
def study(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("study")
    result = cli("extend", str(folder), "--methods", "none", "--lengths", "64",
                  "--bin-size", "32", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ({"study": "64"}, "run.json.study is '64', not an object"),
        ({"study": {"lengths": "64", "passkey_lengths": []}}, "run.json.study.lengths is '64'"),
        ({"study": {"lengths": [64.5], "passkey_lengths": []}}, "run.json.study.lengths[0]"),
        ({"study": {"lengths": [-768], "passkey_lengths": []}}, "holds -768"),
        ({"study": {"lengths": [], "passkey_lengths": []}}, "records no length"),
        ({"dtype": 32}, "run.json.dtype is 32"),
        ({"dtype": "float8"}, "not one of float32"),
        ({"source": ["x"]}, "run.json.source"),
    ],
)
def test_an_export_of_a_run_json_of_wrong_types_is_one_line(
    study: Path, tmp_path: Path, edit: dict[str, Any], needle: str
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    spec = json.loads((study / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**spec, **edit}))
    out = tmp_path / "exported"
    result = cli("extend", "export", str(run), "--method", "yarn", "--out", str(out))
    one_line_error(result, str(run / "run.json"), needle)
    assert not out.exists()


def test_an_export_of_none_is_refused(study: Path, tmp_path: Path) -> None:
    """``none`` would be written with the evaluated length as max_position_embeddings, which the
    next study reads as the length it was trained at."""
    out = tmp_path / "exported"
    result = cli("extend", "export", str(study), "--method", "none", "--out", str(out))
    one_line_error(result, "none is the model as trained")
    assert not out.exists()


@pytest.mark.parametrize("error", ["enospc", "safetensors"])
def test_an_export_out_of_disk_is_one_line_and_leaves_nothing(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    from safetensors import SafetensorError

    def full(self: Any, path: Any, *a: Any, **k: Any) -> None:
        self.config.save_pretrained(path)  # part of the folder written, then the disk is full
        (Path(path) / "model.safetensors").write_bytes(b"\0" * 100)
        if error == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")  # fmt: skip

    model, tok = load_model(resolve_source(str(folder)))
    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    out = tmp_path / "exported"
    with pytest.raises(ValueError, match="is the disk full") as caught:
        export_model(model, tok, parse_method("yarn"), 256, out)
    assert str(out) in str(caught.value) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # no partial folder left, aside or in place


def test_a_results_jsonl_that_is_a_link_is_refused_before_a_row_is_written(
    folder: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.jsonl").symlink_to(elsewhere)
    result = cli("extend", str(folder), "--methods", "none", "--lengths", "64",
                  "--bin-size", "32", "--out", str(out))  # fmt: skip
    one_line_error(result, str(out / "results.jsonl"), "symbolic link")
    assert elsewhere.read_text() == ""


def test_an_option_given_twice_in_a_method_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'factor' of 'yarn' is given twice"):
        parse_method("yarn:factor=0:factor=4")  # the 0 would never be checked
    result = cli("extend", "smollm2", "--methods", "self_extend:group_size=4:group_size=8")
    one_line_error(result, "'group_size'", "given twice")
