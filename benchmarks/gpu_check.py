"""`make gpu-check`: every GPU-only part of posenc in one short, self-checking run.

    python benchmarks/gpu_check.py                 # on a CUDA machine: the real run (< 8 min)
    python benchmarks/gpu_check.py --dry-run       # anywhere: tiny sizes on the CPU, plumbing only
    python benchmarks/gpu_check.py --wheels        # here, with network: wheels for the GPU machine
    python benchmarks/gpu_check.py --merge DIR     # here, after the run: DIR's figures into the repo

The GPU run, phase by phase, each under its own time limit so that one overrun loses only
itself (the lab gets what the others leave, up to its own 5 minutes):

1. ``setup``: installs the carried wheels (``wheels/``, from ``--wheels``) with
   ``pip --no-index``, never torch; posenc itself runs from ``src`` on ``PYTHONPATH``; records the
   versions, the GPU and ``nvidia-smi``.
2. ``tests``: ``pytest -m gpu`` (Triton kernels against the reference, FlexAttention backward
   against SDPA, the CUDA-graph decode test), pytest's summary line printed.
3. ``rope-forward``, ``rope-backward``: ``posenc bench rope --device cuda`` at Llama shapes
   (prefill and decode forward; prefill forward+backward) against transformers eager and
   compiled, Liger and flash-attn where installed, with the copy-bandwidth rows.
4. ``bias``: ``posenc bench bias --device cuda``, ALiBi and T5 at 2k/8k/32k/64k: FlexAttention vs
   plain causal SDPA vs SDPA with a materialized bias.
5. ``lab``: ``posenc lab --preset gpu-small``; its table is written with the comparison to the
   ALiBi paper's ordering next to it.

Everything goes under one folder, ``--out`` (default ``$OUT`` if set, else
``runs/gpu-check/<UTC time>``): ``gpu-check.log`` (all that was printed), one log per phase,
``env.json``, ``pytest-junit.xml``, ``RESULTS.md`` (the benchmark blocks, the targets and the
lab table, as ``benchmarks/RESULTS.md`` blocks), ``lab/`` (``results.jsonl``, ``report/``,
``comparison.md``) and ``summary.json``. Bulky files (checkpoints) go to ``--work`` instead.
Bring the folder back and run ``--merge`` on it to write the blocks into
``benchmarks/RESULTS.md`` and the lab results into ``benchmarks/lab-gpu-small/``.

Without CUDA the script says so and runs the dry run: the same phases with tiny sizes on the CPU
(``pytest --collect-only`` of the gpu tests, one tiny shape per benchmark with one repeat, a
four-encoding tiny lab), then checks that every output file was produced. The dry run never
writes into the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
REPO_RESULTS = ROOT / "benchmarks" / "RESULTS.md"
REPO_LAB = ROOT / "benchmarks" / "lab-gpu-small"
WHEELS = ROOT / "wheels"

#: The whole GPU run must end within 8 minutes; this leaves 10 s for the last files.
TOTAL_BUDGET_S = 470.0
#: The lab's own bound: gpu-small is sized for at most 5 minutes (presets.py).
LAB_LIMIT_S = 300.0
#: Seconds a phase gets after SIGTERM (the lab checkpoints, pytest writes its report) before
#: SIGKILL.
GRACE_S = 10.0

# --- what the GPU machine is missing ---------------------------------------------------------

#: Installed from the carried wheels with their dependencies (none of them needs torch).
WHEEL_REQUIREMENTS = (
    "pytest>=8",
    "pytest-xdist>=3.5",
    "hypothesis>=6.100",
    "typer>=0.12",
    "rich>=13",
)
#: Installed without dependencies: they require torch/triton, which the machine has and which
#: must never be replaced from a wheel.
WHEEL_NODEPS = ("liger-kernel",)
#: The GPU machine: CPython 3.12, manylinux x86-64, torch 2.11 built for CUDA 13.
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")
TARGET_TORCH = "2.11"
TARGET_CUDA_MAJOR = "13"
FLASH_ATTN_RELEASES = "https://github.com/Dao-AILab/flash-attention/releases/download"

# --- sizing of the gpu-small lab preset ------------------------------------------------------

#: How gpu-small was sized (presets.py, benchmarks/README.md). ``cpu_tokens_per_s``: training
#: throughput of the gpu-small model (dim 512, 8 layers, 8 heads, L = 512, batch 2, float32,
#: AdamW) measured on one thread of the 2-core AMD EPYC VM, torch 2.13.0+cpu, 3 steps each, best
#: of the last two. The H200 / CPU-thread factor (:func:`scaling_factor`, ~3,200): 989 dense
#: bf16 TFLOP/s (H100/H200 SXM datasheet) x 20% utilization for an eager (uncompiled) 25M-model
#: with bf16 autocast, over the 61 GFLOP/s measured for RoPE (347 tokens/s x 177 MFLOP/token:
#: 6 x 25.2M parameters + 12 x 8 layers x 512 x 512 for attention + the tied head).
#: ``step_overhead_s``: host time per step that does not shrink with the factor: 5 ms. It was
#: 10 ms while AdamW ran per parameter (82-98 tensors x ~10 kernels, ~1,000 launches at ~5 us);
#: on CUDA the lab's AdamW is multi-tensor now (a few launches), which leaves the forward and
#: backward's launches, the gradient clipping and the per-step loss read.
#: Compiled training (``LabConfig.compile``; the lab compiles each block, train.compile_blocks):
#: ``compile_speedup`` 1.3x on the compute time: Inductor fuses the RMSNorms, GELU, residual adds
#: and autocast casts between the matmuls. Below what compile is reported to give GPT-2-like
#: models on GPUs (nanoGPT's README: ~250 -> 135 ms an iteration, 1.85x; a 4-layer, dim-128
#: nanoGPT: 1.5-2x, karpathy/nanoGPT PR 392) because attention already is one fused SDPA kernel
#: here and the embedding, head and loss stay eager. ``model_compile_s`` 8 s per encoding: one
#: block's forward and backward, compiled once per cell (dynamo's caches are reset between
#: cells). Measured here for the gpu-small model, dynamo + AOTAutograd alone (backend
#: "aot_eager", one core of the loaded 2-core VM): 2.1-2.7 s per block (whole model: 7.9-11.1 s).
#: 8 s = that trace, as much again for Inductor's lowering and the Triton builds, and 1.5x margin.
#: Unmeasured encodings take the figure of the one they run like (named in ``same_as``).
GPU_SMALL_SIZING: dict[str, Any] = {
    "cpu_tokens_per_s": {
        "none": 427,
        "rope": 347,
        "alibi": 335,
        "t5": 357,
        "shaw": 352,
        "transformer-xl": 345,
        "deberta": 252,
    },
    "same_as": {
        "sinusoidal": "none",
        "learned": "none",
        "xpos": "rope",
        "kerple": "alibi",
        "fire": "t5",
        "sandwich": "alibi",
    },
    "flop_per_token": 177e6,
    "h200_bf16_tflops": 989.0,
    "utilization": 0.20,
    "step_overhead_s": 0.005,
    "compile_speedup": 1.3,
    "model_compile_s": 8.0,
    "flex_compile_s": 5.0,
    "startup_s": 15.0,
    "eval_s_per_encoding": 1.0,
}


def scaling_factor(sizing: dict[str, Any] = GPU_SMALL_SIZING) -> float:
    """H200 / CPU-thread throughput: the H200's assumed FLOP/s (peak x utilization) over the
    FLOP/s the CPU thread reached training the RoPE model."""
    gpu = sizing["h200_bf16_tflops"] * 1e12 * sizing["utilization"]
    return float(gpu / (sizing["cpu_tokens_per_s"]["rope"] * sizing["flop_per_token"]))


def estimate_lab_seconds(cfg: Any, sizing: dict[str, Any] = GPU_SMALL_SIZING) -> dict[str, float]:
    """The H200 time of a lab preset by :data:`GPU_SMALL_SIZING`'s model: training from the
    measured CPU throughput times the factor (and the compile speed-up where ``cfg.compile``)
    plus a fixed overhead per step, one model compile per encoding where ``cfg.compile``, one
    FlexAttention compile per bias encoding and eval length that takes the flex path, start-up,
    evaluation."""
    from posenc import registry
    from posenc.attention import FLEX_MIN_SCORES

    tokens_per_step = cfg.train.batch_size * cfg.train_len
    cpu = sizing["cpu_tokens_per_s"]
    factor = scaling_factor(sizing) * (sizing["compile_speedup"] if cfg.compile else 1.0)
    train = 0.0
    for enc in cfg.encodings:
        name = enc.split(":")[0]
        tok_s = cpu.get(name) or cpu[sizing["same_as"].get(name, "rope")]
        step = tokens_per_step / (tok_s * factor) + sizing["step_overhead_s"]
        train += cfg.train.steps * step
    biases = sum(registry.entry(e.split(":")[0]).family == "bias" for e in cfg.encodings)
    flex_lengths = [n for n in cfg.eval_lengths() if n * n >= FLEX_MIN_SCORES]
    flex = biases * len(flex_lengths) * sizing["flex_compile_s"]
    model = len(cfg.encodings) * sizing["model_compile_s"] if cfg.compile else 0.0
    other = sizing["startup_s"] + sizing["eval_s_per_encoding"] * len(cfg.encodings)
    return {
        "train_s": train,
        "model_compile_s": model,
        "flex_compile_s": flex,
        "compile_s": model + flex,
        "other_s": other,
        "total_s": train + model + flex + other,
    }


# --- output ----------------------------------------------------------------------------------


class Log:
    """Print and keep: every line goes to stdout and to ``gpu-check.log``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, line: str = "") -> None:
        with self._lock:
            print(line, flush=True)
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


@dataclass
class Phase:
    """One command of the run: ``argv`` under ``limit_s`` seconds, its output in ``log``."""

    name: str
    argv: list[str]
    limit_s: float
    what: str
    outputs: list[str] = field(default_factory=list)  # files under out it must produce


@dataclass
class PhaseResult:
    name: str
    command: str
    status: str  # ok, failed, timeout, skipped
    returncode: int | None
    seconds: float
    limit_s: float
    log: str
    summary: str = ""


def run_command(
    argv: Sequence[str],
    log_path: Path,
    limit_s: float,
    log: Log,
    env: dict[str, str],
    cwd: Path = ROOT,
) -> tuple[int | None, bool, float, list[str]]:
    """Run ``argv`` in its own process group, streaming its output to the console, the main log
    and ``log_path``; after ``limit_s`` SIGTERM the group, after :data:`GRACE_S` more SIGKILL.
    Returns ``(returncode, timed_out, seconds, output lines)``."""
    lines: list[str] = []
    t0 = time.monotonic()
    with log_path.open("w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(argv)}\n")
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip("\n")
                lines.append(line)
                f.write(line + "\n")
                f.flush()
                log("  | " + line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=max(limit_s, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            log(
                f"  ! time limit {limit_s:.0f} s reached: SIGTERM, then SIGKILL after {GRACE_S:g} s"
            )
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        reader.join(timeout=5)
    return proc.returncode, timed_out, time.monotonic() - t0, lines


def _signal_group(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # the group this script started (start_new_session)


# --- the plan --------------------------------------------------------------------------------

#: Forward: the bench's ``llama`` preset, prefill (Llama-7B [1, 32, 2048, 128], Llama-3-8B
#: [4, 32/8, 4096, 128], a small-head GQA variant) and decode (q/k [1, 32/8, 1, 128] and
#: [8, 32/8, 1, 128]) shapes.
ROPE_FORWARD = "llama"
#: Forward+backward: the bench's ``prefill`` preset, the prefill shapes of ``llama`` (a decode
#: step has no backward).
ROPE_BACKWARD = "prefill"
#: The prefill shapes the forward+backward targets name (Llama-7B and Llama-3-8B).
TARGET_PREFILL = ("[1, 32, 2048, 128]", "[4, 32/8, 4096, 128]")
COPY_TARGET = 0.85
BIAS_LENGTHS = "2k,8k,32k,64k"
DRY_LAB_ENCODINGS = "sinusoidal,rope,alibi,t5"


def gpu_test_files(tests: Path = ROOT / "tests") -> list[Path]:
    """The test modules that mark tests ``gpu`` (a decorator, a ``marks=`` list or
    ``pytestmark``)."""
    return sorted(f for f in tests.glob("test_*.py") if "pytest.mark.gpu" in f.read_text())


def plan(out: Path, work: Path, python: str, dry: bool, xdist: bool) -> list[Phase]:
    """The phases of a run (``dry``: tiny sizes on the CPU, every candidate that compiles for
    seconds left out)."""
    results = ["--results", str(out / "RESULTS.md")]
    # Only the files that hold gpu tests, and a module that cannot be imported there (a
    # transformers model the machine's older transformers lacks) costs only its own tests.
    files = [str(f.relative_to(ROOT)) for f in gpu_test_files()]
    pytest = [python, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider",
              "--continue-on-collection-errors", *files]  # fmt: skip
    if dry:
        tests = [*pytest, "--collect-only", "-q"]
        rope = "bench rope --device cpu --dtypes float32 --repeats 1 --budget 1"
        rope += " --skip hf-compile,rotary-embedding-torch"
        forward, backward, tag = "1x4/2x16x32,2x4/2x1x32", "1x4/2x16x32", "--tag dry-run"
        # FlexAttention is left out on the CPU: its compile alone is most of the dry run's time.
        bias = "bench bias --device cpu --lengths 64 --dtypes float32 --biases alibi"
        bias += " --repeats 3 --budget 0.5 --skip flex"
        lab = "lab --preset gpu-small --device cpu --threads 1 --dim 32 --layers 1 --heads 2"
        lab += " --train-len 32 --steps 4 --batch-size 2 --eval-lens 1x,2x --eval-tokens 128"
        lab += f" --rope-scalings linear --no-plots --encodings {DRY_LAB_ENCODINGS}"
        limits = {"tests": 60.0, "rope": 40.0, "bias": 40.0, "lab": 60.0}
    else:
        junit = str(out / "pytest-junit.xml")
        tests = [*pytest, "-q", "-ra", "--durations=15", f"--junitxml={junit}"]
        if xdist:  # Triton and Inductor compiles dominate: overlap them on the host's cores
            tests += ["-n", "4"]
        rope = "bench rope --device cuda --dtypes bfloat16 --repeats 50 --budget 5"
        rope += " --skip rotary-embedding-torch"
        forward, backward, tag = ROPE_FORWARD, ROPE_BACKWARD, ""
        bias = f"bench bias --device cuda --lengths {BIAS_LENGTHS} --dtypes bfloat16"
        bias += " --biases alibi,t5 --repeats 5 --budget 3"
        lab = "lab --preset gpu-small --device cuda"
        limits = {"tests": 120.0, "rope": 65.0, "bias": 110.0, "lab": LAB_LIMIT_S}

    def cli(*words: str) -> list[str]:
        return [python, "-m", "posenc", *" ".join(words).split()]

    lab_out = ["--out", str(work / "lab")]
    junit_out = [] if dry else ["pytest-junit.xml"]
    return [
        Phase("tests", tests, limits["tests"], "pytest -m gpu", ["tests.log", *junit_out]),
        Phase(
            "rope-forward",
            cli(rope, "--shapes", forward, tag) + results,
            limits["rope"],
            "RoPE prefill and decode, forward",
        ),
        Phase(
            "rope-backward",
            cli(rope, "--shapes", backward, "--backward", tag) + results,
            limits["rope"],
            "RoPE prefill, forward+backward",
        ),
        Phase("bias", cli(bias) + results, limits["bias"], "bias attention: flex vs SDPA"),
        Phase("lab", cli(lab) + lab_out, limits["lab"], "lab preset gpu-small"),
    ]


def bench_blocks(dry: bool) -> dict[str, str]:
    """Phase -> the RESULTS.md block it writes (the bench CLI names blocks by device and tag)."""
    if dry:
        return {
            "rope-forward": "rope-cpu-dry-run",
            "rope-backward": "rope-backward-cpu-dry-run",
            "bias": "bias-cpu",
        }
    return {
        "rope-forward": "rope-cuda",
        "rope-backward": "rope-backward-cuda",
        "bias": "bias-cuda",
    }


# --- RESULTS.md blocks -----------------------------------------------------------------------

_BLOCK_RE = re.compile(
    r"<!-- bench:(?P<name>[^ ]+) -->\n(?P<body>.*?)\n<!-- /bench:(?P=name) -->", re.S
)


def read_blocks(path: Path) -> dict[str, str]:
    """The ``<!-- bench:NAME -->`` blocks of a results file, by name."""
    if not path.exists():
        return {}
    return {m["name"]: m["body"] for m in _BLOCK_RE.finditer(path.read_text(encoding="utf-8"))}


def write_block(path: Path, name: str, text: str) -> None:
    from posenc.bench.harness import write_section

    write_section(path, name, text)


def parse_tables(block: str) -> dict[str, dict[str, dict[str, str]]]:
    """``### heading`` -> the Markdown table under it, as ``{first cell: {column: cell}}``."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    heading: str | None = None
    header: list[str] | None = None
    for raw in block.splitlines():
        line = raw.strip()
        if line.startswith("### "):
            heading, header = line[4:].strip(), None
            continue
        if heading is None or not line.startswith("|"):
            header = None  # a table ends at the first line that is not a row
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
            out.setdefault(heading, {})
        elif set(line) <= set("|-: "):
            continue
        else:
            out[heading][cells[0]] = dict(zip(header, cells, strict=False))
    return out


def _num(cell: str | None) -> float | None:
    if cell is None:
        return None
    m = re.match(r"^\s*([0-9.]+(?:e[-+]?\d+)?)", cell.replace(",", ""))
    return float(m.group(1)) if m else None


@dataclass
class Target:
    name: str
    case: str
    measured: str
    result: str  # met, MISSED, not measured


def rope_targets(blocks: dict[str, str], names: dict[str, str], dry: bool) -> list[Target]:
    """The issue's RoPE targets, read from the benchmark blocks of this run."""
    out: list[Target] = []
    backward = parse_tables(blocks.get(names["rope-backward"], ""))
    forward = parse_tables(blocks.get(names["rope-forward"], ""))
    for heading, table in backward.items():
        if heading == "Summary":
            continue
        if not dry and not heading.startswith(TARGET_PREFILL):
            continue
        posenc = table.get("posenc", {})
        frac = _num(posenc.get("x copy"))
        out.append(
            Target(
                f"fwd+bwd >= {COPY_TARGET:.0%} of copy bandwidth",
                heading,
                f"{frac:.2f} x copy" if frac is not None else "-",
                "not measured" if frac is None else ("met" if frac >= COPY_TARGET else "MISSED"),
            )
        )
        for ref in ("liger", "hf-compile"):
            out.append(_faster(f"fwd+bwd faster than {ref}", heading, table, ref))
    for heading, table in forward.items():
        if is_decode(heading):
            out.append(_faster("decode faster than hf-eager", heading, table, "hf-eager"))
            out.append(
                _faster(
                    "decode step faster than transformers' (module rows)",
                    heading,
                    table,
                    "hf-module",
                    mine="posenc-module",
                )
            )
    return out


def is_decode(heading: str) -> bool:
    """``[8, 32/8, 1, 128] bfloat16`` (one query position) is a decode case."""
    m = re.match(r"^\[(\d+), ([\d/]+), (\d+), (\d+)\]", heading)
    return m is not None and m.group(3) == "1"


def _faster(
    name: str, heading: str, table: dict[str, dict[str, str]], ref: str, mine: str = "posenc"
) -> Target:
    ours = _num(table.get(mine, {}).get("median ms"))
    theirs = _num(table.get(ref, {}).get("median ms"))
    if ours is None or theirs is None or ours <= 0:
        absent = [n for n in (mine, ref) if n not in table]
        why = "not measured" + (f" ({', '.join(absent)} not in the table)" if absent else "")
        return Target(name, heading, "-", why)
    return Target(
        name,
        heading,
        f"{theirs / ours:.2f}x ({ours:.3f} vs {theirs:.3f} ms)",
        "met" if ours < theirs else "MISSED",
    )


def bias_targets(block: str) -> list[Target]:
    """The bias benchmark's own target lines (its ``### Targets`` list)."""
    out = []
    in_targets = False
    for line in block.splitlines():
        if line.startswith("### "):
            in_targets = line.strip() == "### Targets"
            continue
        if in_targets and line.startswith("- "):
            text = line[2:].strip()
            result = "MISSED" if "MISSED" in text else ("met" if " met" in text else "see text")
            out.append(Target("bias", "", text, result))
    return out


def targets_markdown(targets: Sequence[Target]) -> str:
    from posenc.bench.harness import markdown_table

    rows = [[t.name, t.case or "-", t.measured, t.result] for t in targets]
    return markdown_table(["target", "case", "measured", "result"], rows) if rows else "(none)"


# --- the lab table and the published ordering --------------------------------------------------

#: Degradation past L closer than this (bits) is noise for one seed (README: ~0.02).
FLAT_BITS = 0.03
PUBLISHED = (
    "Published ordering (Press et al., 2022, *Train Short, Test Long*, appendix Table 2: "
    "WikiText-103, models trained at L = 512 and evaluated on longer inputs): sinusoidal breaks "
    "hardest past L, ALiBi stays flat (or improves), rotary degrades, and the T5 bias lies in "
    "between (it extrapolates better than rotary, worse than ALiBi)."
)


def ordering_checks(rows: list[dict[str, Any]]) -> list[Target]:
    """Each clause of :data:`PUBLISHED`, checked on the lab's own rows (one seed's mean): the
    degradation of an encoding is its bits at the longest eval length minus its bits at L."""
    from posenc.lab.report import lengths_of, table_rows

    if not rows:
        return []
    lengths = lengths_of(rows)
    first, last = lengths[0], lengths[-1]
    base: dict[str, dict[int, float]] = {}
    for line in table_rows(rows):
        if line.variant != "base":
            continue
        vals = {n: [x for x in v if x is not None] for n, v in line.bits.items()}
        base[line.encoding] = {n: sum(v) / len(v) for n, v in vals.items() if v}

    def deg(enc: str) -> float | None:
        v = base.get(enc, {})
        return v[last] - v[first] if first in v and last in v else None

    d = {e: deg(e) for e in ("sinusoidal", "rope", "t5", "alibi")}
    span = f"{first} -> {last}"

    def fmt(*names: str) -> str:
        return ", ".join(f"{n} {d[n]:+.3f}" for n in names if d[n] is not None)

    checks: list[Target] = []
    ran = [e for e, v in d.items() if v is not None]
    if d["sinusoidal"] is not None and len(ran) > 1:
        worst = max(ran, key=lambda e: d[e] or 0.0)
        checks.append(
            Target(
                "sinusoidal breaks hardest past L",
                span,
                fmt(*ran),
                "met" if worst == "sinusoidal" and (d["sinusoidal"] or 0) > FLAT_BITS else "MISSED",
            )
        )
    if d["alibi"] is not None:
        v = base["alibi"]
        rise = max(v[n] - v[first] for n in v)
        checks.append(
            Target(
                "ALiBi stays flat",
                span,
                f"largest rise over L {rise:+.3f} bits",
                "met" if rise <= FLAT_BITS else "MISSED",
            )
        )
    if d["rope"] is not None:
        checks.append(
            Target(
                "RoPE degrades",
                span,
                fmt("rope"),
                "met" if (d["rope"] or 0) > FLAT_BITS else "MISSED",
            )
        )
    if None not in (d["t5"], d["alibi"], d["rope"]):
        ok = (d["alibi"] or 0) <= (d["t5"] or 0) <= (d["rope"] or 0)
        checks.append(
            Target(
                "T5 between ALiBi and RoPE",
                span,
                fmt("alibi", "t5", "rope"),
                "met" if ok else "MISSED",
            )
        )
    return checks


def lab_section(rows: list[dict[str, Any]], dry: bool) -> str:
    """The lab table with the published comparison next to it (Markdown)."""
    from posenc.lab.report import results_markdown

    checks = ordering_checks(rows)
    parts = [
        f"## lab gpu-small ({'dry run: tiny sizes on the CPU, plumbing only' if dry else 'GPU'})",
        "",
        results_markdown(rows).rstrip() if rows else "(no finished cells)",
        "",
        "### Against the published ordering",
        "",
        PUBLISHED,
        "",
        f"Degradation = bits at the longest eval length - bits at L (base model, no rescaling); "
        f"'flat' and 'degrades' use a {FLAT_BITS} bit margin (one seed).",
        "",
        targets_markdown(checks),
    ]
    return "\n".join(parts) + "\n"


# --- setup -----------------------------------------------------------------------------------


def subprocess_env(extra_path: Sequence[Path] = (), dry: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(p) for p in (*extra_path, SRC)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env["COLUMNS"] = "200"  # rich tables in logs: wide, not squeezed into 80 columns
    if not dry:
        env.pop("TRITON_INTERPRET", None)  # the real kernels, not the interpreter
    return env


def wheel_requirements(wheels: Path) -> tuple[list[str], list[str]]:
    """(with dependencies, without) from the folder ``--wheels`` wrote."""

    def read(name: str) -> list[str]:
        path = wheels / name
        if not path.exists():
            return []
        lines = (ln.split("#")[0].strip() for ln in path.read_text().splitlines())
        return [ln for ln in lines if ln]

    return read("requirements.txt"), read("requirements-nodeps.txt")


def install_commands(python: str, wheels: Path) -> list[list[str]]:
    """pip commands that install the carried wheels offline (torch is never among them)."""
    deps, nodeps = wheel_requirements(wheels)
    base = [
        python,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        str(wheels),
        "--disable-pip-version-check",
    ]
    cmds = []
    if deps:
        cmds.append([*base, *deps])
    if nodeps:
        cmds.append([*base, "--no-deps", *nodeps])
    return cmds


def extract_wheels(wheels: Path, dest: Path) -> Path:
    """Without pip: unpack the (pure-Python) wheels into ``dest``, to go on PYTHONPATH."""
    dest.mkdir(parents=True, exist_ok=True)
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest)
    return dest


def install_wheels(
    python: str, wheels: Path, site: Path, dry: bool, say: Callable[[str], None]
) -> tuple[list[Path], bool]:
    """Install the carried wheels offline; returns (folders for PYTHONPATH, success).

    First into the interpreter's own environment (pip installs only what is missing there);
    where that is refused (an externally managed or read-only Python) into ``site`` with
    ``--target``, which goes on PYTHONPATH; without pip the wheels are unpacked into ``site``.
    """
    cmds = install_commands(python, wheels) if wheels.is_dir() else []
    if not cmds:
        say(f"no wheels to install ({wheels} has no requirements files; `make gpu-wheels`)")
        return [], True
    if dry:
        for cmd in cmds:
            say(f"dry run: would run {shlex.join(cmd)}")
        return [], True
    if subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode:
        say(f"no pip here: unpacking {wheels} into {site} (on PYTHONPATH)")
        return [extract_wheels(wheels, site)], True

    def run(cmd: list[str]) -> bool:
        say(f"$ {shlex.join(cmd)}")
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        for ln in (res.stdout + res.stderr).splitlines():
            say(ln)
        return res.returncode == 0

    if all(run(cmd) for cmd in cmds):
        return [], True
    say(f"installing into this Python failed: installing into {site} instead (on PYTHONPATH)")
    site.mkdir(parents=True, exist_ok=True)
    target = [["--target", str(site), "--upgrade", *cmd[4:]] for cmd in cmds]
    ok = all(run([*cmd[:4], *extra]) for cmd, extra in zip(cmds, target, strict=True))
    return [site], ok


PROBE = r"""
import importlib, importlib.metadata as md, json, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable}
for dist in ("torch", "triton", "transformers", "liger-kernel", "flash-attn", "pytest",
             "pytest-xdist", "hypothesis", "typer", "rich", "numpy", "matplotlib"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        out[dist] = None
import torch
out["torch.version.cuda"] = torch.version.cuda
out["cuda_available"] = torch.cuda.is_available()
if out["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    out["gpu"] = torch.cuda.get_device_name(0)
    out["gpu_memory_gib"] = round(p.total_memory / 2**30, 1)
    out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
for mod, attr in (("liger_kernel.transformers.rope", "liger_rotary_pos_emb"),
                  ("flash_attn.layers.rotary", "apply_rotary_emb")):
    try:
        getattr(importlib.import_module(mod), attr)
        out["import " + mod] = "ok"
    except Exception as e:
        out["import " + mod] = f"{type(e).__name__}: {e}"[:160]
import posenc
out["posenc"] = posenc.__version__
out["posenc_path"] = posenc.__file__
print("PROBE " + json.dumps(out))
"""


def setup_phase(
    out: Path, work: Path, python: str, dry: bool, log: Log
) -> tuple[PhaseResult, dict[str, Any], list[Path]]:
    """Install the carried wheels (GPU run only), then record the environment."""
    t0 = time.monotonic()
    lines = []
    extra: list[Path] = []
    status, rc = "ok", 0
    log_path = out / "setup.log"
    with log_path.open("w", encoding="utf-8") as f:

        def say(line: str) -> None:
            lines.append(line)
            f.write(line + "\n")
            log("  | " + line)

        extra, ok = install_wheels(python, WHEELS, work / "site", dry, say)
        if not ok:
            status, rc = "failed", 1
        if shutil.which("nvidia-smi"):
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
            (out / "nvidia-smi.txt").write_text(smi.stdout + smi.stderr)
        res = subprocess.run(
            [python, "-c", PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            env=subprocess_env(extra, dry),
            cwd=ROOT,
        )
        env: dict[str, Any] = {}
        for ln in res.stdout.splitlines():
            if ln.startswith("PROBE "):
                env = json.loads(ln[len("PROBE ") :])
        if not env:
            status, rc = "failed", res.returncode or 1
            for ln in (res.stdout + res.stderr).splitlines():
                say(ln)
        for k, v in env.items():
            say(f"{k}: {v}")
    (out / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    result = PhaseResult(
        "setup", "install wheels; probe", status, rc, time.monotonic() - t0, 240.0, log_path.name
    )
    return result, env, extra


# --- the run ---------------------------------------------------------------------------------

_PYTEST_SUMMARY = re.compile(
    r"\b(passed|failed|errors?|skipped|xfailed|xpassed|deselected|collected|no tests ran)\b"
)


def pytest_summary(lines: Sequence[str]) -> str:
    """pytest's last summary line (``12 passed, 1 skipped in 30.1s`` or the collection count)."""
    for line in reversed(lines):
        text = line.strip().strip("=").strip()
        if text and _PYTEST_SUMMARY.search(text) and re.search(r"\bin [0-9.]+s\b", text):
            return text
    return ""


def default_out() -> Path:
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"])
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return ROOT / "runs" / "gpu-check" / stamp


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_check(
    out: Path,
    work: Path,
    dry: bool,
    python: str = sys.executable,
    budget_s: float = TOTAL_BUDGET_S,
    only: Sequence[str] | None = None,
    write_repo: bool = True,
) -> int:
    """The whole check; returns the exit status (0: every phase ran and passed)."""
    t_start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu-check.log")
    try:
        return _run_check(out, work, dry, python, budget_s, only, write_repo, log, t_start)
    finally:
        log.close()


def _run_check(
    out: Path,
    work: Path,
    dry: bool,
    python: str,
    budget_s: float,
    only: Sequence[str] | None,
    write_repo: bool,
    log: Log,
    t_start: float,
) -> int:
    mode = "DRY RUN (CPU, tiny sizes: checks the plumbing, measures nothing)" if dry else "GPU run"
    log(f"posenc gpu-check: {mode}")
    log(f"out: {out}")
    log(f"work (bulky files, not brought back): {work}")
    log(f"budget: {budget_s:.0f} s in all")
    setup, env, extra = setup_phase(out, work, python, dry, log)
    results = [setup]
    phase_env = subprocess_env(extra, dry)
    xdist = not dry and env.get("pytest-xdist") is not None
    phases = plan(out, work, python, dry, xdist)
    if only:
        phases = [p for p in phases if p.name in only]
    # Reserve, for each later phase, a minimum it needs to be worth starting.
    floor = {
        "tests": 30.0,
        "rope-forward": 15.0,
        "rope-backward": 15.0,
        "bias": 30.0,
        "lab": 60.0,
    }
    for i, ph in enumerate(phases):
        spent = time.monotonic() - t_start
        reserve = sum(floor.get(p.name, 10.0) for p in phases[i + 1 :]) if not dry else 0.0
        left = budget_s - spent - reserve - GRACE_S
        limit = min(ph.limit_s, left) if not dry else ph.limit_s
        log("")
        log(f"== {ph.name}: {ph.what} (limit {limit:.0f} s; {spent:.0f} s spent so far)")
        if limit < 5:
            log(f"  skipped: only {left:.0f} s left in the budget")
            results.append(
                PhaseResult(
                    ph.name, shlex.join(ph.argv), "skipped", None, 0.0, limit, f"{ph.name}.log"
                )
            )
            continue
        log(f"$ {shlex.join(ph.argv)}")
        rc, timed_out, secs, lines = run_command(
            ph.argv, out / f"{ph.name}.log", limit, log, phase_env
        )
        status = "timeout" if timed_out else ("ok" if rc == 0 else "failed")
        pytest_line = pytest_summary(lines) if ph.name == "tests" else ""
        res = PhaseResult(
            ph.name, shlex.join(ph.argv), status, rc, secs, limit, f"{ph.name}.log", pytest_line
        )
        results.append(res)
        log(
            f"-- {ph.name}: {status} (exit {rc}) in {secs:.1f} s"
            + (f"; pytest: {pytest_line}" if pytest_line else "")
        )

    # The lab's files: results and report into out (checkpoints stay in work), the comparison.
    lab_rows = collect_lab(out, work, dry, log)
    blocks = read_blocks(out / "RESULTS.md")
    names = bench_blocks(dry)
    targets = rope_targets(blocks, names, dry) + bias_targets(blocks.get(names["bias"], ""))
    lab_checks = ordering_checks(lab_rows)
    device = "cpu" if dry else "cuda"
    write_block(out / "RESULTS.md", f"lab-gpu-small-{device}", lab_section(lab_rows, dry))
    write_block(
        out / "RESULTS.md", f"gpu-check-{device}", check_section(results, targets, env, dry)
    )

    missing = verify_outputs(out, dry, phases)
    total = time.monotonic() - t_start
    summary: dict[str, Any] = {
        "dry_run": dry,
        "seconds": round(total, 1),
        "budget_s": budget_s,
        "phases": [asdict(r) for r in results],
        "targets": [asdict(t) for t in targets],
        "lab_ordering": [asdict(t) for t in lab_checks],
        "env": env,
        "missing_outputs": missing,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    log("")
    log(f"== summary ({total:.0f} s)")
    for r in results:
        log(
            f"  {r.name:<14} {r.status:<8} {r.seconds:6.1f} s"
            + (f"  {r.summary}" if r.summary else "")
        )
    for t in targets + lab_checks:
        log(f"  target: {t.name} {t.case}: {t.measured} -> {t.result}")
    if missing:
        log("  missing outputs: " + ", ".join(missing))
    if not dry and write_repo:
        for name, body in read_blocks(out / "RESULTS.md").items():
            write_block(REPO_RESULTS, name, body)
        log(f"  wrote the blocks into {REPO_RESULTS} (this machine's copy of the tree)")
    failed = [r.name for r in results if r.status != "ok" and not (dry and r.status == "skipped")]
    if dry:
        ok = not failed and not missing
        log(
            f"dry run {'OK' if ok else 'FAILED'}: every phase ran and produced its files"
            if ok
            else f"dry run FAILED: {', '.join(failed + missing)}"
        )
        return 0 if ok else 1
    log(
        "gpu-check "
        + ("OK" if not failed else f"had failures: {', '.join(failed)}")
        + f"; bring back {out}, then `python benchmarks/gpu_check.py --merge {out}`"
    )
    return 0 if not failed and not missing else 1


def collect_lab(out: Path, work: Path, dry: bool, log: Log) -> list[dict[str, Any]]:
    """Copy the lab's results into ``out/lab`` and write its report there (no checkpoints)."""
    from posenc.lab.report import load_rows, write_report

    src = work / "lab" / "results.jsonl"
    dest = out / "lab"
    dest.mkdir(parents=True, exist_ok=True)
    if not src.exists():
        log(f"lab: no results at {src}")
        return []
    shutil.copy2(src, dest / "results.jsonl")
    rows = load_rows(dest)
    write_report(dest, rows, plots=not dry)
    (dest / "comparison.md").write_text(lab_section(rows, dry))
    log(f"lab: {len(rows)} finished cells -> {dest}")
    return rows


def check_section(
    results: Sequence[PhaseResult], targets: Sequence[Target], env: dict[str, Any], dry: bool
) -> str:
    from posenc.bench.harness import markdown_table

    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    keys = (
        "gpu",
        "gpu_memory_gib",
        "python",
        "torch",
        "torch.version.cuda",
        "triton",
        "transformers",
        "liger-kernel",
        "flash-attn",
    )
    parts = [
        f"## gpu-check ({'dry run on the CPU: plumbing only' if dry else 'GPU'})",
        "",
        f"- date: {date}",
        *(f"- {k}: {env.get(k)}" for k in keys if k in env),
        "- command: `make gpu-check` (benchmarks/gpu_check.py)",
        "",
        "### Phases",
        "",
        markdown_table(
            ["phase", "status", "seconds", "limit s", "notes"],
            [
                [r.name, r.status, f"{r.seconds:.1f}", f"{r.limit_s:.0f}", r.summary or "-"]
                for r in results
            ],
        ),
        "",
        "### Targets (measured side by side in this run)",
        "",
        targets_markdown(targets),
    ]
    return "\n".join(parts) + "\n"


def verify_outputs(out: Path, dry: bool, phases: Sequence[Phase]) -> list[str]:
    """Files (and RESULTS.md blocks) the run must have produced; returns what is missing."""
    missing = []
    need = {"gpu-check.log", "env.json", "setup.log", "RESULTS.md"}
    for ph in phases:
        need.add(f"{ph.name}.log")
        need.update(ph.outputs)
    if any(p.name == "lab" for p in phases):
        need.update(
            {
                "lab/results.jsonl",
                "lab/comparison.md",
                "lab/report/table.md",
                "lab/report/results.csv",
            }
        )
    for rel in sorted(need):
        path = out / rel
        if not path.exists() or path.stat().st_size == 0:
            missing.append(rel)
    blocks = read_blocks(out / "RESULTS.md")
    names = bench_blocks(dry)
    for ph in phases:
        if ph.name in names and names[ph.name] not in blocks:
            missing.append(f"RESULTS.md block {names[ph.name]}")
    return missing


# --- wheels ----------------------------------------------------------------------------------


def pip_download(python: str, dest: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        TARGET_PYTHON,
        "--implementation",
        "cp",
        *(a for p in TARGET_PLATFORMS for a in ("--platform", p)),
        *args,
    ]
    print("$ " + shlex.join(cmd), flush=True)
    return subprocess.run(cmd, capture_output=True, text=True)


def flash_attn_wheel_name(version: str) -> str:
    """The name flash-attn's own installer looks for on its GitHub releases (setup.py's
    ``get_wheel_url``) for the GPU machine: torch 2.11, CUDA 13, CPython 3.12, C++11 ABI."""
    return (
        f"flash_attn-{version}+cu{TARGET_CUDA_MAJOR}torch{TARGET_TORCH}cxx11abiTRUE-"
        f"cp312-cp312-linux_x86_64.whl"
    )


def fetch_flash_attn(python: str, dest: Path) -> tuple[bool, str]:
    """A prebuilt flash-attn wheel that matches the GPU machine, or why there is none."""
    res = pip_download(python, dest, ["--no-deps", "flash-attn"])
    if res.returncode == 0:
        return True, "a binary wheel from the package index"
    index = subprocess.run(
        [python, "-m", "pip", "index", "versions", "flash-attn"], capture_output=True, text=True
    )
    m = re.search(r"flash-attn \(([^)]+)\)", index.stdout)
    if not m:
        return False, "flash-attn is not on the package index reachable from here"
    version = m.group(1)
    name = flash_attn_wheel_name(version)
    url = os.environ.get("FLASH_ATTN_WHEEL_URL") or f"{FLASH_ATTN_RELEASES}/v{version}/{name}"
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            (dest / name).write_bytes(r.read())
        return True, f"prebuilt wheel {url}"
    except (urllib.error.URLError, OSError) as e:
        return False, (
            f"unavailable: the package index has flash-attn {version} only as a source "
            f"distribution (a CUDA build the GPU machine cannot do offline in minutes), and the "
            f"prebuilt wheel its installer would fetch, {url}, could not be downloaded "
            f"({type(e).__name__}: {e}). Set FLASH_ATTN_WHEEL_URL to a wheel built for torch "
            f"{TARGET_TORCH} / CUDA {TARGET_CUDA_MAJOR} / cp312 to carry one."
        )


def build_wheels(dest: Path, python: str = sys.executable) -> int:
    """Download what the GPU machine lacks into ``dest`` (the folder the run carries)."""
    dest.mkdir(parents=True, exist_ok=True)
    report = [
        "# Wheels for `make gpu-check`",
        "",
        f"Target: CPython {TARGET_PYTHON}, {', '.join(TARGET_PLATFORMS)}, torch {TARGET_TORCH} "
        f"(CUDA {TARGET_CUDA_MAJOR}) already installed there. Written by `make gpu-wheels` on "
        f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}.",
        "",
    ]
    status = 0
    res = pip_download(python, dest, WHEEL_REQUIREMENTS)
    print(res.stdout[-2000:] + res.stderr[-2000:], flush=True)
    if res.returncode != 0:
        status = 1
    report.append(
        f"- {', '.join(WHEEL_REQUIREMENTS)} (with dependencies): "
        + ("ok" if res.returncode == 0 else "FAILED")
    )
    nodeps = []
    for name in WHEEL_NODEPS:
        r = pip_download(python, dest, ["--no-deps", name])
        ok = r.returncode == 0
        print(r.stdout[-1000:] + r.stderr[-1000:], flush=True)
        report.append(
            f"- {name} (no dependencies: torch/triton are the machine's): "
            + ("ok" if ok else "FAILED " + r.stderr.strip()[-300:])
        )
        if ok:
            nodeps.append(name)
        else:
            status = 1
    ok, why = fetch_flash_attn(python, dest)
    report.append(f"- flash-attn: {why}")
    if ok:
        nodeps.append("flash-attn")
    (dest / "requirements.txt").write_text("\n".join(WHEEL_REQUIREMENTS) + "\n")
    (dest / "requirements-nodeps.txt").write_text("\n".join(nodeps) + "\n")
    files = sorted(dest.glob("*.whl"))
    size = sum(f.stat().st_size for f in files)
    report += ["", f"{len(files)} wheels, {size / 2**20:.1f} MiB:", ""]
    report += [f"- {f.name}" for f in files]
    (dest / "MANIFEST.md").write_text("\n".join(report) + "\n")
    print("\n".join(report), flush=True)
    return status


# --- merge -----------------------------------------------------------------------------------


def merge(run: Path, force: bool = False) -> int:
    """Write a brought-back run's blocks into benchmarks/RESULTS.md and its lab results into
    benchmarks/lab-gpu-small/."""
    summary_path = run / "summary.json"
    if not summary_path.exists():
        print(f"{run} has no summary.json: not a gpu-check output folder", file=sys.stderr)
        return 2
    summary = json.loads(summary_path.read_text())
    if summary.get("dry_run") and not force:
        print(
            f"{run} is a dry run (CPU, tiny sizes): nothing to merge (--force to do so anyway)",
            file=sys.stderr,
        )
        return 2
    blocks = read_blocks(run / "RESULTS.md")
    for name, body in blocks.items():
        write_block(REPO_RESULTS, name, body)
        print(f"block {name} -> {REPO_RESULTS}")
    lab = run / "lab"
    if (lab / "results.jsonl").exists():
        REPO_LAB.mkdir(parents=True, exist_ok=True)
        for rel in (
            "results.jsonl",
            "comparison.md",
            "report/table.md",
            "report/results.csv",
            "report/lab.png",
        ):
            if (lab / rel).exists():
                shutil.copy2(lab / rel, REPO_LAB / Path(rel).name)
                print(f"{lab / rel} -> {REPO_LAB / Path(rel).name}")
    return 0


# --- command line ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument(
        "--out", type=Path, help="output folder (default $OUT or runs/gpu-check/<time>)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="bulky files, not brought back (default runs/gpu-check-work/<out's name>)",
    )
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds in all")
    parser.add_argument(
        "--only",
        help="comma-separated phases (tests, rope-forward, rope-backward, bias, lab)",
    )
    parser.add_argument("--no-repo", action="store_true", help="do not write benchmarks/RESULTS.md")
    parser.add_argument("--wheels", action="store_true", help="download the wheels (needs network)")
    parser.add_argument("--dest", type=Path, default=WHEELS, help="wheel folder (default wheels/)")
    parser.add_argument("--merge", type=Path, metavar="DIR", help="merge a brought-back run")
    parser.add_argument("--force", action="store_true", help="--merge a dry run anyway")
    args = parser.parse_args(argv)
    if args.wheels:
        return build_wheels(args.dest)
    sys.path.insert(0, str(SRC))  # posenc from this tree, installed or not
    if args.merge:
        return merge(args.merge, args.force)
    dry = args.dry_run
    if not dry and not cuda_available():
        print(
            "CUDA is not available here: running the dry run instead (tiny sizes on the CPU; "
            "it checks the plumbing and measures nothing)",
            flush=True,
        )
        dry = True
    out = (args.out or default_out()).resolve()
    work = (args.work or ROOT / "runs" / "gpu-check-work" / out.name).resolve()
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    return run_check(out, work, dry, budget_s=args.budget, only=only, write_repo=not args.no_repo)


if __name__ == "__main__":
    sys.exit(main())
