"""The lab's smaller items: the extend table never cuts a number (at 80 columns, on a narrow
terminal, in a log), ``--text`` says the corpus size and the capped test budget, a bias
registered after ``posenc.lab.extension.extend`` is imported is extendable, and the extend options refuse
an infinite learning rate and explain a curve a 1-step fine-tune cannot have.

The extend rows are real ones (``tests/data/lab_extend_rows.jsonl``: a ``cpu-small`` grid's rope
and alibi cells fine-tuned for 3 steps at 4L, their loss-by-position curves dropped); nothing
here trains but one 2-step grid on a 32 KiB corpus."""

from __future__ import annotations

import copy
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from posenc import registry
from posenc.cli import app
from posenc.lab.cells.config import DataConfig, TrainConfig
from posenc.lab.reports.extend_report import extend_table, print_extend_table
from posenc.lab.training.data import corpus_note, load_data
from posenc.runs.store import RESULTS_FILE
from posenc.runs.term_table import column_groups, print_table

DATA = Path(__file__).resolve().parent / "data"
EXTEND_ROWS: list[dict[str, Any]] = [
    json.loads(line) for line in (DATA / "lab_extend_rows.jsonl").read_text().splitlines()
]
NUMBER = re.compile(r"[+-]?\d+\.\d+")


def _wide_rows() -> list[dict[str, Any]]:
    """The real rows evaluated at three more lengths (8L, 16L, 32L: the 2L results copied), so
    the table has 15 columns, as wide as a default run's"""
    rows = copy.deepcopy(EXTEND_ROWS)
    for r in rows:
        ev = r["eval"]
        if "128" not in ev["variants"]["base"]["results"]:
            continue
        for n in (512, 1024, 2048):
            ev["lengths"].append(n)
            for v in ev["variants"].values():
                v["results"][str(n)] = dict(v["results"]["128"])
    return rows


def _numbers(rows: list[dict[str, Any]]) -> list[str]:
    _, body = extend_table(rows)
    found = [NUMBER.fullmatch(c) for row in body for c in row[1:]]
    return [m.group() for m in found if m]


def _assert_all_in_full(text: str, numbers: list[str]) -> None:
    assert "…" not in text
    printed = NUMBER.findall(text)
    for n in set(numbers):  # each as a whole number, as often as the table has it
        assert printed.count(n) >= numbers.count(n), (n, text)


def test_extend_table_in_a_log_at_80_columns_prints_every_number_in_full(tmp_path):
    """``posenc lab report --question extend`` with stdout captured (not a terminal) and
    COLUMNS=80: the whole table at its own width, every number whole."""
    rows = _wide_rows()
    out = tmp_path / "out"
    out.mkdir()
    (out / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["lab", "report", "--out", str(out), "--no-plots", "--question", "extend"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    numbers = _numbers(rows)
    assert len(numbers) > 30
    _assert_all_in_full(res.output, numbers)
    assert "rope @256 from scratch (20 steps x 4 x 256)" in res.output


@pytest.mark.parametrize("width", [80, 60, 40])
def test_extend_table_on_a_narrow_terminal_splits_instead_of_cutting(width):
    """On a terminal the table is split into parts that each fit, headers wrapped at their
    words; no line is wider than the terminal and no number is cut."""
    rows = _wide_rows()
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None)
    print_extend_table(rows, console=console)
    text = buf.getvalue()
    _assert_all_in_full(text, _numbers(rows))
    assert max(len(line) for line in text.splitlines()) <= width
    assert text.count("┃ extension") + text.count("┃            ") >= 2  # more than one part


def test_a_terminal_too_narrow_for_a_column_gets_one_line_per_value():
    header = ["extension", "steps to scratch+0.02 @4L", "0-shot 1L"]
    body = [["rope + YaRN", "> 50", "3.412"], ["alibi", "5", "12.345"]]
    buf = io.StringIO()
    print_table(header, body, console=Console(file=buf, width=12, force_terminal=True))
    assert buf.getvalue().splitlines() == [
        "rope + YaRN: steps to scratch+0.02 @4L = > 50",
        "rope + YaRN: 0-shot 1L = 3.412",
        "alibi: steps to scratch+0.02 @4L = 5",
        "alibi: 0-shot 1L = 12.345",
    ]


def test_column_groups_fill_each_part_and_keep_the_order():
    # A column of width w takes w + 3 (padding and a rule), the table's edges 1 more: the label
    # column and one of width 5 take 22, the label and the 20-wide one 37.
    widths = [10, 5, 5, 5, 20]
    assert column_groups(widths, 1000) == [[1, 2, 3, 4]]
    assert column_groups(widths, 38) == [[1, 2, 3], [4]]
    assert column_groups(widths, 37) == [[1, 2], [3], [4]]
    assert column_groups(widths, 36) is None  # the 20-wide column cannot sit beside the label


# --- --text: the corpus and the capped budget ---------------------------------------------------


@pytest.fixture
def docs(tmp_path):
    """Three files, 32,768 bytes; the test split is the 7,296-byte file."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, n in (("a.txt", 15000), ("b.txt", 10472), ("c.txt", 7296)):
        (folder / name).write_bytes((b"the quick brown fox jumps over the lazy dog\n" * 400)[:n])
    return folder


def test_text_says_the_corpus_size_and_that_the_budget_is_capped(docs, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = DataConfig(source="text", path=str(docs), split_seed=0)
    data = load_data(cfg)
    test = len(data.split("test"))
    note = corpus_note(cfg, data, 32768)
    assert note is not None
    assert note.startswith(f"--text {docs}: 3 file(s), 32,768 bytes; test split {test:,} bytes")
    assert f"so --eval-tokens 32768 is capped to {test - 1:,} per length" in note
    assert "capped" not in (corpus_note(cfg, data, 100) or "")
    assert "100 tokens scored per length" in (corpus_note(cfg, data, 100) or "")


def test_lab_with_text_logs_the_corpus_line_once_and_the_report_says_the_cap(
    docs, monkeypatch, tmp_path
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "run"
    args = ["lab", "--text", str(docs), "-e", "none", "--steps", "2", "--train-len", "16",
            "--eval-lens", "16", "--seeds", "1", "--dim", "16", "--layers", "1", "--heads", "2",
            "--batch-size", "2", "--no-plots", "--jobs", "1", "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("--text ")]
    assert len(lines) == 1, res.output
    assert "3 file(s), 32,768 bytes" in lines[0] and "--eval-tokens 32768 is capped" in lines[0]
    # The report's caption says it too (table.md), beside the tokens it scored.
    table = (out / "report" / "table.md").read_text()
    assert "(the whole test split: --eval-tokens 32768 is capped to it)" in table


# --- extend reads the registry when used ---------------------------------------------------------

LATE = "late-bias"


@pytest.fixture
def late_bias():
    """A bias registered after posenc.lab.extension.extend was imported (ALiBi's builder, another name)."""
    import posenc.lab.extension.extend  # noqa: F401  (imported first, on purpose)

    registry.register(LATE, "bias", description="ALiBi under another name")(
        registry.entry("alibi").builder
    )
    try:
        yield LATE
    finally:
        registry.unregister(LATE)


def test_a_bias_registered_after_import_is_extendable(late_bias):
    from posenc.lab.extension import plan as E

    assert late_bias in E.BIAS_ENCODINGS and late_bias in E.ExtendConfig().encodings
    assert E.extendable(late_bias)
    got = E.resolve(E.ExtendConfig(encodings=(late_bias,), reference=()), TrainConfig(steps=100))
    assert got.encodings == (late_bias,)
    # A grid cell of it is fine-tuned once, unchanged (no RoPE method).
    row = copy.deepcopy(json.loads((DATA / "lab_store_rows.jsonl").read_text().splitlines()[2]))
    row["encoding"] = row["encoding_name"] = late_bias
    row["identity"]["train"]["model"]["encoding"] = late_bias
    bases = E.base_cells([row], got.encodings)
    assert [(j.kind, j.method) for j in E.jobs(bases, got)] == [("extend", "none")]


# --- extend options -----------------------------------------------------------------------


@pytest.fixture
def grid_out(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(DATA / "lab_store_rows.jsonl", out / RESULTS_FILE)
    return out


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        (["--lr", "1e400"], "lr must be a positive finite number, got inf"),
        (["--lr", "nan"], "lr must be a positive finite number, got nan"),
        (["--curve", "1"], "none: a 1-step fine-tune has no steps between"),
    ],
)
def test_extend_refuses_in_one_line(grid_out, extra, why):
    res = CliRunner().invoke(app, ["lab", "extend", "--out", str(grid_out), *extra])
    assert res.exit_code == 2, res.output
    assert why in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


# --- the grid's table (posenc lab report) ------------------------------------------------------


def _grid_rows() -> list[dict[str, Any]]:
    """The three real grid rows as three seeds each (seed and key changed, bits shifted by
    0.01 a seed), evaluated at six lengths (the 2L results copied): cells like ``4.364 ± 0.025``."""
    good = [json.loads(line) for line in (DATA / "lab_store_rows.jsonl").read_text().splitlines()]
    rows = []
    for seed in range(3):
        for r in copy.deepcopy(good):
            r["seed"], r["config_hash"] = seed, f"{r['config_hash']}-{seed}"
            ev = r["eval"]
            ev["lengths"] = [64, 128, 256, 512, 1024, 2048]
            for v in ev["variants"].values():
                for n in ev["lengths"][2:]:
                    v["results"][str(n)] = copy.deepcopy(v["results"]["128"])
                for res in v["results"].values():
                    if res["bits"] is not None:
                        res["bits"] += 0.01 * seed
            rows.append(r)
    return rows


@pytest.mark.parametrize("width", [80, 50])
def test_the_grid_table_on_a_narrow_terminal_cuts_no_number(width):
    from posenc.lab.reports.report import print_table as print_grid
    from posenc.lab.reports.report import table_cells

    rows = _grid_rows()
    buf = io.StringIO()
    print_grid(rows, console=Console(file=buf, width=width, force_terminal=True, color_system=None))
    text = buf.getvalue()
    _, body = table_cells(rows)
    numbers = [n for row in body for c in row[1:-2] for n in NUMBER.findall(c.replace("*", ""))]
    assert len(numbers) > 30
    _assert_all_in_full(text, numbers)
    assert max(len(line) for line in text.splitlines()) <= width
