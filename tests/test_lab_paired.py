"""Paired differences against a reference line (``posenc lab report --reference``): the t
quantile they use for df 1..1000, the per-seed differences and their 95% intervals, the paired t
test's p-values and Holm's correction across the table, the resolved marks, and where they are
written (terminal, table.md, results.csv, the README block).

Every expected number here is computed in this file from the rows' bits with the t quantile
written out from a published table (R's ``qt(0.975, df)`` to 6 decimals, which agrees with the
NIST/SEMATECH e-Handbook's 3-decimal table), or checked against mpmath's incomplete beta
function; Holm's rule is the textbook's sequential procedure written out here (and statsmodels'
``multipletests`` where it is installed); none is read back from the report.
"""

from __future__ import annotations

import csv
import io
import json
import math

import pytest
from typer.testing import CliRunner

from _lab_rows import fake_row as lab_row
from posenc.cli import app
from posenc.lab.reports import paired as P
from posenc.lab.reports import readme as RD
from posenc.lab.reports import report as R
from posenc.lab.reports.stats import holm, paired_mean_ci, paired_t_p, t_critical

# --- the t quantile for df 1..1000 ---------------------------------------------------------

# t_{0.975, df}: R's qt(0.975, df), 6 decimals.
T975 = {
    1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445, 5: 2.570582, 6: 2.446912,
    7: 2.364624, 8: 2.306004, 9: 2.262157, 10: 2.228139, 15: 2.131450, 20: 2.085963,
    25: 2.059539, 30: 2.042272, 40: 2.021075, 50: 2.008559, 60: 2.000298, 100: 1.983972,
    120: 1.979930, 200: 1.971896, 500: 1.964720, 1000: 1.962339,
}  # fmt: skip


@pytest.mark.parametrize(("df", "want"), sorted(T975.items()))
def test_t_quantile_matches_the_published_values(df, want):
    assert t_critical(df, 0.95) == pytest.approx(want, abs=1e-6)


def test_t_quantile_solves_the_t_distribution_for_every_df_to_1000():
    """For every df in 1..1000, ``P(|T| <= t) = 0.95`` at the returned ``t`` by mpmath's
    regularized incomplete beta function (``P(|T| > t) = I_{df / (df + t^2)}(df / 2, 1 / 2)``),
    which shares nothing with the closed-form sums of posenc._stats; and ``t`` falls with df
    towards the normal quantile 1.959964."""
    mpmath = pytest.importorskip("mpmath")
    previous = math.inf
    for df in range(1, 1001):
        t = t_critical(df)
        tail = mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True)
        assert float(tail) == pytest.approx(0.05, abs=1e-9), df
        assert 1.959964 < t < previous, df
        previous = t


# --- fixture rows with known bits -----------------------------------------------------------

LENGTHS = (16, 32, 64)

# encoding -> variant -> length -> bits of seeds 0, 1, 2. Per-encoding intervals are wide
# (seeds differ by 0.2 bits) and all overlap; the paired differences are what resolves.
ROPE = {16: [3.00, 3.20, 3.40], 32: [3.10, 3.30, 3.50], 64: [3.40, 3.70, 3.90]}
BITS = {
    "rope": {"base": ROPE,
             "yarn": {16: ROPE[16], 32: [3.05, 3.26, 3.46], 64: [3.20, 3.50, 3.75]}},
    # worse at every length, tightly: differences 0.05, 0.06, 0.04 at 16
    "alibi": {"base": {16: [3.05, 3.26, 3.44], 32: [3.12, 3.33, 3.52], 64: [3.46, 3.75, 3.96]}},
    # no shown difference: differences straddle 0
    "none": {"base": {16: [2.90, 3.30, 3.42], 32: [3.20, 3.20, 3.55], 64: [3.45, 3.60, 4.00]}},
    # no value past L on any seed (the table's n/a)
    "learned": {"base": {16: [3.01, 3.22, 3.40], 32: [None] * 3, 64: [None] * 3}},
}  # fmt: skip
LABELS = {"base": "", "yarn": "YaRN"}
T2 = 4.302653  # t_{0.975, 2}
T4 = 2.776445  # t_{0.975, 4}


def fake_row(encoding: str, seed: int, bits: dict | None = None) -> dict:
    """One result row in the store's format (the fields the report reads)."""
    return lab_row(encoding, seed, BITS[encoding] if bits is None else bits, LABELS, LENGTHS)


def fake_rows(seeds: int = 3) -> list[dict]:
    return [fake_row(e, s) for e in BITS for s in range(seeds)]


def interval(diffs: list[float], t: float) -> tuple[float, float]:
    """Mean and ``t * s / sqrt(n)`` of ``diffs``, written out (sample std, n - 1)."""
    n = len(diffs)
    mean = sum(diffs) / n
    s = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    return mean, t * s / math.sqrt(n)


def diffs(encoding: str, n: int, variant: str = "base") -> list[float]:
    return [a - b for a, b in zip(BITS[encoding][variant][n], ROPE[n], strict=True)]


def cell(encoding: str, n: int, mark: str, variant: str = "base") -> str:
    mean, half = interval(diffs(encoding, n, variant), T2)
    return f"{mean:+.3f} ± {half:.3f}" + (f" {mark}" if mark else "")


def lines_by_label(rows: list[dict]) -> dict:
    return {line.label: line for line in R.table_rows(rows)}


def t_test_p(d: list[float]) -> float:
    """The paired t test's two-sided p from mpmath's regularized incomplete beta function:
    ``P(|T| >= t) = I_{df / (df + t^2)}(df / 2, 1 / 2)``."""
    import mpmath

    n = len(d)
    mean, s = sum(d) / n, math.sqrt(sum((x - sum(d) / n) ** 2 for x in d) / (n - 1))
    t, df = mean / (s / math.sqrt(n)), n - 1
    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


def holm_rejects(ps: dict, alpha: float = 0.05) -> set:
    """The textbook's sequential Holm procedure: sort ascending, reject while
    ``p_(k) <= alpha / (m - k + 1)``, stop at the first that is not."""
    out, m = set(), len(ps)
    for k, key in enumerate(sorted(ps, key=ps.get), start=1):
        if ps[key] > alpha / (m - k + 1):
            break
        out.add(key)
    return out


def expected_marks() -> dict:
    """``(label, length) -> "worse" | "better" | ""``: each comparison of the fake table (the
    differences with a spread: not the reference, not n/a, not rope +YaRN's zeros at L) tested
    by :func:`t_test_p`, the family corrected by :func:`holm_rejects`."""
    ps = {}
    for label, enc, variant in (("rope +YaRN", "rope", "yarn"), ("alibi", "alibi", "base"),
                                ("none", "none", "base"), ("learned", "learned", "base")):  # fmt: skip
        for n in LENGTHS:
            d = [a - b for a, b in zip(BITS[enc][variant][n], ROPE[n], strict=True)
                 if a is not None]  # fmt: skip
            if len(d) == 3 and any(d):
                ps[label, n] = (t_test_p(d), sum(d))
    rejected = holm_rejects({k: p for k, (p, _) in ps.items()})
    marks = {k: ("worse" if total > 0 else "better") if k in rejected else ""
             for k, (_, total) in ps.items()}  # fmt: skip
    assert set(marks.values()) == {"", "worse", "better"}  # the fixture exercises each
    return marks


# --- the numbers ----------------------------------------------------------------------------


def test_paired_mean_ci_is_the_t_interval_of_the_differences():
    mean, half = paired_mean_ci([3.05, 3.26, 3.44], [3.00, 3.20, 3.40])
    assert mean == pytest.approx(0.05, abs=1e-12)
    assert half == pytest.approx(T2 * 0.01 / math.sqrt(3), rel=1e-6)
    assert paired_mean_ci([3.1], [3.0]) == (pytest.approx(0.1), None)
    with pytest.raises(ValueError, match="one reference value per value, got 2 and 3"):
        paired_mean_ci([1.0, 2.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize("n", LENGTHS)
def test_differences_and_intervals_against_a_hand_computation(n):
    lines = lines_by_label(fake_rows())
    rope = lines["rope"]
    for label, encoding, variant in (("alibi", "alibi", "base"), ("none", "none", "base"),
                                     ("rope +YaRN", "rope", "yarn")):  # fmt: skip
        d = P.paired_diff(lines[label], rope, n)
        mean, half = interval(diffs(encoding, n, variant), T2)
        assert d.pairs == 3
        if half == 0:  # rope +YaRN at L is the same model and numbers: no difference
            assert d.mean == pytest.approx(0.0, abs=1e-12) and d.resolved == "no"
            continue
        assert d.mean == pytest.approx(mean, abs=1e-12)
        assert d.half == pytest.approx(half, rel=1e-6)
        assert (d.low, d.high) == (pytest.approx(mean - half), pytest.approx(mean + half))


def test_resolved_marks_follow_the_interval():
    lines = lines_by_label(fake_rows())
    rope = lines["rope"]
    assert [P.paired_diff(lines["alibi"], rope, n).resolved for n in LENGTHS] == ["worse"] * 3
    assert [P.paired_diff(lines["none"], rope, n).resolved for n in LENGTHS] == ["no"] * 3
    yarn = [P.paired_diff(lines["rope +YaRN"], rope, n).resolved for n in LENGTHS]
    assert yarn == ["no", "better", "better"]
    # what the overlapping per-encoding intervals could not tell: alibi's and rope's overlap
    assert R.noise_marks(R.table_rows(fake_rows()), [16]).get((2, 16)) == "tie"
    learned = P.paired_diff(lines["learned"], rope, 32)
    assert (learned.mean, learned.half, learned.resolved) == (None, None, "")


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7])
def test_paired_t_p_is_the_t_distributions_tail(df):
    """Against mpmath's incomplete beta, at differences of several sizes; and the test's
    duality with the interval: p < 5% exactly where the 95% interval excludes 0."""
    for k in range(1, 40):
        d = [0.01 * k + 0.02 * math.sin(3 * i + k) for i in range(df + 1)]
        p = paired_t_p(d, [0.0] * len(d))
        assert p == pytest.approx(t_test_p(d), rel=1e-7, abs=1e-12)
        mean, half = paired_mean_ci(d, [0.0] * len(d))
        assert (p < 0.05) == (abs(mean) > half)
    assert paired_t_p([1.0, 2.0], [1.0, 2.0]) is None  # the same numbers: nothing to test
    assert paired_t_p([1.0], [0.0]) is None and paired_t_p([1.0, 2.0], [0.5, 1.5]) == 0.0


# Wikipedia, "Holm-Bonferroni method", example: four hypotheses, alpha 0.05; H1 and H4 are
# rejected, H2 and H3 not (the procedure stops at H3's 0.03 > 0.05 / 2).
HOLM_EXAMPLE = {"H1": 0.01, "H2": 0.04, "H3": 0.03, "H4": 0.005}


def test_holm_against_the_textbook_procedure():
    names, ps = list(HOLM_EXAMPLE), list(HOLM_EXAMPLE.values())
    adjusted = holm(ps)
    assert {n for n, a in zip(names, adjusted, strict=True) if a < 0.05} == {"H1", "H4"}
    assert holm_rejects(HOLM_EXAMPLE) == {"H1", "H4"}
    # the adjusted values by their definition, max over j <= i of min(1, (m - j + 1) p_(j))
    order = sorted(range(4), key=ps.__getitem__)
    for i in range(4):
        want = max(min(1.0, (4 - j) * ps[order[j]]) for j in range(i + 1))
        assert adjusted[order[i]] == pytest.approx(want)
    # random families: the adjusted p is below alpha exactly for the procedure's rejections
    import random

    rng = random.Random(0)
    for _ in range(200):
        family = {i: rng.random() ** 3 for i in range(rng.randint(1, 30))}
        got = holm(list(family.values()))
        for alpha in (0.01, 0.05, 0.2):
            assert {i for i, a in zip(family, got, strict=True) if a <= alpha} == holm_rejects(
                family, alpha
            )
    with pytest.raises(ValueError, match=r"p-values in \[0, 1\], got 1.5"):
        holm([0.1, 1.5])
    assert holm([]) == []


def test_holm_against_statsmodels():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    import random

    rng = random.Random(1)
    for _ in range(50):
        ps = [rng.random() ** 2 for _ in range(rng.randint(1, 40))]
        _, adjusted, _, _ = multitest.multipletests(ps, alpha=0.05, method="holm")
        assert holm(ps) == pytest.approx(list(adjusted), abs=1e-12)


def test_the_table_marks_follow_holm_not_each_interval():
    """Across the table: every comparison's mark is the corrected decision; two of them
    (alibi at L and 2L) have intervals that exclude 0 and lose their mark."""
    lines = R.table_rows(fake_rows())
    rope = next(line for line in lines if line.label == "rope")
    table = P.paired_table(lines, rope, LENGTHS)
    marks = expected_marks()
    assert table.comparisons == len(marks) == 9
    for (i, n), d in table.diffs.items():
        key = (lines[i].label, n)
        assert d.resolved == (marks.get(key) or ("" if d.mean is None else "no")), key
        if key in marks:
            alone = P.paired_diff(lines[i], rope, n)
            assert d.p == alone.p and d.p_holm >= d.p  # the correction never lowers p
    uncorrected = {k for k in marks if P.paired_diff(lines_by_label(fake_rows())[k[0]], rope,
                                                     k[1]).resolved in ("worse", "better")}  # fmt: skip
    assert {("alibi", 16), ("alibi", 32)} <= uncorrected - {k for k, m in marks.items() if m}


def test_pairs_are_the_shared_seeds_and_five_seeds_use_df_4():
    """A reference with five seeds and a line with three pair over three; five and five use
    t_{0.975, 4}."""
    more = {"base": {16: [3.00, 3.20, 3.40, 3.10, 3.30]}}
    other = {"base": {16: [3.02, 3.25, 3.41, 3.13, 3.31]}}
    rows = [fake_row("rope", s, more) for s in range(5)]
    rows += [fake_row("alibi", s, other) for s in range(5)]
    rows += [fake_row("none", s, other) for s in (0, 2, 4)]
    lines = lines_by_label(rows)
    d5 = P.paired_diff(lines["alibi"], lines["rope"], 16)
    mean, half = interval([0.02, 0.05, 0.01, 0.03, 0.01], T4)
    assert (d5.pairs, d5.mean, d5.half) == (5, pytest.approx(mean), pytest.approx(half, rel=1e-6))
    d3 = P.paired_diff(lines["none"], lines["rope"], 16)
    mean, half = interval([0.02, 0.01, 0.01], T2)
    assert (d3.pairs, d3.mean, d3.half) == (3, pytest.approx(mean), pytest.approx(half, rel=1e-6))


# --- where they are written -----------------------------------------------------------------


def test_markdown_table_of_differences():
    md = R.paired_markdown(fake_rows())
    legend, table = md.split("\n\n")
    assert legend.startswith("Paired differences from rope: for each seed")
    assert "95% interval" in legend and "excludes 0" in legend
    # the rule is stated, with the size of the family: 9 tests (4 lines x 3 lengths, less
    # learned's two n/a and rope +YaRN's zeros at L)
    assert "after Holm's correction for the table's 9 comparisons" in legend
    marks = expected_marks()
    lines = table.splitlines()
    assert lines[0] == "| vs rope | 16 (L) | 32 (2L) | 64 (4L) | seeds |"
    body = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert list(body) == ["rope +YaRN", "alibi", "none", "learned"]  # the table's order
    alibi = " | ".join(cell("alibi", n, marks["alibi", n]) for n in LENGTHS)
    assert body["alibi"] == f"| alibi | {alibi} | 3 |"
    assert body["none"] == "| none | " + " | ".join(cell("none", n, "") for n in LENGTHS) + " | 3 |"
    yarn = [cell("rope", n, marks["rope +YaRN", n], "yarn") for n in LENGTHS[1:]]
    assert body["rope +YaRN"] == "| rope +YaRN | 0.000 ± 0.000 | " + " | ".join(yarn) + " | 3 |"
    assert body["learned"].endswith("| n/a | n/a | 3 |")


def test_table_md_and_readme_block_carry_the_differences(tmp_path):
    rows = fake_rows()
    md = R.results_markdown(rows)
    assert md.endswith("\n\n" + R.paired_markdown(rows))
    block = RD.readme_table(rows)
    main, paired = block.split("\n\n", 1)
    assert main.startswith("| encoding | 16 (L) |") and paired == R.paired_markdown(rows)
    readme = tmp_path / "README.md"
    readme.write_text(f"a\n{RD.README_START}\nold\n{RD.README_END}\nb\n", encoding="utf-8")
    RD.write_readme_table(readme, rows, reference="alibi")
    text = readme.read_text(encoding="utf-8")
    assert "| vs alibi |" in text and "| rope | " in text.split("| vs alibi |")[1]


def test_terminal_table_is_compact_and_fits_80_columns():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=80, record=True, force_terminal=True)
    R.print_table(fake_rows(), console=console)
    text = console.export_text()
    tail = text.split("paired by seed", 1)[1]
    assert expected_marks()["alibi", 64] == "worse"
    mean, half = interval(diffs("alibi", 64), T2)
    assert f"{mean:+.3f}±{half:.3f}*" in tail  # * resolved
    assert expected_marks()["alibi", 16] == ""  # its interval excludes 0; not after Holm
    mean, half = interval(diffs("alibi", 16), T2)
    assert f"{mean:+.3f}±{half:.3f}*" not in tail and f"{mean:+.3f}±{half:.3f}" in tail
    assert "Holm" in " ".join(tail.split())
    mean, half = interval(diffs("none", 16), T2)
    assert f"{mean:+.3f}±{half:.3f} " in tail or f"{mean:+.3f}±{half:.3f}\n" in tail
    assert "…" not in text.split("difference from rope", 1)[1].split("Paired")[0]


def test_csv_columns_of_the_differences(tmp_path):
    path = tmp_path / "results.csv"
    R.write_csv(fake_rows(), path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, lines = reader.fieldnames, list(reader)
    assert fields[-8:] == [
        "reference", "bits_diff_mean", "bits_diff_ci95_low", "bits_diff_ci95_high",
        "diff_resolved", "diff_n_seeds", "diff_p", "diff_p_holm",
    ]  # fmt: skip
    assert {line["reference"] for line in lines} == {"rope"}
    marks = expected_marks()
    for line in lines:
        key = (line["encoding"], line["variant"], int(line["eval_len"]))
        if key[:2] == ("rope", "base") or key == ("learned", "base", 32):
            assert line["bits_diff_mean"] == line["diff_resolved"] == ""
            continue
        if key[0] in ("alibi", "none"):
            mean, half = interval(diffs(key[0], key[2]), T2)
            assert float(line["bits_diff_mean"]) == pytest.approx(mean, abs=1e-12)
            assert float(line["bits_diff_ci95_low"]) == pytest.approx(mean - half, rel=1e-6)
            assert float(line["bits_diff_ci95_high"]) == pytest.approx(mean + half, rel=1e-6)
            assert line["diff_resolved"] == (marks[key[0], key[2]] or "no")
            assert line["diff_n_seeds"] == "3"
            p = t_test_p(diffs(key[0], key[2]))
            assert float(line["diff_p"]) == pytest.approx(p, rel=1e-6, abs=1e-12)
            assert float(line["diff_p"]) <= float(line["diff_p_holm"]) <= 1


def test_one_seed_says_the_differences_need_two():
    rows = fake_rows(1)
    md = R.paired_markdown(rows)
    assert md == (
        "Paired differences against rope need at least 2 seeds; rope has 1 here "
        "(run with --seeds 2 or more).\n"
    )
    assert "±" not in R.results_markdown(rows) and "worse" not in RD.readme_table(rows)


def test_no_rope_no_default_table_and_an_unknown_reference_is_named():
    rows = [r for r in fake_rows() if r["encoding"] != "rope"]
    assert R.paired_markdown(rows) == ""
    assert "vs none" in R.paired_markdown(rows, "NONE")  # labels match case-insensitively
    with pytest.raises(ValueError, match=r"--reference 'rope' is not a line of this table; "
                                         r"lines: alibi, none, learned$"):  # fmt: skip
        R.paired_markdown(rows, "rope")


# --- the command ----------------------------------------------------------------------------


def store(tmp_path, rows: list[dict]):
    out = tmp_path / "lab"
    out.mkdir()
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def report(out, *args: str):
    return CliRunner().invoke(
        app, ["lab", "report", "--out", str(out), "--no-plots", *args], terminal_width=80
    )


def test_lab_report_reference_option(tmp_path):
    out = store(tmp_path, fake_rows())
    res = report(out, "--reference", "rope +yarn")
    assert res.exit_code == 0, res.output
    assert "difference from rope +YaRN" in res.output
    table = (out / "report" / "table.md").read_text()
    assert "| vs rope +YaRN |" in table and "| rope | " in table.split("| vs rope +YaRN |")[1]
    res = report(out, "--reference", "kerple")
    assert res.exit_code == 2
    assert "--reference 'kerple' is not a line of this table; lines: rope, rope +YaRN" in (
        " ".join(res.output.split())
    )
    assert not (out / "report" / "results.csv").read_text().count("kerple")
    res = report(out, "--question", "extend", "--reference", "rope")
    assert res.exit_code == 2 and "--reference compares the grid's lines" in res.output


def test_lab_report_with_one_seed_says_so(tmp_path):
    out = store(tmp_path, fake_rows(1))
    res = report(out, "--reference", "alibi")
    assert res.exit_code == 0, res.output
    assert "Paired differences against alibi need at least 2 seeds" in " ".join(res.output.split())


def test_the_report_at_the_end_of_a_run_has_the_differences(tmp_path):
    """``posenc lab`` (a tiny grid of two seeds) prints and writes the paired table too."""
    out = tmp_path / "run"
    args = ["lab", "-e", "none,rope", "--seeds", "2", "--task", "copy", "-L", "16", "--dim", "32",
            "--layers", "1", "--heads", "2", "--steps", "2", "--batch-size", "4",
            "--eval-tokens", "64", "--eval-lens", "1x,2x", "--jobs", "1", "--out", str(out),
            "--no-plots"]  # fmt: skip
    res = CliRunner().invoke(app, args, terminal_width=80)
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # a title wider than its table wraps
    assert "difference from rope in bits per token, paired by seed" in said
    table = (out / "report" / "table.md").read_text()
    assert "\n| vs rope | 16 (L) | 32 (2L) | seeds |\n" in table
    rows = R.load_rows(out)
    assert table.endswith(R.paired_markdown(rows)) and "| none | " in R.paired_markdown(rows)
