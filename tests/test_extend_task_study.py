"""``posenc extend --tasks``: RULER-style task cells as study rows, end to end on a tiny Llama
saved to a folder. Every method answers the same prompts (cached once in ``<out>/prompts``), a
rerun recomputes nothing and rebuilds no prompt, the report gives effective lengths and the
heatmap, and a careless user's input is one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _cli_here import cli
from _tiny import bpe_tokenizer, tiny_folder
from posenc.extend.measures.tasks import get_task, sample_digest
from posenc.extend.measures.tasks.prompts import cached_samples
from posenc.extend.reports.tasks import method_lengths, task_table
from posenc.extend.study.config import StudyConfig, cells
from posenc.extend.study.rows import read_study_rows
from posenc.extend.study.run import study_rows

TRAINED = 128
METHODS = "none,self_extend"  # a rescaling and the extension path: the pairing is the point


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("llama"), TRAINED)


def _args(folder: Path, out: Path, *extra: str) -> list[str]:
    return ["extend", str(folder), "--methods", METHODS, "--lengths", "64,128", "--bin-size", "32",
            "--tasks", "niah_single_1,fwe", "--task-lengths", "384,512",
            "--task-depths", "0.25,0.75", "--samples", "2", "--out", str(out), *extra]  # fmt: skip


@pytest.fixture(scope="module")
def study(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    result = cli(*_args(folder, out))
    assert result.exit_code == 0, result.output
    return out


def test_task_cells_are_rows_every_method_on_the_same_prompts(study: Path) -> None:
    rows = [r for r in study_rows(study) if r["kind"] == "task"]
    # niah at two depths and fwe (no depth), at two lengths, for each of two methods
    assert len(rows) == (2 + 1) * 2 * 2
    assert {r["method"] for r in rows} == set(METHODS.split(","))
    cells_of: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        cells_of.setdefault((r["task"], r["length"], r["depth"]), []).append(r)
        assert r["n"] == 2 and len(r["scores"]) == 2 and r["task_seed"] == 0
        assert 0.0 <= r["low"] <= r["score"] <= r["high"] <= 1.0
        assert (r["depth"] is None) == (r["task"] == "fwe")
    for (task, length, depth), group in cells_of.items():
        assert len(group) == 2
        assert len({tuple(r["digests"]) for r in group}) == 1, (task, length, depth)
        # the digests are those of the task's own samples for the seed
        own = get_task(task).samples(bpe_tokenizer(), length, depth, 2, 0)
        assert group[0]["digests"] == [sample_digest(s) for s in own]
    assert len(list((study / "prompts").glob("*.json"))) == 3 * 2  # one file per cell
    spec = json.loads((study / "run.json").read_text())  # one JSON per run, lm-eval's habit
    assert spec["settings"]["tasks"] == ["niah_single_1", "fwe"]
    assert spec["settings"]["task_samples"] == 2 and spec["model"] == rows[0]["model"]
    assert set(spec["versions"]) >= {"posenc", "torch", "transformers", "python"}


def test_a_rerun_recomputes_nothing_and_rebuilds_no_prompt(folder: Path, study: Path) -> None:
    lines = (study / "results.jsonl").read_text().splitlines()
    prompts = {p: p.stat().st_mtime_ns for p in (study / "prompts").glob("*.json")}
    again = cli(*_args(folder, study))
    assert again.exit_code == 0, again.output
    assert (study / "results.jsonl").read_text().splitlines() == lines
    assert {p: p.stat().st_mtime_ns for p in (study / "prompts").glob("*.json")} == prompts
    assert "effective" in again.output  # the task table with the effective lengths


def test_a_damaged_prompt_file_is_built_again_with_the_same_ids(tmp_path: Path,
                                                                caplog: Any) -> None:  # fmt: skip
    tok = bpe_tokenizer()
    first = cached_samples(tmp_path, tok, "niah_single_1", 384, 0.5, 2, 0, {"m": 1})
    (path,) = (tmp_path / "prompts").glob("*.json")
    path.write_text(json.dumps([{"task": "x"}]))
    again = cached_samples(tmp_path, tok, "niah_single_1", 384, 0.5, 2, 0, {"m": 1})
    assert [s.ids for s in again] == [s.ids for s in first]
    assert "built again" in caplog.text
    # another tokenizer identity or seed is another file, never these prompts
    cached_samples(tmp_path, tok, "niah_single_1", 384, 0.5, 2, 1, {"m": 1})
    cached_samples(tmp_path, tok, "niah_single_1", 384, 0.5, 2, 0, {"m": 2})
    assert len(list((tmp_path / "prompts").glob("*.json"))) == 3


def test_report_gives_effective_lengths_heatmap_and_task_figure(study: Path,
                                                                tmp_path: Path) -> None:  # fmt: skip
    heat, curves = tmp_path / "heat.png", tmp_path / "tasks.svg"
    result = cli("extend", "report", str(study), "--heatmap", str(heat), "--task-figure",
                  str(curves))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert heat.stat().st_size > 10_000 and curves.stat().st_size > 10_000
    md = cli("extend", "report", str(study), "--markdown").output
    assert "effective (85.6%)" in md and "Wilson" in md and "| niah_single_1 | none |" in md
    header, body = task_table(study_rows(study))
    assert header[1:3] == ["score@384", "score@512"] and len(body) == 2


def test_effective_lengths_from_rows_use_none_as_the_reference() -> None:
    def row(method: str, length: int, scores: list[float]) -> dict[str, Any]:
        return {"kind": "task", "method": method, "task": "t", "depth": 0.5, "length": length,
                "n": len(scores), "scores": scores, "seconds": 1.0}  # fmt: skip

    rows = [row("none", 1024, [1, 1, 1, 1]), row("none", 2048, [0, 0, 0, 0]),
            row("yarn", 1024, [1, 1, 1, 0]), row("yarn", 2048, [1, 1, 1, 1])]  # fmt: skip
    got = method_lengths(rows)
    assert got["none"]["absolute"].length == 1024 and got["none"]["relative"].length == 1024
    # yarn: 75% at 1024 is below RULER's 85.6% but at 90% of none's 100%? no: 75 < 90
    assert got["yarn"]["absolute"].length is None
    assert got["yarn"]["relative"].length is None and got["yarn"]["relative"].threshold == 0.9


def test_task_cell_order_is_length_first_every_method_together() -> None:
    from posenc.extend.methods.names import parse_methods

    cfg = StudyConfig(methods=tuple(parse_methods("none,yarn")), lengths=(64, 128), documents=(),
                      bin_size=32, tasks=("niah_single_1", "vt"), task_lengths=(256, 512),
                      task_depths=(0.5,))  # fmt: skip
    got = [(c.length, c.task, c.method.label) for c in cells(cfg)]
    assert got[:4] == [(256, "niah_single_1", "none"), (256, "niah_single_1", "yarn"),
                       (256, "vt", "none"), (256, "vt", "yarn")]  # fmt: skip
    assert cfg.target == 512  # the methods' factors are set for the longest task length


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--tasks", "niah_single_9"], "unknown task 'niah_single_9'"),
        (["--tasks", "vt", "--task-depths", "1.5"], "--task-depths: '1.5'"),
        (["--tasks", "vt", "--task-lengths", "2k,inf"], "--task-lengths: 'inf'"),
        (["--tasks", "vt", "--task-lengths", "512,256"], "(--task-lengths) must increase"),
        (["--tasks", "vt", "--task-lengths", "256,256"], "each given once"),
        (
            ["--tasks", "niah_multikey_3", "--task-lengths", "40"],
            "task niah_multikey_3 at 40 tokens, the shortest task length (--task-lengths",
        ),
        (["--tasks", ""], "--tasks names no task"),
        (["--tasks", " , "], "--tasks names no task"),
        (["--task-lengths", "256"], "--task-lengths is set but no --tasks"),
        (["--task-depths", "0.1"], "--task-depths is set but no --tasks"),
        (["--samples", "2"], "--samples is set but no --tasks"),
        (["--samples", "4"], "--samples is set but no --tasks"),  # its default, but given
        (["--task-depths", "0.5"], "--task-depths is set but no --tasks"),
        (["--task-seed", "3"], "--task-seed is set but no --tasks"),
        (["--tasks", "vt", "--task-depths", ""], "(--task-depths) name no depth"),
        (["--tasks", "vt", "--task-depths", "0.5,0.5"], "given more than once: [0.5, 0.5]"),
    ],
)
def test_bad_task_options_are_one_line_and_write_nothing(
    folder: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    base = ["extend", str(folder), "--methods", "none", "--lengths", "64,128", "--bin-size", "32",
            "--out", str(out)]  # fmt: skip
    result = cli(*base, *extra)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()


def test_another_task_seed_in_the_folder_is_another_study(folder: Path, study: Path) -> None:
    result = cli(*_args(folder, study, "--task-seed", "3"))
    assert result.exit_code != 0 and "another study" in result.output, result.output


def assert_a_row_without_is_skipped(study: Path, tmp_path: Path, kind: str, field: str) -> None:
    """A copy of ``study``'s rows plus one ``kind`` row without ``field``: read with one warning
    naming the field and the kind, the row skipped, never a crash."""
    lines = (study / "results.jsonl").read_text().splitlines()
    row = json.loads(next(x for x in lines if f'"kind": "{kind}"' in x))
    del row[field]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join([*lines, json.dumps(row)]) + "\n")
    with pytest.warns(UserWarning, match=rf"no row\.{field} \(a {kind} row\)"):
        rows = read_study_rows(path)
    assert len(rows) == len(lines)


def test_a_task_row_with_a_field_missing_is_skipped_with_a_warning(study: Path,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    assert_a_row_without_is_skipped(study, tmp_path, "task", "scores")


def test_dry_run_counts_the_task_cells(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "dry"
    result = cli(*_args(folder, out, "--dry-run"))
    assert result.exit_code == 0, result.output
    assert "12 task cells of 2 samples at 384, 512 tokens" in result.output, result.output
    assert "each answer at most" in result.output and not out.exists()


def test_a_length_answered_in_part_is_marked_and_left_out_of_effective_lengths() -> None:
    """A study run in pieces: at 2048 only one of two tasks is answered so far. Its average would
    be that task's alone (100), so it is shown with its share and read by no effective length."""

    def row(task: str, length: int, scores: list[float]) -> dict[str, Any]:
        return {"kind": "task", "method": "none", "task": task, "depth": 0.5, "length": length,
                "n": len(scores), "scores": scores, "seconds": 1.0}  # fmt: skip

    rows = [row("a", 1024, [1, 1]), row("b", 1024, [1, 0]), row("a", 2048, [1, 1])]
    _, body = task_table(rows)
    assert body[0][1:3] == ["75.0", "100.0 (1/2 cells)"]
    got = method_lengths(rows)["none"]
    assert got["relative"].length == 1024 and got["relative"].censored  # 2048 not read


def test_a_study_of_tasks_alone_runs_no_perplexity_forward(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "tasks-only"
    args = ["extend", str(folder), "--methods", "none", "--lengths", "384", "--documents", "0",
            "--tasks", "niah_single_1", "--samples", "1", "--out", str(out)]  # fmt: skip
    dry = cli(*args, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "1 cell (1 method set for 384 tokens; 1 task cell of 1 sample at 384" in dry.output, (
        dry.output
    )
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert [r["kind"] for r in study_rows(out)] == ["task"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "nothing to measure"),
        (["--passkey-lengths", "384", "--passkey-methods", ","], "nothing to measure"),
        (["--tasks", "niah_single_1", "--longppl"], "--longppl measures documents"),
    ],
)
def test_no_documents_needs_something_else_to_measure(
    folder: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    result = cli("extend", str(folder), "--methods", "none", "--lengths", "384", "--documents",
                  "0", "--out", str(out), *extra)  # fmt: skip
    assert result.exit_code != 0 and message in result.output, result.output
    assert not out.exists()


def test_a_heatmap_of_a_study_without_needles_is_refused_before_the_table(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "words"
    run = cli("extend", str(folder), "--methods", "none", "--lengths", "384", "--documents", "0",
               "--tasks", "fwe", "--samples", "1", "--out", str(out))  # fmt: skip
    assert run.exit_code == 0, run.output
    result = cli("extend", "report", str(out), "--heatmap", str(tmp_path / "h.png"))
    assert result.exit_code != 0 and result.output.startswith("error: --heatmap draws the needle")
    assert not (tmp_path / "h.png").exists()


def test_export_of_a_tasks_only_study_keeps_the_factor_it_was_measured_with(
    folder: Path, tmp_path: Path
) -> None:
    """The methods' factors are set for the longest of every kind of length: a task length past
    --lengths counts, in the study and in the exported config alike."""
    out = tmp_path / "tasks"
    run = cli("extend", str(folder), "--methods", "linear", "--lengths", "64", "--documents", "0",
               "--tasks", "niah_single_1", "--task-lengths", "384", "--samples", "1",
               "--out", str(out))  # fmt: skip
    assert run.exit_code == 0, run.output
    (row,) = study_rows(out)
    result = cli("extend", "export", str(out), "--method", "linear", "--out", str(tmp_path / "m"))
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    rope = config.get("rope_parameters") or config.get("rope_scaling")
    assert rope["factor"] == row["settings"]["scaling"]["factor"] == 384 / 128
