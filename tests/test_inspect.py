"""``posenc inspect``: every published config, against the transformers model built from it, and
each warning with a config that triggers it and one that does not."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from _hf_corpus_paths import config_path, top_level_files  # noqa: E402
from _hf_probe import probe, text_config, tiny_text_config  # noqa: E402
from posenc.cli import app  # noqa: E402
from posenc.hf.inspect import config_warnings, format_indices, inspect_config  # noqa: E402
from posenc.rotary import RotaryEmbedding  # noqa: E402

FILES = top_level_files()
# files this probe cannot build a tiny model of (checked elsewhere), with the reason
PROBE_SKIPS = {
    path.stem: (
        "DeepSeek-V4 (rope sets by label, trailing slice): _hf_probe does not shrink its "
        "config; its tiny model is checked by tests/test_hf_ds4_logits.py"
    )
    for path in FILES
    if path.stem.startswith("deepseek-v4-")
}
runner = CliRunner()


def load(name: str) -> dict[str, Any]:
    raw = json.loads(config_path(name).read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def run_json(path: Path) -> dict[str, Any]:
    result = runner.invoke(app, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, (path.name, result.output)
    return json.loads(result.stdout)


def test_every_corpus_file_prints_a_table() -> None:
    for path in FILES:
        result = runner.invoke(app, ["inspect", str(path)])
        assert result.exit_code == 0, (path.name, result.output)
        assert "layers" in result.stdout


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_json_matches_the_model_built_from_the_same_file(path: Path) -> None:
    if path.stem in PROBE_SKIPS:
        pytest.skip(PROBE_SKIPS[path.stem])
    report = run_json(path)
    raw = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    assert len(report["layers"]) == text_config(raw).num_hidden_layers == report["num_layers"]
    assert [x["index"] for x in report["layers"]] == list(range(report["num_layers"]))
    seen = probe(tiny_text_config(raw))  # the file's position keys, first layers only
    for index, got in seen.items():
        layer = report["layers"][index]
        assert got["rope"] == layer["rope"], (path.stem, index)
        t = layer["temperature"]
        assert got["temperature"] == (None if t is None else (t["kind"], t["beta"], t["length"]))
        if layer["rope"] and got["inv_freq"] is not None:
            ours = RotaryEmbedding(
                layer["head_dim"], layer["base"], layer["scaling"], layer["layout"],
                layer["rotary_dim"], angle_dtype=torch.float32,
            ).frequencies()[0]  # fmt: skip
            torch.testing.assert_close(ours, got["inv_freq"].float(), rtol=1e-6, atol=0)


def test_nope_temperatures_and_types_in_json(tmp_path: Path) -> None:
    raw = CONFIG_MAPPING["llama4_text"]().to_dict()
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    layers = run_json(tmp_path)["layers"]  # a model folder
    assert [x["rope"] for x in layers[:4]] == [True, True, True, False]
    assert [x["span"] for x in layers[:4]] == [["chunk", 8192]] * 3 + ["full"]
    assert layers[3]["temperature"] == {"kind": "llama4_temperature", "beta": 0.1, "length": 8192}
    assert layers[0]["temperature"] is None


def test_format_indices() -> None:
    assert format_indices((0, 1, 2, 3, 5)) == "0-3, 5"
    assert format_indices([4]) == "4"
    assert format_indices([3, 1, 2, 9, 10]) == "1-3, 9-10"


def test_table_groups_equal_layers() -> None:
    result = runner.invoke(app, ["inspect", str(config_path("gemma-2-9b"))])
    assert result.exit_code == 0
    assert "0, 2, 4, 6" in result.stdout and "1, 3, 5, 7" in result.stdout


@pytest.mark.parametrize(
    "argument, message",
    [
        ("no/such-model", "no model 'no/such-model' with a config.json in the Hugging Face cache"),
        ("./missing.json", "no file or folder './missing.json'"),
    ],
)
def test_bad_input_is_one_line_exit_2(argument: str, message: str) -> None:
    result = runner.invoke(app, ["inspect", argument])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_bad_json_and_unreadable_configs_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    nope = tmp_path / "nope.json"
    nope.write_text(json.dumps(_llama(rope_theta=-1.0)))
    for path, message in ((bad, "is not valid JSON"), (listed, "must hold a JSON object"),
                          (nope, "rope_theta must be a finite number > 0"), (tmp_path, "has no config.json")):  # fmt: skip
        if path == tmp_path:
            for p in (bad, listed, nope):
                p.unlink()
        result = runner.invoke(app, ["inspect", str(path)])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("error: ") and message in result.output


# --- each warning: a config that triggers it, and one that does not ------------------------------


def _llama(**changes: Any) -> dict[str, Any]:
    raw = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "max_position_embeddings": 4096, "rope_theta": 1e4}  # fmt: skip
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def _has(warnings: list[str], text: str) -> bool:
    return any(text in w for w in warnings)


def test_warning_4x_rope_scaling_key() -> None:
    notes = inspect_config(load("llama-3.1-8b-instruct"))["notes"]
    assert _has(notes, "4.x keys, read as 5.x does: 'rope_scaling' (read as rope_parameters)")
    assert not _has(config_warnings(load("llama-3.1-8b-instruct")), "4.x")  # a note, no trap
    raw = load("llama-3.1-8b-instruct")
    raw["rope_parameters"] = {**raw.pop("rope_scaling"), "rope_theta": raw.pop("rope_theta")}
    assert not _has(config_warnings(raw), "rope_scaling")
    assert not _has(inspect_config(raw)["notes"], "rope_scaling")
    both = _llama(rope_scaling={"rope_type": "linear", "factor": 2.0},
                  rope_parameters={"rope_type": "default", "rope_theta": 1e4})  # fmt: skip
    assert _has(config_warnings(both), "which replaces the 'rope_parameters' given")
    # ... as transformers does: the 4.x dict wins
    got = CONFIG_MAPPING["llama"].from_dict(copy.deepcopy(both)).rope_parameters["rope_type"]
    assert got == "linear"
    assert inspect_config(both)["layers"][0]["scaling"]["rope_type"] == "linear"


def test_warning_type_instead_of_rope_type() -> None:
    old = _llama(rope_parameters={"type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert _has(inspect_config(old)["notes"], "'type' (read as rope_type)")
    new = _llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert not _has(inspect_config(new)["notes"], "'type'")


def test_warning_missing_rope_theta_names_the_default() -> None:
    assert _has(
        config_warnings(_llama(rope_theta=None)), "falls back to 10000, transformers' default"
    )
    oss = copy.deepcopy(load("gpt-oss-20b"))
    oss.pop("rope_theta")
    oss["rope_scaling"].pop("rope_theta", None)
    warnings = config_warnings(oss)
    assert _has(warnings, "falls back to 150000, the default of transformers' GptOssConfig")
    theirs = CONFIG_MAPPING["gpt_oss"].from_dict(copy.deepcopy(oss))
    assert theirs.rope_parameters["rope_theta"] == 150000.0
    fallback = config_warnings(oss, use_transformers=False)
    assert _has(fallback, "falls back to 150000, the default of the 'gpt_oss' config class")
    assert not _has(config_warnings(_llama()), "rope_theta")


def _transformers_yarn_warning(raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> bool:
    from transformers import modeling_rope_utils

    said: list[str] = []
    monkeypatch.setattr(modeling_rope_utils.logger, "warning_once", lambda m, *a: said.append(m))
    CONFIG_MAPPING[raw["model_type"]].from_dict(copy.deepcopy(raw))
    return any("implicit factor" in m for m in said)


@pytest.mark.parametrize("factor, orig, warns", [(4.0, 4096, True), (8.0, 4096, False),
                                                 (4.0, None, False)])  # fmt: skip
def test_warning_yarn_factor_follows_transformers_rule(
    factor: float, orig: int | None, warns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    scaling = {"rope_type": "yarn", "factor": factor, "rope_theta": 1e4}
    if orig is not None:
        scaling["original_max_position_embeddings"] = orig
    raw = _llama(max_position_embeddings=32768, rope_parameters=scaling)
    assert _has(config_warnings(raw), "YaRN factor") is warns
    assert _transformers_yarn_warning(raw, monkeypatch) is warns


def _olmo3(**full: Any) -> dict[str, Any]:
    raw = CONFIG_MAPPING["olmo3"]().to_dict()
    raw["max_position_embeddings"] = 65536
    yarn = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}
    raw["rope_parameters"] = {
        "full_attention": {**yarn, "rope_theta": 5e5, **full},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
    }
    return raw


def test_warning_truncate_per_layer_type() -> None:
    assert _has(config_warnings(_olmo3(truncate=False)), "the per-type value is ignored")
    assert not _has(config_warnings(_olmo3()), "truncate")
    # transformers' YaRN reads the top level only (the per-type value never reaches it)
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    cfg = CONFIG_MAPPING["olmo3"].from_dict(_olmo3(truncate=False))
    with_flag, _ = _compute_yarn_parameters(cfg, layer_type="full_attention")
    cfg_plain = CONFIG_MAPPING["olmo3"].from_dict(_olmo3())
    without, _ = _compute_yarn_parameters(cfg_plain, layer_type="full_attention")
    torch.testing.assert_close(with_flag, without, rtol=0, atol=0)


def test_warning_keys_transformers_ignores(monkeypatch: pytest.MonkeyPatch) -> None:
    qwen = CONFIG_MAPPING["qwen2"]().to_dict()
    off = {**qwen, "use_sliding_window": False, "sliding_window": 4096, "layer_types": None}
    assert _has(config_warnings(off), "sliding_window=4096")
    on = {**off, "use_sliding_window": True, "max_window_layers": 2}
    assert not _has(config_warnings(on), "sliding_window=4096")
    # a rope parameter transformers' validation does not know for the rope type
    from transformers import modeling_rope_utils

    said: list[str] = []
    monkeypatch.setattr(modeling_rope_utils.logger, "warning", lambda m, *a: said.append(m))
    extra = _llama(rope_parameters={"rope_type": "linear", "factor": 2.0, "beta_fast": 32})
    CONFIG_MAPPING["llama"].from_dict(copy.deepcopy(extra))
    assert any("Unrecognized keys" in m and "beta_fast" in m for m in said)
    report = inspect_config(extra)
    assert _has(
        report["warnings"], "keys transformers ignores for rope_type 'linear': ['beta_fast']"
    )
    assert report["layers"][0]["scaling"] == {"rope_type": "linear", "factor": 2.0}
    plain = _llama(rope_parameters={"rope_type": "linear", "factor": 2.0})
    assert not _has(config_warnings(plain), "ignores")


def test_no_warnings_on_a_clean_5x_config() -> None:
    assert config_warnings(_llama()) == []
