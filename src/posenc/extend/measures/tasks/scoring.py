"""RULER's scoring rules, per sample (RULER's ``scripts/eval/synthetic/constants.py``).

RULER scores a list of predictions at once and reports a percentage; here each rule scores one
output in ``[0, 1]`` and the mean over samples is RULER's number divided by 100. RULER uses
``string_match_all`` for every synthetic task (every NIAH variant, multi-value included,
variable tracking, common- and frequent-words extraction) and ``string_match_part`` only for its
QA tasks, which need downloaded data and are not built here; both are registered so a task can
name either. Before scoring RULER strips the output and turns control characters into newlines
(``postprocess_pred`` in ``scripts/eval/evaluate.py``), which :func:`postprocess` repeats; no
rule depends on it (a newline never makes or breaks a substring match of a reference).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .base import Metric

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess(output: str) -> str:
    """RULER's ``postprocess_pred``: stripped, each control character a newline, stripped."""
    return _CONTROL.sub("\n", output.strip()).strip()


def string_match_all(output: str, references: Sequence[str]) -> float:
    """The fraction of ``references`` found in ``output``, case-insensitively (RULER's
    ``string_match_all`` for one prediction): 1 only when every reference is there."""
    if not references:
        raise ValueError("string_match_all needs at least one reference")
    text = output.lower()
    return sum(r.lower() in text for r in references) / len(references)


def string_match_part(output: str, references: Sequence[str]) -> float:
    """1 when any of ``references`` is found in ``output`` case-insensitively, else 0 (RULER's
    ``string_match_part`` for one prediction)."""
    if not references:
        raise ValueError("string_match_part needs at least one reference")
    text = output.lower()
    return float(any(r.lower() in text for r in references))


#: RULER's metric names -> the rule.
METRICS: dict[str, Metric] = {
    "string_match_all": string_match_all,
    "string_match_part": string_match_part,
}
