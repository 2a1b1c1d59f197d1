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


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether ``mean ± half`` intervals ``a`` and ``b`` (each ``(mean, half)``) share a point:
    the report's "within noise" test. A lenient one: two intervals that do not overlap differ
    clearly (well past a 5%-level t test of the difference), but overlapping ones can still
    hide a real difference, so a tie reads "not shown to differ", not "equal"."""
    return abs(a[0] - b[0]) <= a[1] + b[1]
