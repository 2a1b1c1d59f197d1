"""The interval of a study's score at a length (RULER's mean over tasks of each task's mean):
``weighted_cluster_wilson_interval`` against the stratified cluster-robust variance written out
sample by sample, and against the textbook form of a stratified sample of equal clusters
(``W_h**2 var(cluster means) / C_h``, from :func:`statistics.variance`); ``intervals_by_length``
against the same over rows, contexts as clusters and tasks as strata."""

from __future__ import annotations

import math
import statistics

import pytest

from posenc._stats import (
    MIN_CLUSTERS,
    cluster_wilson_interval,
    weighted_cluster_wilson_interval,
    wilson_interval,
)
from posenc.extend.measures.tasks import intervals_by_length, scores_by_length

Z95 = 1.959963984540054


def _wilson_at(p: float, m: float) -> tuple[float, float]:
    centre = (p + Z95**2 / (2 * m)) / (1 + Z95**2 / m)
    half = Z95 / (1 + Z95**2 / m) * math.sqrt(p * (1 - p) / m + Z95**2 / (4 * m * m))
    return max(0.0, centre - half), min(1.0, centre + half)


def _naive(scores: list[float], weights: list[float], clusters: list[object],
           strata: list[object] | None = None) -> tuple[float, float]:  # fmt: skip
    """Wilson at p (1 - p) / V: V each stratum's variance of the separate estimator, summed (a
    stratum of fewer than five clusters at its worst case, p (1 - p) sum W_c**2), held to the
    clusters' Kish size below and the samples' above; written out stratum by stratum."""
    strata = strata or [0] * len(scores)
    total = sum(weights)
    w = [x / total for x in weights]
    p = sum(a * b for a, b in zip(w, scores, strict=True))
    n_kish = 1 / sum(x * x for x in w)
    pairs = list(dict.fromkeys(zip(strata, clusters, strict=True)))
    if len(pairs) == len(scores):
        return _wilson_at(p, n_kish)
    mass = {pc: sum(w[i] for i in range(len(w)) if (strata[i], clusters[i]) == pc) for pc in pairs}
    fewest = min(n_kish, 1 / sum(v * v for v in mass.values()))
    if p in (0.0, 1.0):
        return _wilson_at(p, fewest)
    var = 0.0
    for h in dict.fromkeys(strata):
        mine = [i for i in range(len(w)) if strata[i] == h]
        p_h = sum(w[i] * scores[i] for i in mine) / sum(w[i] for i in mine)
        cells = [pc for pc in pairs if pc[0] == h]
        if len(cells) < 5:
            var += p * (1 - p) * sum(mass[pc] ** 2 for pc in cells)
            continue
        z = [sum(w[i] * (scores[i] - p_h) for i in mine if (h, clusters[i]) == pc) for pc in cells]
        var += len(z) / (len(z) - 1) * sum(x * x for x in z)
    return _wilson_at(p, n_kish if var == 0 else min(n_kish, max(fewest, p * (1 - p) / var)))


def _textbook(tasks: list[list[list[float]]]) -> tuple[float, float]:
    """A stratified sample of equal clusters, each task weighing 1 / T: p the mean of the task
    means, V = sum_h (1/T)**2 var(cluster means) / C_h; Wilson at p (1 - p) / V."""
    t = len(tasks)
    p = sum(statistics.fmean(statistics.fmean(c) for c in task) for task in tasks) / t
    v = sum((1 / t) ** 2 * statistics.variance([statistics.fmean(c) for c in task]) / len(task)
            for task in tasks)  # fmt: skip
    return _wilson_at(p, p * (1 - p) / v)


@pytest.mark.parametrize(("scores", "weights", "clusters"), [
    # two tasks of unequal size: 4 samples of one weigh 1/8 each, 2 of the other 1/4
    ([1, 0, 1, 1, 0, 1], [1, 1, 1, 1, 2, 2], [0, 1, 2, 3, 4, 5]),
    ([1, 1, 0, 0, 0.5, 1, 0.2, 0.9], [1, 1, 1, 1, 3, 3, 3, 3], [0, 0, 1, 1, 2, 2, 3, 3]),
    ([1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2],
     [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
    ([1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 2, 2], ["a", "a", "b", "b", "c", "d"]),
    ([1, 1, 1, 1], [1, 2, 1, 2], [0, 0, 1, 1]),  # every score 1: the clusters' Kish size
])  # fmt: skip
def test_weighted_interval_against_a_naive_computation(scores, weights, clusters) -> None:
    got = weighted_cluster_wilson_interval(scores, weights, clusters)
    assert got == pytest.approx(_naive(scores, weights, clusters), abs=1e-12)


def test_equal_weights_are_the_unweighted_interval_exactly() -> None:
    scores = [0.5, 1, 0, 0.25, 1, 1, 0, 0, 1, 0.5, 0, 1]
    clusters = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert weighted_cluster_wilson_interval(scores, [2.0] * 12, clusters) == pytest.approx(
        cluster_wilson_interval(scores, clusters), abs=1e-15
    )
    assert weighted_cluster_wilson_interval([1, 0, 1], [1, 1, 1], [0, 1, 2]) == pytest.approx(
        wilson_interval(2, 3), abs=1e-15
    )


def test_equal_clusters_give_the_textbook_stratified_variance() -> None:
    # task a: 6 contexts of 2 questions; task b: 5 contexts of 3 (fractional scores)
    a = [[1, 1], [1, 0], [0, 0], [1, 1], [0, 1], [1, 1]]
    b = [[0.2, 0.4, 0.0], [1.0, 0.8, 0.6], [0.0, 0.0, 0.2], [0.4, 0.4, 0.4], [0.6, 1.0, 0.8]]
    scores = [v for task in (a, b) for c in task for v in c]
    weights = [1 / 12] * 12 + [1 / 15] * 15
    clusters = [f"a{i}" for i, c in enumerate(a) for _ in c] + [f"b{i}" for i, c in enumerate(b)
                                                                 for _ in c]  # fmt: skip
    strata = ["a"] * 12 + ["b"] * 15
    got = weighted_cluster_wilson_interval(scores, weights, clusters, strata=strata)
    assert got == pytest.approx(_textbook([a, b]), abs=1e-12)
    assert got == pytest.approx(_naive(scores, weights, clusters, strata), abs=1e-12)


def test_strata_leave_the_difference_between_tasks_out() -> None:
    # task a: 5 contexts of 2 questions, all right; task b: 5 contexts, all wrong
    scores = [1] * 10 + [0] * 10
    clusters = [f"a{i // 2}" for i in range(10)] + [f"b{i // 2}" for i in range(10)]
    strata = ["a"] * 10 + ["b"] * 10
    got = weighted_cluster_wilson_interval(scores, [1] * 20, clusters, strata=strata)
    assert got == pytest.approx(_naive(scores, [1] * 20, clusters, strata), abs=1e-12)
    # every context agrees with its task's mean: no variance left within a stratum, the
    # independent size n; one stratum counts the tasks' difference as noise between contexts
    # (n_eff held at the 10 contexts)
    assert got == pytest.approx(wilson_interval(10, 20), abs=1e-12)
    lumped = weighted_cluster_wilson_interval(scores, [1] * 20, clusters)
    assert lumped == pytest.approx(wilson_interval(5, 10), abs=1e-12)
    with pytest.raises(ValueError, match=r"one stratum per score, got 20 scores.* and 7 strata"):
        weighted_cluster_wilson_interval(scores, [1] * 20, clusters, strata=strata[:7])


def test_a_stratum_of_too_few_clusters_is_taken_at_its_worst_case() -> None:
    assert MIN_CLUSTERS == 5
    # two haystacks of four questions whose answers agree within each: estimated from the two,
    # the variance would be 0 and the interval that of 8 independent answers
    scores, clusters = [1, 1, 1, 1, 0, 0, 0, 0, 1, 0], ["h1"] * 4 + ["h2"] * 4 + ["v1", "v2"]
    strata, weights = ["niah"] * 8 + ["vt"] * 2, [1 / 8] * 8 + [1 / 2] * 2
    got = weighted_cluster_wilson_interval(scores, weights, clusters, strata=strata)
    assert got == pytest.approx(_naive(scores, weights, clusters, strata), abs=1e-12)
    # both strata at their worst case: the clusters' Kish size, 1 / (2 (1/4)**2 + 2 (1/4)**2) = 4
    assert got == pytest.approx(_wilson_at(0.5, 4.0), abs=1e-12)
    # two haystacks whose means agree (an estimate of 0 between them) beside six single
    # questions (estimated): the worst case puts n_eff at the clusters' 6, not the samples' 13.7
    scores = [1, 1, 0, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0]
    clusters, strata = ["h1"] * 4 + ["h2"] * 4 + [f"v{i}" for i in range(6)], ["n"] * 8 + ["v"] * 6
    weights = [1 / 16] * 8 + [1 / 12] * 6
    got = weighted_cluster_wilson_interval(scores, weights, clusters, strata=strata)
    assert got == pytest.approx(_naive(scores, weights, clusters, strata), abs=1e-12)
    assert got == pytest.approx(_wilson_at(0.5, 6.0), abs=1e-12)


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
        # niah at two depths (pooled: 12 samples, rows of unequal size), 6 contexts of 2
        _row(
            "niah", 2048, [1, 1, 0, 0, 1, 1, 0, 0], ["c1", "c1", "c2", "c2", "c3", "c3", "c4", "c4"]
        ),
        _row("niah", 2048, [1, 0, 1, 1], ["c5", "c5", "c6", "c6"]),
        _row("vt", 2048, [0.0, 1.0, 0.0, 0.8, 0.2, 1.0]),  # one question a context
        _row("vt", 4096, [0.0, 0.4]),
    ]
    got = intervals_by_length(rows)
    niah = [[1, 1], [0, 0], [1, 1], [0, 0], [1, 0], [1, 1]]
    vt = [[0.0], [1.0], [0.0], [0.8], [0.2], [1.0]]
    assert got[2048] == pytest.approx(_textbook([niah, vt]), abs=1e-12)
    # the same by the sample-by-sample form; and neither without the strata nor without the
    # clusters nor with equal weights
    scores = [1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0.0, 1.0, 0.0, 0.8, 0.2, 1.0]
    weights = [1 / 24] * 12 + [1 / 12] * 6
    clusters = [f"c{i // 2 + 1}" for i in range(12)] + [f"v{i}" for i in range(6)]
    strata = ["niah"] * 12 + ["vt"] * 6
    assert got[2048] == pytest.approx(_naive(scores, weights, clusters, strata), abs=1e-12)
    for wrong in (_naive(scores, weights, clusters), _naive(scores, weights, range(18), strata),
                  _naive(scores, [1] * 18, clusters, strata)):  # fmt: skip
        assert got[2048] != pytest.approx(wrong, abs=1e-6)
    assert got[4096] == pytest.approx(wilson_interval(0.4, 2), abs=1e-12)
    mean = scores_by_length(rows)[2048]
    assert got[2048][0] < mean < got[2048][1]


def test_a_row_whose_contexts_do_not_match_its_scores_is_refused() -> None:
    with pytest.raises(ValueError, match="has 2 scores and 1 context names"):
        intervals_by_length([_row("niah", 1024, [1, 0], ["c1"])])
