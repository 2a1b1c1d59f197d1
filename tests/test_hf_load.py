"""One resolver for every posenc.hf entry: dicts, config objects, config.json paths, model folders,
cached model ids (never the network); and the reader without transformers."""

from __future__ import annotations

import builtins
import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from _hf_corpus_paths import config_path
from posenc.hf import (
    attention_temperature_from_hf,
    hf_rope_kwargs,
    position_plan,
    resolve_config,
    rope_from_hf,
)
from posenc.hf.load import cached_config_path, hub_cache_dir

ENTRIES = (
    lambda c: rope_from_hf(c).base,
    lambda c: hf_rope_kwargs(c)["base"],
    lambda c: attention_temperature_from_hf(c),
    lambda c: position_plan(c).layers[0].base,
)


def _ministral() -> dict[str, Any]:
    return json.loads(config_path("ministral-3-3b-reasoning-2512").read_text())


def _cache(root: Path, model_id: str, raw: dict[str, Any], rev: str = "abc123") -> Path:
    repo = root / f"models--{model_id.replace('/', '--')}"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(raw))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    return snap / "config.json"


def test_every_entry_takes_every_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = _ministral()
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache(tmp_path / "hub", "mistralai/Ministral-3-3B", raw)
    forms = [raw, str(folder / "config.json"), folder / "config.json", str(folder), folder,
             "mistralai/Ministral-3-3B"]  # fmt: skip
    for entry in ENTRIES:
        results = [entry(form) for form in forms]
        assert all(r == results[0] for r in results), results
    assert attention_temperature_from_hf(folder).kind == "llama4_scaling"


def test_objects_and_dicts_pass_through() -> None:
    raw = {"model_type": "llama"}
    assert resolve_config(raw) is raw
    transformers = pytest.importorskip("transformers")
    obj = transformers.LlamaConfig(num_hidden_layers=2)
    assert resolve_config(obj) is obj
    assert position_plan(obj).num_layers == 2


def test_cache_locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    found = _cache(tmp_path / "home" / "hub", "org/name", {"model_type": "llama"})
    assert cached_config_path("org/name") == found
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"


def test_cache_read_without_huggingface_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    found = _cache(tmp_path, "org/name", {"model_type": "llama"})
    assert cached_config_path("org/name") == found
    # no refs/main: the newest snapshot
    (tmp_path / "models--org--name" / "refs" / "main").unlink()
    assert cached_config_path("org/name") == found
    assert resolve_config("org/name") == {"model_type": "llama"}


def test_not_found_names_what_was_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ValueError) as err:
        rope_from_hf("org/missing")
    message = str(err.value)
    assert "no file or folder 'org/missing'" in message
    assert (
        f"no model 'org/missing' with a config.json in the Hugging Face cache {str(tmp_path)!r}"
        in message
    )
    assert "never downloads" in message
    with pytest.raises(ValueError, match="not a model id 'org/name'"):
        position_plan("just-a-name")
    with pytest.raises(ValueError, match=r"has no config\.json"):
        position_plan(tmp_path)
    with pytest.raises(TypeError, match="config must be a dict, a transformers config object"):
        rope_from_hf(42)


def test_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{oops")
    with pytest.raises(ValueError, match="is not valid JSON"):
        hf_rope_kwargs(path)
    path.write_text("[]")
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        hf_rope_kwargs(path)


# --- without transformers ------------------------------------------------------------------------


def _gemma3_leaving_defaults() -> dict[str, Any]:
    """gemma-3-4b-it (a rebuilt fixture, tests/data/hf_configs_rebuilt/): its text_config leaves
    head_dim and the heads to the class."""
    raw = json.loads(config_path("gemma-3-4b-it").read_text())
    text = raw["text_config"]
    for key in ("head_dim", "num_attention_heads", "num_key_value_heads"):
        text.pop(key)
    return raw


def _hide_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "transformers" or name.startswith("transformers."):
            raise ModuleNotFoundError("No module named 'transformers'", name="transformers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


@pytest.mark.parametrize("how", ["use_transformers=False", "hidden module"])
def test_class_defaults_without_transformers_name_the_extra(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = _gemma3_leaving_defaults()
    kwargs: dict[str, Any] = {}
    if how == "hidden module":
        _hide_transformers(monkeypatch)
    else:
        kwargs["use_transformers"] = False
    for entry in (rope_from_hf, hf_rope_kwargs):
        with pytest.raises(ValueError) as err:
            entry(copy.deepcopy(raw), "full_attention", **kwargs)
        assert "transformers" in str(
            err.value
        ) and 'pip install -e ".[hf]" in the posenc clone' in str(err.value)
    with pytest.raises(ValueError, match=r'pip install -e "\.\[hf\]" in the posenc clone'):
        position_plan(copy.deepcopy(raw), **kwargs)


def test_class_defaults_with_transformers() -> None:
    pytest.importorskip("transformers")
    plan = position_plan(_gemma3_leaving_defaults())
    assert plan.layers[0].head_dim == 256  # Gemma3TextConfig's default


def test_complete_configs_read_without_transformers(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_transformers(monkeypatch)
    plan = position_plan(config_path("gemma-2-9b"))
    assert [x.span for x in plan.layers[:2]] == [("sliding", 4096), "full"]


def test_pyproject_has_the_hf_extra() -> None:
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert 'hf = ["transformers>=4.56"]' in text
    dev = next(line for line in text.splitlines() if line.startswith("dev = "))
    assert "hf" in dev.split("[", 2)[2]
