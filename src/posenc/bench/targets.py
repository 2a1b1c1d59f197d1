"""Every benchmark target, judged from the rows (:mod:`.rows`), for CPU and GPU runs alike.

The bench blocks of ``benchmarks/RESULTS.md`` print these verdicts and ``make gpu-check``
(``benchmarks/gpu_check.py``) tabulates them; both call this module, so a target has one
definition. A verdict is ``met``, ``MISSED`` or ``not measured`` (a figure it needs did not run;
``why`` says which), never guessed from text.

- RoPE, CPU (forward; prefill: issue 5, decode and the fresh-output limit: the RoPE-core issue):
  bf16 >= 4x transformers eager, >= 1.2x compiled transformers, in place >= 0.6x copy
  bandwidth, float32 within 1.2x of a fresh output's time; decode >= 2x ``hf-module``.
- RoPE, GPU: forward+backward >= 85% of copy bandwidth and faster than Liger and compiled
  transformers at the Llama-7B and Llama-3-8B prefill shapes; a decode step faster than
  transformers eager (and the whole-module step against transformers' module).
- Bias: CPU inference, compiled flex >= 1.5x the materialized bias at s >= 2048; GPU
  forward+backward, ALiBi/T5 flex within 1.25x of causal SDPA at 8k and running at 64k where
  the materialized bias cannot.
- Lab (gpu-small): the published extrapolation ordering of Press et al. (2022).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .rope import RopeCase, cases_from_rows
from .rows import BenchRows, number

TARGET_VS_HF_EAGER = 4.0
TARGET_VS_HF_COMPILE = 1.2
TARGET_INPLACE_FRACTION = 0.6
TARGET_DECODE_VS_HF = 2.0
TARGET_FRESH_FRACTION = 1.2  # out-of-place float32 within 1.2x of a fresh output's time
#: GPU: forward+backward at least this fraction of copy bandwidth (copy time / posenc time).
COPY_TARGET = 0.85
#: The prefill shapes the GPU forward+backward targets name (Llama-7B and Llama-3-8B).
TARGET_PREFILL = ("[1, 32, 2048, 128]", "[4, 32/8, 4096, 128]")
#: Degradation past L closer than this (bits) is noise for one seed (README: ~0.02).
FLAT_BITS = 0.03
VERDICTS = ("met", "MISSED")


@dataclass(frozen=True)
class Target:
    """One target on one case: ``result`` is met, MISSED or not measured (``why``)."""

    name: str
    case: str
    measured: str
    result: str
    why: str = ""

    @property
    def text(self) -> str:
        """``NAME met`` / ``NAME MISSED`` / ``NAME: why``, as the bench blocks print it."""
        return (
            f"{self.name} {self.result}" if self.result in VERDICTS else f"{self.name}: {self.why}"
        )


def _judge(name: str, case: str, value: float, ok: bool, shown: str, why: str = "") -> Target:
    """A verdict on ``value`` (NaN: not measured)."""
    if math.isnan(value):
        return Target(name, case, "-", "not measured", why or "not measured")
    return Target(name, case, shown, "met" if ok else "MISSED")


# --- RoPE ----------------------------------------------------------------------------------


def _case_label(case: RopeCase) -> str:
    return f"{case.shape.label} {case.dtype}"


def _at_least(name: str, case: RopeCase, value: float, bound: float, unit: str = "x") -> Target:
    return _judge(name, _case_label(case), value, value >= bound, f"{value:.2f}{unit}")


def rope_cpu(case: RopeCase) -> list[Target]:
    """The CPU targets that apply to a forward case."""
    if case.backward:
        return []
    if case.shape.decode:
        speed = case.speedup("hf-module")
        name = f"decode >={TARGET_DECODE_VS_HF:g}x hf-module"
        return [_at_least(name, case, speed, TARGET_DECODE_VS_HF)]
    checks = []
    if case.dtype == "bfloat16":
        eager = case.speedup("hf-eager")
        checks.append(
            _at_least(f">={TARGET_VS_HF_EAGER:g}x hf-eager", case, eager, TARGET_VS_HF_EAGER)
        )
    comp = case.speedup("hf-compile")
    checks.append(
        _at_least(f">={TARGET_VS_HF_COMPILE:g}x hf-compile", case, comp, TARGET_VS_HF_COMPILE)
    )
    inplace = case.fraction_of_copy("posenc-inplace")
    name = f"in-place >={TARGET_INPLACE_FRACTION:g} copy"
    checks.append(_at_least(name, case, inplace, TARGET_INPLACE_FRACTION, " x copy"))
    if case.dtype == "float32":
        fresh = case.ms("posenc") / case.ms("fresh")
        name = f"<={TARGET_FRESH_FRACTION:g}x fresh"
        checks.append(
            _judge(name, _case_label(case), fresh, fresh <= TARGET_FRESH_FRACTION, f"{fresh:.2f}x")
        )
    return checks


def _faster(name: str, case: RopeCase, ref: str, mine: str = "posenc") -> Target:
    ours, theirs = case.ms(mine), case.ms(ref)
    absent = [n for n in (mine, ref) if n not in case.medians]
    why = "not measured" + (f" ({', '.join(absent)} did not run)" if absent else "")
    shown = f"{theirs / ours:.2f}x ({ours:.3f} vs {theirs:.3f} ms)"
    return _judge(name, _case_label(case), theirs / ours, ours < theirs, shown, why)


def rope_gpu(case: RopeCase, all_shapes: bool = False) -> list[Target]:
    """The GPU targets that apply to a case (``all_shapes``: every prefill shape, for the dry
    run's tiny ones)."""
    if case.backward:
        if case.shape.decode or not (all_shapes or case.shape.label in TARGET_PREFILL):
            return []
        frac = case.fraction_of_copy("posenc")
        name = f"fwd+bwd >= {COPY_TARGET:.0%} of copy bandwidth"
        copy = _judge(name, _case_label(case), frac, frac >= COPY_TARGET, f"{frac:.2f} x copy")
        return [copy] + [
            _faster(f"fwd+bwd faster than {r}", case, r) for r in ("liger", "hf-compile")
        ]
    if not case.shape.decode:
        return []
    module = "decode step faster than transformers' (module rows)"
    return [
        _faster("decode faster than hf-eager", case, "hf-eager"),
        _faster(module, case, "hf-module", mine="posenc-module"),
    ]


def rope(doc: BenchRows, gpu: bool | None = None, all_shapes: bool = False) -> list[Target]:
    """The targets of a ``rope`` rows file: the GPU rules on a CUDA run (or where ``gpu``)."""
    cases = cases_from_rows(doc.rows, bool(doc.settings.get("backward")))
    use_gpu = doc.device == "cuda" if gpu is None else gpu
    return [t for c in cases for t in (rope_gpu(c, all_shapes) if use_gpu else rope_cpu(c))]


# --- bias ----------------------------------------------------------------------------------

#: CPU: compiled FlexAttention at least this much faster than the materialized bias, at
#: s >= TARGET_MIN_S, inference.
TARGET_SPEEDUP = 1.5
TARGET_MIN_S = 2048
#: GPU (forward + backward): ALiBi and T5 flex within this factor of plain causal SDPA at
#: s = 8k, and flex running at s = 64k where the materialized bias cannot.
GPU_TARGET_RATIO = 1.25
GPU_TARGET_BIASES = ("alibi", "t5")


def _ok(row: dict[str, Any], kind: str) -> bool:
    return bool(row[kind]["status"] == "ok")


def _ms(row: dict[str, Any], kind: str) -> float:
    return number(row[kind]["ms"])


def _bias_case(r: dict[str, Any]) -> str:
    return f"{r['bias']} s={r['s']} {r['dtype']}"


def _cpu_applies(r: dict[str, Any]) -> bool:
    return bool(r["device"] == "cpu" and r["mode"] == "inference" and r["s"] >= TARGET_MIN_S)


def bias_row(r: dict[str, Any]) -> Target | None:
    """The bias target that applies to a row (``BiasRow.as_row()``), if any."""
    case = _bias_case(r)
    if _cpu_applies(r):
        name = f"flex >={TARGET_SPEEDUP:g}x materialized"
        if not _ok(r, "flex"):
            return Target(name, case, "-", "not measured", "flex did not run")
        if not _ok(r, "materialized"):
            why = f"- (materialized {r['materialized']['status']}; flex ran)"
            return Target(name, case, "-", "not measured", why)
        speed = _ms(r, "materialized") / _ms(r, "flex")
        return _judge(name, case, speed, speed >= TARGET_SPEEDUP, f"{speed:.2f}x")
    if r["device"] != "cuda" or r["bias"] not in GPU_TARGET_BIASES:
        return None
    if r["s"] == 8192:
        both = _ok(r, "flex") and _ok(r, "causal")
        ratio = _ms(r, "flex") / _ms(r, "causal") if both else math.nan
        name = f"flex <={GPU_TARGET_RATIO:g}x causal at 8k"
        return _judge(name, case, ratio, ratio <= GPU_TARGET_RATIO, f"{ratio:.2f}x causal")
    if r["s"] == 65536:
        ok = _ok(r, "flex") and not _ok(r, "materialized")
        shown = f"flex {r['flex']['status']}, materialized {r['materialized']['status']}"
        name = "flex runs at 64k, materialized cannot"
        return Target(name, case, shown, "met" if ok else "MISSED")
    return None


def bias_cpu_summary(rows: Sequence[dict[str, Any]]) -> str | None:
    """The CPU target over a run: how many rows where both paths ran met it, which missed."""
    cpu = [r for r in rows if _cpu_applies(r)]
    if not cpu:
        return None
    both = [r for r in cpu if _ok(r, "flex") and _ok(r, "materialized")]
    verdicts = [(r, _ms(r, "materialized") / _ms(r, "flex")) for r in both]
    met = [r for r, x in verdicts if x >= TARGET_SPEEDUP]
    missed = [f"{_bias_case(r)} ({x:.2f}x)" for r, x in verdicts if x < TARGET_SPEEDUP]
    only_flex = [r for r in cpu if _ok(r, "flex") and not _ok(r, "materialized")]
    line = (
        f"CPU inference, compiled flex >= {TARGET_SPEEDUP:g}x faster than the materialized "
        f"bias at s >= {TARGET_MIN_S}: met in {len(met)} of {len(both)} rows where both ran"
    )
    if missed:
        line += f"; missed: {', '.join(missed)}"
    if only_flex:
        line += f"; {len(only_flex)} more rows where only flex could run (materialized skipped)"
    return line


def bias(doc: BenchRows) -> list[Target]:
    """The targets of a ``bias`` rows file, one per row a target applies to."""
    return [t for r in doc.rows if (t := bias_row(r)) is not None]


def judge(doc: BenchRows, gpu: bool | None = None, all_shapes: bool = False) -> list[Target]:
    """The targets of any rows file (none for benches without targets)."""
    if doc.bench == "rope":
        return rope(doc, gpu, all_shapes)
    if doc.bench == "bias":
        return bias(doc)
    return []


# --- the lab's published ordering ------------------------------------------------------------

PUBLISHED = (
    "Published ordering (Press et al., 2022, *Train Short, Test Long*, appendix Table 2: "
    "WikiText-103, models trained at L = 512 and evaluated on longer inputs): sinusoidal breaks "
    "hardest past L, ALiBi stays flat (or improves), rotary degrades, and the T5 bias lies in "
    "between (it extrapolates better than rotary, worse than ALiBi)."
)
#: The encodings the published ordering names (the dry run's lab trains these).
PUBLISHED_ENCODINGS = ("sinusoidal", "rope", "alibi", "t5")


def _base_bits(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[int, float]], list[int]]:
    """``({encoding: {eval length: mean bits}}, lengths)`` of the base (unrescaled) models."""
    from ..lab.reports.report import lengths_of, table_rows

    base: dict[str, dict[int, float]] = {}
    for line in table_rows(rows):
        if line.variant == "base":
            vals = {n: [x for x in v if x is not None] for n, v in line.bits.items()}
            base[line.encoding] = {n: sum(v) / len(v) for n, v in vals.items() if v}
    return base, lengths_of(rows)


def lab_ordering(rows: list[dict[str, Any]]) -> list[Target]:
    """Each clause of :data:`PUBLISHED`, checked on the lab's rows (one seed's mean): an
    encoding's degradation is its bits at the longest eval length minus its bits at L."""
    if not rows:
        return []
    base, lengths = _base_bits(rows)
    first, last = lengths[0], lengths[-1]
    d = {
        e: base[e][last] - base[e][first]
        for e in PUBLISHED_ENCODINGS
        if {first, last} <= base.get(e, {}).keys()
    }
    span = f"{first} -> {last}"

    def shown(*names: str) -> str:
        return ", ".join(f"{n} {d[n]:+.3f}" for n in names if n in d)

    def check(name: str, measured: str, ok: bool) -> Target:
        return Target(name, span, measured, "met" if ok else "MISSED")

    checks = []
    if "sinusoidal" in d and len(d) > 1:
        worst = max(d, key=d.__getitem__)
        ok = worst == "sinusoidal" and d["sinusoidal"] > FLAT_BITS
        checks.append(check("sinusoidal breaks hardest past L", shown(*d), ok))
    if "alibi" in d:
        rise = max(v - base["alibi"][first] for v in base["alibi"].values())
        measured = f"largest rise over L {rise:+.3f} bits"
        checks.append(check("ALiBi stays flat", measured, rise <= FLAT_BITS))
    if "rope" in d:
        checks.append(check("RoPE degrades", shown("rope"), d["rope"] > FLAT_BITS))
    if {"t5", "alibi", "rope"} <= d.keys():
        ok = d["alibi"] <= d["t5"] <= d["rope"]
        checks.append(check("T5 between ALiBi and RoPE", shown("alibi", "t5", "rope"), ok))
    return checks
