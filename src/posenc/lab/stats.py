"""Statistics across seeds (mean and confidence interval of a cell): the lab's name for
:mod:`posenc._stats`, which the plots read too."""

from __future__ import annotations

from .._stats import intervals_overlap, mean_ci, t_critical, t_two_sided_prob

__all__ = ["intervals_overlap", "mean_ci", "t_critical", "t_two_sided_prob"]
