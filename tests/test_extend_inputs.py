"""Every ``posenc extend`` input is checked before the model loads or anything is written: numbers
parsed strictly (a bool, a float where an integer goes, 0 where a positive value goes, a list,
inf or NaN refused naming the option and what it allows), ``--out`` a folder that can be written,
``--device`` one this machine has; defaults derived from the user's own lengths; each refusal
one ``error:`` line. Tiny transformers models in temporary folders."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import posenc.cli_errors
from _cli_here import cli, one_line_error
from _tiny import bpe_tokenizer, tiny_folder
from posenc.extend.methods.names import Method, parse_method, resolve
from posenc.extend.study.config import StudyConfig, default_bin_size, parse_lengths
from posenc.extend.study.run import study_rows
from posenc.hf.extension import extension_from_config
from test_extend_safety import TRAINED

STUDY = ["--methods", "none", "--lengths", "64,256", "--bin-size", "32"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("llama"), TRAINED)


@pytest.fixture
def never_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal that must come before the model loads: loading fails the test."""

    def load(*a: Any, **k: Any) -> Any:
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr("posenc.extend.model.load.load_model", load)


# --- method options: strict, named, never replaced -----------------------------------------------


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("yarn:factor=0", ["'factor'", ">= 1", "got 0"]),  # ran factor 2.0 labelled factor=0
        ("yarn:factor=-2", ["'factor'", ">= 1"]),
        ("yarn:factor=Infinity", ["'factor'", "finite", "got inf"]),
        ("yarn:factor=NaN", ["'factor'", "finite", "got nan"]),
        ("yarn:factor=true", ["'factor'", "got True"]),
        ("yarn:factor=[2,3]", ["'factor'", "got [2, 3]"]),
        ("yarn:factor=abc", ["'factor'", "got 'abc'"]),
        ("yarn:beta_fast=0", ["'beta_fast'", "> 0"]),
        ("yarn:original_max_position_embeddings=128.5", ["original_max_position_embeddings", "integer"]),
        ("yarn:original_max_position_embeddings=128.0", ["original_max_position_embeddings", "integer"]),
        ("self_extend:group_size=2.7", ["group_size", "integer in [1, 2147483647]", "got 2.7"]),  # ran 2
        ("self_extend:group_size=true", ["group_size", "integer in [1, 2147483647]", "got True"]),  # ran 1
        ("self_extend:group_size=2.0", ["group_size", "integer", "got 2.0"]),
        ("self_extend:group_size=[4]", ["group_size", "integer", "got [4]"]),
        ("self_extend:neighbor_window=0", ["neighbor_window", "integer in [1, 2147483647]", "got 0"]),
        ("dual_chunk:chunk_size=NaN", ["chunk_size", "integer in [2, 2147483647]", "got nan"]),
        ("dual_chunk:local_size=-1", ["local_size", "integer in [0, 2147483647]"]),
        ("yarn:layers=5", ["layers", "auto"]),
    ],
)  # fmt: skip
def test_a_bad_method_option_is_refused_naming_it(text: str, needles: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        parse_method(text)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_options_built_in_code_are_refused_not_rounded() -> None:
    """``resolve`` (what the API reaches without the parser) never rounds an option or replaces
    a factor of 0 by the default."""
    with pytest.raises(ValueError, match="group_size must be an integer"):
        resolve(Method("self_extend", {"group_size": 2.7}), 128, 512, 8)
    with pytest.raises(ValueError, match="chunk_size must be an integer"):
        resolve(Method("dual_chunk", {"chunk_size": True}), 128, 512, 8)
    with pytest.raises(ValueError, match=r"'factor'\] must be a finite number >= 1"):
        resolve(Method("yarn", {"factor": 0}), 128, 512, 8)
    assert resolve(Method("yarn", {"factor": 3}), 128, 512, 8).scaling["factor"] == 3.0


# --- lengths, depths and the bin size -----------------------------------------------------------


@pytest.mark.parametrize("text", ["64,inf", "64,nan", "64,256.5", "[64,128]", "64,-inf", "1"])
def test_a_length_that_is_no_whole_number_of_tokens_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--lengths"):
        parse_lengths(text)
    with pytest.raises(ValueError, match="--passkey-lengths"):
        parse_lengths(text, "--passkey-lengths")


def test_lengths_given_in_code_are_integers() -> None:
    assert parse_lengths([64, 128]) == (64, 128)
    assert parse_lengths("1.5k,2k") == (1536, 2048)
    for bad in ([64, 128.5], [True, 64]):
        with pytest.raises(ValueError, match="must be integers"):
            parse_lengths(bad)
    none = (Method("none"),)
    for kw in ({"lengths": (64, 256.5)}, {"lengths": (64, 256), "passkey_lengths": (True,)}):
        with pytest.raises(ValueError, match="must be integers"):
            StudyConfig(methods=none, documents=(), bin_size=32, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bin size must be an integer"):
        StudyConfig(methods=none, lengths=(64, 256), documents=(), bin_size=32.0)  # type: ignore[arg-type]


def test_the_default_bin_size_comes_from_the_users_lengths(folder: Path, tmp_path: Path) -> None:
    """``--lengths 32,64`` alone was refused with "bin size must be in [1, 31]" (the default 1024)."""
    assert default_bin_size([2048, 4096]) == 1024  # as before for the default lengths
    assert default_bin_size([32, 64]) == 16 and default_bin_size([2]) == 1
    assert all(1 <= default_bin_size([n]) < n for n in range(2, 5000, 7))
    out = tmp_path / "out"
    result = cli(
        "extend", str(folder), "--methods", "none", "--lengths", "32,64", "--out", str(out)
    )
    assert result.exit_code == 0, result.output
    (row,) = study_rows(out)
    assert row["bin_size"] == 16 and set(row["ppl"]) == {"32", "64"}


# --- the command: one line, before the model loads, nothing written ------------------------------

BEFORE_LOAD = [
    (["--methods", "yarn:factor=0"], ["'factor'", ">= 1"]),
    (["--methods", "self_extend:group_size=2.7"], ["group_size", "integer"]),
    (["--methods", "self_extend:group_size=true"], ["group_size", "got True"]),
    (["--methods", "yarn:factor=[2,3]"], ["'factor'"]),
    (["--lengths", "64,inf"], ["--lengths", "'inf'"]),
    (["--lengths", "64,256.5"], ["--lengths", "'256.5'"]),
    (["--passkey-lengths", "nan"], ["--passkey-lengths", "'nan'"]),
    (["--passkey-depths", "0.5,nan"], ["--passkey-depths", "'nan'", "[0, 1]"]),
    (["--passkey-depths", "[0.5]"], ["--passkey-depths", "[0, 1]"]),
    (["--device", "cuda:64"], ["--device cuda:64"]),
    (["--device", "nowhere"], ["--device 'nowhere'"]),
    (["--finetune", "lora"], ["--finetune", "'pose'"]),
    (["--finetune", "pose", "--train-len", "32", "--lr", "nan"], ["--lr", "finite"]),
    (["--finetune", "pose", "--train-len", "32", "--lr", "0"], ["--lr", "> 0"]),
    (["--finetune", "pose", "--finetune-method", "bogus"], ["--finetune-method", "yarn"]),
    (["--finetune", "pose", "--finetune-method", "none"], ["--finetune-method", "got 'none'"]),
    (["--finetune", "pose", "--train-len", "256"], ["train_len < target_len", "256 and 256"]),
]


@pytest.mark.parametrize(("extra", "needles"), BEFORE_LOAD)
def test_bad_input_is_one_line_before_the_model_loads(
    folder: Path, tmp_path: Path, never_loads: None, extra: list[str], needles: list[str]
) -> None:
    out = tmp_path / "out"
    result = cli("extend", str(folder), *STUDY, "--out", str(out), *extra)
    one_line_error(result, *needles)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_one_line(
    folder: Path, tmp_path: Path, never_loads: None
) -> None:
    result = cli("extend", str(folder), *STUDY, "--out", str(tmp_path / "o"), "--device", "cuda")
    one_line_error(result, "--device cuda", "CUDA is not available")


def test_an_out_that_cannot_be_a_folder_is_one_line(
    folder: Path, tmp_path: Path, never_loads: None
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    for out, needle in [(a_file, "not a folder"), (a_file / "sub" / "deeper", "is a file")]:
        result = cli("extend", str(folder), *STUDY, "--out", str(out))
        one_line_error(result, f"--out {out}", needle)
    assert a_file.read_text() == "mine\n"


def test_an_out_on_a_read_only_file_system_is_one_line(
    folder: Path, tmp_path: Path, never_loads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*a: Any, **k: Any) -> Any:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(posenc.cli_errors.tempfile, "TemporaryFile", read_only)
    out = tmp_path / "new" / "out"
    result = cli("extend", str(folder), *STUDY, "--out", str(out))
    one_line_error(result, f"--out {out}", "read-only file system")
    assert not (tmp_path / "new").exists()  # the check creates nothing


def test_texts_too_short_are_refused_before_any_cell(folder: Path, tmp_path: Path) -> None:
    """``--passkey-lengths 8`` failed after the perplexity cells ran; a document shorter than
    the longest length failed at its first cell."""
    short = tmp_path / "short.txt"
    short.write_text("a few words only\n")
    cases = [
        (["--passkey-lengths", "8"], "passkey length 8 is too short"),
        (["--text", str(short)], "fewer than the 256 asked for"),
    ]
    for extra, needle in cases:
        out = tmp_path / "out"
        one_line_error(cli("extend", str(folder), *STUDY, "--out", str(out), *extra), needle)
        assert not out.exists()


def test_a_model_without_rope_is_refused_before_any_cell(tmp_path: Path) -> None:
    """gpt2 (learned absolute positions): a scaling is refused in one line naming the method,
    before the first cell and before anything is written."""
    tok = bpe_tokenizer()
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    model_dir = tmp_path / "gpt2"
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    out = tmp_path / "out"
    for dry in ([], ["--dry-run"]):
        result = cli("extend", str(model_dir), *STUDY[:1], "none,yarn", *STUDY[2:],
                      "--out", str(out), *dry)  # fmt: skip
        one_line_error(result, "method yarn:", "gpt2")
        assert not out.exists()


def test_report_readme_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "README.md"
    result = cli("extend", "report", str(tmp_path), "--readme", str(missing))
    one_line_error(result, f"--readme {missing}", "no such file")
    assert not missing.exists()


def test_export_a_file_it_cannot_read_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError inside ``export`` (here the run's folder unreadable) is the one ``error:``
    line every ``extend`` subcommand gives, not a traceback."""

    def unreadable(*a: Any, **k: Any) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "rows.jsonl"))

    monkeypatch.setattr("posenc.extend.study.folder.check_export", unreadable)
    (tmp_path / "run.json").write_text(json.dumps({  # a well-formed run.json: the read fails
        "dtype": "float32", "model": {}, "source": {"path": str(tmp_path)},
        "study": {"lengths": [64], "passkey_lengths": []}}))  # fmt: skip
    result = cli("extend", "export", str(tmp_path), "--method", "yarn", "--out",
                  str(tmp_path / "model"))  # fmt: skip
    one_line_error(result, "Permission denied", "rows.jsonl")


def test_explore_out_under_a_file_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    result = cli("explore", "--out", str(a_file / "page.html"))
    one_line_error(result, str(a_file), "not a folder")


@pytest.mark.parametrize(
    "dca",
    [True, 1, "yes", [8192], {"chunk_size": 262144}, {"local_size": 8192}],
)
def test_a_partial_or_boolean_dual_chunk_config_is_one_line(dca: Any) -> None:
    with pytest.raises(ValueError, match="dual_chunk_attention_config must be a dict"):
        extension_from_config({"dual_chunk_attention_config": dca})
    with pytest.raises(
        ValueError, match="chunk_size must be an integer in \\[2, 2147483647\\], got True"
    ):
        extension_from_config(
            {"dual_chunk_attention_config": {"chunk_size": True, "local_size": 0}}
        )
    for none in (None, False, {}):
        assert extension_from_config({"dual_chunk_attention_config": none}) is None


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        ([], "lower --lengths or"),  # the perplexity lengths are the longest forward
        (["--tasks", "niah_single_1", "--task-lengths", "4096"], "lower --task-lengths or"),
    ],
)
def test_a_forward_too_large_names_the_option_that_asked_for_it(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: list[str], option: str
) -> None:
    monkeypatch.setattr("posenc.extend.study.estimate.available_bytes", lambda device: 1)
    out = tmp_path / "out"
    result = cli("extend", str(folder), *STUDY, "--out", str(out), *extra)
    message = one_line_error(result, "GiB is available", option)
    assert ("4096 tokens" in message) == bool(extra), message
    assert not out.exists()


def test_a_scaling_within_the_trained_length_is_named_before_it_runs(
    folder: Path, tmp_path: Path
) -> None:
    """YaRN set for a target inside the trained length has factor 1: the model as trained. The
    dry run says so (and still counts its cells: the user may want the control)."""
    out = tmp_path / "out"
    result = cli("extend", str(folder), "--methods", "none,yarn,linear", "--lengths", "64",
                  "--bin-size", "32", "--out", str(out), "--dry-run")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "note: yarn, linear at 64 tokens" in result.output, result.output
    assert "have factor 1: the model as trained" in result.output
    assert "3 cells (3 methods" in result.output and "task cell" not in result.output
