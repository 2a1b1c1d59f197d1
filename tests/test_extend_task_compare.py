"""``posenc extend compare``: two runs' answers to the same task cells paired sample by sample
(posenc.extend.task_compare). The shares and the paired difference are checked against sums
written out by hand; prompts that differ, or no cell in common, are refused in one line; end to
end, a tiny Llama's study in float32 and in bfloat16 on the same prompts."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from posenc.cli import app
from posenc.extend.task_compare import compare_markdown, compare_table, paired_cells
from test_extend_task_study import tiny_llama_folder


def row(method: str, task: str, length: int, outputs: list[str], scores: list[float],
        digests: list[str] | None = None, dtype: str = "float32") -> dict[str, Any]:  # fmt: skip
    return {"kind": "task", "method": method, "task": task, "length": length, "depth": 0.5,
            "outputs": outputs, "scores": scores, "digests": digests or ["d1", "d2"],
            "model": {"gguf": "m.gguf", "dtype": dtype},
            "versions": {"posenc": "0.1.0"}}  # fmt: skip


FIRST = [
    row("none", "niah", 2048, ["123", "456"], [1.0, 1.0]),
    row("none", "vt", 2048, ["X Y", "Z"], [1.0, 0.0]),
    row("yarn", "niah", 2048, ["123", "9"], [1.0, 0.0]),
    row("none", "niah", 4096, ["7", "8"], [0.0, 0.0]),
    row("none", "cwe", 4096, ["a b", "c"], [0.5, 0.25]),  # only in the first run
]
SECOND = [
    row("none", "niah", 2048, ["123", "456"], [1.0, 1.0], dtype="bfloat16"),  # the same answers
    row("none", "vt", 2048, ["X Y.", "Z"], [1.0, 0.0], dtype="bfloat16"),  # same score, new text
    row("yarn", "niah", 2048, ["123", "456"], [1.0, 1.0], dtype="bfloat16"),  # a score changes
    row("none", "niah", 4096, ["7", "99"], [0.0, 1.0], dtype="bfloat16"),
]


def test_cells_pair_by_method_task_length_depth_and_the_rest_are_counted() -> None:
    pairs, unpaired = paired_cells(FIRST, SECOND)
    assert [(a["method"], a["task"], a["length"]) for a, _ in pairs] == [
        ("none", "niah", 2048), ("none", "vt", 2048), ("yarn", "niah", 2048),
        ("none", "niah", 4096)]  # fmt: skip
    assert all(a["outputs"] is not b["outputs"] for a, b in pairs)
    assert unpaired == 1


def test_shares_scores_and_difference_against_sums_by_hand() -> None:
    header, rows = compare_table(FIRST, SECOND, ("f32", "bf16"))
    assert header[-1] == "bf16 − f32 (95 % CI)"
    by = {r[0]: r for r in rows}
    # 2k: 6 samples, outputs the same in 4 ("X Y" -> "X Y.", "9" -> "456"), scores in 5
    assert by["2k"][1:5] == ["3", "6", f"{100 * 4 / 6:.0f}", f"{100 * 5 / 6:.0f}"]
    # RULER's score: niah's mean over its 4 samples (3/4 first, 4/4 second), vt's (1/2), averaged
    assert by["2k"][5] == f"{100 * (0.75 + 0.5) / 2:.1f}"
    assert by["2k"][6] == f"{100 * (1.0 + 0.5) / 2:.1f}"
    diffs = [0, 0, 0, 0, 0, 1.0]  # one sample gains its point
    half = 2.5705818366147395 * statistics.stdev(diffs) / math.sqrt(6)  # t(0.975, 5)
    assert by["2k"][7] == f"{100 * sum(diffs) / 6:+.1f} ± {100 * half:.1f}"
    # all: 8 samples, the mean of the lengths' scores
    assert by["all"][1:3] == ["4", "8"]
    assert by["all"][5] == f"{100 * ((0.75 + 0.5) / 2 + 0.0) / 2:.1f}"


def test_one_length_has_no_all_row() -> None:
    _, rows = compare_table(FIRST[:1], SECOND[:1])
    assert [r[0] for r in rows] == ["2k"]
    assert rows[0][7] == "+0.0 ± 0.0"


def test_other_prompts_are_refused_naming_the_cell() -> None:
    other = [row("none", "niah", 2048, ["123", "456"], [1.0, 1.0], digests=["d1", "dX"])]
    with pytest.raises(ValueError, match=r"niah at 2048 \(depth 0.5, none\) answered different"):
        compare_table(FIRST, other)


def test_no_cell_in_common_is_refused() -> None:
    with pytest.raises(ValueError, match="no task cell in common"):
        compare_table(FIRST[:1], SECOND[1:2])


def test_markdown_says_in_what_the_runs_differ() -> None:
    text = compare_markdown(FIRST, SECOND, ("a", "b"))
    assert "(4; 1 only one has)" in text
    assert "model.dtype: 'float32' -> 'bfloat16'" in text
    assert "\n| length | cells |" in text


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama's task cells in float32 and in bfloat16, the same prompts."""
    folder = tiny_llama_folder(tmp_path_factory.mktemp("llama"), 128)
    outs = []
    for dtype in ("float32", "bfloat16"):
        out = tmp_path_factory.mktemp(dtype)
        result = CliRunner().invoke(app, [
            "extend", str(folder), "--methods", "none,yarn", "--lengths", "64,128",
            "--bin-size", "32", "--tasks", "niah_single_1", "--task-lengths", "384",
            "--task-depths", "0.5", "--samples", "2", "--dtype", dtype, "--out", str(out)])  # fmt: skip
        assert result.exit_code == 0, result.output
        outs.append(out)
    return outs[0], outs[1]


def test_compare_two_dtypes_end_to_end(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = two_runs
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(second)])
    assert result.exit_code == 0, result.output
    assert "(2; 0 only one has)" in result.output
    assert "model.dtype: 'float32' -> 'bfloat16'" in result.output
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- extend:dtype -->\nold\n<!-- /extend:dtype -->\nb\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(second),
                                      "--readme", str(page), "--block", "dtype"])  # fmt: skip
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    assert text.startswith("a\n<!-- extend:dtype -->\nThe task cells both runs answered (2;")
    assert "old" not in text and text.endswith("<!-- /extend:dtype -->\nb\n")


def test_compare_refusals_are_one_line(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    first, _ = two_runs
    missing = tmp_path / "nope.md"
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(first),
                                      "--readme", str(missing)])  # fmt: skip
    assert result.exit_code != 0 and f"--readme {missing}: no such file" in result.output
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(tmp_path)])
    assert result.exit_code != 0 and "holds no study results" in result.output
