"""Effective context length: the longest length up to which a model's score stays above a
threshold (RULER, Hsieh et al. 2024, section 4: the threshold is Llama-2-7B-chat's average over
its 13 tasks at 4K, 85.6%).

Two thresholds, each stated in the result with how the length was found:

* ``absolute``: RULER's 85.6% (:data:`RULER_THRESHOLD`), comparable with its tables;
* ``relative``: a fraction (default 0.9) of the series' own score at its shortest length — or of
  a ``reference`` score given, such as the model as trained (``none``) at the shortest length —
  for small models that never reach 85.6% even where they work as trained.

The rule: the longest tested length ``L`` such that the score at *every* tested length up to
``L`` is at or above the threshold ("stays above"); a dip followed by a recovery ends it at the
dip, and the later lengths that pass again are reported as ``passes_after``. Every length
passing means the effective length is at least the longest tested (``censored``); the shortest
length failing gives None. Scores are point estimates, as RULER's are; their intervals are the
table's to show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: RULER's threshold: Llama-2-7B-chat's average score at 4K, as a fraction.
RULER_THRESHOLD = 0.856
#: The default fraction of the shortest length's score a relative threshold keeps.
RELATIVE_FRACTION = 0.9


@dataclass(frozen=True)
class EffectiveLength:
    """``length``: the effective length (None: below the threshold at the shortest length);
    ``threshold``: the score it was held to; ``rule``: ``"absolute"`` or ``"relative"``;
    ``first_failure``: the first tested length below it (None: none); ``censored``: every tested
    length passed, so the true value is at least ``length``; ``passes_after``: lengths past the
    first failure that pass again; ``how``: one sentence saying all of it."""

    length: int | None
    threshold: float
    rule: str
    first_failure: int | None
    censored: bool
    passes_after: tuple[int, ...]
    how: str


def effective_length(scores: Mapping[int, float], threshold: float,
                     rule: str = "absolute") -> EffectiveLength:  # fmt: skip
    """``scores`` (tested length -> score in ``[0, 1]``) held to ``threshold``: the longest length
    up to which every score is at or above it (:class:`EffectiveLength`)."""
    _check_fractions(scores)
    lengths = sorted(scores)
    failing = [n for n in lengths if scores[n] < threshold]
    first = failing[0] if failing else None
    passed = [n for n in lengths if first is None or n < first]
    length = passed[-1] if passed else None
    after = tuple(n for n in lengths if first is not None and n > first and n not in failing)
    pct = f"{threshold:.1%}"
    if length is None:
        how = f"below {pct} already at the shortest length tested, {lengths[0]}"
    elif first is None:
        how = f"at or above {pct} at every length tested, up to {length}: at least {length}"
    else:
        how = f"at or above {pct} up to {length}; {scores[first]:.1%} at {first}"
    if after:  # a recovery past the first failure: the rule ends at the dip, the reader sees both
        how += f" (above again at {', '.join(map(str, after))})"
    return EffectiveLength(length, threshold, rule, first, first is None, after,
                           f"{rule} threshold: {how}")  # fmt: skip


def _check_fractions(scores: Mapping[int, float]) -> None:
    """Scores as fractions in ``[0, 1]``: a percentage (``94`` for 94 %) would pass any bar."""
    if not scores:
        raise ValueError("effective_length needs at least one length's score")
    for n, score in scores.items():
        if not 0.0 <= float(score) <= 1.0:  # NaN fails too
            raise ValueError(
                f"the score at {n} is {score}: scores are fractions in [0, 1] "
                f"(0.94 for 94 %), not percentages"
            )


def ruler_effective_length(scores: Mapping[int, float]) -> EffectiveLength:
    """:func:`effective_length` against RULER's 85.6%."""
    return effective_length(scores, RULER_THRESHOLD, "absolute")


def relative_effective_length(scores: Mapping[int, float], fraction: float = RELATIVE_FRACTION,
                              reference: float | None = None) -> EffectiveLength:  # fmt: skip
    """:func:`effective_length` against ``fraction`` of ``reference`` (default: ``scores`` at its
    shortest length). A reference of 0 (the task never solved) gives a threshold of 0, which
    every length passes; the sentence says so."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    _check_fractions(scores)
    if reference is not None and not 0.0 <= float(reference) <= 1.0:
        raise ValueError(f"reference must be a fraction in [0, 1] (0.8 for 80 %), got {reference}")
    base = scores[min(scores)] if reference is None else reference
    result = effective_length(scores, fraction * base, "relative")
    whose = f"the score at {min(scores)}" if reference is None else "the reference score"
    note = f" ({fraction:.0%} of {whose}, {base:.1%})"
    if base == 0:
        note += "; the reference is 0, so this says nothing"
    return EffectiveLength(result.length, result.threshold, result.rule, result.first_failure,
                           result.censored, result.passes_after, result.how + note)  # fmt: skip
