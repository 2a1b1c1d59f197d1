"""The benchmark's tables: rows as strings (terminal and Markdown), notes, the targets' summary,
and the ``bias-<device>`` block of ``benchmarks/RESULTS.md``."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .. import targets
from ..harness import markdown_table
from ..rows import BenchRows
from .limits import MiB, PeakMemory, human_bytes
from .rows import GPU_TARGET_RATIO, BiasRow, Measurement

TABLE_HEADER = [
    "bias",
    "dtype",
    "s",
    "materialized ms",
    "flex ms",
    "causal ms",
    "flex speedup vs materialized",
    "flex / causal",
    "flex first call s",
    "peak MiB materialized",
    "peak MiB flex",
    "peak MiB causal",
    "max abs diff",
    "target",
]

# The same columns, named short enough for a terminal.
SHORT_HEADER = ["bias", "dtype", "s", "mat ms", "flex ms", "causal ms", "flex vs mat",
                "flex/causal", "flex 1st s", "MiB mat", "MiB flex", "MiB causal", "max diff",
                "target"]  # fmt: skip


def _ms(m: Measurement) -> str:
    if m.ok:
        return f"{m.ms:.1f}"
    if m.status == "skipped":
        return (
            f"skipped: {m.note.split(' (')[0]}"
            if m.note.startswith(("memory", "time"))
            else "skipped"
        )
    return m.status


def _mib(m: Measurement) -> str:
    return "-" if not m.ok or m.peak_bytes is None else f"{m.peak_bytes / MiB:.0f}"


def _ratio(x: float) -> str:
    return "-" if x != x else f"{x:.2f}x"


def _target(r: BiasRow) -> str:
    t = targets.bias_row(r.as_row())
    return "-" if t is None else t.text


def table_rows(rows: Sequence[BiasRow]) -> list[list[str]]:
    """One line per row, in :data:`TABLE_HEADER`'s columns."""
    out = []
    for r in rows:
        out.append(
            [
                r.bias,
                r.dtype,
                str(r.s),
                _ms(r.materialized),
                _ms(r.flex),
                _ms(r.causal),
                _ratio(r.speedup_vs_materialized),
                _ratio(r.flex_over_causal),
                "-" if r.flex.first_s != r.flex.first_s else f"{r.flex.first_s:.1f}",
                _mib(r.materialized),
                _mib(r.flex),
                _mib(r.causal),
                "-" if r.max_abs_diff != r.max_abs_diff else f"{r.max_abs_diff:.1e}",
                _target(r),
            ]
        )
    return out


def row_notes(rows: Sequence[BiasRow]) -> list[str]:
    """Skip reasons, errors and per-row notes, one line each (shared notes once per case)."""
    lines: list[str] = []
    seen: set[str] = set()
    for r in rows:
        where = f"s={r.s} {r.dtype}"
        for name, m in (("causal", r.causal), ("materialized", r.materialized), ("flex", r.flex)):
            if m.status in ("skipped", "error") and m.note:
                line = f"{where} {'' if name == 'causal' else r.bias + ' '}{name}: {m.status}: {m.note}"
                if line not in seen:
                    seen.add(line)
                    lines.append(line)
        for note in r.notes:
            line = (
                f"{where}: {note}"
                if note.startswith("causal block mask")
                else f"{where} {r.bias}: {note}"
            )
            if line not in seen:
                seen.add(line)
                lines.append(line)
    return lines


def target_summary(rows: Sequence[BiasRow]) -> list[str]:
    """One line per target (:mod:`posenc.bench.targets`): the CPU one over the run (how many
    applicable rows met it, which missed), the GPU ones per row."""
    data = [r.as_row() for r in rows]
    cpu = targets.bias_cpu_summary(data)
    gpu = [t for r in data if r["device"] == "cuda" and (t := targets.bias_row(r)) is not None]
    return ([cpu] if cpu else []) + [f"{t.case}: {t.text}" for t in gpu]


#: What the three candidates are, for the results block.
CANDIDATES_TEXT = (
    "Candidates, timed round-robin in one run (median ms; at least 3 samples, up to the "
    "`--repeats` given, after one untimed first call): **materialized** = "
    '`Attention(backend="sdpa")`, the `[h, s, t]` float32 bias masked and passed to SDPA; '
    '**flex** = `Attention(backend="flex")`, compiled FlexAttention with the bias in a '
    "`score_mod` (its first call, the kernel compile plus one run, is the `flex first call` "
    "column: a cold compile unless the notes say it came from inductor's on-disk cache; the "
    "causal block mask, built once per s and shared by every layer, is timed apart in the "
    "notes); **causal** = the same layer without a bias through SDPA's causal kernel, the "
    "floor (posenc's layer still builds an `[s, t]` bool mask before taking it). "
    "`flex speedup vs materialized` = materialized ms / flex ms; `flex / causal` = flex ms "
    "/ causal ms. `max abs diff` = largest |flex - materialized| of the layer's outputs."
)


def rows_doc(
    rows: Sequence[BiasRow],
    env: dict[str, str],
    command: str,
    memory_limit: int,
    max_call_s: float,
    device: torch.device,
) -> BenchRows:
    """The run as data (block ``bias-<device>``): one row per :class:`BiasRow`
    (:meth:`BiasRow.as_row`); settings: ``device``, ``mode``, ``memory_limit`` (bytes),
    ``max_call_s``, ``peak_method`` (how peak memory was measured here)."""
    peak = PeakMemory(device)
    mode = rows[0].mode if rows else ("forward+backward" if device.type == "cuda" else "inference")
    settings = {
        "device": device.type,
        "mode": mode,
        "memory_limit": memory_limit,
        "max_call_s": max_call_s,
        "peak_method": peak.why or peak.method,
    }
    return BenchRows("bias", f"bias-{device.type}", dict(env), command, settings,
                     [r.as_row() for r in rows])  # fmt: skip


def block(doc: BenchRows) -> str:
    """The ``bias-<device>`` block of ``benchmarks/RESULTS.md``, from its rows."""
    rows = [BiasRow.from_row(r) for r in doc.rows]
    st = doc.settings
    shape = (
        f"batch {rows[0].batch}, heads {rows[0].heads}, head_dim {rows[0].head_dim}" if rows else ""
    )
    parts = [
        f"## bias ({st['mode']}, {doc.device})",
        "",
        "\n".join(f"- {k}: {v}" for k, v in doc.env.items()),
        f"- command: `{doc.command}`",
        f"- shape: {shape}, causal self-attention (t = s), a whole posenc Attention layer",
        "",
        CANDIDATES_TEXT,
        "",
        f"Peak memory: growth during one timed call above what was held just before it. "
        f"{st['peak_method']}. The flex path ran with its encoding's `.bias` replaced by "
        "a function that raises, so each flex row also shows that path never built an "
        "`[h, s, t]` bias.",
        "",
        f"Skips: the materialized bias is not tried when its estimated need (the larger of "
        f"h*s*t*4 bytes and the peak per score measured at a shorter length, times s*t) exceeds "
        f"{human_bytes(st['memory_limit'])} or 90% of the memory available at that moment; any "
        f"candidate predicted (from a shorter length, times (s/s_prev)^2) to take more than "
        f"{st['max_call_s']:g} s per call is skipped for time.",
        "",
        "### Targets",
        "",
        *(f"- {line}" for line in target_summary(rows)),
    ]
    if doc.device != "cuda":
        parts.append(
            "- GPU targets (forward+backward: FlexAttention ALiBi/T5 at s = 8k within "
            f"{GPU_TARGET_RATIO:g}x of plain causal SDPA; running at s = 64k where the "
            "materialized bias cannot): not measured, this run had no CUDA device. "
            "`posenc bench bias --preset full` on a GPU measures them (s = 64k is added there)."
        )
    parts += ["", "### Results", "", markdown_table(TABLE_HEADER, table_rows(rows))]
    notes = row_notes(rows)
    if notes:
        parts += ["", "### Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(parts)
