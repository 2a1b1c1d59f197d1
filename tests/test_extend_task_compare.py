"""``posenc extend compare``: two runs' answers to the same task cells paired sample by sample
(posenc.extend.reports.compare). The shares and the paired difference are checked against sums
written out by hand; prompts that differ, or no cell in common, are refused in one line; end to
end, a tiny Llama's study in float32 and in bfloat16 on the same prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _tiny import tiny_folder
from posenc._stats import sign_test_p
from posenc.cli import app
from posenc.extend.reports.compare import compare_markdown, compare_table, paired_cells


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
    depthless = [{**FIRST[0], "depth": None}]
    assert len(paired_cells(depthless, [{**SECOND[0], "depth": None}])[0]) == 1
    assert paired_cells(depthless, SECOND[:1])[0] == []  # no depth is not depth 0.5


def test_shares_scores_and_difference_against_sums_by_hand() -> None:
    header, rows = compare_table(FIRST, SECOND, ("f32", "bf16"))
    assert header[5:7] == ["score f32", "score bf16"]
    by = {r[0]: r for r in rows}
    # none: 3 cells, 6 samples; outputs the same in 4 ("X Y" -> "X Y.", "8" -> "99"), scores in 5
    assert by["none"][1:5] == ["3", "6", f"{100 * 4 / 6:.0f}", f"{100 * 5 / 6:.0f}"]
    # RULER's score at 2k: niah 2/2 and vt 1/2 -> (1 + 0.5) / 2; at 4k niah only: 0 and 1/2
    f32, bf16 = ((1 + 0.5) / 2 + 0.0) / 2, ((1 + 0.5) / 2 + 0.5) / 2
    assert by["none"][5:10] == [f"{100 * f32:.1f}", f"{100 * bf16:.1f}",
                                f"{100 * (bf16 - f32):+.1f}", "1 / 0", "1"]  # fmt: skip
    # yarn: 1 cell, one sample gains its point
    assert by["yarn"][1:10] == ["1", "2", "50", "50", "50.0", "100.0", "+50.0", "1 / 0", "1"]
    # all: the mean over methods of each method's score; 2 up, 0 down: p = 2 * 1/4
    assert by["all"][1:10] == ["4", "8", f"{100 * 5 / 8:.0f}", f"{100 * 6 / 8:.0f}",
                               f"{100 * (f32 + 0.5) / 2:.1f}", f"{100 * (bf16 + 1.0) / 2:.1f}",
                               f"{100 * ((bf16 + 1.0) - (f32 + 0.5)) / 2:+.1f}", "2 / 0", "0.5"]  # fmt: skip


def test_one_method_has_no_all_row_and_no_change_no_test() -> None:
    _, rows = compare_table(FIRST[:1], SECOND[:1])
    assert [r[0] for r in rows] == ["none"]
    assert rows[0][7:] == ["+0.0", "0 / 0", "–"]


@pytest.mark.parametrize("up, down, p", [(5, 0, 2 / 32), (1, 1, 1.0), (6, 1, 2 * 8 / 128),
                                         (0, 3, 2 / 8), (10, 10, 1.0)])  # fmt: skip
def test_sign_test_against_the_binomial_by_hand(up: int, down: int, p: float) -> None:
    assert sign_test_p(up, down) == pytest.approx(p)


def test_sign_test_refuses_negative_counts_and_has_nothing_to_test_without_change() -> None:
    assert sign_test_p(0, 0) is None
    with pytest.raises(ValueError, match="counts >= 0"):
        sign_test_p(-1, 2)


def test_other_prompts_are_refused_naming_the_cell() -> None:
    other = [row("none", "niah", 2048, ["123", "456"], [1.0, 1.0], digests=["d1", "dX"])]
    with pytest.raises(ValueError, match=r"niah at 2048 \(depth 0.5, none\) answered different"):
        compare_table(FIRST, other)


def test_two_models_prompts_are_refused_naming_the_models() -> None:
    other = [{**row("none", "niah", 2048, ["1", "2"], [1.0, 1.0], digests=["e1", "e2"]),
              "model": {"gguf": "other.gguf", "dtype": "float32"}}]  # fmt: skip
    with pytest.raises(ValueError, match=r"different models, m\.gguf and other\.gguf"):
        paired_cells(FIRST, other)


def test_other_sample_counts_are_refused_as_such() -> None:
    more = [row("none", "niah", 2048, ["1", "2", "3"], [1.0] * 3, digests=["d1", "d2", "d3"])]
    with pytest.raises(ValueError, match="2 samples in first and 3 in second: run both with"):
        compare_table(FIRST, more)


def test_a_cell_twice_in_one_run_is_refused() -> None:
    with pytest.raises(ValueError, match=r"second holds niah at 2048 .* twice"):
        compare_table(FIRST, SECOND + SECOND[:1])


def test_a_damaged_row_is_refused() -> None:
    damaged = [{**SECOND[0], "scores": [1.0]}]
    with pytest.raises(ValueError, match="damaged: its scores, outputs and digests"):
        compare_table(FIRST, damaged)


def test_no_task_rows_or_no_cell_in_common_is_refused() -> None:
    with pytest.raises(ValueError, match="no task cell in common"):
        compare_table(FIRST[:1], SECOND[1:2])
    ppl = [{"kind": "ppl", "method": "none"}]
    with pytest.raises(ValueError, match="second holds no task rows"):
        compare_table(FIRST, ppl)


def test_markdown_says_where_and_in_what_the_runs_differ() -> None:
    second = [{**r, "settings": {"factor": 2.0}} if r["method"] == "yarn" else r for r in SECOND]
    text = compare_markdown(FIRST, second, ("a", "b"))
    assert "(4, at 2k, 4k; 1 only one has)" in text
    assert "model.dtype: 'float32' -> 'bfloat16'" in text
    assert "yarn: settings: None -> {'factor': 2.0}" in text
    assert "`b` minus `a`" in text and "\n| method | cells |" in text


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny Llama's task cells in float32 and in bfloat16, the same prompts."""
    folder = tiny_folder(tmp_path_factory.mktemp("llama"), 128)
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
    assert "(2, at 384; 0 only one has)" in result.output
    assert "model.dtype: 'float32' -> 'bfloat16'" in result.output
    page = tmp_path / "page.md"
    page.write_text("a\n<!-- extend:dtype -->\nold\n<!-- /extend:dtype -->\nb\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(second),
                                      "--readme", str(page), "--block", "dtype"])  # fmt: skip
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    assert text.startswith("a\n<!-- extend:dtype -->\nThe task cells both runs answered (2,")
    assert "old" not in text and text.endswith("<!-- /extend:dtype -->\nb\n")


def test_compare_refusals_are_one_line(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    first, second = two_runs
    missing = tmp_path / "nope.md"
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(second),
                                      "--readme", str(missing)])  # fmt: skip
    assert result.exit_code != 0 and f"--readme {missing}: no such file" in result.output
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(tmp_path)])
    assert result.exit_code != 0 and "holds no study results" in result.output
    result = CliRunner().invoke(app, ["extend", "compare", str(first), str(first) + "/"])
    assert result.exit_code != 0 and "was given twice" in result.output
    result = CliRunner().invoke(app, ["extend", "compare", str(tmp_path / "gone"), str(first)])
    assert result.exit_code != 0 and "gone': no such folder" in result.output
