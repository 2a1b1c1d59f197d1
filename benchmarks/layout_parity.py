"""Two runs of the same study, before and after a change that must not move a number: are they
equal to the last digit?

    python benchmarks/layout_parity.py --lab BEFORE AFTER --extend BEFORE AFTER

``--lab``: two ``posenc lab`` output folders: every result row (matched by encoding and seed)
and the table of ``report/table.md``. ``--extend``: two ``posenc extend`` folders: every study
row (matched by kind, method, document, length and depth). Every field is compared exactly
(floats as parsed from JSON, so equal means bit for bit), except what a rerun changes without
computing anything differently: wall-clock seconds and rates, timestamps, and the hash of
posenc's own source (which any edit moves, so the keys that hash it move too). Prints one verdict
line per comparison and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: Lab row fields that a rerun of the same computation changes: timings, the finish time, and
#: posenc's source hash with the two hashes of identities that hold it.
LAB_SKIPPED = {
    "config_hash", "train_hash", "finished_at", "identity.train.code.package",
    "train.train_seconds", "train.tokens_per_s", "train.tokens_per_s_fast",
    "train.tokens_per_cpu_s", "runtime.eval_seconds", "runtime.cell_seconds",
}  # fmt: skip
#: The same for an extend study row (its model's file is found at the same path both times).
EXTEND_SKIPPED = {"seconds"}
#: Table columns that are measured throughput, not results.
TIMING_COLUMNS = ("tok/s", "×NoPE")
#: What matches an extend row across the two runs.
EXTEND_KEY = ("kind", "method", "document", "length", "depth", "encoding", "seed")


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows of ``folder/results.jsonl``, in the order written."""
    lines = (folder / "results.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def differences(a: Any, b: Any, skipped: set[str], path: str = "") -> tuple[int, list[str]]:
    """``(numbers compared, paths that differ)`` between two parsed JSON values, leaving out
    the dotted paths in ``skipped`` (a variant's ``seconds`` at any depth too)."""
    if isinstance(a, dict) and isinstance(b, dict):
        count, found = 0, []
        for key in sorted(set(a) | set(b)):
            sub = f"{path}.{key}" if path else key
            if sub in skipped or (key == "seconds" and path.startswith("eval.")):
                continue
            if key not in a or key not in b:
                found.append(f"{sub}: only in {'after' if key in b else 'before'}")
                continue
            n, more = differences(a[key], b[key], skipped, sub)
            count, found = count + n, found + more
        return count, found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        count, found = 0, []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            n, more = differences(x, y, skipped, f"{path}[{i}]")
            count, found = count + n, found + more
        return count, found
    number = isinstance(a, int | float) and not isinstance(a, bool)
    same = a == b or (number and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    return int(number), [] if same else [f"{path}: {a!r} != {b!r}"]


def compare_rows(
    before: list[dict[str, Any]], after: list[dict[str, Any]], key: tuple[str, ...],
    skipped: set[str],
) -> tuple[int, list[str]]:  # fmt: skip
    """Rows matched by the fields ``key``: ``(numbers compared, what differs)``."""

    def keyed(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
        return {tuple(r.get(k) for k in key): r for r in rows}

    a, b = keyed(before), keyed(after)
    found = [f"row {k}: only in {'after' if k in b else 'before'}" for k in sorted(
        set(a) ^ set(b), key=repr)]  # fmt: skip
    count = 0
    for k in sorted(set(a) & set(b), key=repr):
        n, more = differences(a[k], b[k], skipped)
        count += n
        found += [f"row {k}: {m}" for m in more]
    return count, found


def table_cells(folder: Path) -> list[list[str]]:
    """The cells of ``folder/report/table.md``'s table, its throughput columns left out."""
    text = (folder / "report" / "table.md").read_text(encoding="utf-8")
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|") and not set(line) <= set("|-: ")
    ]
    keep = [i for i, h in enumerate(rows[0]) if not any(t in h for t in TIMING_COLUMNS)]
    return [[r[i] for i in keep] for r in rows]


def verdict(name: str, count: int, found: list[str], unit: str = "numbers") -> bool:
    """Print one line (and up to ten differences); True if nothing differs."""
    print(f"{name}: {count} {unit} compared, " + ("all equal" if not found else
          f"{len(found)} differences"))  # fmt: skip
    for line in found[:10]:
        print(f"  {line}")
    return not found


def compare_lab(before: Path, after: Path) -> bool:
    rows_a, rows_b = read_rows(before), read_rows(after)
    count, found = compare_rows(rows_a, rows_b, ("encoding", "seed"), LAB_SKIPPED)
    ok = verdict(f"lab rows ({len(rows_a)} before, {len(rows_b)} after)", count, found)
    table_a, table_b = table_cells(before), table_cells(after)
    cells = sum(len(r) for r in table_a[1:])
    same = [] if table_a == table_b else ["report/table.md: the tables differ"]
    shape = f"{len(table_a) - 1} lines x {len(table_a[0])} columns"
    name = f"lab table ({shape}, throughput columns left out)"
    return verdict(name, cells, same, "cells") and ok


def compare_extend(before: Path, after: Path) -> bool:
    rows_a, rows_b = read_rows(before), read_rows(after)
    count, found = compare_rows(rows_a, rows_b, EXTEND_KEY, EXTEND_SKIPPED)
    return verdict(f"extend rows ({len(rows_a)} before, {len(rows_b)} after)", count, found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--extend", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    ok = True
    if args.lab:
        ok = compare_lab(*args.lab) and ok
    if args.extend:
        ok = compare_extend(*args.extend) and ok
    print("verdict: " + ("bit-identical" if ok else "DIFFERENT"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
