"""Timing, environment and report helpers shared by the ``posenc bench`` subcommands.

Every candidate of one case (one shape and dtype) is timed in the same run, round-robin: call 1
of each, then call 2 of each, and so on. On a shared machine a burst of load then hits every
candidate alike instead of one, and the ratios stay meaningful; medians drop the bursts.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch

from .._markdown import markdown_table as markdown_table  # re-exported: the one formatter
from .rows import number


@dataclass(frozen=True)
class Shape:
    """q ``[b, h, s, d]`` and k ``[b, hk, s, d]``; written ``BxHxSxD`` or ``BxH/HKxSxD`` (GQA)."""

    b: int
    h: int
    hk: int
    s: int
    d: int

    @property
    def decode(self) -> bool:
        """One query per sequence: a decode step, where per-call overhead is the cost."""
        return self.s == 1

    @property
    def short(self) -> str:
        """``BxH/HKxSxD``, the command-line spelling (narrow, for summary tables)."""
        heads = f"{self.h}" if self.h == self.hk else f"{self.h}/{self.hk}"
        return f"{self.b}x{heads}x{self.s}x{self.d}"

    @property
    def label(self) -> str:
        heads = f"{self.h}" if self.h == self.hk else f"{self.h}/{self.hk}"
        return f"[{self.b}, {heads}, {self.s}, {self.d}]"


_DECODE = "1x32/8x1x128,8x32/8x1x128"  # one new token per sequence, LLaMA-3-8B heads
# LLaMA-7B (32 heads of 128), LLaMA-3-8B (GQA 32/8) at 4K and a small-head GQA variant.
_PREFILL = "1x32x2048x128,4x32/8x4096x128,4x8x4096x64"
SHAPE_PRESETS = {
    # The prefill shapes and decode steps (a batch of 1 and of 8).
    "llama": _PREFILL + "," + _DECODE,
    # The prefill shapes alone: the forward+backward set (a decode step has no backward).
    "prefill": _PREFILL,
    "quick": "1x32x512x128,2x32/8x1024x128," + _DECODE,
    "decode": _DECODE,
}
_SHAPE_RE = re.compile(r"^(\d+)x(\d+)(?:/(\d+))?x(\d+)x(\d+)$")


def parse_shapes(spec: str) -> list[Shape]:
    """``"1x32x2048x128,4x32/8x4096x128"`` or a preset name (``llama``, ``prefill``, ``quick``,
    ``decode``) -> shapes."""
    out = []
    parts = [SHAPE_PRESETS.get(p.strip(), p) for p in spec.split(",")]  # presets may be mixed in
    for part in ",".join(parts).split(","):
        m = _SHAPE_RE.match(part.strip())
        if not m:
            raise ValueError(
                f"shape {part!r} must read BxHxSxD or BxH/HKxSxD (e.g. 4x32/8x4096x128), or be a "
                f"preset: {', '.join(SHAPE_PRESETS)}"
            )
        b, h, hk, s, d = m.groups()
        shape = Shape(int(b), int(h), int(hk or h), int(s), int(d))
        if min(shape.b, shape.h, shape.hk, shape.s, shape.d) < 1 or shape.d % 2:
            raise ValueError(f"shape {part!r}: sizes must be positive and head_dim even")
        out.append(shape)
    return out


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}  # fmt: skip


def parse_dtypes(spec: str) -> list[torch.dtype]:
    out = []
    for name in spec.split(","):
        name = name.strip()
        if name not in DTYPES:
            raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
        out.append(DTYPES[name])
    return out


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass
class Timing:
    """Seconds per call of one candidate; ``first`` is the first call (compile, kernel build)."""

    samples: list[float] = field(default_factory=list)
    first: float = float("nan")
    error: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


_C = TypeVar("_C", bound="TimedCase")


@dataclass
class TimedCase:
    """One shape and dtype of a bench: each candidate's median and first-call ms (those that
    ran) and the notes (why a candidate did not run, which backend ran).

    Rows (:meth:`as_rows`), one per candidate that ran or has a note, in :attr:`CANDIDATES`
    order: ``shape`` (``BxH/HKxSxD``), ``dtype``, ``impl``, ``status`` (``ok``, or ``not run``
    with the reason in ``note``), ``median_ms``, ``first_ms``, ``samples``, then the
    subclass's :attr:`CASE_KEYS`.
    """

    shape: Shape
    dtype: str  # "float32", "bfloat16", ...
    medians: dict[str, float] = field(default_factory=dict)  # ms per call
    firsts: dict[str, float] = field(default_factory=dict)  # ms of the first call
    samples: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    CANDIDATES: ClassVar[tuple[str, ...]] = ()
    CASE_KEYS: ClassVar[tuple[str, ...]] = ()  # fields of the case repeated in each row

    def ms(self, name: str) -> float:
        return self.medians.get(name, float("nan"))

    def record(self, timings: dict[str, Timing], notes: dict[str, str]) -> None:
        """Take the figures of :func:`time_round_robin` and the run's notes (errors last)."""
        for name, t in timings.items():
            if t.samples:
                self.medians[name] = t.median * 1e3
                self.firsts[name] = t.first * 1e3
                self.samples[name] = len(t.samples)
        self.notes.update(notes)
        self.notes.update({n: t.error for n, t in timings.items() if t.error})

    def as_rows(self) -> list[dict[str, Any]]:
        rows = []
        for name in self.CANDIDATES:
            if name not in self.medians and name not in self.notes:
                continue
            rows.append({
                "shape": self.shape.short, "dtype": self.dtype, "impl": name,
                "status": "ok" if name in self.medians else "not run",
                "median_ms": self.ms(name), "first_ms": self.firsts.get(name, float("nan")),
                "samples": self.samples.get(name, 0), "note": self.notes.get(name, ""),
                **{k: getattr(self, k) for k in self.CASE_KEYS},
            })  # fmt: skip
        return rows

    @classmethod
    def from_rows(cls: type[_C], rows: list[dict[str, Any]], **fields: Any) -> list[_C]:
        """The cases of a rows file, in the order they ran; ``fields``: run-wide ones."""
        cases: dict[tuple[str, str], _C] = {}
        for r in rows:
            key = (r["shape"], r["dtype"])
            if key not in cases:
                (shape,) = parse_shapes(r["shape"])
                case_fields = {k: r[k] for k in cls.CASE_KEYS}
                cases[key] = cls(shape, r["dtype"], **case_fields, **fields)
            case = cases[key]
            if r["status"] == "ok":
                case.medians[r["impl"]] = number(r["median_ms"])
                case.firsts[r["impl"]] = number(r["first_ms"])
                case.samples[r["impl"]] = int(r["samples"])
            if r.get("note"):
                case.notes[r["impl"]] = r["note"]
        return list(cases.values())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def time_round_robin(
    candidates: dict[str, Callable[[], object]],
    device: torch.device,
    repeats: int,
    warmup: int = 2,
    budget_s: float = 20.0,
    calls: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time each candidate ``repeats`` times, interleaved (module docstring).

    A candidate whose samples already add up to ``budget_s`` stops early (with at least 3
    samples): a reference 100x slower than the rest would otherwise dominate the run. A
    candidate that raises is reported with its error and dropped. ``calls``: back-to-back calls
    per sample (each sample is their mean): for calls of ~0.1 ms, where one call timed alone
    between other candidates measures a cold cache more than the call. ``clock``: wall time by
    default; ``time.thread_time`` (this thread's CPU time, blind to other processes' load)
    where torch runs one thread.
    """
    timings = {name: Timing() for name in candidates}
    live = dict(candidates)
    for name, fn in list(live.items()):
        try:
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            timings[name].first = time.perf_counter() - t0
            for _ in range(warmup - 1):
                fn()
            _sync(device)
        except Exception as e:  # a reference that cannot run this case is reported, not fatal
            timings[name].error = f"{type(e).__name__}: {e}"[:200]
            del live[name]
    order = list(live.items())
    for i in range(repeats):
        # Every other round in reverse: no candidate always runs right after the same one (a
        # fixed order left a 1 % bias between two identical 15 s steps).
        for name, fn in order if i % 2 == 0 else order[::-1]:
            t = timings[name]
            if len(t.samples) >= 3 and sum(t.samples) > budget_s:
                continue
            _sync(device)
            t0 = clock()
            for _ in range(calls):
                fn()
            _sync(device)
            t.samples.append((clock() - t0) / calls)
    return timings


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}"


def environment(device: torch.device, packages: Sequence[str]) -> dict[str, str]:
    """What a reader needs to reproduce or discount a figure."""
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device_description(device),
        "machine": f"{platform.system()} {platform.release()}, {platform.machine()}",
        "python": platform.python_version(),
    }
    for name in packages:
        v = package_version(name)
        if v is not None:
            env[name] = v
    for var in ("OMP_NUM_THREADS", "THP_MEM_ALLOC_ENABLE"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    try:  # transparent huge pages change the cost of fresh (out-of-place) outputs
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            env["transparent hugepages"] = f.read().strip()
    except OSError:
        pass
    if hasattr(os, "getloadavg"):
        env["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return env


def fmt(x: float, digits: int = 2) -> str:
    if x != x:  # NaN
        return "-"
    return f"{x:.{digits}f}"


def write_section(path: Path, section: str, text: str) -> None:
    """Replace the ``section`` block of a results file (or append it), keeping the others.

    Each subcommand owns one block between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``,
    so ``rope``, ``cos-sin`` and later subcommands share one RESULTS.md.
    """
    start, end = f"<!-- bench:{section} -->", f"<!-- /bench:{section} -->"
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else "# posenc benchmark results\n\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        new = head + block + ("\n" + tail if tail else "")
    else:
        new = old.rstrip() + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def load_warning() -> str:
    """A warning when the 1-minute load average exceeds the cores ("" otherwise): timings taken
    while other work runs are slower and noisier, ratios less so (round-robin timing)."""
    if not hasattr(os, "getloadavg"):
        return ""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load <= cores:
        return ""
    return (
        f"load average {load:.2f} exceeds the {cores} cores: other work is running, so times "
        "are inflated and noisy; compare ratios from one run, or rerun on a quiet machine"
    )
