"""`make gpu-check` (benchmarks/gpu_check.py): its dry run end to end on the CPU, the phase
table's command lines against the CLIs they call and against what the issue measures, the time
limits, the wheel list, merging, and (on a GPU, run by the check with the other ``gpu`` tests) a
whole-model decode step with KV caches replayed from a CUDA graph: the CUDA paths of
``Attention`` for a rotary, a bias and no encoding (``test_rotary_compile.py`` captures
``RotaryEmbedding`` alone). The targets it reports are tested in ``test_bench_targets.py``."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
CUDA = torch.cuda.is_available()


def _load_script():
    sys.path.insert(0, str(SCRIPT.parent))  # gpu_report, beside it
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


gc = _load_script()


def _block(text: str, name: str) -> str:
    m = re.search(rf"<!-- bench:{name} -->\n(.*?)\n<!-- /bench:{name} -->", text, re.S)
    assert m is not None, f"no block {name}"
    return m.group(1)


# --- the dry run, as `make gpu-check` runs it without CUDA --------------------------------------


# About 30 s (six phases, each a process of its own): `make test-long`, and `make gpu-check
# GPU_CHECK_ARGS=--dry-run` on a CPU before a GPU session; the phases' pieces are tested below.
@pytest.mark.long
def test_dry_run_passes_and_writes_every_output(tmp_path: Path) -> None:
    from posenc.bench import render
    from posenc.bench.rows import load_all
    from posenc.bench.targets import PUBLISHED_ENCODINGS

    out, work = tmp_path / "out", tmp_path / "work"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out), "--work", str(work)],
        cwd=ROOT, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert res.stdout.rstrip().endswith("dry run OK")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dry_run"] and summary["missing_outputs"] == []
    phases = {p["name"]: p for p in summary["phases"]}
    assert list(phases) == [p.name for p in gc.PHASES]
    assert all(p["status"] == "ok" for p in phases.values()), phases
    # pytest's summary line: the gpu tests were collected (and only they).
    assert int(phases["tests"]["summary"].split("/")[0]) >= 40
    values = gc.fields(out, work, True)
    for rel in ("gpu-check.log", "env.json", "pytest-junit.xml", "lab/results.jsonl",
                *(o.format(**values) for p in gc.PHASES for o in p.outputs)):  # fmt: skip
        assert (out / rel).stat().st_size > 0, rel
    # Each bench block of the run is its rows' rendering; the lab and check blocks are there.
    text = (out / "RESULTS.md").read_text()
    docs = load_all(out / "rows")
    assert set(docs) == {"rope-cpu-dry-run", "rope-decode-cpu-dry-run", "rope-backward-cpu-dry-run",
                         "bias-cpu"}  # fmt: skip
    for name, doc in docs.items():
        assert _block(text, name).rstrip() == render.render(doc).rstrip()
    check = _block(text, "gpu-check-cpu")
    assert "| lab | ok |" in check and "| decode faster than hf-eager |" in check
    log = (out / "gpu-check.log").read_text()
    assert "rope [2, 4/2, 1, 32] float32" in log  # the benches' own output is in the log
    # The tiny lab: one row per encoding, and every published clause checked on it.
    rows = [json.loads(line) for line in (out / "lab/results.jsonl").read_text().splitlines()]
    assert tuple(r["encoding"] for r in rows) == PUBLISHED_ENCODINGS
    assert "Press et al., 2022" in (out / "lab/comparison.md").read_text()
    assert {t["name"] for t in summary["lab_ordering"]} == {
        "sinusoidal breaks hardest past L", "ALiBi stays flat", "RoPE degrades",
        "T5 between ALiBi and RoPE",
    }  # fmt: skip
    # The targets were judged from the rows: the decode case has both timings.
    decode = [t for t in summary["targets"] if t["name"] == "decode faster than hf-eager"]
    assert decode and all(t["result"] in ("met", "MISSED") for t in decode)
    assert not list(out.rglob("*.pt")) and list(work.rglob("final.pt"))  # checkpoints stay out
    assert not (ROOT / "benchmarks" / "rows" / "rope-cpu-dry-run.json").exists()


# --- the phase table -----------------------------------------------------------------------------


def _help(*args: str) -> str:
    from typer.testing import CliRunner

    from posenc.cli import app

    res = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return res.output


def _argvs(tmp_path: Path, dry: bool) -> dict[str, list[str]]:
    values = gc.fields(tmp_path / "o", tmp_path / "w", dry, python="py")
    return {p.name: gc.argv_of(p, dry, values) for p in gc.PHASES}


@pytest.mark.parametrize("dry", [False, True])
def test_phase_commands_use_only_options_the_clis_have(tmp_path: Path, dry: bool) -> None:
    helps = {"rope": _help("bench", "rope"), "bias": _help("bench", "bias"), "lab": _help("lab")}
    argvs = _argvs(tmp_path, dry)
    for name in ("rope-forward", "rope-backward", "bias", "lab"):
        argv = argvs[name]
        assert argv[:3] == ["py", "-m", "posenc"] and ("cpu" if dry else "cuda") in argv
        text = helps[name.split("-")[0]]
        for opt in (a for a in argv if a.startswith("--")):
            assert opt in text, f"{name}: {opt} is not an option of {argv[3:5]}"
    assert all("{" not in a for argv in argvs.values() for a in argv)  # every field filled


def test_gpu_phases_measure_what_the_issue_asks(tmp_path: Path) -> None:
    from posenc.bench.bias import parse_lengths
    from posenc.bench.harness import parse_shapes
    from posenc.bench.targets import GPU_TARGET_BIASES

    argvs = _argvs(tmp_path, dry=False)

    def value(phase: str, opt: str) -> str:
        argv = argvs[phase]
        return argv[argv.index(opt) + 1]

    tests = argvs["tests"]
    assert tests[tests.index("-m", 3) + 1] == "gpu" and "--collect-only" not in tests
    files = {a for a in tests if a.startswith("tests/")}
    assert {"tests/test_kernels_rope.py", "tests/test_flex.py", "tests/test_gpu_check.py"} <= files
    assert "tests/test_docs.py" not in files and "--continue-on-collection-errors" in tests
    assert f"--junitxml={tmp_path / 'o' / 'pytest-junit.xml'}" in tests

    def shapes(phase: str) -> set[tuple[int, ...]]:
        return {(s.b, s.h, s.hk, s.s, s.d) for s in parse_shapes(value(phase, "--shapes"))}

    prefill = {(1, 32, 32, 2048, 128), (4, 32, 8, 4096, 128)}  # Llama-7B, Llama-3-8B
    decode = {(1, 32, 8, 1, 128), (8, 32, 8, 1, 128)}  # one token, KV heads 8
    assert prefill | decode <= shapes("rope-forward") and "--backward" not in argvs["rope-forward"]
    assert prefill <= shapes("rope-backward") and "--backward" in argvs["rope-backward"]
    assert all(s[3] > 1 for s in shapes("rope-backward"))  # a decode step has no backward
    for phase in ("rope-forward", "rope-backward", "bias"):
        assert value(phase, "--results") == str(tmp_path / "o" / "RESULTS.md")
    assert value("rope-forward", "--skip") == "rotary-embedding-torch"  # liger, flash-attn stay
    assert parse_lengths(value("bias", "--lengths")) == [2048, 8192, 32768, 65536]
    assert tuple(value("bias", "--biases").split(",")) == GPU_TARGET_BIASES
    assert value("lab", "--preset") == "gpu-small"
    assert not (tmp_path / "w").is_relative_to(tmp_path / "o")  # checkpoints never come back
    setup = argvs["setup"]
    assert {"--no-index", "--no-deps", "--target"} <= set(setup)
    assert setup[setup.index("-r") + 1] == str(gc.WHEEL_LIST)


def test_time_limits_fit_the_session() -> None:
    limits = {p.name: p.limit_s for p in gc.PHASES}
    assert limits["lab"] <= 300 and gc.TOTAL_BUDGET_S + gc.GRACE_S <= 480
    # Every phase but the lab fits its own limit with the others' floors reserved.
    assert sum(v for k, v in limits.items() if k != "lab") < gc.TOTAL_BUDGET_S
    assert all(p.floor_s <= p.limit_s for p in gc.PHASES)


def test_later_phases_keep_their_floor_and_missing_inputs_skip(tmp_path: Path) -> None:
    quick = "{py} -c pass"
    phases = [gc.Phase("a", "a", quick, quick, 100, 100, floor_s=15),
              gc.Phase("b", "b", quick, quick, 100, 100, floor_s=15),
              gc.Phase("c", "c", quick, quick, 100, 100, needs=str(tmp_path / "absent"))]  # fmt: skip
    (tmp_path / "o").mkdir()
    log = gc.Log(tmp_path / "main.log")
    results = gc.run_phases(phases, tmp_path / "o", tmp_path / "w", False, 60.0, log)
    log.close()
    a, b, c = results
    # a: 60 - floors of b and c (15 each) - grace 10 = 20 s; b: what a left, minus c's floor.
    assert a.status == "ok" and 19 < a.limit_s <= 20
    assert b.status == "ok" and a.limit_s < b.limit_s <= 35
    assert c.status == "skipped" and c.returncode is None


def test_phase_time_limit_kills_the_process_group(tmp_path: Path) -> None:
    log = gc.Log(tmp_path / "main.log")
    code = "import subprocess, sys, time\n"
    code += "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    code += "print('started', child.pid, flush=True)\ntime.sleep(60)\n"
    t0 = time.monotonic()
    env = gc.subprocess_env(tmp_path, dry=True)
    rc, timed_out, _, lines = gc.run_command(
        [sys.executable, "-c", code], tmp_path / "phase.log", 1.0, log, env
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


# --- wheels and merging -------------------------------------------------------------------------


def test_wheel_list_is_pinned_and_never_torch() -> None:
    lines = [ln.split("#")[0].strip() for ln in gc.WHEEL_LIST.read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    assert reqs and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", r) for r in reqs), reqs
    names = {r.split("==")[0].lower() for r in reqs}
    assert not names & {"torch", "triton", "nvidia-cublas", "transformers"}
    cmd = gc.wheels_command(Path("dest"), "py")
    assert cmd[:4] == ["py", "-m", "pip", "download"] and "--no-deps" in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in cmd
    assert cmd[cmd.index("-r") + 1] == str(gc.WHEEL_LIST)
    makefile = (ROOT / "Makefile").read_text()
    assert "benchmarks/gpu_check.py --wheels wheels" in makefile


def test_merge_writes_rows_and_blocks_and_refuses_dry_runs(tmp_path, monkeypatch) -> None:
    from posenc.bench import render
    from posenc.bench.rows import BenchRows

    committed = BenchRows.load(ROOT / "benchmarks" / "rows" / "hf-model-cpu.json")
    run = tmp_path / "run"
    doc = BenchRows(**{**committed.__dict__, "block": "hf-model-cuda"})
    doc.save(run / "rows" / "hf-model-cuda.json")
    (run / "RESULTS.md").write_text(
        "<!-- bench:gpu-check-cuda -->\n## gpu-check (GPU)\n<!-- /bench:gpu-check-cuda -->\n"
        "<!-- bench:hf-model-cuda -->\nstale\n<!-- /bench:hf-model-cuda -->\n"
    )
    (run / "lab" / "report").mkdir(parents=True)
    (run / "lab" / "results.jsonl").write_text("{}\n")
    (run / "lab" / "report" / "table.md").write_text("| t |\n")
    repo = tmp_path / "bench" / "RESULTS.md"
    repo.parent.mkdir()
    repo.write_text("# results\n\nanalysis kept\n")
    monkeypatch.setattr(gc, "REPO_RESULTS", repo)
    monkeypatch.setattr(gc, "REPO_LAB", tmp_path / "lab-gpu-small")
    (run / "summary.json").write_text(json.dumps({"dry_run": True}))
    assert gc.merge(run) == 2 and "gpu-check" not in repo.read_text()
    (run / "summary.json").write_text(json.dumps({"dry_run": False}))
    assert gc.merge(run) == 0
    text = repo.read_text()
    assert "analysis kept" in text and "## gpu-check (GPU)" in _block(text, "gpu-check-cuda")
    assert (repo.parent / "rows" / "hf-model-cuda.json").exists()
    assert _block(text, "hf-model-cuda").rstrip() == render.render(doc).rstrip()  # not "stale"
    assert (tmp_path / "lab-gpu-small" / "table.md").exists()
    assert (tmp_path / "lab-gpu-small" / "results.jsonl").exists()


# --- gpu-small -----------------------------------------------------------------------------------


def test_gpu_small_is_the_published_setting() -> None:
    from posenc.bench.targets import PUBLISHED_ENCODINGS
    from posenc.lab.cells.presets import DEFAULT_ENCODINGS, DEFAULT_ROPE_SCALINGS, preset

    cfg = preset("gpu-small")
    assert cfg.train_len == 512 and cfg.eval_lengths() == [512, 1024, 2048, 4096]
    assert cfg.eval.rope_scalings == DEFAULT_ROPE_SCALINGS
    assert sorted(cfg.encodings) == sorted(DEFAULT_ENCODINGS)
    assert cfg.encodings[:4] == PUBLISHED_ENCODINGS  # the comparison first: a cut run has it
    assert cfg.compile  # trained as a GPU run is: compiled (bf16 autocast and flex with CUDA)
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
