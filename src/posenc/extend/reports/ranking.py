"""Which method is better than which, at each length of a task study, by a paired test.

Every method of a study answers the same prompts, so two methods compare sample by sample: a
prompt one answers and the other does not is evidence, a prompt both answer (or both miss) is
not. For each length and each pair of methods that answered every cell there, the samples both
answered (same task, depth and prompt digest) are paired; samples that share a context (a row's
``contexts``: several questions asked of one prefilled context) are one unit, their score
differences averaged, since they are not independent draws. The exact two-sided sign test
(:func:`posenc._stats.sign_test_p`) counts the units where the first method scored higher
against those where it scored lower, ties left out. Holm's step-down correction
(:func:`posenc._stats.holm`) runs over every comparison of the study, so a verdict is a claim on
its own at 5 % family-wise (as the lab's paired differences are). Where the corrected p is not
below 5 %, or no unit differs, the pair is *not distinguishable*: two samples a cell cannot rank
methods, and this says so instead of letting a difference of means speak.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from ..._stats import holm, sign_test_p
from .tasks import complete_rows, k_text, study_methods

#: The family-wise error rate a verdict is held to.
ALPHA = 0.05

Rows = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class Comparison:
    """Methods ``a`` and ``b`` at ``length``: ``up`` units where ``a`` scored higher, ``down``
    where lower, ``units`` paired in all; ``p`` the sign test's (None: no unit differs) and
    ``p_holm`` over the study's comparisons."""

    length: int
    a: str
    b: str
    up: int
    down: int
    units: int
    p: float | None
    p_holm: float = 1.0

    @property
    def verdict(self) -> str:
        """``a > b``, ``b > a`` or ``not distinguishable``."""
        if self.p_holm >= ALPHA:
            return "not distinguishable"
        return f"{self.a} > {self.b}" if self.up > self.down else f"{self.b} > {self.a}"


def _units(rows: Rows, method: str, length: int) -> dict[tuple[Any, ...], dict[str, float]]:
    """(task, depth, unit) -> {sample digest: score} of ``method`` at ``length``; a unit is a
    shared context where the row names one per sample (``contexts``), else the sample itself."""
    out: dict[tuple[Any, ...], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["method"] != method or int(r["length"]) != length:
            continue
        contexts = r.get("contexts") or r["digests"]
        for digest, context, score in zip(r["digests"], contexts, r["scores"], strict=True):
            out[(r["task"], r["depth"], context)][digest] = float(score)
    return out


def compare(rows: Rows, a: str, b: str, length: int) -> Comparison:
    """``a`` against ``b`` at ``length`` over the samples both answered (see the module)."""
    mine, theirs = _units(rows, a, length), _units(rows, b, length)
    up = down = units = 0
    for key, scores in mine.items():
        other = theirs.get(key, {})
        shared = [d for d in scores if d in other]
        if not shared:
            continue
        units += 1
        diff = sum(scores[d] - other[d] for d in shared) / len(shared)
        up, down = up + (diff > 0), down + (diff < 0)
    return Comparison(length, a, b, up, down, units, sign_test_p(up, down))


def rank(rows: Rows) -> list[Comparison]:
    """Every pair of methods at every length all of them answered in full, Holm-adjusted over
    the whole list (comparisons with no differing unit count as p = 1)."""
    full = complete_rows(rows)
    methods = study_methods(full)
    by_length: dict[int, set[str]] = defaultdict(set)
    for r in full:
        by_length[int(r["length"])].add(r["method"])
    found = [compare(full, a, b, n) for n in sorted(by_length)
             for a, b in combinations([m for m in methods if m in by_length[n]], 2)]  # fmt: skip
    adjusted = holm([1.0 if c.p is None else c.p for c in found])
    return [Comparison(c.length, c.a, c.b, c.up, c.down, c.units, c.p, p)
            for c, p in zip(found, adjusted, strict=True)]  # fmt: skip


def better_than(comparisons: Sequence[Comparison], method: str, length: int) -> list[str]:
    """The methods ``method`` is shown better than at ``length``."""
    out = []
    for c in comparisons:
        if c.length == length and c.verdict == f"{method} > {c.b if c.a == method else c.a}":
            out.append(c.b if c.a == method else c.a)
    return out


def ranking_line(rows: Rows) -> str:
    """One line: at each length, the pairs the paired test tells apart (with their counts and
    Holm-adjusted p), or that none is; how many comparisons the correction covered."""
    found = rank(rows)
    if not found:
        return "paired test: no length with two methods answered in full"
    parts = []
    for n in sorted({c.length for c in found}):
        told = [c for c in found if c.length == n and c.verdict != "not distinguishable"]
        units = max(c.units for c in found if c.length == n)
        said = ", ".join(f"{c.verdict} ({max(c.up, c.down)} of {c.up + c.down} differing, "
                         f"p {c.p_holm:.3f})" for c in told)  # fmt: skip
        parts.append(f"{k_text(n)}: {said or 'not distinguishable'} ({units} paired)")
    return f"paired sign test, Holm over {len(found)} comparisons: " + "; ".join(parts)
