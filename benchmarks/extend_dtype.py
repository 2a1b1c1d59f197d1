"""The task studies' dtype (docs/real-model.md): one prefill of 4,096 tokens through each packaged
model in float32 and in bfloat16, as the studies run it (posenc.hf.linear_memory, one thread),
CPU-time medians of 3 rounds after a warm-up, both dtypes in the same rounds; the ratio is
float32's time over bfloat16's. A benchmark, never CI (each model loads from its package).

    python benchmarks/extend_dtype.py [LENGTH]
"""

import statistics
import sys
import time

import torch

from posenc.extend.model.load import load_model, resolve_source
from posenc.extend.model.packaged import packaged_gguf
from posenc.hf.linear_memory import linear_memory


def prefill_seconds(model, ids: torch.Tensor) -> float:
    with linear_memory(model), torch.inference_mode():
        start = time.process_time()
        model.model(input_ids=ids)
        return time.process_time() - start


if __name__ == "__main__":
    torch.set_num_threads(1)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    print(f"torch {torch.__version__}, 1 thread, prefill of {n} tokens, CPU seconds, median of 3")
    print("| model | float32 | bfloat16 | ratio |\n|---|---|---|---|")
    for name in ("smollm2", "gemma3-270m"):
        source = resolve_source(str(packaged_gguf(name)))
        models = {dt: load_model(source, dtype=dt)[0] for dt in ("float32", "bfloat16")}
        ids = torch.randint(100, 20000, (1, n), generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {dt: [] for dt in models}
        for m in models.values():
            prefill_seconds(m, ids[:, :512])  # warm-up
        for _ in range(3):
            for dt, m in models.items():
                times[dt].append(prefill_seconds(m, ids))
        f32, bf16 = (statistics.median(times[dt]) for dt in ("float32", "bfloat16"))
        print(f"| {name} | {f32:.2f} s | {bf16:.2f} s | {f32 / bf16:.2f}x |", flush=True)
