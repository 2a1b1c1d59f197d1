"""`make gpu-check` (benchmarks/gpu_check.py): its dry run end to end on the CPU, the GPU plan's
command lines against the CLIs they call, the target and ordering readers, the gpu-small sizing,
and (on a GPU, run by the check with the other ``gpu`` tests) a whole-model decode step with KV
caches replayed from a CUDA graph: the CUDA paths of ``Attention`` for a rotary, a bias and no
encoding (``test_rotary_compile.py`` captures ``RotaryEmbedding`` alone)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
CUDA = torch.cuda.is_available()


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gc = _load_script()


# --- the dry run, as `make gpu-check` runs it without CUDA --------------------------------------


@pytest.mark.slow
def test_dry_run_passes_and_writes_every_output(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--work", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    seconds = time.monotonic() - t0
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "dry run OK" in res.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and not summary["missing_outputs"]
    phases = {p["name"]: p for p in summary["phases"]}
    assert list(phases) == [
        "setup", "tests", "rope-forward", "rope-backward", "bias", "lab",
    ]  # fmt: skip
    assert all(p["status"] == "ok" for p in phases.values()), phases
    # pytest's summary line: the gpu tests were collected (and only they).
    assert "collected" in phases["tests"]["summary"]
    collected = int(phases["tests"]["summary"].split("/")[0])
    assert collected >= 40

    for rel in ("gpu-check.log", "env.json", "setup.log", "tests.log", "rope-forward.log",
                "rope-backward.log", "bias.log", "lab.log",
                "lab/results.jsonl", "lab/comparison.md", "lab/report/table.md"):  # fmt: skip
        assert (out / rel).stat().st_size > 0, rel
    blocks = gc.read_blocks(out / "RESULTS.md")
    for name in (*gc.bench_blocks(True).values(), "lab-gpu-small-cpu", "gpu-check-cpu"):
        assert name in blocks, name
    # Everything printed is in the log, the benchmarks' own tables included.
    log = (out / "gpu-check.log").read_text()
    assert "dry run OK" in log and "rope [2, 4/2, 1, 32] float32" in log
    assert "wrote the blocks into" not in log  # a dry run never writes into the repository
    # The tiny lab: one row per encoding, and every published clause checked on it.
    rows = [json.loads(line) for line in (out / "lab/results.jsonl").read_text().splitlines()]
    assert [r["encoding"] for r in rows] == gc.DRY_LAB_ENCODINGS.split(",")
    comparison = (out / "lab/comparison.md").read_text()
    assert "Press et al., 2022" in comparison and "| sinusoidal |" in comparison
    assert {t["name"] for t in summary["lab_ordering"]} == {
        "sinusoidal breaks hardest past L", "ALiBi stays flat", "RoPE degrades",
        "T5 between ALiBi and RoPE",
    }  # fmt: skip
    # The target reader read the real benchmark output: the decode row has both timings.
    decode = [t for t in summary["targets"] if t["name"] == "decode faster than hf-eager"]
    assert decode and all(t["result"] in ("met", "MISSED") for t in decode)
    assert not list(out.rglob("*.pt")) and list(work.rglob("final.pt"))  # checkpoints stay out
    assert seconds < 120, f"the dry run took {seconds:.0f} s"


# --- the GPU plan ------------------------------------------------------------------------------


def _option_names(argv: list[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def _help(*args: str) -> str:
    from typer.testing import CliRunner

    from posenc.cli import app

    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return res.output


def test_gpu_plan_uses_only_options_the_clis_have(tmp_path: Path) -> None:
    phases = {p.name: p for p in gc.plan(tmp_path / "o", tmp_path / "w", "py", False, True)}
    helps = {"rope": _help("bench", "rope"), "bias": _help("bench", "bias"), "lab": _help("lab")}
    for name, phase in phases.items():
        if name == "tests":
            continue
        text = helps[name.split("-")[0]]
        for opt in _option_names(phase.argv):
            assert opt in text, f"{name}: {opt} is not an option of {phase.argv[3:5]}"
        assert phase.argv[1:3] == ["-m", "posenc"] and "cuda" in phase.argv


def test_gpu_plan_measures_what_the_issue_asks(tmp_path: Path) -> None:
    from posenc.bench.bias import parse_lengths
    from posenc.bench.harness import parse_shapes

    out = tmp_path / "o"
    phases = {p.name: p for p in gc.plan(out, tmp_path / "w", "py", False, True)}

    def value(phase: str, opt: str) -> str:
        argv = phases[phase].argv
        return argv[argv.index(opt) + 1]

    tests = phases["tests"].argv
    assert tests[tests.index("-m", 3) + 1] == "gpu" and "--collect-only" not in tests
    files = {a for a in tests if a.startswith("tests/")}
    assert {"tests/test_kernels_rope.py", "tests/test_flex.py", "tests/test_gpu_check.py"} <= files
    assert "tests/test_docs.py" not in files and "--continue-on-collection-errors" in tests
    assert "-n" in tests and f"--junitxml={out / 'pytest-junit.xml'}" in tests

    def shapes(phase: str) -> set[tuple[int, ...]]:
        return {(s.b, s.h, s.hk, s.s, s.d) for s in parse_shapes(value(phase, "--shapes"))}

    prefill = {(1, 32, 32, 2048, 128), (4, 32, 8, 4096, 128)}  # Llama-7B, Llama-3-8B
    decode = {(1, 32, 8, 1, 128), (8, 32, 8, 1, 128)}  # one token, KV heads 8
    assert (
        prefill | decode <= shapes("rope-forward")
        and "--backward" not in phases["rope-forward"].argv
    )
    assert prefill <= shapes("rope-backward") and "--backward" in phases["rope-backward"].argv
    assert all(s[3] > 1 for s in shapes("rope-backward"))  # a decode step has no backward
    # The bench's `prefill` preset: `llama` without its decode steps.
    assert value("rope-backward", "--shapes") == "prefill"
    assert parse_shapes("prefill") == [s for s in parse_shapes("llama") if not s.decode]
    # Liger, flash-attn, eager and compiled transformers and the copy rows stay in.
    for phase in ("rope-forward", "rope-backward"):
        assert value(phase, "--skip") == "rotary-embedding-torch"
        assert value(phase, "--results") == str(out / "RESULTS.md")
    assert parse_lengths(value("bias", "--lengths")) == [2048, 8192, 32768, 65536]
    assert set(value("bias", "--biases").split(",")) == {"alibi", "t5"}
    assert value("lab", "--preset") == "gpu-small"
    # Each phase has its own limit, and the worst case still ends inside 8 minutes.
    others = sum(p.limit_s for n, p in phases.items() if n != "lab")
    assert phases["lab"].limit_s == gc.LAB_LIMIT_S <= 300
    assert others < gc.TOTAL_BUDGET_S and gc.TOTAL_BUDGET_S + gc.GRACE_S <= 480
    # Checkpoints never go to the folder that is brought back.
    assert not (tmp_path / "w").is_relative_to(out)


def test_phase_time_limit_kills_the_process_group(tmp_path: Path) -> None:
    log = gc.Log(tmp_path / "main.log")
    code = "import subprocess, sys, time\n"
    code += "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    code += "print('started', child.pid, flush=True)\ntime.sleep(60)\n"
    t0 = time.monotonic()
    rc, timed_out, _, lines = gc.run_command(
        [sys.executable, "-c", code], tmp_path / "phase.log", 1.0, log, gc.subprocess_env()
    )
    log.close()
    assert timed_out and rc is not None and rc != 0 and lines[0].startswith("started")
    assert time.monotonic() - t0 < 15
    grandchild = int(lines[0].split()[1])
    for _ in range(50):  # the whole group got the signal: the grandchild is gone too
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"process {grandchild} outlived the phase's time limit")
    assert "time limit" in (tmp_path / "main.log").read_text()
    assert "started" in (tmp_path / "phase.log").read_text()


def test_pytest_summary_line() -> None:
    assert gc.pytest_summary(["x", "== 40 passed, 3 skipped in 61.20s ==", ""]) == (
        "40 passed, 3 skipped in 61.20s"
    )
    assert gc.pytest_summary(["a::b", "", "44/700 tests collected (656 deselected) in 6.01s"])
    assert gc.pytest_summary(["no summary here"]) == ""


# --- targets and the published ordering ----------------------------------------------------------


def _case(heading: str, ms: dict[str, float], xcopy: float) -> str:
    from posenc.bench.harness import markdown_table

    rows = [[impl, f"{v:.3f}", "1.0", f"{xcopy:.2f}" if impl == "posenc" else "1.00", "-", "1"]
            for impl, v in ms.items()]  # fmt: skip
    header = ["impl", "median ms", "GB/s", "x copy", "posenc speedup", "first call ms"]
    return f"### {heading}\n\n{markdown_table(header, rows)}\n\n- posenc: backend triton\n"


def test_rope_targets_read_from_the_blocks() -> None:
    names = gc.bench_blocks(False)
    fast = {"copy": 1.0, "posenc": 1.1, "liger": 1.5, "hf-compile": 1.3}
    slow = {"copy": 1.0, "posenc": 1.6, "hf-compile": 1.3}
    blocks = {
        names["rope-backward"]: "## rope\n\n### Summary\n\n| a |\n|---|\n| b |\n\n"
        + _case("[1, 32, 2048, 128] bfloat16", fast, 0.91)
        + _case("[4, 32/8, 4096, 128] bfloat16", slow, 0.62)
        + _case("[4, 8, 4096, 64] bfloat16", slow, 0.5),  # not a target shape
        names["rope-forward"]: _case("[4, 32/8, 4096, 128] bfloat16", fast, 0.9)  # prefill: no target
        + _case("[8, 32/8, 1, 128] bfloat16", {"posenc": 0.01, "hf-eager": 0.05}, 0.1),
    }  # fmt: skip
    got = {(t.name, t.case): t.result for t in gc.rope_targets(blocks, names, dry=False)}
    seven, eight = "[1, 32, 2048, 128] bfloat16", "[4, 32/8, 4096, 128] bfloat16"
    assert got[("fwd+bwd >= 85% of copy bandwidth", seven)] == "met"
    assert got[("fwd+bwd >= 85% of copy bandwidth", eight)] == "MISSED"
    assert got[("fwd+bwd faster than liger", seven)] == "met"
    assert got[("fwd+bwd faster than liger", eight)] == "not measured (liger not in the table)"
    assert got[("fwd+bwd faster than hf-compile", seven)] == "met"
    assert got[("fwd+bwd faster than hf-compile", eight)] == "MISSED"
    assert got[("decode faster than hf-eager", "[8, 32/8, 1, 128] bfloat16")] == "met"
    module = ("decode step faster than transformers' (module rows)", "[8, 32/8, 1, 128] bfloat16")
    assert got[module] == "not measured (posenc-module, hf-module not in the table)"
    assert sum(name.startswith("decode") for name, _ in got) == 2
    assert not any("[4, 8, 4096, 64]" in case for _, case in got)


def test_bias_targets_are_the_benchmarks_own_lines() -> None:
    block = "## bias\n\n### Targets\n\n- alibi s=8192 bfloat16: flex <=1.25x causal at 8k met\n"
    block += "- t5 s=65536 bfloat16: flex runs at 64k, materialized cannot MISSED\n\n### Results\n"
    got = gc.bias_targets(block)
    assert [t.result for t in got] == ["met", "MISSED"] and "64k" in got[1].measured


def _row(enc: str, bits: dict[int, float]) -> dict:
    results = {str(n): {"bits": b, "acc": None} for n, b in bits.items()}
    return {
        "encoding": enc, "seed": 0, "params": 1, "train_len": min(bits),
        "train": {"tokens_per_s": 1.0, "final_loss_bits": 1.0},
        "eval": {"lengths": sorted(bits), "variants": {"base": {"label": "base", "results": results}}},
    }  # fmt: skip


def test_ordering_checks_follow_the_published_clauses() -> None:
    lens = (512, 1024, 2048, 4096)

    def rows(alibi_rise: float) -> list[dict]:
        table = {  # degradation past L: sinusoidal > rope > t5 > alibi (flat)
            "sinusoidal": (3.0, 3.9, 4.5, 5.0),
            "rope": (2.9, 3.0, 3.3, 3.6),
            "t5": (3.0, 2.98, 3.05, 3.1),
            "alibi": (3.0, 2.97, 2.96, 2.96 + alibi_rise),
        }
        return [_row(e, dict(zip(lens, v, strict=True))) for e, v in table.items()]

    assert {t.name: t.result for t in gc.ordering_checks(rows(0.0))} == {
        "sinusoidal breaks hardest past L": "met", "ALiBi stays flat": "met",
        "RoPE degrades": "met", "T5 between ALiBi and RoPE": "met",
    }  # fmt: skip
    broken = {t.name: t.result for t in gc.ordering_checks(rows(0.5))}
    assert broken["ALiBi stays flat"] == "MISSED"
    assert broken["T5 between ALiBi and RoPE"] == "MISSED"
    table = gc.targets_markdown(gc.ordering_checks(rows(0.5)))
    assert "| ALiBi stays flat | 512 -> 4096 | largest rise over L +0.460 bits | MISSED |" in table


# --- wheels and merging -------------------------------------------------------------------------


def test_carried_wheels_install_offline_and_never_torch(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("\n".join(gc.WHEEL_REQUIREMENTS) + "\n")
    (tmp_path / "requirements-nodeps.txt").write_text("liger-kernel\n")
    with_deps, no_deps = gc.install_commands("py", tmp_path)
    for cmd in (with_deps, no_deps):
        assert cmd[:4] == ["py", "-m", "pip", "install"] and "--no-index" in cmd
        assert cmd[cmd.index("--find-links") + 1] == str(tmp_path)
        assert not any(a.split("=")[0].split(">")[0] in ("torch", "triton") for a in cmd)
    assert "--no-deps" in no_deps and no_deps[-1] == "liger-kernel" and "--no-deps" not in with_deps
    assert gc.install_commands("py", tmp_path / "absent") == []
    name = gc.flash_attn_wheel_name("2.8.3")
    assert name == "flash_attn-2.8.3+cu13torch2.11cxx11abiTRUE-cp312-cp312-linux_x86_64.whl"


def test_merge_writes_blocks_and_lab_files_and_refuses_dry_runs(tmp_path, monkeypatch) -> None:
    run = tmp_path / "run"
    (run / "lab" / "report").mkdir(parents=True)
    (run / "RESULTS.md").write_text(
        "<!-- bench:rope-cuda -->\n## rope (cuda)\n<!-- /bench:rope-cuda -->\n"
    )
    (run / "lab" / "results.jsonl").write_text("{}\n")
    (run / "lab" / "report" / "table.md").write_text("| t |\n")
    repo = tmp_path / "RESULTS.md"
    repo.write_text("# results\n\nanalysis kept\n")
    monkeypatch.setattr(gc, "REPO_RESULTS", repo)
    monkeypatch.setattr(gc, "REPO_LAB", tmp_path / "lab-gpu-small")
    (run / "summary.json").write_text(json.dumps({"dry_run": True}))
    assert gc.merge(run) == 2 and "rope-cuda" not in repo.read_text()
    (run / "summary.json").write_text(json.dumps({"dry_run": False}))
    assert gc.merge(run) == 0
    text = repo.read_text()
    assert "analysis kept" in text and "## rope (cuda)" in gc.read_blocks(repo)["rope-cuda"]
    assert (tmp_path / "lab-gpu-small" / "table.md").exists()
    assert (tmp_path / "lab-gpu-small" / "results.jsonl").exists()


# --- gpu-small -----------------------------------------------------------------------------------


def test_gpu_small_is_the_published_setting_sized_to_fit() -> None:
    from posenc.lab.presets import DEFAULT_ENCODINGS, DEFAULT_ROPE_SCALINGS, model_config, preset
    from posenc.model import TransformerLM

    cfg = preset("gpu-small")
    assert cfg.train_len == 512 and cfg.eval_lengths() == [512, 1024, 2048, 4096]
    assert cfg.eval.rope_scalings == DEFAULT_ROPE_SCALINGS
    assert sorted(cfg.encodings) == sorted(DEFAULT_ENCODINGS)
    assert cfg.encodings[:4] == ("sinusoidal", "rope", "alibi", "t5")  # the comparison first
    # The FLOP count the sizing assumes is this model's: 6 N + 12 layers L d per trained token.
    model = TransformerLM(model_config(cfg, "rope", 256))
    n = model.num_params()
    flop = 6 * n + 12 * cfg.model.num_layers * cfg.train_len * cfg.model.dim
    assert abs(flop / gc.GPU_SMALL_SIZING["flop_per_token"] - 1) < 0.03
    assert 3000 < gc.scaling_factor() < 3500
    # Trained as the issue asks: compiled (bf16 autocast and FlexAttention come with CUDA).
    assert cfg.compile
    est = gc.estimate_lab_seconds(cfg)
    # Inside 5 min: ~270 s with the compiles (13 model compiles of 8 s) counted.
    assert 120 < est["total_s"] <= 0.95 * gc.LAB_LIMIT_S, est
    assert est["model_compile_s"] == len(cfg.encodings) * gc.GPU_SMALL_SIZING["model_compile_s"]
    eager = gc.estimate_lab_seconds(replace(cfg, compile=False))
    assert eager["model_compile_s"] == 0 and eager["train_s"] > est["train_s"]
    # The tokens it trains: under one epoch of the stdlib corpus (12 MB without the tests).
    assert cfg.train.steps * cfg.train.batch_size * cfg.train_len < 10e6


# --- CUDA-graph decode (run by the check with every other `gpu` test) ----------------------------


def _decode_setup(encoding: str, device: str, b: int = 2, prompt: int = 16):
    from posenc.model import ModelConfig, TransformerLM

    torch.manual_seed(0)
    cfg = ModelConfig(dim=64, num_layers=2, num_heads=4, max_len=64, encoding=encoding)
    model = TransformerLM(cfg).to(device).eval()
    tokens = torch.randint(0, 256, (b, prompt), device=device)
    caches = model.new_caches()
    with torch.no_grad():
        model(tokens, caches=caches)
    assert all(c.k is not None and c.v is not None and c.positions is not None for c in caches)
    static = [(c.k, c.v, c.positions) for c in caches]
    return model, tokens, static


def _decode_step(model, static, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """One decode step against a fixed prefix: fresh caches over static K/V buffers, so the same
    step can be captured once and replayed with new ``token`` and ``position`` values."""
    from posenc.attention import KVCache

    caches = []
    for k, v, p in static:
        cache = KVCache()
        cache.k, cache.v, cache.positions = k, v, p
        caches.append(cache)
    return model(token, positions=position, caches=caches)[:, -1]  # [b, vocab]


@pytest.mark.parametrize("encoding", ["none", "rope", "alibi"])
def test_static_decode_step_equals_the_full_forward(encoding: str) -> None:
    """The step the CUDA-graph test captures is a real decode step (CPU: runs everywhere)."""
    model, tokens, static = _decode_setup(encoding, "cpu")
    nxt = torch.randint(0, 256, (tokens.shape[0], 1))
    with torch.no_grad():
        step = _decode_step(model, static, nxt, torch.tensor([tokens.shape[1]]))
        full = model(torch.cat((tokens, nxt), dim=1))[:, -1]
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("encoding", ["none", "rope", "alibi", "t5"])
def test_cuda_graph_decode_step_replays_new_tokens_and_positions(encoding: str) -> None:
    """A whole-model decode step captured in a CUDA graph: nothing on the forward path may read
    a value back to the host (DESIGN.md, capture-safe forwards), and each replay with a new token
    and position must equal the eager step."""
    model, tokens, static = _decode_setup(encoding, "cuda")
    b, prompt = tokens.shape
    token = torch.zeros(b, 1, dtype=torch.long, device="cuda")  # static input buffers
    position = torch.tensor([prompt], device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (lazy tables, kernel selection) off the graph
            for _ in range(3):
                _decode_step(model, static, token, position)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _decode_step(model, static, token, position)
        for pos in (prompt, prompt + 7, 50):
            token.copy_(torch.randint(0, 256, (b, 1), device="cuda"))
            position.fill_(pos)
            graph.replay()
            want = _decode_step(model, static, token.clone(), torch.tensor([pos], device="cuda"))
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
