"""Statistics across seeds (mean and confidence interval of a cell, and of the paired
differences between two cells that share seeds): the lab's name for
:mod:`posenc._stats`, which the plots read too."""

from __future__ import annotations

from .._stats import intervals_overlap, mean_ci, paired_mean_ci, t_critical, t_two_sided_prob

__all__ = [
    "CI_LEVEL", "intervals_overlap", "mean_ci", "paired_mean_ci", "t_critical", "t_two_sided_prob",
]  # fmt: skip

#: The confidence level of the lab's intervals: the table's ``±``, the CSV's ``bits_ci95_half``
#: and the paired differences' (:mod:`posenc.lab.paired`).
CI_LEVEL = 0.95
