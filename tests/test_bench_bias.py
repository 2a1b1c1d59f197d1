"""``posenc bench bias``: rows and their fields, the materialized-bias skip rule, the CLI.

Everything runs at s = 64 and 128. FlexAttention runs eagerly here (``compile_flex=False``: the
same ``score_mod`` and block mask without a kernel compile of seconds per bias and length); the
compiled path is what the benchmark itself times. That the flex path never materializes the bias
is checked by tests/test_flex.py (``test_flex_never_materializes_the_bias``) and, for every bias
and the compiled kernel, by the benchmark (its flex modules refuse ``.bias``).
"""

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posenc.bench import bias as bench
from posenc.cli import app

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
runner = CliRunner()


def test_rows_have_every_field() -> None:
    cases = bench.plan_cases("quick", lengths=[64, 128], biases=list(bench.BIASES))
    rows = bench.run_bias_bench(cases, heads=2, head_dim=16, repeats=2, compile_flex=False)
    assert [(r.s, r.bias) for r in rows] == [(s, b) for s in (64, 128) for b in bench.BIASES]
    for r in rows:
        assert (r.dtype, r.device, r.mode, r.heads, r.head_dim) == (
            "float32", "cpu", "inference", 2, 16
        )  # fmt: skip
        for m in (r.materialized, r.flex, r.causal):
            assert m.ok and m.ms > 0 and m.first_s > 0 and m.samples >= 2, m
        assert math.isfinite(r.speedup_vs_materialized) and math.isfinite(r.flex_over_causal)
        assert r.max_abs_diff < 1e-4  # both paths compute the same layer
    # The causal floor is measured once per case and shared by its rows.
    assert rows[0].causal is rows[1].causal
    table = bench.table_rows(rows)
    assert len(table) == len(rows) and all(len(t) == len(bench.TABLE_HEADER) for t in table)


def test_materialized_bias_is_skipped_not_tried_when_too_big() -> None:
    # s = 32k, h = 8: the float32 bias alone is 32 GiB.
    need = bench.materialized_need(8, 32768, 32768)
    assert need == 8 * 32768 * 32768 * 4
    why = bench.memory_skip_reason(need, limit=6 * bench.GiB)
    assert why == "memory (would need 32.0 GiB > limit 6.0 GiB)"
    assert bench.memory_skip_reason(need, limit=64 * bench.GiB, available=20 * bench.GiB)
    assert bench.memory_skip_reason(bench.MiB, limit=bench.GiB, available=bench.GiB) is None
    # A peak measured at a shorter length (FIRE: far above the bias) is scaled by s * t.
    assert (
        bench.materialized_need(8, 2048, 2048, (800 * bench.MiB, 1024 * 1024)) == 3200 * bench.MiB
    )
    assert bench.time_skip_reason((8192, 4.0), 32768, 60.0) is not None  # ~64 s predicted
    assert bench.time_skip_reason((8192, 1.0), 16384, 60.0) is None

    # In a run: 64 fits under the limit, 128 (4x the bias) does not; flex and causal still run.
    limit = 2 * 64 * 64 * 4 * 2
    cases = bench.plan_cases("quick", lengths=[64, 128], biases=["alibi"])
    rows = bench.run_bias_bench(
        cases, heads=2, head_dim=16, repeats=1, memory_limit=limit, compile_flex=False
    )
    short, long = rows
    assert short.materialized.ok
    assert long.materialized.status == "skipped" and "would need" in long.materialized.note
    assert long.flex.ok and long.causal.ok
    assert "skipped: memory" in bench.table_rows([long])[0][3]


@pytest.mark.skipif(
    not bench.PeakMemory(torch.device("cpu")).supported, reason="peak RSS cannot be reset here"
)
def test_peak_memory_sees_a_large_allocation() -> None:
    peak = bench.PeakMemory(torch.device("cpu"))
    peak.start()
    x = torch.ones(64 * bench.MiB // 4)  # 64 MiB, touched
    del x
    used = peak.stop()
    assert used is not None and used >= 60 * bench.MiB


def test_plan_and_parsers() -> None:
    full = bench.plan_cases("full")
    assert [(c.s, c.dtype) for c in full][:4] == [
        (s, torch.float32) for s in (1024, 2048, 4096, 8192)
    ]
    assert full[-1].s == 32768 and full[-1].biases == ("alibi",)
    assert bench.plan_cases("full", device_type="cuda")[-1].s == 65536
    one = bench.plan_cases("full", lengths=[64], dtypes=["bfloat16"])
    assert len(one) == 1 and one[0].biases == bench.BIASES  # sweeps merged, no duplicates
    assert bench.parse_lengths("1024, 2k") == [1024, 2048]
    for bad, match in (("0", "positive integers"), ("-5", "positive"), ("x", "positive")):
        with pytest.raises(ValueError, match=match):
            bench.parse_lengths(bad)
    with pytest.raises(ValueError, match="unknown bias"):
        bench.parse_biases("alibi,rope")
    with pytest.raises(ValueError, match="not one of"):
        bench.parse_dtype_names("float8")
    with pytest.raises(ValueError, match="unknown preset"):
        bench.plan_cases("huge")
    with pytest.raises(ValueError, match="unknown candidate"):
        bench.parse_skip("flex,eager")


def test_cli_help_bad_options_and_results_block(tmp_path: Path) -> None:
    res = runner.invoke(app, ["bench", "bias", "--help"])
    assert res.exit_code == 0 and "--preset" in res.output and "--lengths" in res.output
    for args, message in (
        (["--biases", "nope"], "unknown bias"),
        (["--lengths", "0"], "positive integers"),
        (["--dtypes", "float8"], "not one of"),
        (["--memory-fraction", "2"], "memory-fraction"),
    ):
        res = runner.invoke(app, ["bench", "bias", *args])
        assert res.exit_code != 0 and message in res.output, res.output
    out = tmp_path / "RESULTS.md"
    out.write_text("# results\n\n<!-- bench:rope-cpu -->\nrope figures\n<!-- /bench:rope-cpu -->\n")
    args = ["bench", "bias", "--lengths", "64", "--biases", "alibi", "--skip", "flex",
            "--heads", "2", "--head-dim", "16", "--repeats", "3", "--results", str(out)]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "rope figures" in text and "<!-- bench:bias-cpu -->" in text
    assert "| alibi | float32 | 64 |" in text and "GPU targets" in text
