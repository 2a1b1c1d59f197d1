"""``posenc extend summary``: several studies' task scores on one screen (posenc.extend.
task_summary). The scores, the bold trained length, partial lengths, the highest method and the
missing cells are checked against values worked out by hand from the rows below; a folder without
task rows is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from posenc.cli import app
from posenc.extend.task_summary import study_line, summary_markdown, summary_table


def row(model: str, trained: int, method: str, task: str, length: int,
        scores: list[float]) -> dict[str, Any]:  # fmt: skip
    return {"kind": "task", "method": method, "task": task, "depth": 0.5, "length": length,
            "n": len(scores), "scores": scores, "seconds": 60.0 * len(scores), "threads": 1,
            "model": {"source": f"/cache/{model}", "trained_length": trained}}  # fmt: skip


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
    header, body = summary_table([SMALL, LARGE])
    assert header == ["model (trained)", "method", "1k", "2k", "4k", "effective (rel.)",
                      "effective (85.6%)"]  # fmt: skip
    assert body[0] == ["a.gguf (2k)", "none", "75.0", "**25.0**", "0.0", "1k", "< shortest"]
    # yarn: 100 and 75 % against 90 % of none's 75 % (67.5 %): it holds at 2k; 4k is partial,
    # so the relative length is censored at 2k; RULER's 85.6 % holds only at 1k
    assert body[1] == ["a.gguf (2k)", "yarn", "100.0", "**75.0**", "(1/2 cells)", "≥ 2k", "1k"]
    assert body[2] == ["b.gguf (4k)", "none", "", "", "**50.0**", "≥ 4k", "< shortest"]


def test_study_line_names_the_highest_at_the_longest_full_length_and_what_is_missing() -> None:
    line = study_line(SMALL)
    assert line.startswith("a.gguf, trained at 2k: at 2k (1x the trained length) the highest is "
                           "yarn (75.0 %), the model as trained 25.0 %; 1 cell not yet answered")  # fmt: skip
    assert "22 min of forwards (11 cells, 1 thread)" in line  # 11 rows x 2 samples x 60 s


def test_a_length_some_method_has_not_begun_is_not_full() -> None:
    line = study_line(SMALL[:10])  # none has answered 4k, yarn nothing there yet
    assert "at 2k (1x the trained length) the highest is yarn (75.0 %)" in line
    assert "2 cells not yet answered" in line


def test_study_line_of_a_complete_study_says_nothing_is_missing() -> None:
    line = study_line(SMALL[:8])
    assert "the highest is yarn (75.0 %), the model as trained 25.0 %;" in line
    assert "not yet answered" not in line


def test_markdown_is_the_table_then_a_line_per_study() -> None:
    text = summary_markdown([SMALL, LARGE])
    assert "| a.gguf (2k) | none | 75.0 | **25.0** | 0.0 | 1k | < shortest |" in text
    assert text.splitlines()[-2].startswith("- a.gguf") and text.splitlines()[-1].startswith(
        "- b.gguf"
    )


def test_cli_writes_the_block_between_its_markers(tmp_path: Path) -> None:
    from posenc.extend.study import study_rows

    study = Path(__file__).resolve().parent.parent / "benchmarks" / "studies" / "gemma3-270m-tasks"
    page = tmp_path / "page.md"
    page.write_text("# t\n\n<!-- extend:ruler -->\nold\n<!-- /extend:ruler -->\n\nafter\n")
    result = CliRunner().invoke(
        app, ["extend", "summary", str(study), "--readme", str(page), "--block", "ruler"]
    )
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert summary_markdown([study_rows(study)]) + "\n<!-- /extend:ruler -->\n\nafter\n" in text
    assert "\nold\n" not in text


def test_cli_refuses_a_folder_without_task_rows(tmp_path: Path) -> None:
    runner = CliRunner()
    ppl = tmp_path / "ppl"
    ppl.mkdir()
    ppl_row = {"kind": "ppl", "method": "none"}
    (ppl / "results.jsonl").write_text(json.dumps(ppl_row) + "\n")
    result = runner.invoke(app, ["extend", "summary", str(ppl)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "no task rows" in result.output or "skipped" in result.output, result.output
    missing = runner.invoke(app, ["extend", "summary", str(tmp_path / "nothere")])
    assert missing.exit_code != 0 and "no results.jsonl" in missing.output, missing.output
