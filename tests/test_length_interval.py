"""The interval of a study's score at a length (RULER's mean over tasks of each task's mean):
``weighted_cluster_wilson_interval`` against Kish's design effect written out by hand, and
``intervals_by_length`` against the same naive computation over rows, contexts as clusters."""

from __future__ import annotations

import math

import pytest

from posenc._stats import (
    cluster_wilson_interval,
    weighted_cluster_wilson_interval,
    wilson_interval,
)
from posenc.extend.measures.tasks import intervals_by_length, scores_by_length

Z95 = 1.959963984540054


def _naive(scores: list[float], weights: list[float], clusters: list[object],
           strata: list[object] | None = None) -> tuple[float, float]:  # fmt: skip
    """Wilson at p (1 - p) / V, V the stratified cluster-robust variance of the weighted mean
    (Cochran 5A.12), written out stratum by stratum."""
    strata = strata or [0] * len(scores)
    total = sum(weights)
    w = [x / total for x in weights]
    p = sum(a * b for a, b in zip(w, scores, strict=True))
    n_kish = 1 / sum(x * x for x in w)
    pairs = list(dict.fromkeys(zip(strata, clusters, strict=True)))
    k = len(pairs)
    if k == len(scores):
        m = n_kish
    else:
        var = 0.0
        for h in dict.fromkeys(strata):
            mine = [pc for pc in pairs if pc[0] == h]
            z = [sum(w[i] * (scores[i] - p) for i in range(len(scores))
                     if (strata[i], clusters[i]) == pc) for pc in mine]  # fmt: skip
            mean = sum(z) / len(z)
            var += len(z) / (len(z) - 1) * sum((x - mean) ** 2 for x in z)
        lowest = min(k, n_kish)
        if p in (0.0, 1.0):
            m = lowest
        else:
            m = n_kish if var == 0 else min(n_kish, max(lowest, p * (1 - p) / var))
    centre = (p + Z95**2 / (2 * m)) / (1 + Z95**2 / m)
    half = Z95 / (1 + Z95**2 / m) * math.sqrt(p * (1 - p) / m + Z95**2 / (4 * m * m))
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize(("scores", "weights", "clusters"), [
    # two tasks of unequal size: 4 samples of one weigh 1/8 each, 2 of the other 1/4
    ([1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 2, 2], [0, 1, 2, 3, 4, 5]),
    ([1, 1, 0, 0, 0.5, 1, 0.2, 0.9], [1, 1, 1, 1, 3, 3, 3, 3], [0, 0, 1, 1, 2, 2, 3, 3]),
    ([1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 2, 2], ["a", "a", "b", "b", "c", "d"]),
    ([1, 1, 1, 1], [1, 2, 1, 2], [0, 0, 1, 1]),  # every score equal: the clusters' size
])  # fmt: skip
def test_weighted_interval_against_a_naive_computation(scores, weights, clusters) -> None:
    got = weighted_cluster_wilson_interval(scores, weights, clusters)
    assert got == pytest.approx(_naive(scores, weights, clusters), abs=1e-12)


def test_strata_leave_the_difference_between_tasks_out() -> None:
    # task a: 2 contexts of 2 questions, all right; task b: 2 contexts, all wrong
    scores = [1, 1, 1, 1, 0, 0, 0, 0]
    clusters = ["a1", "a1", "a2", "a2", "b1", "b1", "b2", "b2"]
    strata = ["a"] * 4 + ["b"] * 4
    got = weighted_cluster_wilson_interval(scores, [1] * 8, clusters, strata=strata)
    assert got == pytest.approx(_naive(scores, [1] * 8, clusters, strata), abs=1e-12)
    # every context agrees with its task's mean: no variance left within a stratum, the
    # independent size n; one stratum counts the tasks' difference as noise between contexts
    # (n_eff 3 by the variance, held at the 4 contexts)
    assert got == pytest.approx(wilson_interval(4, 8), abs=1e-12)
    lumped = weighted_cluster_wilson_interval(scores, [1] * 8, clusters)
    assert lumped == pytest.approx(wilson_interval(2, 4), abs=1e-12)
    with pytest.raises(ValueError, match=r"one stratum per score, got 8 scores.* and 7 strata"):
        weighted_cluster_wilson_interval(scores, [1] * 8, clusters, strata=strata[:7])


def test_equal_weights_are_the_unweighted_interval_exactly() -> None:
    scores, clusters = [0.5, 1, 0, 0.25, 1, 1, 0, 0], [0, 0, 1, 1, 2, 2, 3, 3]
    assert weighted_cluster_wilson_interval(scores, [2.0] * 8, clusters) == pytest.approx(
        cluster_wilson_interval(scores, clusters), abs=1e-15
    )
    assert weighted_cluster_wilson_interval([1, 0, 1], [1, 1, 1], [0, 1, 2]) == pytest.approx(
        wilson_interval(2, 3), abs=1e-15
    )


@pytest.mark.parametrize(("weights", "match"), [
    ([1, 1], "one weight, one cluster and one stratum per score"),
    ([1, 0, 1], "weights must be finite and > 0"),
    ([1, float("nan"), 1], "weights must be finite and > 0"),
])  # fmt: skip
def test_bad_weights_are_refused(weights, match) -> None:
    with pytest.raises(ValueError, match=match):
        weighted_cluster_wilson_interval([1, 0, 1], weights, [0, 1, 2])


def _row(task: str, length: int, scores: list[float], contexts: list[str] | None = None) -> dict:
    return {"task": task, "length": length, "scores": scores, "contexts": contexts,
            "digests": [f"{task}{length}d{i}" for i in range(len(scores))]}  # fmt: skip


def test_intervals_by_length_weigh_tasks_equally_and_cluster_by_context() -> None:
    rows = [
        # niah at two depths (pooled: 8 samples), questions of 2 contexts per depth
        _row("niah", 2048, [1, 1, 0, 1], ["c1", "c1", "c2", "c2"]),
        _row("niah", 2048, [0, 0, 1, 0], ["c3", "c3", "c4", "c4"]),
        _row("vt", 2048, [0.2, 0.6, 0.0, 1.0]),  # one question a context
        _row("vt", 4096, [0.0, 0.4]),
    ]
    got = intervals_by_length(rows)
    scores = [1, 1, 0, 1, 0, 0, 1, 0, 0.2, 0.6, 0.0, 1.0]
    weights = [1 / 16] * 8 + [1 / 8] * 4  # two tasks: 8 niah samples, 4 vt ones
    clusters = ["c1", "c1", "c2", "c2", "c3", "c3", "c4", "c4", "v0", "v1", "v2", "v3"]
    strata = ["niah"] * 8 + ["vt"] * 4
    assert got[2048] == pytest.approx(_naive(scores, weights, clusters, strata), abs=1e-12)
    assert got[4096] == pytest.approx(wilson_interval(0.4, 2), abs=1e-12)
    mean = scores_by_length(rows)[2048]
    assert got[2048][0] < mean < got[2048][1]


def test_a_row_whose_contexts_do_not_match_its_scores_is_refused() -> None:
    with pytest.raises(ValueError, match="has 2 scores and 1 context names"):
        intervals_by_length([_row("niah", 1024, [1, 0], ["c1"])])
