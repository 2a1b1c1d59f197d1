"""Statistics across seeds (mean and confidence interval of a cell, and of the paired
differences between two cells that share seeds, their paired t test and Holm's correction
across a table of them): the lab's name for
:mod:`posenc._stats`, which the plots read too."""

from __future__ import annotations

from ..._stats import (
    holm,
    intervals_overlap,
    mean_ci,
    paired_mean_ci,
    paired_t_p,
    t_critical,
    t_two_sided_prob,
)

__all__ = [
    "CI_LEVEL", "holm", "intervals_overlap", "mean_ci", "paired_mean_ci", "paired_t_p",
    "t_critical", "t_two_sided_prob",
]  # fmt: skip

#: The confidence level of the lab's intervals: the table's ``±``, the CSV's ``bits_ci95_half``
#: and the paired differences' (:mod:`posenc.lab.reports.paired`).
CI_LEVEL = 0.95
