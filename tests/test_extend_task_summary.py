"""``posenc extend summary``: several studies' task scores on one screen (posenc.extend.
task_summary). The scores, the bold trained length, partial lengths, the relative bar, the highest
method and the missing cells are checked against values worked out by hand from the rows below;
bad folders are refused in one line; the block is written between its markers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from posenc.cli import app
from posenc.extend.reports.summary import study_line, summary_markdown, summary_table

ROOT = Path(__file__).resolve().parent.parent


def row(model: str, trained: int, method: str, task: str, length: int,
        scores: list[float], dtype: str = "bfloat16") -> dict[str, Any]:  # fmt: skip
    return {"kind": "task", "method": method, "task": task, "depth": 0.5, "length": length,
            "n": len(scores), "scores": scores, "seconds": 60.0 * len(scores), "threads": 1,
            "digests": [f"{task}|{length}|{i}" for i in range(len(scores))],
            "model": {"source": f"/cache/{model}", "trained_length": trained,
                      "dtype": dtype}}  # fmt: skip


# model A, trained at 2048: two tasks, two methods; at 4096 yarn has answered one task of two
SMALL = [
    row("a.gguf", 2048, "none", "niah", 1024, [1.0, 1.0]),
    row("a.gguf", 2048, "none", "vt", 1024, [1.0, 0.0]),  # none @1024: (1 + 0.5) / 2 = 75 %
    row("a.gguf", 2048, "yarn", "niah", 1024, [1.0, 1.0]),
    row("a.gguf", 2048, "yarn", "vt", 1024, [1.0, 1.0]),  # yarn @1024: 100 %
    row("a.gguf", 2048, "none", "niah", 2048, [0.0, 1.0]),
    row("a.gguf", 2048, "none", "vt", 2048, [0.0, 0.0]),  # none @2048: 25 %
    row("a.gguf", 2048, "yarn", "niah", 2048, [1.0, 1.0]),
    row("a.gguf", 2048, "yarn", "vt", 2048, [0.0, 1.0]),  # yarn @2048: 75 %
    row("a.gguf", 2048, "none", "niah", 4096, [0.0, 0.0]),
    row("a.gguf", 2048, "none", "vt", 4096, [0.0, 0.0]),  # none @4096: 0 %
    row("a.gguf", 2048, "yarn", "niah", 4096, [1.0, 1.0]),  # yarn @4096: 1 of 2 cells
]
# model B, trained at 4096, one task, one method, only at 4096
LARGE = [row("b.gguf", 4096, "none", "niah", 4096, [1.0, 0.0])]


def test_table_has_every_length_of_every_study_the_trained_one_bold() -> None:
    header, body = summary_table([SMALL, LARGE], ["small", "large"])
    assert header == ["model (trained, dtype)", "method", "1k", "2k", "4k", "effective (85.6%)",
                      "effective (rel.)"]  # fmt: skip
    # none: 75 % at 1k is below RULER's 85.6 %; the relative bar is 90 % of its own 75 %. Each
    # score's interval: Wilson's of k of 4 samples (two tasks of two, each weighing 1/4, every
    # sample its own context), worked out from the formula, rounded outward: 3/4 [30-96], 1/4 [4-70],
    # 0/4 [0-49]
    assert body[0] == ["a.gguf (2k, bfloat16)", "none", "75.0 [30–96]", "**25.0** [4–70]",
                       "0.0 [0–49]", "< 1k", "1k"]  # fmt: skip
    # yarn: 100 and 75 % against the bar 67.5 %: it holds at 2k, and 4k is partial, so the
    # relative length is at least 2k; RULER's 85.6 % holds only at 1k
    assert body[1] == ["a.gguf (2k, bfloat16)", "yarn", "100.0 [51–100]", "**75.0** [30–96]",
                       "1 of 2 cells", "1k", "≥ 2k"]  # fmt: skip
    assert body[2] == ["b.gguf (4k, bfloat16)", "none", "", "", "**50.0** [9–91]", "< 4k", "≥ 4k"]


def test_a_partial_trained_length_stays_bold_and_two_runs_of_one_model_are_told_apart() -> None:
    partial = [r for r in SMALL if (r["length"], r["method"], r["task"]) != (2048, "yarn", "vt")]
    _, body = summary_table([partial, SMALL], ["first", "second"])
    assert body[1][3] == "**1 of 2 cells**"  # yarn's 2k: the niah cell answered, vt not yet
    assert body[0][0] == "a.gguf (2k, bfloat16) `first`" and body[2][0].endswith("`second`")


def test_a_zero_reference_gives_no_relative_length() -> None:
    rows = [row("c.gguf", 1024, "none", "niah", 1024, [0.0, 0.0]),
            row("c.gguf", 1024, "yarn", "niah", 1024, [1.0, 0.0])]  # fmt: skip
    _, body = summary_table([rows], ["c"])
    assert [b[-1] for b in body] == ["n/a", "n/a"]  # a bar of 0 %: every length would pass
    assert "no relative bar: the model as trained scores 0 at 1k" in study_line(rows, "c")


def test_study_line_names_tasks_bar_the_highest_and_what_is_missing() -> None:
    line = study_line(SMALL, "small")
    assert line.startswith("`small`: a.gguf, trained at 2k; tasks niah, vt, 2 samples per cell; "
                           "relative bar 67.5 % (90 % of the model's 75.0 % as trained at 1k); "
                           "highest at 2k (the trained length): yarn (75.0 %; not distinguishable "
                           "from the others by the paired test), the model as trained 25.0 %; 1 "
                           "cell of the lengths begun not yet answered")  # fmt: skip
    # two samples per cell: no pair is told apart (4 samples paired at each full length)
    assert ("; paired sign test, Holm over 2 comparisons: 1k: not distinguishable (4 paired); "
            "2k: not distinguishable (4 paired); ") in line  # fmt: skip
    assert "22 min of forwards (11 cells, 1 thread)" in line  # 11 rows x 2 samples x 60 s


def test_a_length_some_method_has_not_begun_is_not_full() -> None:
    line = study_line(SMALL[:10], "s")  # none has answered 4k, yarn nothing there yet
    assert "highest at 2k (the trained length): yarn (75.0 %;" in line
    assert "2 cells of the lengths begun not yet answered" in line


def test_ties_at_the_shown_precision_name_every_method() -> None:
    rows = [row("d.gguf", 1024, m, "niah", 2048, [1.0, 0.0]) for m in ("none", "yarn")]
    line = study_line(rows, "d")
    assert "highest at 2k (2x the trained length): none, yarn (50.0 %;" in line
    assert "not yet answered" not in line


def test_markdown_is_the_intro_the_table_then_a_line_per_study() -> None:
    text = summary_markdown([SMALL, LARGE], ["small", "large"])
    assert ("| a.gguf (2k, bfloat16) | none | 75.0 [30–96] | **25.0** [4–70] | 0.0 [0–49] | < 1k "
            "| 1k |") in text  # fmt: skip
    last = text.splitlines()[-2:]
    assert last[0].startswith("- `small`: a.gguf") and last[1].startswith("- `large`: b.gguf")


def _real(r: dict[str, Any]) -> dict[str, Any]:
    """A row above as a study writes one, which the reader checks: a registered task (``niah``:
    ``niah_single_1``), a per-sample entry for each of its scores."""
    task = {"niah": "niah_single_1"}.get(r["task"], r["task"])
    n = len(r["scores"])
    return {
        **r,
        "task": task,
        "outputs": [""] * n,
        "references": [["x"]] * n,
        "target_logprobs": [None] * n,
        "new_tokens": [0] * n,
        "score": sum(r["scores"]) / n,
        "low": 0.0,
        "high": 1.0,
    }


def _folder(tmp_path: Path, name: str, rows: list[dict[str, Any]]) -> Path:
    """A results folder of ``rows`` made whole from a committed task row (every field the store
    reads), so the CLI reads them as it reads a study's."""
    committed = ROOT / "benchmarks" / "studies" / "gemma3-270m-tasks" / "results.jsonl"
    with committed.open(encoding="utf-8") as f:
        template = json.loads(f.readline())
    folder = tmp_path / name
    folder.mkdir()
    lines = [json.dumps({**template, **_real(r), "model": {**template["model"], **r["model"]},
                         "encoding": r["method"], "config_hash": f"cell{i}"})  # one key each
             for i, r in enumerate(rows)]  # fmt: skip
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_cli_writes_the_block_between_its_markers(tmp_path: Path) -> None:
    small, large = _folder(tmp_path, "small", SMALL), _folder(tmp_path, "large", LARGE)
    page = tmp_path / "page.md"
    page.write_text("# t\n\n<!-- extend:ruler -->\nold\n<!-- /extend:ruler -->\n\nafter\n")
    result = CliRunner().invoke(
        app,
        ["extend", "summary", str(small), str(large), "--readme", str(page), "--block", "ruler"],
    )
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "| a.gguf (2k, bfloat16) | yarn | 100.0 [51–100] | **75.0** [30–96] |" in text
    assert "- `large`: b.gguf, trained at 4k" in text
    assert "\nold\n" not in text and text.endswith("<!-- /extend:ruler -->\n\nafter\n")


@pytest.mark.parametrize("case", ["perplexity only", "no folder", "a file", "twice"])
def test_cli_refuses_bad_folders_in_one_line(tmp_path: Path, case: str) -> None:
    small = _folder(tmp_path, "small", SMALL)
    if case == "perplexity only":
        ppl = _folder(tmp_path, "ppl", [])
        committed = ROOT / "benchmarks" / "studies" / "smollm2-ppl" / "results.jsonl"
        with committed.open(encoding="utf-8") as f:
            (ppl / "results.jsonl").write_text(f.readline())
        args, message = [str(small), str(ppl)], "has no task rows: run its study with --tasks"
    elif case == "no folder":
        args, message = [str(small), str(tmp_path / "nothere")], "no such folder"
    elif case == "a file":  # results.jsonl given for its folder
        args, message = (
            [str(small / "results.jsonl")],
            f"is a file; give the `posenc extend` results folder that holds it ('{small}')",
        )
    else:
        args, message = [str(small), str(small)], "a folder was given twice"
    result = CliRunner().invoke(app, ["extend", "summary", *args])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("scores", "want"),
    [
        ({8192: 0.2, 16384: 0.5, 32768: 0.6}, "< 8k (again at 16k, 32k)"),  # Gemma's YaRN
        ({8192: 0.5, 16384: 0.2, 32768: 0.6}, "8k (again at 32k)"),
        ({8192: 0.5, 16384: 0.5}, "≥ 16k"),
        ({8192: 0.2, 16384: 0.2}, "< 8k"),
    ],
)
def test_an_effective_length_cell_shows_a_recovery_past_the_first_failure(
    scores: dict[int, float], want: str
) -> None:
    from posenc.extend.measures.tasks import effective_length
    from posenc.extend.reports.tasks import length_text

    assert length_text(effective_length(scores, 0.3), min(scores)) == want


@pytest.mark.parametrize(
    ("option", "name", "needles"),
    [
        ("--figure", "f.png", ["--figure", "no perplexity rows", "--heatmap"]),  # task rows only
        ("--heatmap", "h.jpg", [".jpg", ".png"]),  # a suffix no figure has
    ],
)
def test_report_checks_its_figures_before_it_prints_the_table(
    tmp_path: Path, option: str, name: str, needles: list[str]
) -> None:
    study = ROOT / "benchmarks" / "studies" / "gemma3-270m-tasks"
    result = CliRunner().invoke(app, ["extend", "report", str(study), option, str(tmp_path / name)])
    assert result.exit_code != 0
    assert result.output.startswith("error:") and len(result.output.strip().splitlines()) == 1
    for needle in needles:
        assert needle in result.output, result.output
    assert not (tmp_path / name).exists()


def test_the_task_table_marks_a_scaling_of_factor_one() -> None:
    from posenc.extend.reports.tasks import task_table

    rows = [dict(r, identical_to_none=True) if r["method"] == "yarn" else r for r in SMALL]
    header, body = task_table(rows)
    assert [line[0] for line in body] == ["none", "yarn (= none: within the trained length)"]
    assert header[1:4] == ["score@1k", "score@2k (trained)", "score@4k"]  # as summary writes


def test_the_heatmap_draws_only_the_needles_asked_at_every_depth() -> None:
    """A distractor-key needle asked at 50 % alone is left out of the grid: pooled, it would
    pull the 50 % row down and read as a depth effect."""
    from posenc.extend.reports.tasks import needle_data

    def needle(task: str, depth: float, scores: list[float]) -> dict[str, Any]:
        return dict(row("a.gguf", 2048, "none", task, 1024, scores), depth=depth)

    rows = [needle("niah_single_2", d, [1.0, 1.0]) for d in (0.1, 0.5, 0.9)]
    rows.append(needle("niah_multikey_1", 0.5, [0.0, 0.0]))
    got = needle_data(rows)
    assert got["tasks"] == ["niah_single_2"]
    assert got["scores"]["none"] == {(0.1, 1024): 1.0, (0.5, 1024): 1.0, (0.9, 1024): 1.0}


def test_the_study_line_says_what_length_the_scalings_are_set_for() -> None:
    yarn = {"scaling": {"rope_type": "yarn", "factor": 2.0}, "extension": None}
    rows = [dict(r, settings=yarn) if r["method"] == "yarn" else r for r in SMALL]
    assert "scalings at factor 2 (set for 4k, the longest length) at every length" in study_line(
        rows, "a"
    )
    eight = {"scaling": {"rope_type": "yarn", "factor": 8.0}, "extension": None}  # given by hand
    rows = [dict(r, settings=eight) if r["method"] == "yarn" else r for r in SMALL]
    assert "scalings at factor 8 at every length" in study_line(rows, "a")  # no target claimed
    assert "scalings at" not in study_line(SMALL, "a")  # no factor recorded: nothing claimed


def test_needles_that_share_no_full_depth_grid_draw_the_widest_one_alone() -> None:
    from posenc.extend.reports.tasks import needle_data

    def needle(task: str, depth: float) -> dict[str, Any]:
        return dict(row("a.gguf", 2048, "none", task, 1024, [1.0]), depth=depth)

    rows = [needle("niah_single_1", 0.1), needle("niah_single_1", 0.5),
            needle("niah_single_2", 0.5), needle("niah_single_2", 0.9),
            needle("niah_single_3", 0.9)]  # fmt: skip
    got = needle_data(rows)
    assert got["tasks"] == ["niah_single_1"]  # named: the title says which one is drawn
    assert set(got["scores"]["none"]) == {(0.1, 1024), (0.5, 1024)}
    assert needle_data([row("a.gguf", 2048, "none", "vt", 1024, [1.0])])["scores"] == {}
