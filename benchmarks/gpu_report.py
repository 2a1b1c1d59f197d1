"""The report of ``make gpu-check`` (``benchmarks/gpu_check.py``), written after its phases:
the lab's files into ``OUT/lab``, every target judged from the run's rows by
:mod:`posenc.bench.targets` (the same rules the CPU blocks print), the ``lab-gpu-small-<dev>``
and ``gpu-check-<dev>`` blocks of ``OUT/RESULTS.md`` and ``OUT/summary.json``."""

from __future__ import annotations

import datetime as _dt
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def collect_lab(
    out: Path, work: Path, dry: bool, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Copy the lab's results into ``out/lab`` and write its report there (no checkpoints)."""
    from posenc.lab.reports.report import load_rows, write_report

    src, dest = work / "lab" / "results.jsonl", out / "lab"
    dest.mkdir(parents=True, exist_ok=True)
    if not src.exists():
        log(f"lab: no results at {src}")
        return []
    shutil.copy2(src, dest / "results.jsonl")
    rows = load_rows(dest)
    write_report(dest, rows, plots=not dry)
    log(f"lab: {len(rows)} finished cells -> {dest}")
    return rows


def _table(items: Sequence[Any]) -> str:
    from posenc.bench.harness import markdown_table

    rows = [[t.name, t.case or "-", t.measured, t.result if t.result != "not measured"
             else t.why] for t in items]  # fmt: skip
    return markdown_table(["target", "case", "measured", "result"], rows) if rows else "(none)"


def lab_section(rows: list[dict[str, Any]], dry: bool) -> str:
    """The lab table with the published ordering checked next to it."""
    from posenc.bench import targets
    from posenc.lab.reports.report import results_markdown

    return "\n".join([
        f"## lab gpu-small ({'dry run: tiny sizes on the CPU, plumbing only' if dry else 'GPU'})",
        "", results_markdown(rows).rstrip() if rows else "(no finished cells)", "",
        "### Against the published ordering", "", targets.PUBLISHED, "",
        "Degradation = bits at the longest eval length - bits at L (base model, no rescaling); "
        f"'flat' and 'degrades' use a {targets.FLAT_BITS} bit margin (one seed).", "",
        _table(targets.lab_ordering(rows)),
    ]) + "\n"  # fmt: skip


def check_section(results: Sequence[Any], found: Sequence[Any], env: dict, dry: bool) -> str:
    from posenc.bench.harness import markdown_table

    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    keys = ("gpu", "gpu_memory_gib", "python", "torch", "torch.version.cuda", "triton",
            "transformers", "liger-kernel", "flash-attn")  # fmt: skip
    phases = [[r.name, r.status, f"{r.seconds:.1f}", f"{r.limit_s:.0f}", r.summary or "-"]
              for r in results]  # fmt: skip
    return "\n".join([
        f"## gpu-check ({'dry run on the CPU: plumbing only' if dry else 'GPU'})", "",
        f"- date: {date}", *(f"- {k}: {env.get(k)}" for k in keys if k in env),
        "- command: `make gpu-check` (benchmarks/gpu_check.py)", "", "### Phases", "",
        markdown_table(["phase", "status", "seconds", "limit s", "notes"], phases), "",
        "### Targets (posenc.bench.targets, judged from this run's rows)", "", _table(found),
    ]) + "\n"  # fmt: skip


def report(
    out: Path,
    work: Path,
    dry: bool,
    results: Sequence[Any],
    log: Callable[[str], None],
    missing: Callable[[], list[str]],
) -> dict[str, Any]:
    """Judge the rows, write the lab and gpu-check blocks and ``summary.json`` (its
    ``missing_outputs`` from ``missing``, called once every file is written)."""
    from posenc.bench import targets
    from posenc.bench.harness import write_section
    from posenc.bench.rows import load_all

    lab_rows = collect_lab(out, work, dry, log)
    lab_text = lab_section(lab_rows, dry)
    (out / "lab" / "comparison.md").write_text(lab_text)
    found = [t for d in load_all(out / "rows").values() for t in targets.judge(d, True, dry)]
    ordering = targets.lab_ordering(lab_rows)
    env, dev = read_json(out / "env.json"), "cpu" if dry else "cuda"
    write_section(out / "RESULTS.md", f"lab-gpu-small-{dev}", lab_text)
    write_section(out / "RESULTS.md", f"gpu-check-{dev}", check_section(results, found, env, dry))
    summary = {"dry_run": dry, "phases": [asdict(r) for r in results],
               "targets": [asdict(t) for t in found], "lab_ordering": [asdict(t) for t in ordering],
               "env": env, "missing_outputs": []}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    summary["missing_outputs"] = missing()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for t in [*found, *ordering]:
        log(f"  target: {t.name} {t.case}: {t.measured} -> {t.result}")
    return summary
