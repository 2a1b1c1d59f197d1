"""The lab's preflight: a run that will not fit in memory is refused in one line before anything
is read or written, ``--dry-run`` prints the cells, the estimate and the output folder, and the
estimate is checked against the peak resident size of a real cell run in its own process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posenc import _sizes
from posenc.cli import app
from posenc.lab.cells.flags import Overrides, build_config
from posenc.lab.grid.estimate import eval_bytes, train_bytes
from posenc.lab.grid.preflight import cell_models, estimate_run
from posenc.model import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
GB = 10**9


@pytest.fixture
def twenty_gb(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine has 20 GB available, whatever this one has."""
    monkeypatch.delenv(_sizes.NO_CHECK_ENV, raising=False)
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": 20 * GB)


def _lab(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["lab", *args])
    return res.exit_code, res.output


def _one_line_refusal(code: int, output: str) -> str:
    lines = output.strip().splitlines()
    assert code == 2, output
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert "20.0 GB is available" in lines[0]
    assert "POSENC_NO_MEMORY_CHECK=1" in lines[0]
    return lines[0]


def test_huge_batch_refused_in_one_line_and_nothing_written(tmp_path: Path, twenty_gb) -> None:
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code, output = _lab(["-e", "rope", "--steps", "5", "--batch-size", "1000000", "-o", str(out)])
    line = _one_line_refusal(code, output)
    assert time.perf_counter() - t0 < 20  # no data read, no model built at that size
    # 1e6 x 64 tokens at ~25 KB each (2 layers x 128 wide x 80 bytes, 256 x 16 for the logits)
    assert "this run needs about 1" in line and "--batch-size 1000000 x --train-len 64" in line
    assert "lower --batch-size, --train-len" in line
    assert not out.exists()


def test_long_eval_refused_naming_eval_lens(tmp_path: Path, twenty_gb) -> None:
    """Shaw materializes [rows, h, n, n] scores: at n = 30000, 4 x 9e8 x 16 bytes."""
    out = tmp_path / "run"
    code, output = _lab(["-e", "shaw", "--eval-lens", "30000", "-o", str(out)])
    line = _one_line_refusal(code, output)
    assert re.search(r"evaluation [\d.]+ GB at --eval-lens 30000", line), line
    assert "lower --eval-lens" in line
    assert not out.exists()


def test_jobs_multiply_the_peak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that fits alone is refused with --jobs 8 when eight cells would not fit at once."""
    cfg = build_config("cpu-small", Overrides(encodings="rope", batch_size=4096))
    models = cell_models(cfg)
    one = estimate_run(cfg, models, "cpu", jobs=1, threads=1)
    eight = estimate_run(cfg, models, "cpu", jobs=8, threads=1)
    assert eight.jobs == 1  # one cell: capped at the cells there are
    cfg = build_config("cpu-small", Overrides(encodings="rope", batch_size=4096, seeds=8))
    eight = estimate_run(cfg, models, "cpu", jobs=8, threads=1)
    assert eight.peak > 8 * one.peak
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": 2 * one.peak)
    code, output = _lab(["-e", "rope", "--batch-size", "4096", "--seeds", "8", "-j", "8",
                         "-o", str(tmp_path / "run")])  # fmt: skip
    assert code == 2 and "8 jobs at once" in output and "or --jobs" in output, output
    assert not (tmp_path / "run").exists()


def test_override_lets_the_run_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sizes, "available_bytes", lambda device="cpu": 1)
    cfg = build_config("cpu-small", Overrides(encodings="rope"))
    est = estimate_run(cfg, cell_models(cfg), "cpu", jobs=1, threads=1)
    assert est.available == 1
    with pytest.raises(ValueError, match="this run needs about"):
        est.check()
    monkeypatch.setenv(_sizes.NO_CHECK_ENV, "1")
    est.check()


def test_dry_run_prints_cells_estimate_and_folder_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = _lab(["-e", "alibi,shaw", "--seeds", "2", "--dry-run", "-o", str(out)])
    assert code == 0, output
    lines = output.strip().splitlines()
    assert lines[0].startswith("4 cell(s), ")
    cells = [line.split()[0:2] for line in lines[1:5]]
    assert cells == [["alibi", "s0"], ["shaw", "s0"], ["alibi", "s1"], ["shaw", "s1"]]
    assert all(re.search(r"~[\d.]+ (s|min|h), peak ~[\d.]+ [MG]B$", line) for line in lines[1:5])
    assert lines[5].startswith("peak memory: about ") and "available" in lines[5]
    assert lines[6].startswith("time: about ")
    assert lines[7] == f"output folder: {out}"
    assert not out.exists()


def test_activations_scale_with_the_shapes() -> None:
    """Scores count only where a path materializes them: none for RoPE, b h L^2 per layer for
    bias and relative encodings; evaluation keeps one layer's."""
    rope = ModelConfig(encoding="rope", max_len=512)
    alibi = ModelConfig(encoding="alibi", max_len=512)
    shaw = ModelConfig(encoding="shaw", max_len=512)
    assert train_bytes(rope, 2, 512) == pytest.approx(2 * train_bytes(rope, 1, 512), rel=1e-6)
    scores = 16 * 4 * 512 * 512 * 2
    assert train_bytes(alibi, 16, 512) - train_bytes(rope, 16, 512) > scores * 6
    assert train_bytes(shaw, 16, 512) > train_bytes(alibi, 16, 512)
    assert eval_bytes(shaw, 4096, 8192, "cpu") > 4 * 4096 * 4096 * 10


PROBE = r"""
import json, sys
from posenc.cli import app
import posenc.lab.grid.estimate, posenc.lab.grid.experiment, posenc.lab.grid.preflight, posenc.lab.evaluation.tasks

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))

base = status("VmRSS")
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    # VmHWM, this address space's own peak: ru_maxrss keeps the peak of the process image
    # before exec (Linux carries it over), i.e. of the test worker that started this one
    peak = status("VmHWM")
    print(json.dumps({"base": base, "peak": peak}))
"""

#: The estimate and the measured peak growth of a real cell agree within this factor (alone:
#: 1.15x; in the full suite on 2 xdist workers one run measured 2.2x, 1.11 GB against 0.50 GB,
#: where the allocator's arenas held more; a constant 10x too large still fails at 3.3x).
FACTOR = 2.5


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_estimate_within_a_factor_of_a_real_cell(tmp_path: Path) -> None:
    """A Shaw cell at 32 x 256 (activations and scores ~400 MB, far above the process's fixed
    costs) trained and evaluated by ``posenc lab`` in a process of its own: the growth of its
    peak resident size over the imports is within :data:`FACTOR` of the estimate (measured
    1.4x above it: the allocator's arenas, see ``ALLOCATOR_SLACK``)."""
    opts = dict(encodings="shaw", task="copy", steps=1, batch_size=32, train_len=256,
                eval_lens="1x", eval_tokens=1024)  # fmt: skip
    args = ["lab", "-e", "shaw", "--task", "copy", "--steps", "1", "--batch-size", "32",
            "--train-len", "256", "--eval-lens", "1x", "--eval-tokens", "1024", "--jobs", "1",
            "--threads", "1", "--no-plots", "-q", "-o", str(tmp_path / "run")]  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    measured = json.loads(res.stdout.strip().splitlines()[-1])
    growth = measured["peak"] - measured["base"]
    cfg = build_config("cpu-small", Overrides(**opts))
    estimate = estimate_run(cfg, cell_models(cfg), "cpu", jobs=1, threads=1).peak
    assert estimate > 300e6  # the activations dominate: a test of the model, not of constants
    assert estimate / FACTOR < growth < estimate * FACTOR, (growth, estimate)


@pytest.mark.parametrize("label", ["rope", "alibi", "shaw", "t5"])
def test_state_counts_what_adamw_holds_after_a_step(label: str) -> None:
    """The estimate's state (weights, gradients, AdamW's two moments, buffers) against a real
    model trained one step with the lab's own optimizer: the bytes of every parameter, its
    gradient and every tensor in the optimizer's state (exp_avg and exp_avg_sq; the scalar step
    counters left out), and of the buffers, summed here from the live tensors."""
    import torch

    from posenc.lab.cells import presets as P
    from posenc.lab.grid.estimate import count_state
    from posenc.lab.training.schedule import make_optimizer
    from posenc.model import TransformerLM

    cfg = P.preset("cpu-small")
    model_cfg = P.model_config(cfg, label, 256)
    params, estimated = count_state(model_cfg)
    torch.manual_seed(0)
    net = TransformerLM(model_cfg)
    opt = make_optimizer(net, cfg.train, torch.device("cpu"))
    x = torch.randint(0, 256, (2, cfg.train_len))
    loss = torch.nn.functional.cross_entropy(net(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    trained = [p for p in net.parameters() if p.requires_grad]
    nbytes = lambda t: t.numel() * t.element_size()  # noqa: E731
    moments = [t for st in opt.state.values() for k, t in st.items() if k != "step"]
    assert len(moments) == 2 * len(trained)  # AdamW: exp_avg and exp_avg_sq per parameter
    measured = (
        sum(nbytes(p) for p in trained)
        + sum(nbytes(p.grad) for p in trained)
        + sum(nbytes(t) for t in moments)
        + sum(nbytes(p) for p in net.parameters() if not p.requires_grad)
        + sum(nbytes(b) for b in net.buffers())
    )
    assert params == sum(p.numel() for p in trained)
    assert estimated == measured, (estimated, measured)
