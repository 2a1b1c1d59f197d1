"""RULER-style long-context tasks, built offline with the model's own tokenizer.

Each task is data plus a scoring rule (:class:`Task`, registered by name in :data:`TASKS`):
``get_task("niah_single_1").samples(tokenizer, length, depth, n, seed)`` gives ``n`` prompts of
exactly ``length`` ids, the same for the same seed (so every method answers the same ones and
compares paired); :func:`answer` has a transformers model write its answer greedily through the
KV cache and scores it, with the reference's teacher-forced log-probability beside it;
:func:`summarize` gives a mean with its Wilson interval; :func:`ruler_effective_length` and
:func:`relative_effective_length` read an effective context length off scores by length;
:func:`run_cell` answers a (task, length, depth) cell's samples, :func:`paired_difference`
compares two methods' cells sample by sample and :func:`effective_lengths` reads both effective
lengths off a method's cells.

Tasks (RULER's ``scripts/synthetic.yaml`` names): ``niah_single_1``-``3``,
``niah_multikey_1``-``3``, ``niah_multivalue``, ``niah_multiquery`` (:mod:`.niah`), ``vt``
(:mod:`.variable_tracking`), ``cwe`` and ``fwe`` (:mod:`.extraction`). RULER's ``qa_1``/``qa_2``
need SQuAD and HotpotQA, downloaded, and are not here.
"""

from __future__ import annotations

from . import extraction, niah, variable_tracking  # noqa: F401  (each registers its tasks)
from .base import TASKS, Sample, Span, Task, get_task, register, task_names
from .cell import (
    context_digest,
    effective_lengths,
    intervals_by_length,
    paired_difference,
    run_cell,
    sample_digest,
    scores_by_length,
)
from .effective import (
    RELATIVE_FRACTION,
    RULER_THRESHOLD,
    EffectiveLength,
    effective_length,
    relative_effective_length,
    ruler_effective_length,
)
from .generation import Answer, Score, answer, answer_group, summarize
from .scoring import METRICS, postprocess, string_match_all, string_match_part

# RULER's order (synthetic.yaml), whatever order the modules registered in
for _name in [*niah.CONFIGS, "vt", "cwe", "fwe"]:
    TASKS[_name] = TASKS.pop(_name)

__all__ = [
    "METRICS",
    "RELATIVE_FRACTION",
    "RULER_THRESHOLD",
    "TASKS",
    "Answer",
    "EffectiveLength",
    "Sample",
    "Score",
    "Span",
    "Task",
    "answer",
    "answer_group",
    "context_digest",
    "effective_length",
    "effective_lengths",
    "get_task",
    "intervals_by_length",
    "paired_difference",
    "postprocess",
    "register",
    "relative_effective_length",
    "ruler_effective_length",
    "run_cell",
    "sample_digest",
    "scores_by_length",
    "string_match_all",
    "string_match_part",
    "summarize",
    "task_names",
]  # fmt: skip
