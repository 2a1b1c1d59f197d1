"""What eight samples a cell cost against two, read from the committed study rows: for each
(task, length) both folders answered with the same methods, the median over methods of a cell's
wall and CPU seconds (its forwards and its decoding, every depth of the task summed), and the
CPU time per sample.

Both, because the two-sample studies ran on one thread and the eight-sample ones on two: the
wall time is what a user waits, the CPU time (a row's ``cpu_seconds``, the process's over the
cell) what the cell used on every thread together. A task's "cell"
here is every depth the study asks of it at that length: the two-sample studies ask
``niah_single_2`` at three depths (6 samples), the eight-sample ones at one (8 samples, two
prefilled contexts of four questions).

    python benchmarks/study_costs.py [BEFORE AFTER ...]   # folders under benchmarks/studies
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from posenc._markdown import markdown_table  # noqa: E402
from posenc.extend.reports.tasks import k_text, task_rows  # noqa: E402
from posenc.extend.study.run import study_rows  # noqa: E402

PAIRS = (("smollm2-135m-bf16", "smollm2-135m-n8"), ("gemma3-270m-tasks", "gemma3-270m-n8"))


def per_task(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], tuple[int, float, float]]:
    """(task, length, method) -> (samples, CPU seconds, wall seconds), every depth summed."""
    out: dict[tuple[str, int, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for r in task_rows(rows):
        key = (str(r["task"]), int(r["length"]), str(r["method"]))
        out[key][0] += int(r["n"])
        out[key][1] += float(r["cpu_seconds"])
        out[key][2] += float(r["seconds"])
    return {k: (int(v[0]), v[1], v[2]) for k, v in out.items()}


def _threads(rows: list[dict[str, Any]]) -> str:
    return "/".join(str(t) for t in sorted({int(r["threads"]) for r in task_rows(rows)}))


def cost_table(before: str, after: str) -> tuple[list[str], list[list[str]]]:
    """Header and body: one line per (task, length) both folders answered, medians over the
    methods both ran there."""
    studies = ROOT / "benchmarks" / "studies"
    rows_a, rows_b = study_rows(studies / before), study_rows(studies / after)
    old, new = per_task(rows_a), per_task(rows_b)
    body = []
    for task, length in sorted({(t, n) for t, n, _ in new}, key=lambda k: (k[1], k[0])):
        methods = sorted({m for t, n, m in new if (t, n) == (task, length)}
                         & {m for t, n, m in old if (t, n) == (task, length)})  # fmt: skip
        if not methods:
            continue
        a = [old[(task, length, m)] for m in methods]
        b = [new[(task, length, m)] for m in methods]
        wall_a, wall_b = (statistics.median(w for _, _, w in x) for x in (a, b))
        cpu_a, cpu_b = (statistics.median(c for _, c, _ in x) for x in (a, b))
        body.append([task, k_text(length), str(len(methods)), f"{a[0][0]} / {b[0][0]}",
                     f"{wall_a:.0f} / {wall_b:.0f}", f"{wall_b / wall_a:.2f}",
                     f"{cpu_a:.0f} / {cpu_b:.0f}", f"{cpu_b / cpu_a:.2f}",
                     f"{cpu_b / b[0][0] / (cpu_a / a[0][0]):.2f}"])  # fmt: skip
    header = ["task", "length", "methods", "samples", f"wall s ({_threads(rows_a)} / "
              f"{_threads(rows_b)} threads)", "wall x", "CPU s", "CPU x",
              "CPU x per sample"]  # fmt: skip
    return header, body


def main(argv: list[str]) -> int:
    if len(argv) % 2:
        print("usage: python benchmarks/study_costs.py [BEFORE AFTER ...]", file=sys.stderr)
        return 2
    pairs = list(zip(argv[::2], argv[1::2], strict=True)) or list(PAIRS)
    for before, after in pairs:
        if not (ROOT / "benchmarks" / "studies" / after / "results.jsonl").is_file():
            print(f"{after}: no rows yet\n")
            continue
        print(
            f"`{before}` (before) against `{after}` (after), medians over the methods both ran:\n"
        )
        print(markdown_table(*cost_table(before, after)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
