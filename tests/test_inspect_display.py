"""What ``posenc inspect`` shows a reader, on published configs: the M-RoPE allocation, where the
lengths come from, DeepSeek-V3's softmax scale, transformers' own messages and the 4.x note,
each checked against transformers or the file itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from typer.testing import CliRunner  # noqa: E402

from _hf_corpus_paths import config_path, corpus_files  # noqa: E402
from posenc.cli import app  # noqa: E402
from posenc.hf.inspect import inspect_config  # noqa: E402

runner = CliRunner()


def _raw(name: str) -> dict[str, Any]:
    return json.loads(config_path(name).read_text())


def _table(name: str) -> str:
    result = runner.invoke(app, ["inspect", str(config_path(name))])
    assert result.exit_code == 0, result.output
    return result.stdout


def _temporal_channels(name: str, module: str) -> list[int]:
    """The channels (of the first half) that transformers turns by the temporal position: its
    rotary module (and, where cos/sin stay per axis, its apply) at position (t, h, w) = (1, 0, 0)."""
    modeling = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["x"])
    raw = _raw(name)
    config = transformers.AutoConfig.for_model(**raw).get_text_config(decoder=True)
    rotary = next(getattr(modeling, n) for n in dir(modeling)
                  if n.endswith("RotaryEmbedding") and "Vision" not in n)  # fmt: skip
    positions = torch.tensor([1, 0, 0]).view(3, 1, 1)  # [3, b, s]
    cos, sin = rotary(config)(torch.zeros(1), positions)
    if cos.dim() == 4:  # [3, b, s, d]: the sections are taken in the apply function
        q = torch.ones(1, 1, 1, cos.shape[-1])
        section = config.rope_parameters["mrope_section"]
        rotated, _ = modeling.apply_multimodal_rotary_pos_emb(q, q, cos, sin, section)
        turned = (rotated[0, 0, 0] - 1).abs() > 1e-6
    else:  # [b, s, d]: already laid out
        turned = sin[0, 0].abs() > 0
    half = turned.shape[-1] // 2
    return [i for i in range(half) if turned[i]]


@pytest.mark.parametrize(
    ("name", "module"),
    [("qwen3-vl-32b-instruct", "qwen3_vl"), ("qwen2.5-vl-7b-instruct", "qwen2_5_vl")],
)
def test_the_mrope_allocation_is_shown_as_transformers_lays_it_out(name: str, module: str) -> None:
    """Qwen3-VL interleaves the sections (T at channels 0, 3, 6, ...), Qwen2.5-VL lays them out
    contiguously (T at 0 .. s_t - 1): read from transformers' own rotation."""
    layer = inspect_config(config_path(name))["layers"][0]
    temporal = _temporal_channels(name, module)
    contiguous = temporal == list(range(layer["mrope_section"][0]))
    want = "contiguous" if contiguous else "interleaved"
    assert contiguous or temporal[:3] == [0, 3, 6]
    assert layer["mrope_allocation"] == want
    assert want in _table(name)


@pytest.mark.parametrize(
    "name", ["qwen3-vl-32b-instruct", "smollm3-3b", "gemma-4-26b-a4b", "rebuilt/gemma-3-4b-it"]
)
def test_no_training_length_is_claimed_where_the_file_gives_none(name: str) -> None:
    text = json.dumps(_raw(name))
    assert "original_max_position_embeddings" not in text  # the file names no training length
    report = inspect_config(config_path(name))
    assert report["training_length"] is None
    assert "training length not given" in _table(name)
    assert "trained at" not in _table(name)


def test_the_training_length_is_the_files_original_length() -> None:
    raw = _raw("deepseek-v3")
    report = inspect_config(config_path("deepseek-v3"))
    assert report["training_length"] == raw["rope_scaling"]["original_max_position_embeddings"]
    assert report["max_position_embeddings_source"] == "file"
    assert "trained at L = 4096 (original_max_position_embeddings)" in _table("deepseek-v3")


def test_a_class_default_max_position_is_named_so() -> None:
    raw = {k: v for k, v in _raw("qwen3-8b").items() if k != "max_position_embeddings"}
    report = inspect_config(raw)
    want = transformers.Qwen3Config().max_position_embeddings  # the class default
    assert report["max_position_embeddings"] == want
    assert report["max_position_embeddings_source"] == "class default"


def _wide_table(name: str) -> str:
    from rich.console import Console

    from posenc.hf.inspect import report_table

    console = Console(width=400, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(report_table(inspect_config(config_path(name))))
    return console.export_text()


def test_deepseek_v3_softmax_scale_is_transformers() -> None:
    ds3 = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")
    raw = _raw("deepseek-v3")
    config = transformers.DeepseekV3Config.from_dict(dict(raw))
    with torch.device("meta"):  # only the scale is read: no weights
        attention = ds3.DeepseekV3Attention(config, 0)
    want = attention.scaling * attention.qk_head_dim**0.5
    got = inspect_config(config_path("deepseek-v3"))["layers"][0]["softmax_scale_factor"]
    assert got == pytest.approx(want, rel=1e-12)
    assert want > 1.8  # the x1.87 of the issue, not 1
    assert f"softmax x{want:.3g} (mscale 1/mscale_all_dim 1)" in _wide_table("deepseek-v3")
    llama = inspect_config(config_path("llama-3.1-8b"))["layers"][0]
    assert llama["softmax_scale_factor"] is None  # Llama's attention reads no rope parameter


def test_transformers_messages_become_notes_after_the_table() -> None:
    """A subprocess, as a user runs it: transformers' validator warning (Llama-4 Scout's llama3
    factors) is not on stderr above the table, but once among the notes after it."""
    path = config_path("llama-4-scout-17b-16e-instruct-fp8-dynamic")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run(
        [sys.executable, "-m", "posenc", "inspect", str(path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "[transformers]" not in run.stderr
    out = " ".join(run.stdout.split())
    message = "note: transformers: `rope_parameters`'s high_freq_factor field must be greater"
    assert out.count(message) == 1
    assert out.index("longest wavelength") < out.index(message)


def test_the_4x_note_is_once_brief_and_after_the_warnings() -> None:
    for path in corpus_files():
        report = inspect_config(path)
        legacy = [n for n in report["notes"] if "4.x" in n]
        assert len(legacy) <= 1, path.name
        assert not any("4.x" in w and "beside" not in w for w in report["warnings"]), path.name
        if legacy:
            assert len(legacy[0]) < 120, legacy[0]
    out = _table("deepseek-v3")
    lines = [x for x in out.splitlines() if x.startswith(("warning:", "note:"))]
    assert lines[0].startswith("note:") or "4.x" not in lines[0]
    assert sum("4.x" in x for x in lines) == 1


def test_notes_are_in_the_json_report(tmp_path: Path) -> None:
    result = runner.invoke(app, ["inspect", str(config_path("deepseek-v3")), "--json"])
    report = json.loads(result.stdout)
    assert any("'type' (read as rope_type)" in n for n in report["notes"])
    assert report["layers"][0]["mrope_allocation"] is None
