"""An lm-eval run's output written as lm-eval's own CLI writes it (``--output_path`` with
``--log_samples``): what posenc's reader takes back, from a :func:`lm_eval.simple_evaluate`."""

from __future__ import annotations

from typing import Any


def save_run(tracker: Any, results: dict[str, Any] | None) -> None:
    """``results`` of ``simple_evaluate(..., log_samples=True, evaluation_tracker=tracker)``
    saved by ``tracker`` (an ``EvaluationTracker``): the aggregated file and each task's samples."""
    assert results is not None
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in results["configs"]:
        tracker.save_results_samples(task_name=name, samples=samples[name])
