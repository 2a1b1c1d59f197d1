"""The summary's paired ranking of methods: samples paired by prompt digest, samples of one shared
context counted as one unit, the exact sign test per pair, Holm over the study's comparisons, and
"not distinguishable" where the corrected p is not below 5 % — checked on made-up rows against
the binomial tail and Holm's rule computed here."""

from __future__ import annotations

import math
from typing import Any

from posenc.extend.reports.ranking import better_than, compare, rank, ranking_line
from posenc.extend.reports.summary import summary_markdown


def _row(method: str, length: int, scores: list[float], *, task: str = "niah_single_2",
         contexts: list[str] | None = None, tag: str = "") -> dict[str, Any]:  # fmt: skip
    digests = [f"{task}{length}{tag}{i}" for i in range(len(scores))]
    row: dict[str, Any] = {
        "kind": "task", "method": method, "task": task, "length": length, "depth": 0.5,
        "n": len(scores), "scores": scores, "digests": digests, "score": sum(scores) / len(scores),
        "model": {"source": "m.gguf", "trained_length": 1024, "dtype": "float32"},
        "settings": {}, "seconds": 1.0, "cpu_seconds": 1.0, "threads": 1,
    }  # fmt: skip
    if contexts is not None:
        row["contexts"] = contexts
    return row


def _binomial_two_sided(k: int, n: int) -> float:
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def test_a_method_that_answers_what_another_misses_is_ranked_with_holm() -> None:
    rows = [_row("none", 1024, [1.0] * 10), _row("yarn", 1024, [0.0] * 10),
            _row("ntk", 1024, [1.0] * 9 + [0.0])]  # fmt: skip
    found = {(c.a, c.b): c for c in rank(rows)}
    assert set(found) == {("none", "yarn"), ("none", "ntk"), ("yarn", "ntk")}
    c = found[("none", "yarn")]
    assert (c.up, c.down, c.units) == (10, 0, 10)
    assert math.isclose(c.p or 0, _binomial_two_sided(0, 10))
    # Holm over three: the smallest p times 3; none-ntk differs in one sample only (p = 1)
    assert math.isclose(c.p_holm, 3 * _binomial_two_sided(0, 10))
    assert c.verdict == "none > yarn" and found[("yarn", "ntk")].verdict == "ntk > yarn"
    assert found[("none", "ntk")].verdict == "not distinguishable"
    assert better_than(list(found.values()), "none", 1024) == ["yarn"]
    assert "1k: none > yarn (10 of 10 differing" in ranking_line(rows)


def test_samples_of_one_context_are_one_unit() -> None:
    # ten questions of two contexts: two units, never ten independent draws
    contexts = ["c0"] * 5 + ["c1"] * 5
    rows = [_row("none", 1024, [1.0] * 10, contexts=contexts),
            _row("yarn", 1024, [0.0] * 10, contexts=contexts)]  # fmt: skip
    c = compare(rows, "none", "yarn", 1024)
    assert (c.up, c.down, c.units) == (2, 0, 2)
    assert math.isclose(c.p or 0, _binomial_two_sided(0, 2))  # 0.5: not distinguishable
    assert rank(rows)[0].verdict == "not distinguishable"


def test_only_samples_both_answered_are_paired_and_ties_are_left_out() -> None:
    rows = [_row("none", 1024, [1.0, 1.0, 0.0, 1.0]),
            _row("yarn", 1024, [1.0, 0.0, 0.0, 1.0]),
            _row("none", 2048, [1.0] * 8, tag="x"),
            _row("yarn", 2048, [0.0] * 8, tag="y")]  # other prompts: nothing pairs  # fmt: skip
    c = compare(rows, "none", "yarn", 1024)
    assert (c.up, c.down, c.units) == (1, 0, 4)
    empty = compare(rows, "none", "yarn", 2048)
    assert empty.units == 0 and empty.p is None
    assert all(c.verdict == "not distinguishable" for c in rank(rows))


def test_the_summary_ties_its_highest_method_to_the_paired_test() -> None:
    rows = [_row("none", 1024, [1.0] * 12), _row("yarn", 1024, [0.0] * 12)]
    text = summary_markdown([rows], ["study"])
    assert "highest at 1k (the trained length): none (100.0 %; better by the paired test than " \
        "yarn)" in text  # fmt: skip
    assert "paired sign test, Holm over 1 comparisons: 1k: none > yarn (12 of 12" in text
    rows = [_row("none", 1024, [1.0, 1.0]), _row("yarn", 1024, [0.0, 0.0])]
    assert "not distinguishable from the others by the paired test" in summary_markdown(
        [rows], ["study"]
    )
