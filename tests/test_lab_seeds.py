"""``posenc lab --seeds N``: the Student t quantile, the table's ``mean ± 95% half-width`` and
its within-noise marks, the CSV's interval columns, and the lab figure's error bars.

The t values below are written out from a published table (NIST/SEMATECH e-Handbook of
Statistical Methods, 1.3.6.7.2, "Critical values of the Student's t distribution"), or from
closed forms that do not share code with :mod:`posenc.lab.reports.stats`; the table's cells are
computed here from the formula with those values, never read back from the report.
"""

from __future__ import annotations

import csv
import io
import math
import statistics

import numpy as np
import pytest

from _lab_rows import fake_row as lab_row
from posenc.lab.reports import readme as RD
from posenc.lab.reports import report as R
from posenc.lab.reports.stats import intervals_overlap, mean_ci, t_critical, t_two_sided_prob

# --- the t quantile -----------------------------------------------------------------------

# (df, level, published two-sided critical value to 3 decimals): NIST table, columns 0.975
# (level 0.95), 0.995 (0.99), 0.95 (0.90).
PUBLISHED = [
    (1, 0.95, 12.706), (2, 0.95, 4.303), (3, 0.95, 3.182), (4, 0.95, 2.776),
    (5, 0.95, 2.571), (9, 0.95, 2.262), (10, 0.95, 2.228), (20, 0.95, 2.086),
    (29, 0.95, 2.045), (30, 0.95, 2.042), (100, 0.95, 1.984),
    (1, 0.99, 63.657), (10, 0.99, 3.169), (1, 0.90, 6.314), (5, 0.90, 2.015),
]  # fmt: skip


@pytest.mark.parametrize(("df", "level", "want"), PUBLISHED)
def test_t_critical_matches_the_published_table(df, level, want):
    assert t_critical(df, level) == pytest.approx(want, abs=5e-4)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.95, 0.99, 0.999])
def test_t_critical_matches_the_closed_forms_of_one_and_two_degrees(level):
    """df = 1 is the Cauchy distribution, P(|T| <= t) = 2 atan(t) / pi; df = 2 has
    P(|T| <= t) = t / sqrt(2 + t^2), so t = sqrt(2 p^2 / (1 - p^2))."""
    assert t_critical(1, level) == pytest.approx(math.tan(math.pi * level / 2), rel=1e-10)
    want = math.sqrt(2 * level**2 / (1 - level**2))
    assert t_critical(2, level) == pytest.approx(want, rel=1e-10)


def test_t_critical_tends_to_the_normal_quantile():
    """Large df: the Cornish-Fisher expansion of A&S 26.7.5 around the normal quantile
    z = 1.959963984540054, and 1.960 itself."""
    z, df = 1.959963984540054, 1000
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    assert t_critical(df) == pytest.approx(z + g1 / df + g2 / df**2 + g3 / df**3, abs=1e-9)
    assert t_critical(10_000) == pytest.approx(1.960, abs=5e-4)


def test_t_critical_against_scipy_when_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 7, 30, 200):
        for level in (0.9, 0.95, 0.99):
            want = stats.t.ppf((1 + level) / 2, df)
            assert t_critical(df, level) == pytest.approx(want, rel=1e-9)


def test_t_functions_reject_what_they_cannot_compute():
    with pytest.raises(ValueError, match="df must be a positive integer, got 0"):
        t_two_sided_prob(1.0, 0)
    with pytest.raises(ValueError, match=r"level must be between 0 and 1 \(exclusive\), got 1"):
        t_critical(3, 1)


# --- mean_ci ------------------------------------------------------------------------------


def test_mean_ci_is_the_student_t_interval():
    values = [3.00, 3.02, 3.07]
    mean, half = mean_ci(values)
    s = math.sqrt(sum((v - 3.03) ** 2 for v in values) / 2)  # sample std, n - 1 = 2
    assert mean == pytest.approx(3.03, rel=1e-12)
    assert half == pytest.approx(4.30265 * s / math.sqrt(3), rel=1e-5)
    assert mean_ci([2.5]) == (2.5, None)  # one seed: no spread to estimate
    assert mean_ci([1.0, 1.0]) == (1.0, 0.0)


def test_mean_ci_says_what_was_wrong():
    with pytest.raises(ValueError, match="at least one value, got none"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite values, got nan"):
        mean_ci([1.0, math.nan])


def test_intervals_overlap_touching_counts():
    assert intervals_overlap((1.0, 0.25), (1.5, 0.25))
    assert not intervals_overlap((1.0, 0.2), (1.5, 0.2))


# --- synthetic result rows ----------------------------------------------------------------

T2 = 4.303  # t_{0.975, 2}: three seeds (NIST table)
LENGTHS = (16, 32)

# encoding -> variant -> eval length -> bits of seeds 0, 1, 2. At 16: rope is best, alibi's
# interval overlaps rope's, none's does not; rope +PI is lower than everything but is a variant.
# At 32: alibi is best, none overlaps it, rope does not.
BITS = {
    "rope": {"base": {16: [3.00, 3.02, 3.04], 32: [3.50, 3.60, 3.70]},
             "linear": {16: [2.90, 2.91, 2.92], 32: [3.90, 3.91, 3.92]}},
    "alibi": {"base": {16: [3.05, 3.07, 3.09], 32: [3.10, 3.11, 3.12]}},
    "none": {"base": {16: [3.30, 3.31, 3.32], 32: [3.13, 3.14, 3.15]}},
}  # fmt: skip
LABELS = {"base": "", "linear": "PI"}


def fake_row(encoding: str, seed: int) -> dict:
    """One result row in the store's format (the fields the report and plots read)."""
    return lab_row(encoding, seed, BITS[encoding], LABELS, LENGTHS)


def fake_rows(seeds: int) -> list[dict]:
    return [fake_row(e, s) for e in BITS for s in range(seeds)]


def expected_cell(values: list[float]) -> str:
    """``mean ± t * s / sqrt(n)`` for three seeds, t written out above."""
    half = T2 * statistics.stdev(values) / math.sqrt(len(values))
    return f"{statistics.fmean(values):.3f} ± {half:.3f}"


def cells_by_label(rows: list[dict], **kw) -> dict[str, list[str]]:
    header, body = R.table_cells(rows, **kw)
    assert header[1:3] == ["16 (L)", "32 (2L)"]
    return {cells[0]: cells[1:3] for cells in body}


# --- the table ----------------------------------------------------------------------------


def test_three_seeds_show_mean_and_95_half_width_with_within_noise_marks():
    cells = cells_by_label(fake_rows(3))
    assert cells["rope"][0] == f"**{expected_cell(BITS['rope']['base'][16])}**"  # best at 16
    assert cells["rope"][0] == "**3.020 ± 0.050**"  # the same, read by eye
    assert cells["alibi"][0] == expected_cell(BITS["alibi"]["base"][16]) + " ≈"  # overlaps
    assert cells["none"][0] == expected_cell(BITS["none"]["base"][16])  # clearly worse
    assert cells["rope +PI"][0] == expected_cell(BITS["rope"]["linear"][16])  # never marked
    assert cells["alibi"][1] == f"**{expected_cell(BITS['alibi']['base'][32])}**"
    assert cells["none"][1] == expected_cell(BITS["none"]["base"][32]) + " ≈"
    assert cells["rope"][1] == expected_cell(BITS["rope"]["base"][32])
    assert cells["rope +PI"][1] == expected_cell(BITS["rope"]["linear"][32])


def test_the_legend_says_what_the_interval_and_marks_are():
    md = R.results_markdown(fake_rows(3))
    assert "± half-width of its 95% confidence interval (Student t" in md
    assert "bold is the lowest base encoding" in md and "≈ marks" in md
    assert "variant lines (+...) are not marked" in md


def test_one_seed_shows_the_mean_alone_and_marks_nothing():
    rows = fake_rows(1)
    cells = cells_by_label(rows)
    assert cells["rope"] == ["3.000", "3.500"] and cells["alibi"] == ["3.050", "3.100"]
    assert cells["rope +PI"] == ["2.900", "3.900"]
    md = R.results_markdown(rows)
    assert "**" not in md and "≈" not in md and "±" not in md
    assert "confidence interval" not in md  # the legend has nothing to explain
    assert "**" not in RD.readme_table(rows)


def test_a_best_line_without_an_interval_marks_nothing():
    """A one-seed line with the lowest mean cannot be compared, so no cell is marked there."""
    extra = fake_row("rope", 0)
    extra["encoding"] = "kerple"
    rows = [*fake_rows(3), extra]
    for v in extra["eval"]["variants"].values():
        for res in v["results"].values():
            res["bits"] = 1.0
    cells = cells_by_label(rows)
    assert cells["kerple"] == ["1.000", "1.000"]
    assert not any("**" in c or "≈" in c for line in cells.values() for c in line)


def test_terminal_table_shows_the_interval_in_bold_without_markup():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, record=True)
    R.print_table(fake_rows(3), console=console)
    text = console.export_text()
    assert "3.020 ± 0.050" in text and "3.070 ± 0.050 ≈" in text
    assert "**" not in text and "[bold]" not in text


# --- the CSV ------------------------------------------------------------------------------

OLD_COLUMNS = [
    "group", "config_hash", "encoding", "variant", "seed", "train_len", "eval_len",
    "bits", "acc", "tokens", "note", "train_tokens_per_s", "train_tokens_per_s_fast",
    "train_seconds", "train_loss_bits", "params", "threads", "world_size", "device",
]  # fmt: skip


def read_csv(rows: list[dict], tmp_path) -> tuple[list[str], list[dict]]:
    path = tmp_path / "results.csv"
    R.write_csv(rows, path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def test_csv_appends_the_interval_and_seed_count(tmp_path):
    fields, lines = read_csv(fake_rows(3), tmp_path)
    assert fields[: len(OLD_COLUMNS) + 3] == [
        *OLD_COLUMNS,
        "bits_mean",
        "bits_ci95_half",
        "n_seeds",
    ]
    assert len(lines) == 3 * (2 + 1 + 1) * 2  # seeds x (rope base, PI, alibi, none) x lengths
    for line in lines:
        values = BITS[line["encoding"]][line["variant"]][int(line["eval_len"])]
        assert float(line["bits"]) == values[int(line["seed"])]
        assert float(line["bits_mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12)
        half = T2 * statistics.stdev(values) / math.sqrt(3)
        assert float(line["bits_ci95_half"]) == pytest.approx(half, rel=2e-4)
        assert line["n_seeds"] == "3"


def test_csv_with_one_seed_has_no_interval(tmp_path):
    _, lines = read_csv(fake_rows(1), tmp_path)
    assert {line["bits_ci95_half"] for line in lines} == {""}
    assert {line["n_seeds"] for line in lines} == {"1"}
    assert all(float(line["bits_mean"]) == float(line["bits"]) for line in lines)


# --- the figure ---------------------------------------------------------------------------


def test_lab_data_gives_the_half_width_per_line_and_length():
    from posenc.plots.lab import lab_data

    lines = {(x["encoding"], x["variant"]): x for x in lab_data(rows=fake_rows(3))["lines"]}
    for (enc, variant), line in lines.items():
        for k, n in enumerate(LENGTHS):
            values = BITS[enc][variant][n]
            half = T2 * statistics.stdev(values) / math.sqrt(3)
            assert line["ci"][k] == pytest.approx(half, rel=2e-4)
            assert line["bits"][k] == pytest.approx(statistics.fmean(values), rel=1e-12)
    one = lab_data(rows=fake_rows(1))["lines"]
    assert all(np.isnan(x["ci"]).all() for x in one)


def test_lab_figure_draws_error_bars_only_with_seeds():
    pytest.importorskip("matplotlib")
    from matplotlib.collections import LineCollection

    from posenc.plots.common import caption
    from posenc.plots.lab import CI_CAPTION, draw_lab, lab_data

    def bars(fig) -> list[int]:
        return [sum(isinstance(c, LineCollection) for c in ax.collections) for ax in fig.axes]

    three = draw_lab(lab_data(rows=fake_rows(3)))
    assert bars(three)[:2] == [3, 2]  # top left: 3 base lines; top right: rope and rope +PI
    assert CI_CAPTION in caption(three) and "95% confidence interval" in CI_CAPTION
    one = draw_lab(lab_data(rows=fake_rows(1)))
    assert bars(one)[:2] == [0, 0] and CI_CAPTION not in caption(one)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_html_report_table_shows_the_best_cell_in_bold_without_markdown():
    from posenc.plots.report import lab_table_html

    page = lab_table_html(fake_rows(3))
    assert "**" not in page and "\x02" not in page
    assert page.count("<b>") == page.count("</b>") >= 1


def test_cpu_preset_runs_three_seeds_and_cpu_small_one():
    from posenc.lab.cli import Overrides, build_config

    assert build_config("cpu").seeds == (0, 1, 2)
    assert build_config("cpu-small").seeds == (0,)
    assert build_config("cpu", Overrides(seeds=1, seed=5)).seeds == (5,)
    assert build_config("cpu-small", Overrides(seeds=3)).seeds == (0, 1, 2)
    with pytest.raises(ValueError, match="--seeds"):
        build_config("cpu", Overrides(seeds=0))


def test_default_and_length_grids_in_one_folder_each_keep_their_table(tmp_path):
    """`posenc lab` and `posenc lab -e length` into one folder share a group (a group is the
    grid minus its encodings): each question takes its own rows of it, and each README block
    gets its own table, never the other's."""
    from posenc.runs.store import ResultStore

    rows = fake_rows(1)  # rope, alibi, none: a default grid
    assert R.question_of_rows(rows) == "extrapolation"
    pose = {**fake_row("rope", 0), "encoding": "rope:positions=pose", "config_hash": "p0"}
    pose.update(lab_options={"positions": "pose"}, length_method="pose")
    rows.append(pose)
    assert R.question_of(rows[0]) == "extrapolation" and R.question_of(pose) == "length"
    assert R.question_of_rows(rows) == "extrapolation"  # `none` is not in the length table
    assert [r["encoding"] for r in R.question_rows(rows, "extrapolation")] == [
        "rope", "alibi", "none",
    ]  # fmt: skip
    assert [r["encoding"] for r in R.question_rows(rows, "length")] == [
        "rope", "alibi", "rope:positions=pose",
    ]  # fmt: skip
    only_length = R.question_rows(rows, "length")
    assert R.question_of_rows(only_length) == "length"  # a length grid alone
    readme = tmp_path / "R.md"
    readme.write_text(
        "<!-- lab:table -->\nmain\n<!-- /lab:table -->\n<!-- lab:length -->\n<!-- /lab:length -->\n"
    )
    RD.write_readme_table(readme, rows, "length")
    text = readme.read_text()
    assert "<!-- lab:table -->\nmain\n<!-- /lab:table -->" in text  # untouched
    length_block = text[text.index("<!-- lab:length -->") :]
    assert "| rope:positions=pose |" in length_block and "| none |" not in length_block
    RD.write_readme_table(readme, rows)  # the group's own question: the main table
    main = readme.read_text().split("<!-- /lab:table -->")[0]
    assert "| none |" in main and "positions=pose" not in main
    store = tmp_path / "out"
    for i, row in enumerate(rows):
        ResultStore(store / "results.jsonl").append({**row, "config_hash": f"c{i}"})
    assert R.newest_group(store, "length") == "g0"
    assert R.newest_group(store, "extrapolation") == "g0"
    assert R.newest_group(store, "passkey") is None
