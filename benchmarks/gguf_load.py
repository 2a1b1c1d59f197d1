"""Reading a GGUF file's metadata and loading the model: gguf's own reader against posenc's
(:mod:`posenc.hf.gguf_read`), on the packaged SmolLM2-135M (49K-token vocabulary) and
Gemma-3-270M (262K) files, in one run.

    .venv/bin/python benchmarks/gguf_load.py [--rounds 3] [--load]

Each round parses each file with each reader (round-robin, CPU time of this process, torch and
numpy on one thread), then checks the two readers' fields are equal; medians over the rounds.
``--load`` also times one whole ``posenc.extend.model.load.load_model`` per model (tokenizer, config
and dequantized weights) with posenc's reading and with transformers' own (a new gguf reader for
each of its three reads of the file and gguf's tensor-name map built per submodule), once each,
after one untimed load that pays the imports.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from posenc.extend.model.packaged import packaged_gguf
from posenc.hf import gguf_read


def _cpu(fn: Any) -> tuple[float, Any]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


@contextmanager
def _stock() -> Any:
    """``load_model`` with gguf's reader as it is (no sharing, no fast views)."""
    before = gguf_read.gguf_read_once

    @contextmanager
    def plain() -> Any:
        yield

    import posenc.extend.model.load as model_module

    model_module.gguf_read_once = plain  # type: ignore[assignment]
    try:
        yield
    finally:
        model_module.gguf_read_once = before  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import gguf

    fast_cls = gguf_read.fast_reader(gguf.GGUFReader)
    if fast_cls is gguf.GGUFReader:
        sys.exit(f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else ''}: no fast reader")
    files = {name: packaged_gguf(name) for name in ("smollm2", "gemma3-270m")}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for name, path in files.items():
            stock_s, stock = _cpu(lambda p=path: gguf.GGUFReader(p))
            fast_s, fast = _cpu(lambda p=path: fast_cls(p))
            assert list(stock.fields) == list(fast.fields)
            for key, field in stock.fields.items():
                other = fast.fields[key]
                assert field.data == other.data and all(
                    np.array_equal(a, b) for a, b in zip(field.parts, other.parts, strict=True)
                ), key
            times.setdefault((name, "stock"), []).append(stock_s)
            times.setdefault((name, "posenc"), []).append(fast_s)
    print("| file | vocabulary | gguf reader s | posenc reader s | ratio |")
    print("|---|---|---|---|---|")
    for name, path in files.items():
        vocab = len(gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].data)
        s, f = (statistics.median(times[(name, k)]) for k in ("stock", "posenc"))
        print(f"| {path.name} | {vocab:,} | {s:.2f} | {f:.2f} | {s / f:.1f}x |")
    if args.load:
        from posenc.extend.model.load import load_model, resolve_source

        print("\n| model | load, stock reader s | load, posenc s | ratio |\n|---|---|---|---|")
        load_model(resolve_source(str(files["smollm2"])))  # imports and first-use costs, untimed
        for name, path in files.items():
            source = resolve_source(str(path))
            with _stock():
                stock_s, _ = _cpu(lambda s=source: load_model(s))
            fast_s, _ = _cpu(lambda s=source: load_model(s))
            print(f"| {name} | {stock_s:.1f} | {fast_s:.1f} | {stock_s / fast_s:.1f}x |")


if __name__ == "__main__":
    main()
