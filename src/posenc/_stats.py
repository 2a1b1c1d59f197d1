"""Statistics across seeds: the mean of a cell and the half-width of its confidence interval.

scipy is not a dependency, so the Student t quantile is computed here, exactly, from the
closed-form t distribution function for an integer number of degrees of freedom
(Abramowitz & Stegun, *Handbook of Mathematical Functions*, 26.7.3 and 26.7.4), inverted by
bisection. Degrees of freedom are ``seeds - 1``, always an integer, and small.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def t_two_sided_prob(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with ``df`` degrees of freedom, ``A(t|df)`` in A&S 26.7.

    With ``theta = atan(t / sqrt(df))`` and ``c = cos(theta)**2``:

    - odd ``df``: ``2/pi * (theta + sin(theta) cos(theta) * (1 + 2/3 c + 2*4/(3*5) c**2 + ...
      + 2*4...(df-3) / (3*5...(df-2)) c**((df-3)/2)))``; ``2 theta / pi`` for ``df = 1``;
    - even ``df``: ``sin(theta) * (1 + 1/2 c + 1*3/(2*4) c**2 + ...
      + 1*3...(df-3) / (2*4...(df-2)) c**((df-2)/2))``.

    Exact (a finite sum, ``df / 2`` terms) for integer ``df``; no special functions needed.
    """
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be a positive integer, got {df!r}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    c = math.cos(theta) ** 2
    if df % 2:  # odd
        term = total = 1.0
        for k in range(1, (df - 3) // 2 + 1):
            term *= c * (2 * k) / (2 * k + 1)
            total += term
        tail = math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0
        return 2.0 / math.pi * (theta + tail)
    term = total = 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_critical(df: int, level: float = 0.95) -> float:
    """The two-sided Student t critical value: ``t`` with ``P(|T| <= t) = level``, that is
    ``t_{(1 + level) / 2, df}`` (``t_{0.975, df}`` for a 95% interval; 12.706 at ``df = 1``,
    1.960 as ``df`` grows).

    Bisection on :func:`t_two_sided_prob` (increasing in ``t``) to 1e-12 relative: slow
    (``O(df)`` per step) only for thousands of degrees of freedom, never the case for seeds.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1 (exclusive), got {level!r}")
    lo, hi = 0.0, 2.0
    while t_two_sided_prob(hi, df) < level:  # the heavy tails of df = 1 need a wide bracket
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if t_two_sided_prob(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float | None]:
    """Mean of ``values`` and the half-width of its ``level`` confidence interval.

    Student t: ``t_{(1 + level) / 2, n - 1} * s / sqrt(n)`` with ``s`` the sample standard
    deviation (``n - 1`` in the denominator). One value has no spread to estimate: the
    half-width is None.
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_ci needs at least one value, got none")
    bad = [v for v in vals if not math.isfinite(v)]
    if bad:
        raise ValueError(f"mean_ci needs finite values, got {bad[0]!r} in {vals}")
    mean = statistics.fmean(vals)
    n = len(vals)
    if n < 2:
        return mean, None
    return mean, t_critical(n - 1, level) * statistics.stdev(vals) / math.sqrt(n)


def paired_mean_ci(
    values: Sequence[float], reference: Sequence[float], level: float = 0.95
) -> tuple[float, float | None]:
    """Mean of the paired differences ``values[i] - reference[i]`` and the half-width of its
    ``level`` confidence interval (:func:`mean_ci` of the differences: Student t with
    ``n - 1`` degrees of freedom, ``n`` the number of pairs; None for one pair).

    The paired test for two sets of runs that share their seeds: what the seeds have in common
    (data order, initialization) cancels in each difference, so its interval is often far
    narrower than either side's."""
    a, b = [float(v) for v in values], [float(v) for v in reference]
    if len(a) != len(b):
        raise ValueError(
            f"paired_mean_ci needs one reference value per value, got {len(a)} and {len(b)}"
        )
    return mean_ci([x - y for x, y in zip(a, b, strict=True)], level)


def paired_t_p(values: Sequence[float], reference: Sequence[float]) -> float | None:
    """The two-sided p-value of the paired t test of ``values[i] - reference[i]`` against 0:
    ``P(|T| >= |t|)`` with ``t = mean / (s / sqrt(n))`` and ``n - 1`` degrees of freedom, the
    test whose acceptance region is :func:`paired_mean_ci`'s interval (``p < 1 - level``
    exactly when the ``level`` interval excludes 0).

    None where there is nothing to test: under two pairs (no spread to estimate), or every
    difference exactly 0 (the same numbers on both sides, such as a rescaling at the training
    length, which is the identity). Equal nonzero differences (no spread) give 0."""
    a, b = [float(v) for v in values], [float(v) for v in reference]
    if len(a) != len(b):
        raise ValueError(
            f"paired_t_p needs one reference value per value, got {len(a)} and {len(b)}"
        )
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if len(diffs) < 2 or all(d == 0 for d in diffs):
        return None
    mean, spread = statistics.fmean(diffs), statistics.stdev(diffs)
    if spread == 0:
        return 0.0
    t = abs(mean) / (spread / math.sqrt(len(diffs)))
    return max(0.0, 1.0 - t_two_sided_prob(t, len(diffs) - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: with ``m`` p-values
    sorted ``p_(1) <= ... <= p_(m)``, ``p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``.
    Rejecting where ``p~ < alpha`` keeps the chance of *any* false rejection among the ``m``
    (the family-wise error rate) at most ``alpha``, whatever the tests' dependence."""
    ps = [float(p) for p in pvalues]
    bad = [p for p in ps if not 0.0 <= p <= 1.0]
    if bad:
        raise ValueError(f"holm needs p-values in [0, 1], got {bad[0]!r}")
    m = len(ps)
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: ps[i])):
        running = max(running, min(1.0, (m - rank) * ps[i]))  # step-down: never decreasing
        out[i] = running
    return out


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether ``mean ± half`` intervals ``a`` and ``b`` (each ``(mean, half)``) share a point:
    the report's "within noise" test. A lenient one: two intervals that do not overlap differ
    clearly (well past a 5%-level t test of the difference), but overlapping ones can still
    hide a real difference, so a tie reads "not shown to differ", not "equal"."""
    return abs(a[0] - b[0]) <= a[1] + b[1]


def wilson_interval(successes: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of a proportion: ``successes`` out of ``n``
    trials (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the normal ``p ± z se``,
    which collapses to a point at 0 or 1 successes). With ``p = successes / n`` and ``z`` the
    two-sided normal quantile of ``level`` (1.960 at 95%)::

        centre = (p + z**2 / (2 n)) / (1 + z**2 / n)
        half   = z / (1 + z**2 / n) * sqrt(p (1 - p) / n + z**2 / (4 n**2))

    ``successes`` may be fractional: the mean of ``n`` scores in ``[0, 1]`` (a sample scoring
    3 of 4 references counts 0.75). Any such score of mean ``p`` has variance at most
    ``p (1 - p)``, the Bernoulli one, so the interval stays conservative there. Never outside
    ``[0, 1]``; ValueError for ``n < 1`` or ``successes`` outside ``[0, n]``."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"wilson_interval needs n >= 1 trials, got {n!r}")
    if not 0.0 <= successes <= n:
        raise ValueError(f"wilson_interval needs 0 <= successes <= n = {n}, got {successes!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1 (exclusive), got {level!r}")
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2.0)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


#: the fewest clusters a stratum needs for its variance to be estimated from them: with fewer
#: (two haystacks of four questions, say) the estimate has one or two degrees of freedom and is 0
#: whenever the clusters agree, so the stratum is taken at its worst case instead (every question
#: of a context answered alike: the clusters' own Kish size)
MIN_CLUSTERS = 5


def cluster_wilson_interval(scores: Sequence[float], clusters: Sequence[object],
                            level: float = 0.95) -> tuple[float, float]:  # fmt: skip
    """The Wilson interval of the mean of ``scores`` (each in ``[0, 1]``) where samples of one
    cluster (``clusters[i]`` names sample ``i``'s: questions asked of one shared context) are
    not independent: Wilson's formula at the *effective* sample size (Kish's design effect;
    Kish 1965, *Survey Sampling*, 8.2), the equal-weight, one-stratum case of
    :func:`weighted_cluster_wilson_interval` (which says how). With ``C`` clusters of equal
    size: ``n_eff`` between ``C`` and ``n``, ``C`` where the clusters are fewer than
    :data:`MIN_CLUSTERS` or every score is 0 (or every one 1). Every cluster of one sample:
    exactly :func:`wilson_interval`."""
    values = [float(v) for v in scores]
    if len(values) != len(clusters) or not values:
        raise ValueError(f"cluster_wilson_interval needs one cluster per score, got "
                         f"{len(values)} scores and {len(clusters)} clusters")  # fmt: skip
    if len(set(clusters)) == len(values) and all(0.0 <= v <= 1.0 for v in values):
        return wilson_interval(sum(values), len(values), level)
    return weighted_cluster_wilson_interval(values, [1.0] * len(values), clusters, level=level)


def weighted_cluster_wilson_interval(scores: Sequence[float], weights: Sequence[float],
                                     clusters: Sequence[object], *,
                                     strata: Sequence[object] | None = None,
                                     level: float = 0.95) -> tuple[float, float]:  # fmt: skip
    """The Wilson interval of the *weighted* mean ``p = sum_i w_i s_i`` (weights normalized to
    sum 1; each score in ``[0, 1]``) where samples of one cluster are not independent: RULER's
    score at a length, the mean over tasks of each task's mean, weighs a sample ``1 / (T n_t)``,
    each task a stratum (its samples drawn apart from the other tasks', its weight fixed).

    Wilson's formula at the effective size ``n_eff = p (1 - p) / V``. ``V`` sums each stratum's
    variance: with ``p_h`` the stratum's own mean and ``z_c = sum_{i in c} w_i (s_i - p_h)``
    per cluster (the separate estimator's linearization), ``C_h / (C_h - 1) sum_{c in h} z_c**2``
    over its ``C_h`` clusters (for clusters of ``m`` samples: ``W_h**2 var(cluster means) /
    C_h``, the textbook stratified cluster sample). A stratum of fewer than
    :data:`MIN_CLUSTERS` clusters is taken at its worst case instead, ``p (1 - p) sum_{c in h}
    W_c**2`` (``W_c`` a cluster's weight: every question of a context answered alike; a stratum
    of single questions, the independent variance). ``n_eff`` is held to ``[n_clusters,
    n_kish]``: ``n_kish = 1 / sum_i w_i**2`` (Kish's size of independent weighted draws; ``n``
    where the weights are equal), ``n_clusters = min(n_kish, 1 / sum_c W_c**2)`` (the clusters'
    Kish size: ``C`` for equal clusters of equal weight). Every cluster of one sample:
    ``n_kish``; every score 0 (or every one 1), the clusters' size."""
    values, mass = [float(v) for v in scores], [float(w) for w in weights]
    layers = [None] * len(values) if strata is None else list(strata)
    if not values or not len(values) == len(mass) == len(clusters) == len(layers):
        raise ValueError(f"weighted_cluster_wilson_interval needs one weight, one cluster and "
                         f"one stratum per score, got {len(values)} scores, {len(mass)} weights, "
                         f"{len(clusters)} clusters and {len(layers)} strata")  # fmt: skip
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"scores must be in [0, 1], got {values}")
    if any(not math.isfinite(w) or w <= 0.0 for w in mass):
        raise ValueError(f"weights must be finite and > 0, got {mass}")
    total = sum(mass)  # normalized last, so that equal weights give the unweighted p and n exactly
    p = min(1.0, max(0.0, sum(m * v for m, v in zip(mass, values, strict=True)) / total))
    n_kish = total * total / sum(m * m for m in mass)
    if len(set(zip(layers, clusters, strict=True))) == len(values):
        return _wilson(p, n_kish, level)
    own: dict[object, list[float]] = {}  # stratum -> [weight, weighted sum]
    for m, v, h in zip(mass, values, layers, strict=True):
        own.setdefault(h, [0.0, 0.0])
        own[h][0] += m
        own[h][1] += m * v
    z: dict[tuple[object, object], list[float]] = {}  # (stratum, cluster) -> [W_c, z_c]
    for m, v, c, h in zip(mass, values, clusters, layers, strict=True):
        z.setdefault((h, c), [0.0, 0.0])
        z[(h, c)][0] += m / total
        z[(h, c)][1] += m / total * (v - own[h][1] / own[h][0])
    n_clusters = min(n_kish, 1.0 / sum(wc * wc for wc, _ in z.values()))
    if p * (1.0 - p) == 0.0:
        return _wilson(p, n_clusters, level)
    variance = _stratified_variance(z, p)
    n_eff = n_kish if variance == 0.0 else min(n_kish, max(n_clusters, p * (1.0 - p) / variance))
    return _wilson(p, n_eff, level)


def _stratified_variance(z: dict[tuple[object, object], list[float]], p: float) -> float:
    """:func:`weighted_cluster_wilson_interval`'s ``V`` from ``(stratum, cluster) -> [W_c,
    z_c]``: each stratum's ``C_h / (C_h - 1) sum z_c**2``, or its worst case ``p (1 - p) sum
    W_c**2`` where it has fewer than :data:`MIN_CLUSTERS` clusters."""
    by_stratum: dict[object, list[tuple[float, float]]] = {}
    for (h, _), (wc, zc) in z.items():
        by_stratum.setdefault(h, []).append((wc, zc))
    variance = 0.0
    for cells in by_stratum.values():
        k = len(cells)
        if k < MIN_CLUSTERS:  # too few to estimate from: the worst case
            variance += p * (1.0 - p) * sum(wc * wc for wc, _ in cells)
        else:
            variance += k / (k - 1) * sum(zc * zc for _, zc in cells)
    return variance


def _wilson(p: float, n: float, level: float) -> tuple[float, float]:
    """Wilson's interval of a proportion ``p`` over ``n`` (possibly fractional) trials."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1 (exclusive), got {level!r}")
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2.0)
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test_p(up: int, down: int) -> float | None:
    """The exact two-sided sign test of ``up`` pairs that went one way against ``down`` that
    went the other (ties left out, as the test leaves them): under the null each changed pair
    goes up with probability 1/2, so ``p = min(1, 2 P(Binomial(up + down, 1/2) <= min(up,
    down)))``. McNemar's exact test on a paired 2x2 table is this test on its discordant
    cells. None where no pair changed (nothing to test)."""
    if up < 0 or down < 0:
        raise ValueError(f"sign_test_p needs counts >= 0, got up={up}, down={down}")
    n = up + down
    if n == 0:
        return None
    tail = sum(math.comb(n, i) for i in range(min(up, down) + 1)) / 2**n
    return min(1.0, 2 * tail)
