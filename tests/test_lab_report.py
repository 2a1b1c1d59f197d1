"""posenc.lab.reports.report: the table's format (the lab's results page and the README's headline are
written by it), units, seed counts, and ``posenc lab report --readme``."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc._markdown import markdown_table, replace_block
from posenc.cli import app
from posenc.lab.reports import readme as RD
from posenc.lab.reports import report as R
from posenc.lab.reports.stats import t_critical

ROOT = Path(__file__).resolve().parents[1]
#: Where `posenc lab report --readme FILE` writes the full lab table (the README: its headline).
LAB_RESULTS = ROOT / "docs" / "lab-results.md"


def readme_block(text: str, markers: tuple[str, str] = (RD.README_START, RD.README_END)) -> str:
    """The lines between a page's lab-table markers (or ``markers``)."""
    return text.split(markers[0] + "\n", 1)[1].split(markers[1], 1)[0]


def _seed_values(cell: str) -> list[float | None]:
    """``"3.382 ± 0.218 ≈"`` (or ``"**2.696 ± 0.122**"``, ``"3.124"``, ``"n/a"``) -> seed values
    with that mean and 95% half-width: ``m - d, m, m + d`` (sample std ``d``) for three seeds,
    ``m`` for one."""
    text = cell.replace("*", "").replace("≈", "").strip()
    if text == "n/a":
        return [None, None, None] if "±" in cell else [None]
    mean, _, half = text.partition(" ± ")
    if not half:
        return [float(mean)]
    d = float(half) * math.sqrt(3) / t_critical(2)
    return [float(mean) - d, float(mean), float(mean) + d]


def rows_from_table(block: str) -> list[dict]:
    """Result rows (the store's format, one per encoding and seed) holding exactly the numbers
    a README-format table shows: the inverse of :func:`posenc.lab.reports.readme.readme_table`."""
    lines = [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()]
    header, body = lines[0], lines[2:]
    lengths = [int(h.split()[0]) for h in header[1:-2]]
    seeds = 3 if "±" in block else 1
    rows: dict[tuple[str, int], dict] = {}
    for cells in body:
        label, bits, tps, ratio = cells[0], cells[1:-2], cells[-2], cells[-1]
        encoding, _, variant = label.partition(" +")
        per_length = [_seed_values(b) for b in bits]
        if len({len(v) for v in per_length}) != 1:  # a column of n/a (learned past L)
            per_length = [v if len(v) == seeds else [None] * seeds for v in per_length]
        for seed in range(seeds):
            results = {
                str(n): {"bits": v[seed], "acc": None, "tokens": 1}
                for n, v in zip(lengths, per_length, strict=True)
            }
            if not variant:
                rows[encoding, seed] = {
                    "encoding": encoding, "seed": seed, "train_len": lengths[0], "params": 1,
                    "eval": {"unit": "byte", "lengths": lengths,
                             "variants": {"base": {"label": "", "results": results}}},
                    "train": {"tokens_per_s": float(tps.replace(",", "")),
                              "tokens_per_s_fast": float(ratio) * 1e4, "final_loss_bits": 0.0},
                }  # fmt: skip
            else:
                variants = rows[encoding, seed]["eval"]["variants"]
                variants[variant.lower()] = {"label": variant, "results": results}
    return list(rows.values())


def test_the_readme_table_is_in_the_generated_format():
    """The results page's table, read back into result rows, is written again byte for byte: the
    numbers come from a results store, the format (header, n/a, empty cells, thousands
    separators, decimals) from :func:`readme_table`. The block's first table only: the paired
    differences under it (tests/test_lab_paired.py) cannot be read back from the means."""
    block = readme_block(LAB_RESULTS.read_text(encoding="utf-8"))
    main = block.split("\n\n", 1)[0].rstrip("\n") + "\n"
    rows = rows_from_table(main)
    assert list(dict.fromkeys(r["encoding"] for r in rows))[:3] == ["none", "sinusoidal", "learned"]
    assert RD.readme_table(rows).split("\n\n", 1)[0] + "\n" == main == RD.headline_table(rows)


def test_markdown_table_writes_empty_cells_as_one_space():
    assert markdown_table(["a", "b", "c"], [["1", "", "x"], ["", "", ""]]) == (
        "| a | b | c |\n|---|---|---|\n| 1 | | x |\n| | | |"
    )


def test_replace_block_keeps_the_rest_and_needs_both_markers(tmp_path):
    f = tmp_path / "doc.md"
    f.write_text("intro\n<!-- s -->\nold\nlines\n<!-- /s -->\noutro\n")
    replace_block(f, "<!-- s -->", "<!-- /s -->", "new\n")
    assert f.read_text() == "intro\n<!-- s -->\nnew\n<!-- /s -->\noutro\n"
    f.write_text("no markers here\n")
    with pytest.raises(ValueError, match=r"doc\.md has no <!-- s --> \.\.\. <!-- /s --> block"):
        replace_block(f, "<!-- s -->", "<!-- /s -->", "new\n")


@pytest.fixture(scope="module")
def lab_out(tmp_path_factory):
    """A real tiny lab run: two seeds of NoPE and RoPE (with a rescaling) on the copy task."""
    from posenc.lab.cells.presets import DataConfig, EvalConfig, LabConfig, ModelShape, TrainConfig
    from posenc.lab.grid.experiment import RunOptions, run_grid

    out = tmp_path_factory.mktemp("lab")
    cfg = LabConfig(
        preset="test",
        encodings=("none", "rope"),
        seeds=(0, 1),
        train_len=16,
        model=ModelShape(dim=32, num_layers=1, num_heads=2),
        train=TrainConfig(steps=2, batch_size=4, warmup_steps=1),
        data=DataConfig(source="task", task="copy"),
        eval=EvalConfig(lengths=("1x", "2x"), tokens=64, batch_tokens=64,
                        rope_scalings=("linear",), curve_points=8),
    )  # fmt: skip
    assert not run_grid(cfg, RunOptions(out=out, quiet=True)).failed
    return out


def test_table_counts_seeds_and_names_its_units(lab_out):
    rows = R.load_rows(lab_out)
    header, body = R.table_cells(rows)
    assert header[-4:] == ["train tok/s", "×NoPE", "params", "seeds"]
    by_label = {cells[0]: cells for cells in body}
    assert by_label["none"][-1] == "2" and by_label["rope"][-1] == "2"  # a count, not "0,1"
    assert by_label["rope +PI"][-4:] == ["", "", "", ""]
    md = R.results_markdown(rows)
    assert md.startswith("| encoding (bits/token) |") and "tokens per second" in md


def test_lab_report_writes_the_readme_headline(lab_out, tmp_path):
    """The same command on the README writes its headline, the means alone, and nothing else."""
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    readme.write_text(text, encoding="utf-8")
    args = ["lab", "report", "--out", str(lab_out), "--no-plots", "--readme", str(readme)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    new = readme.read_text(encoding="utf-8")
    block = readme_block(new, RD.HEADLINE_BLOCK)
    assert block == RD.headline_table(R.load_rows(lab_out)) and "\n\n" not in block
    assert new.replace(block, "") == text.replace(readme_block(text, RD.HEADLINE_BLOCK), "")


def test_lab_report_writes_the_readme_block(lab_out, tmp_path):
    readme = tmp_path / "lab-results.md"
    text = LAB_RESULTS.read_text(encoding="utf-8")
    readme.write_text(text, encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(
        app, ["lab", "report", "--out", str(lab_out), "--no-plots", "--readme", str(readme)]
    )
    assert res.exit_code == 0, res.output
    new = readme.read_text(encoding="utf-8")
    block = readme_block(new)
    assert block == RD.readme_table(R.load_rows(lab_out))
    assert re.match(r"\| encoding \| 16 \(L\) \| 32 \(2L\) \| train tok/s \| ×NoPE \|\n", block)
    old_block = readme_block(text)
    assert new.replace(block, "") == text.replace(old_block, "")  # nothing else changed
    for bad, why in ((tmp_path / "missing.md", "does not exist"), (tmp_path / "x.md", "no ")):
        if bad.name == "x.md":
            bad.write_text("# no markers\n")
        args = ["lab", "report", "--out", str(lab_out), "--no-plots", "--readme", str(bad)]
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and why in res.output, res.output
    res = runner.invoke(app, ["lab", "report", "--out", str(lab_out), "--all", "--readme", "x"])
    assert res.exit_code == 2 and "--readme writes one table" in res.output


def test_every_run_time_claim_is_the_one_measured_figure():
    """README, docs, ``posenc lab --help`` and the report's note state the default run's time
    from :data:`posenc.lab.DEFAULT_RUN_TIME` (3 min 30 s measured; "about 4 minutes")."""
    from posenc.lab import DEFAULT_RUN_TIME

    pattern = r"about (\d+) minutes on two CPU cores \(up to \d+ on .+\)"
    minutes = re.fullmatch(pattern, DEFAULT_RUN_TIME)
    assert minutes
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`posenc lab`, about {minutes[1]} min on 2 cores" in readme
    assert "3 min 30 s" in LAB_RESULTS.read_text(encoding="utf-8")  # what the figure rounds
    lab_doc = (ROOT / "docs" / "lab.md").read_text(encoding="utf-8")
    assert " ".join(DEFAULT_RUN_TIME.split()) in " ".join(lab_doc.split())
    res = CliRunner().invoke(app, ["lab", "--help"], terminal_width=300)
    assert " ".join(DEFAULT_RUN_TIME.split()) in " ".join(res.output.split())
    for path in (ROOT / "README.md", *(ROOT / "docs").glob("*.md")):
        text = path.read_text(encoding="utf-8").lower()
        assert "ten minutes" not in text, path
