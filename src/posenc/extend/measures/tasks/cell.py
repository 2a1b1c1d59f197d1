"""One cell of a task study — a task at one length and depth, ``n`` samples answered by one
model with one method in place — as plain numbers a row can hold; methods compared paired on
the same samples; effective lengths from cells.

Every method of a study answers the same samples (the same seed gives the same ids), and a
cell keeps a digest of each sample's ids, so a paired comparison can check that it compares
like with like before it subtracts. :mod:`posenc.extend.study.run` writes a cell as a ``task`` row
(:mod:`posenc.extend.study.rows`).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...._stats import paired_mean_ci, weighted_cluster_wilson_interval
from .base import Sample, get_task
from .effective import (
    RELATIVE_FRACTION,
    EffectiveLength,
    relative_effective_length,
    ruler_effective_length,
)
from .generation import answer, answer_group, summarize


def sample_digest(sample: Sample) -> str:
    """12 hex digits of SHA-256 over the sample's ids: equal digests, equal prompts."""
    return _digest(sample.ids)


def context_digest(sample: Sample) -> str:
    """12 hex digits of SHA-256 over the context the sample shares with the other questions of
    its group (its first ``prefix`` ids): equal digests, one prefilled context."""
    return _digest(sample.ids[: sample.prefix])


def _digest(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


def _groups(samples: Sequence[Sample]) -> list[list[Sample]]:
    """Consecutive samples of one shared context together; a sample asked alone by itself."""
    out: list[list[Sample]] = []
    for s in samples:
        last = out[-1][-1] if out else None
        if s.prefix and last is not None and last.prefix == s.prefix and \
                last.ids[: s.prefix] == s.ids[: s.prefix]:  # fmt: skip
            out[-1].append(s)
        else:
            out.append([s])
    return out


def run_cell(model: Any, tokenizer: Any, task: str, length: int, depth: float | None, n: int,
             seed: int, *, logprob: bool = True, max_new_tokens: int | None = None,
             samples: Sequence[Sample] | None = None,
             questions: int = 1) -> dict[str, Any]:  # fmt: skip
    """``n`` samples of ``task`` at ``length`` and ``depth`` (seed ``seed``) answered by
    ``model`` as it stands (:func:`~.generation.answer`) -> a dict: the cell's identity
    (``task``, ``length``, ``depth``, ``seed``, ``n``, ``metric``), ``score`` (mean in
    ``[0, 1]``) with its Wilson ``low``/``high``, and per sample (lists of ``n``): ``scores``,
    ``outputs``, ``references``, ``target_logprobs`` (None without ``logprob``), ``new_tokens``,
    ``digests`` (:func:`sample_digest`); ``seconds`` all told. ``samples``: the cell's samples
    prepared before (:func:`~.prompts.cached_samples`), else built here. ``questions`` > 1:
    ``n / questions`` contexts, each prefilled once and asked its questions in turn
    (:func:`~.generation.answer_group`); the dict then adds ``questions`` and ``contexts`` (one
    :func:`context_digest` per sample), and the interval is the cluster-aware one."""
    t = get_task(task)
    if samples is None:
        samples = t.samples(tokenizer, length, depth, n, seed, questions)
    elif len(samples) != n or any(s.task != task or s.length != length for s in samples):
        raise ValueError(f"the samples given are not {n} of {task} at {length} tokens")
    answers = []
    for group in _groups(samples):
        kw: dict[str, Any] = {"logprob": logprob, "max_new_tokens": max_new_tokens, "task": t}
        answers += (answer_group(model, tokenizer, group, **kw) if len(group) > 1
                    else [answer(model, tokenizer, group[0], **kw)])  # fmt: skip
    grouped = any(s.prefix for s in samples)
    contexts = [context_digest(s) if s.prefix else sample_digest(s) for s in samples]
    score = summarize([a.score for a in answers], contexts=contexts if grouped else None)
    extra = {"questions": questions, "contexts": contexts} if grouped else {}
    return {
        "task": task, "length": length, "depth": depth, "seed": seed, "n": n,
        "metric": t.metric_name, "score": score.mean, "low": score.low, "high": score.high,
        "scores": [a.score for a in answers], "outputs": [a.output for a in answers],
        "references": [list(s.references) for s in samples],
        "target_logprobs": [a.target_logprob for a in answers],
        "new_tokens": [a.new_tokens for a in answers],
        "digests": [sample_digest(s) for s in samples],
        "seconds": round(sum(a.seconds for a in answers), 3), **extra,
    }  # fmt: skip


def paired_difference(cell: Mapping[str, Any], reference: Mapping[str, Any],
                      level: float = 0.95) -> tuple[float, float | None]:  # fmt: skip
    """``cell``'s scores minus ``reference``'s, sample by sample (two methods on the same
    samples): the mean difference and the half-width of its Student t interval
    (:func:`posenc._stats.paired_mean_ci`; None for one sample). ValueError where the two
    cells did not answer the same prompts."""
    if list(cell["digests"]) != list(reference["digests"]):
        raise ValueError(
            f"cells of {cell['task']} at {cell['length']} answered different samples (another "
            "seed, tokenizer or posenc): a paired difference needs the same ones"
        )
    return paired_mean_ci(cell["scores"], reference["scores"], level)


def scores_by_length(cells: Iterable[Mapping[str, Any]]) -> dict[int, float]:
    """Length -> the mean over tasks of each task's mean score there (every depth's samples of a
    task pooled first): RULER's average over tasks, each task weighing the same."""
    per: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        per[int(c["length"])][str(c["task"])].extend(float(s) for s in c["scores"])
    return {
        n: sum(sum(v) / len(v) for v in tasks.values()) / len(tasks)
        for n, tasks in sorted(per.items())
    }


def intervals_by_length(cells: Iterable[Mapping[str, Any]],
                        level: float = 0.95) -> dict[int, tuple[float, float]]:  # fmt: skip
    """Length -> the Wilson interval of :func:`scores_by_length`'s score there: every sample
    weighing what it weighs in that mean (``1 / (T n_t)``: ``T`` tasks, ``n_t`` samples of its
    task at that length), each task a stratum, the questions of one prefilled context (a row's
    ``contexts``) one cluster (:func:`posenc._stats.weighted_cluster_wilson_interval`). A cell
    without ``contexts`` (one question a context) is its samples' own clusters, named by
    digest."""
    per: dict[int, dict[str, list[tuple[float, str]]]] = defaultdict(lambda: defaultdict(list))
    for c in cells:
        names = c.get("contexts") or c["digests"]
        if len(names) != len(c["scores"]):
            raise ValueError(f"a {c['task']} row at {c['length']} has {len(c['scores'])} scores "
                             f"and {len(names)} context names; the rows are damaged")  # fmt: skip
        per[int(c["length"])][str(c["task"])].extend(
            (float(v), f"{c['task']}:{name}") for v, name in zip(c["scores"], names, strict=True)
        )
    out = {}
    for n, tasks in sorted(per.items()):
        scores, weights, clusters, strata = [], [], [], []
        for task, samples in tasks.items():
            for v, name in samples:
                scores.append(v)
                weights.append(1.0 / (len(tasks) * len(samples)))
                clusters.append(name)
                strata.append(task)
        out[n] = weighted_cluster_wilson_interval(
            scores, weights, clusters, strata=strata, level=level
        )
    return out


def effective_lengths(cells: Sequence[Mapping[str, Any]], fraction: float = RELATIVE_FRACTION,
                      reference: float | None = None) -> dict[str, EffectiveLength]:  # fmt: skip
    """``{"absolute": ..., "relative": ...}`` effective lengths of one (model, method) from its
    cells (:func:`scores_by_length`, then :mod:`.effective`)."""
    scores = scores_by_length(cells)
    return {
        "absolute": ruler_effective_length(scores),
        "relative": relative_effective_length(scores, fraction, reference),
    }
