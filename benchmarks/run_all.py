"""Run the full benchmark suite and write the figures into benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/run_all.py            # CPU (or the GPU when there is one)
    .venv/bin/python benchmarks/run_all.py --quick    # small shapes, a smoke run

Each subcommand writes its rows to ``benchmarks/rows/<block>.json`` and replaces its own block of
RESULTS.md with their rendering; text outside the blocks (the analysis) is kept. The same figures
come from ``posenc bench rope|cos-sin|decode-positions --results benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from posenc.cli import app

RESULTS = Path(__file__).with_name("RESULTS.md")


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    shapes = "quick" if quick else "llama"
    repeats = "5" if quick else "15"
    runs = [
        ["bench", "rope", "--shapes", shapes, "--repeats", repeats],
        ["bench", "cos-sin", "--shapes", shapes, "--repeats", repeats],
        # per call at positions 100 .. 4e6 (a 2**20-row table: ~1.5 GiB while it runs)
        ["bench", "decode-positions", "--repeats", "5" if quick else "41"]
        + (["--positions", "100,5000"] if quick else []),
    ]
    try:
        import torch

        if torch.cuda.is_available():  # the GPU target is forward + backward
            runs.append(["bench", "rope", "--shapes", "4x32/8x4096x128", "--dtypes", "bfloat16",
                         "--repeats", repeats, "--backward"])  # fmt: skip
    except ImportError:
        pass
    for args in runs:
        app([*args, "--results", str(RESULTS)], standalone_mode=False)


if __name__ == "__main__":
    main()
