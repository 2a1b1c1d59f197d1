"""`make gpu-check`: every GPU-only part of posenc in one short, self-checking run.

    python benchmarks/gpu_check.py               # on a CUDA machine: the GPU run (< 8 min)
    python benchmarks/gpu_check.py --dry-run     # anywhere: tiny sizes on the CPU, plumbing only
    python benchmarks/gpu_check.py --merge DIR   # here, after the run: DIR's figures into the repo

The run is :data:`PHASES`, one row per phase: a command (the GPU run's and the dry run's), its
time limit, the files it must leave under ``--out``. A phase past its limit gets SIGTERM, then
SIGKILL 10 s later (its whole process group), so an overrun loses that phase only; the lab gets
what the earlier phases leave of the budget, up to its own limit. The wheels the machine lacks
are listed in ``benchmarks/gpu-wheels.txt`` (``make gpu-wheels`` downloads them into
``wheels/``). After the phases the benches' rows (``OUT/rows/*.json``) are judged by
:mod:`posenc.bench.targets`, the same rules the CPU blocks print, and the run writes
``OUT/RESULTS.md`` (the bench blocks, ``lab-gpu-small-<dev>``, ``gpu-check-<dev>``),
``OUT/lab/`` and ``OUT/summary.json``. Without CUDA it runs the dry run instead; a dry run never
writes into the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import gpu_report  # benchmarks/, beside this script
from gpu_report import read_json

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
REPO_RESULTS = ROOT / "benchmarks" / "RESULTS.md"
REPO_LAB = ROOT / "benchmarks" / "lab-gpu-small"
WHEELS = ROOT / "wheels"
WHEEL_LIST = ROOT / "benchmarks" / "gpu-wheels.txt"
#: The whole GPU run must end within 8 minutes; this leaves 10 s for the last files.
TOTAL_BUDGET_S = 470.0
GRACE_S = 10.0  # after SIGTERM (the lab checkpoints, pytest writes its report), then SIGKILL
#: What `make gpu-wheels` passes pip: the GPU machine's interpreter and platforms.
WHEEL_TARGET = ("--only-binary=:all: --no-deps --python-version 3.12 --implementation cp "
                "--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 "
                "--platform manylinux_2_28_x86_64")  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """One row of the run: ``command`` (GPU) or ``dry`` (CPU, tiny sizes) under ``limit_s`` /
    ``dry_limit_s`` seconds, the files it must leave under ``out``; ``floor_s`` is what it keeps
    reserved while earlier phases run; ``needs`` a path it is skipped without."""

    name: str
    what: str
    command: str
    dry: str
    limit_s: float
    dry_limit_s: float
    outputs: tuple[str, ...] = ()
    floor_s: float = 15.0
    needs: str = ""


_BENCH = "{py} -m posenc bench"
_RESULTS = "--results {out}/RESULTS.md"
_DRY_ROPE = f"{_BENCH} rope --device cpu --dtypes float32 --repeats 1 --budget 1 --tag dry-run"
_DRY_ROPE += " --skip hf-compile,rotary-embedding-torch"
_ROPE = f"{_BENCH} rope --device cuda --dtypes bfloat16 --repeats 50 --budget 5"
_ROPE += " --skip rotary-embedding-torch"
_PYTEST = "{py} -m pytest -m gpu -p no:cacheprovider --continue-on-collection-errors {gpu_tests}"
_PYTEST += " --junitxml={out}/pytest-junit.xml"
_LAB = "{py} -m posenc lab --preset gpu-small --out {work}/lab"
_DRY_LAB = " --dim 32 --layers 1 --heads 2 --train-len 32 --steps 4 --batch-size 2 --threads 1"
_DRY_LAB += " --eval-lens 1x,2x --eval-tokens 128 --rope-scalings linear --no-plots"
_LAB_FILES = ("lab/results.jsonl", "lab/comparison.md", "lab/report/table.md",
              "lab/report/results.csv")  # fmt: skip

PHASES = (
    Phase("setup", "the carried wheels, offline (never torch)",
          "{py} -m pip install --no-index --no-deps --disable-pip-version-check --find-links "
          "{wheels} --target {work}/site -r {wheel_list}",
          "{py} -c \"print('dry run: no wheels installed')\"", 60, 30, needs="{wheels}"),
    Phase("env", "versions, the GPU, nvidia-smi", "{py} benchmarks/gpu_env.py {out}",
          "{py} benchmarks/gpu_env.py {out}", 30, 60, ("env.json",)),
    Phase("tests", "pytest -m gpu", f"{_PYTEST} -q -ra --durations=15 {{xdist}}",
          f"{_PYTEST} --collect-only -q", 120, 120, ("pytest-junit.xml",), floor_s=30),
    Phase("rope-forward", "RoPE prefill and decode, forward", f"{_ROPE} --shapes llama {_RESULTS}",
          f"{_DRY_ROPE} --shapes 1x4/2x16x32,2x4/2x1x32 {_RESULTS}", 65, 90,
          ("rows/rope-{dev}{tag}.json",)),
    Phase("rope-backward", "RoPE prefill, forward+backward",
          f"{_ROPE} --shapes prefill --backward {_RESULTS}",
          f"{_DRY_ROPE} --shapes 1x4/2x16x32 --backward {_RESULTS}", 65, 90,
          ("rows/rope-backward-{dev}{tag}.json",)),
    Phase("bias", "bias attention: flex vs SDPA",
          f"{_BENCH} bias --device cuda --lengths 2k,8k,32k,64k --dtypes bfloat16 --biases "
          f"{{gpu_biases}} --repeats 5 --budget 3 {_RESULTS}",
          f"{_BENCH} bias --device cpu --lengths 64 --dtypes float32 --biases alibi --repeats 3 "
          f"--budget 0.5 --skip flex {_RESULTS}", 110, 90, ("rows/bias-{dev}.json",), floor_s=30),
    Phase("lab", "lab preset gpu-small", f"{_LAB} --device cuda",
          f"{_LAB} --device cpu{_DRY_LAB} --encodings {{lab_encodings}}", 300, 120, _LAB_FILES,
          floor_s=60),
)  # fmt: skip


@dataclass
class PhaseResult:
    name: str
    command: str
    status: str  # ok, failed, timeout, skipped
    returncode: int | None
    seconds: float
    limit_s: float
    summary: str = ""


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


def _signal_group(proc: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # the group this script started (start_new_session)


def run_command(
    argv: Sequence[str], log_path: Path, limit_s: float, log: Log, env: dict[str, str]
) -> tuple[int | None, bool, float, list[str]]:
    """Run ``argv`` in its own process group, its output to the console, the main log and
    ``log_path``; after ``limit_s`` SIGTERM the group, after :data:`GRACE_S` more SIGKILL.
    Returns ``(returncode, timed_out, seconds, output lines)``."""
    lines: list[str] = []
    t0 = time.monotonic()
    with log_path.open("w", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(argv)}\n")
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                errors="replace", start_new_session=True)  # fmt: skip

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                f.write(line if line.endswith("\n") else line + "\n")
                f.flush()
                log("  | " + lines[-1])

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


def gpu_test_files(tests: Path = ROOT / "tests") -> list[str]:
    """The test modules that mark tests ``gpu``: only they are collected, and a module the
    machine's older transformers cannot import costs only its own tests."""
    files = (f for f in sorted(tests.glob("test_*.py")) if "pytest.mark.gpu" in f.read_text())
    return [str(f.relative_to(ROOT)) for f in files]


def fields(out: Path, work: Path, dry: bool, python: str = sys.executable) -> dict[str, str]:
    """What the :data:`PHASES` templates name (``xdist`` is set once ``env`` has run)."""
    from posenc.bench.targets import GPU_TARGET_BIASES, PUBLISHED_ENCODINGS

    return {"py": shlex.quote(python), "out": str(out), "work": str(work), "wheels": str(WHEELS),
            "wheel_list": str(WHEEL_LIST), "gpu_tests": " ".join(gpu_test_files()),
            "gpu_biases": ",".join(GPU_TARGET_BIASES), "xdist": "",
            "lab_encodings": ",".join(PUBLISHED_ENCODINGS), "dev": "cpu" if dry else "cuda",
            "tag": "-dry-run" if dry else ""}  # fmt: skip


def argv_of(phase: Phase, dry: bool, values: dict[str, str]) -> list[str]:
    return shlex.split((phase.dry if dry else phase.command).format(**values))


def subprocess_env(work: Path, dry: bool) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(work / "site"), str(SRC), *filter(None, [env.get("PYTHONPATH")])]
    env.update(PYTHONPATH=os.pathsep.join(paths), PYTHONUNBUFFERED="1", COLUMNS="200")
    if not dry:
        env.pop("TRITON_INTERPRET", None)  # the real kernels, not the interpreter
    return env


def run_phase(
    ph: Phase, argv: list[str], limit: float, out: Path, log: Log, env: dict
) -> PhaseResult:
    """One phase under its limit (skipped when ``limit`` is under 5 s)."""
    log("")
    log(f"== {ph.name}: {ph.what} (limit {limit:.0f} s)")
    if limit < 5:
        log("  skipped: the budget is spent")
        return PhaseResult(ph.name, shlex.join(argv), "skipped", None, 0.0, limit, "no time left")
    log(f"$ {shlex.join(argv)}")
    rc, timed_out, secs, lines = run_command(argv, out / f"{ph.name}.log", limit, log, env)
    status = "timeout" if timed_out else ("ok" if rc == 0 else "failed")
    note = pytest_summary(lines) if ph.name == "tests" else ""
    log(f"-- {ph.name}: {status} (exit {rc}) in {secs:.1f} s" + (f"; {note}" if note else ""))
    return PhaseResult(ph.name, shlex.join(argv), status, rc, secs, limit, note)


def run_phases(phases: Sequence[Phase], out: Path, work: Path, dry: bool, budget_s: float,
               log: Log) -> list[PhaseResult]:  # fmt: skip
    """Every phase in turn, each limited to what the budget leaves after the later phases'
    floors (the dry run takes each phase's own limit)."""
    t0, values, env = time.monotonic(), fields(out, work, dry), subprocess_env(work, dry)
    results = []
    for i, ph in enumerate(phases):
        if ph.needs and not Path(ph.needs.format(**values)).exists() and not dry:
            log(f"\n== {ph.name}: skipped, no {ph.needs.format(**values)} (`make gpu-wheels`)")
            results.append(PhaseResult(ph.name, "", "skipped", None, 0.0, 0.0, "nothing to do"))
            continue
        left = budget_s - (time.monotonic() - t0) - sum(p.floor_s for p in phases[i + 1 :])
        limit = ph.dry_limit_s if dry else min(ph.limit_s, left - GRACE_S)
        results.append(run_phase(ph, argv_of(ph, dry, values), limit, out, log, env))
        if ph.name == "env" and not dry and read_json(out / "env.json").get("pytest-xdist"):
            values["xdist"] = "-n 4"  # Triton and Inductor compiles dominate: overlap them
    return results


def missing_outputs(out: Path, phases: Sequence[Phase], values: dict[str, str]) -> list[str]:
    need = ["gpu-check.log", "RESULTS.md", "summary.json"]
    need += [f"{p.name}.log" for p in phases]
    need += [o.format(**values) for p in phases for o in p.outputs]
    return [r for r in need if not (out / r).exists() or (out / r).stat().st_size == 0]


def run_check(out: Path, work: Path, dry: bool, budget_s: float = TOTAL_BUDGET_S,
              only: Sequence[str] | None = None) -> int:  # fmt: skip
    """The whole check; 0 when every phase ran and passed and every output is there."""
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu-check.log")
    try:
        log(f"posenc gpu-check: {'DRY RUN (CPU, tiny sizes, plumbing only)' if dry else 'GPU run'}")
        log(f"out: {out}\nwork (bulky files, not brought back): {work}\nbudget: {budget_s:.0f} s")
        phases = [p for p in PHASES if not only or p.name in only]
        results = run_phases(phases, out, work, dry, budget_s, log)
        values = fields(out, work, dry)
        summary = gpu_report.report(
            out, work, dry, results, log, lambda: missing_outputs(out, phases, values)
        )
        failed = [r.name for r in results if r.status not in ("ok", "skipped")]
        bad = failed + summary["missing_outputs"]
        log(
            ("dry run " if dry else "gpu-check ")
            + ("OK" if not bad else f"FAILED: {', '.join(bad)}")
        )
        if not dry:
            log(f"bring back {out}, then `python benchmarks/gpu_check.py --merge {out}`")
        return 0 if not bad else 1
    finally:
        log.close()


# --- merge, wheels, command line -------------------------------------------------------------


def merge(run: Path, force: bool = False) -> int:
    """A brought-back run into the repository: its rows into ``benchmarks/rows/`` and their
    blocks rendered into ``benchmarks/RESULTS.md`` (with the lab and gpu-check blocks), its
    lab files into ``benchmarks/lab-gpu-small/``."""
    from posenc.bench.harness import write_section
    from posenc.bench.render import rerender

    summary = read_json(run / "summary.json")
    if not summary:
        print(f"{run} has no summary.json: not a gpu-check output folder", file=sys.stderr)
        return 2
    if summary.get("dry_run") and not force:
        print(f"{run} is a dry run: nothing to merge (--force to do so anyway)", file=sys.stderr)
        return 2
    rows = REPO_RESULTS.parent / "rows"
    for path in sorted((run / "rows").glob("*.json")):
        rows.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, rows / path.name)
    rerender(REPO_RESULTS, rows)
    text = (run / "RESULTS.md").read_text() if (run / "RESULTS.md").exists() else ""
    for m in re.finditer(
        r"<!-- bench:((?:lab-gpu-small|gpu-check)-\w+) -->\n(.*?)\n<!-- /", text, re.S
    ):
        write_section(REPO_RESULTS, m[1], m[2])
    for rel in (*_LAB_FILES, "lab/report/lab.png"):
        if (run / rel).exists():
            REPO_LAB.mkdir(parents=True, exist_ok=True)
            shutil.copy2(run / rel, REPO_LAB / Path(rel).name)
    print(f"merged {run} into {REPO_RESULTS} and {REPO_LAB}")
    return 0


def wheels_command(dest: Path, python: str = sys.executable) -> list[str]:
    """``pip download`` of :data:`WHEEL_LIST` for the GPU machine (``make gpu-wheels``)."""
    return [python, "-m", "pip", "download", "--disable-pip-version-check", "--dest", str(dest),
            *WHEEL_TARGET.split(), "-r", str(WHEEL_LIST)]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    parser.add_argument(
        "--out", type=Path, help="output folder (default $OUT or runs/gpu-check/<time>)"
    )
    parser.add_argument("--work", type=Path, help="bulky files, not brought back")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds in all")
    parser.add_argument(
        "--only", help="comma-separated phases: " + ",".join(p.name for p in PHASES)
    )
    parser.add_argument("--wheels", type=Path, metavar="DEST", help="download the wheels (network)")
    parser.add_argument("--merge", type=Path, metavar="DIR", help="merge a brought-back run")
    parser.add_argument("--force", action="store_true", help="--merge a dry run anyway")
    args = parser.parse_args(argv)
    if args.wheels:
        return subprocess.run(wheels_command(args.wheels)).returncode
    sys.path.insert(0, str(SRC))  # posenc from this tree, installed or not
    if args.merge:
        return merge(args.merge, args.force)
    import torch

    dry = args.dry_run or not torch.cuda.is_available()
    if dry and not args.dry_run:
        print("CUDA is not available here: running the dry run (tiny sizes on the CPU)", flush=True)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = (args.out or Path(os.environ.get("OUT") or ROOT / "runs" / "gpu-check" / stamp)).resolve()
    work = (args.work or ROOT / "runs" / "gpu-check-work" / out.name).resolve()
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    return run_check(out, work, dry, args.budget, only)


if __name__ == "__main__":
    sys.exit(main())
