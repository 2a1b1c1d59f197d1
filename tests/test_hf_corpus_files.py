"""The published config files themselves: their sources, transformers' reading, posenc's refusals.

``tests/data/hf_configs/`` (with its ``pending/`` and ``refused/`` subfolders) is the corpus: every
file there is a verbatim copy of a published ``config.json``, and ``SOURCES.jsonl`` names, for each,
the Hub model and the public copy it came from (repository, path, commit; ``notes`` say how the copy
is known to be the whole file where that is not plain). Verbatim means that copy unchanged (nothing
added, removed or re-serialized here): the published keys and values; the copy's own spacing may
differ from the Hub's (some copies drop the final newline or re-indent), and ``agrees_with`` names a
second, independent copy with the same keys and values where one was found.
``tests/data/hf_configs_rebuilt/`` holds reconstructed fixtures (dicts, presets, excerpts, configs
cut to fewer layers), with their own ``SOURCES.jsonl`` (``via``): they run here as ``rebuilt/<name>``
so their cases stay covered, but they are not evidence about the published models.
For every file:

* transformers' config class for its ``model_type`` builds it, and keeps every key it holds
  (``to_dict()`` or an attribute, after transformers' documented moves: ``rope_scaling`` ->
  ``rope_parameters``, ``rope_theta`` / ``partial_rotary_factor`` / ``rope_local_base_freq`` /
  ``rotary_emb_base`` / ``rotary_pct`` into ``rope_parameters``, ``torch_dtype`` -> ``dtype``,
  Qwen2.5-VL's top-level text keys into ``text_config``); a key it drops is a failure unless
  :data:`DROPPED` lists it with the reason;
* posenc's :func:`posenc.hf.position_plan` reads it (the cos/sin and rotation parity against
  transformers' rotary classes is ``tests/test_hf_corpus.py``, which runs over the same folders);
* a file under ``refused/`` is refused by :func:`posenc.hf.rope_from_hf` with a reason that names
  what it refuses (its model type, or the ``refusal`` of its entry), never read silently.
``pending/`` holds published files posenc's rotary classes read like transformers, but that other
tests (the plan, inspect and drop-in tests, which glob the top folder) do not pass yet; each
entry's ``pending`` says why, and the file moves up when that is fixed.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402

from _hf_corpus_paths import CORPUS, PREFIX, REBUILT, config_path  # noqa: E402
from posenc.hf import position_plan, rope_from_hf  # noqa: E402


def _sources(folder: Path, prefix: str = "") -> dict[str, dict[str, Any]]:
    lines = (folder / "SOURCES.jsonl").read_text().splitlines()
    return {prefix + e["name"]: e for e in map(json.loads, lines)}


CORPUS_SOURCES = _sources(CORPUS)  # the published files
REBUILT_SOURCES = _sources(REBUILT, PREFIX)  # the reconstructed fixtures
SOURCES = {**CORPUS_SOURCES, **REBUILT_SOURCES}
FILES = sorted(p.name for p in CORPUS.glob("*.json")) + sorted(
    f"pending/{p.name}" for p in CORPUS.glob("pending/*.json")
)
REFUSED = sorted(f"refused/{p.name}" for p in (CORPUS / "refused").glob("*.json"))
FIXTURES = sorted(f"{PREFIX}{p.name}" for p in REBUILT.glob("*.json"))
METADATA = ("_source", "_via", "_notes")

# transformers' own moves of a key (the key survives under the new name)
RENAMES = {"rope_scaling": "rope_parameters", "torch_dtype": "dtype"}
ROPE_KEYS = {  # keys transformers 5 folds into rope_parameters (flat or per layer type)
    "rope_theta", "partial_rotary_factor", "rope_local_base_freq", "rotary_emb_base", "rotary_pct",
}  # fmt: skip
GENERATION = {  # generation settings: transformers 5 keeps them in GenerationConfig (the
    # older save_pretrained files, Llama-3.2-Vision's and Kimi-K2.5's, still spell them out)
    "bad_words_ids", "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "forced_bos_token_id",
    "forced_eos_token_id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size",
    "num_beam_groups", "num_beams", "num_return_sequences", "output_scores",
    "remove_invalid_values", "repetition_penalty", "return_dict_in_generate", "suppress_tokens",
    "temperature", "top_k", "top_p", "typical_p",
}  # fmt: skip
# (file name prefix, key) -> why transformers 5.24 keeps no trace of the key
DROPPED: dict[tuple[str, str], str] = {
    ("lfm2.5-vl", "text_config.block_ff_dim"): (
        "LFM2 training-side width; Lfm2Config reads intermediate_size (same 12288)"
    ),
    ("gemma-4-", "text_config.global_head_dim"): (
        "Gemma4TextConfig keeps no global_head_dim attribute or to_dict key"
    ),
    ("gemma-4-", "text_config.num_global_key_value_heads"): (
        "Gemma4TextConfig keeps no num_global_key_value_heads"
    ),
    ("deepseek-v4-", "num_hash_layers"): "DeepseekV4Config has no such field",
    ("deepseek-v4-", "compress_ratios"): "DeepseekV4Config calls it compress_rates",
}


def _allowed(name: str) -> set[str]:
    return {key for (prefix, key) in DROPPED if name.startswith(prefix)}


# Files of models without RoPE: refused by model type, saying so (read as a RoPE before).
NO_ROPE = sorted(n for n in REFUSED if "has no rotary" in SOURCES[n].get("refusal", ""))


def raw_file(name: str) -> dict[str, Any]:
    """The file's dict without the provenance keys older files carry."""
    raw = json.loads(config_path(name).read_text())
    return {k: v for k, v in raw.items() if k not in METADATA}


def build(raw: dict[str, Any]) -> Any:
    return CONFIG_MAPPING[raw["model_type"]].from_dict(copy.deepcopy(raw))


def _rope_values(kept: dict[str, Any]) -> list[Any]:
    params = kept.get("rope_parameters") or {}
    sets = [params] + [v for v in params.values() if isinstance(v, dict)]
    return [s for s in sets if isinstance(s, dict)]


def _has(config: Any, name: str) -> bool:
    try:
        getattr(config, name)
    except AttributeError:
        return False
    except Exception:  # kept, but per layer (Gemma-4's heterogeneous configs raise on access)
        return True
    return True


def dropped_keys(raw: dict[str, Any], config: Any, prefix: str = "") -> list[str]:
    """Keys of ``raw`` the built ``config`` keeps under no name (sub-configs recursively)."""
    kept = config.to_dict()
    text = kept.get("text_config") or {}
    lost = []
    for key, value in raw.items():
        new = RENAMES.get(key, key)
        if new in kept or _has(config, new):
            sub = getattr(config, new, None) if isinstance(value, dict) else None
            if isinstance(value, dict) and "model_type" in value and hasattr(sub, "to_dict"):
                lost += dropped_keys(value, sub, f"{prefix}{key}.")
            continue
        rope_sets = _rope_values(kept) + _rope_values(text)
        if (key in ROPE_KEYS or key == "rope_scaling") and any(
            key in s or "rope_theta" in s for s in rope_sets
        ):
            continue  # folded into rope_parameters (of the text config, for Qwen2.5-VL)
        if key in text:
            continue  # moved into text_config (Qwen2.5-VL's flat file)
        lost.append(prefix + key)
    return lost


# --- the files and their sources ----------------------------------------------------------------


def test_every_file_has_its_source() -> None:
    """Every file of the corpus (top folder, pending/, refused/) is a verbatim copy of a published
    config.json with its source, and there are at least 80; the fixtures say where they came from."""
    assert sorted(CORPUS_SOURCES) == sorted(FILES + REFUSED)
    assert sorted(REBUILT_SOURCES) == FIXTURES
    assert len(CORPUS_SOURCES) >= 80, len(CORPUS_SOURCES)
    for name, entry in CORPUS_SOURCES.items():
        assert entry["verbatim"] is True, f"{name}: not verbatim, it belongs in {REBUILT.name}/"
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["model"]), name
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repo"]), name
        assert entry["path"].endswith(".json") and re.fullmatch("[0-9a-f]{40}", entry["commit"])
        raw = json.loads(config_path(name).read_text())
        assert isinstance(raw.get("model_type"), str), name
        assert not set(raw) & set(METADATA), name  # the published text, nothing added
        assert name.startswith("refused/") == ("status" in entry), name
        assert name.startswith("pending/") == ("pending" in entry), name  # why it waits there
    for name, entry in REBUILT_SOURCES.items():
        assert entry["verbatim"] is False, name
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["model"]), name
        raw = json.loads(config_path(name).read_text())
        assert isinstance(raw.get("model_type"), str) and raw["_via"] == entry["via"], name


@pytest.mark.parametrize("name", FILES + REFUSED + FIXTURES)
def test_transformers_builds_it_and_keeps_every_key(name: str) -> None:
    raw = raw_file(name)
    if SOURCES[name].get("transformers") is False:  # remote-code models (Kimi-K2, MiMo)
        assert raw["model_type"] not in CONFIG_MAPPING, f"{name}: transformers knows it now"
        return
    lost = [k for k in dropped_keys(raw, build(raw)) if k.rsplit(".", 1)[-1] not in GENERATION]
    unexplained = [k for k in lost if k not in _allowed(name)]
    assert not unexplained, f"{name}: transformers drops {unexplained}"
    stale = [k for k in _allowed(name) if k not in lost]
    assert not stale, f"{name}: DROPPED lists {stale}, which transformers now keeps"


# --- posenc's reading ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES + FIXTURES)
def test_position_plan_reads_it(name: str) -> None:
    raw = raw_file(name)
    plan = position_plan(raw)
    text = build(raw).get_text_config(decoder=True)
    assert len(plan.layers) == text.num_hidden_layers, name


@pytest.mark.parametrize("name", REFUSED)
def test_refused_with_a_reason(name: str) -> None:
    raw = raw_file(name)
    reason = SOURCES[name].get("refusal", raw["model_type"])  # what the message must name
    with pytest.raises(ValueError, match=re.escape(reason)):
        rope_from_hf(raw)
    if SOURCES[name].get("transformers") is not False:
        with pytest.raises(ValueError):
            rope_from_hf(build(raw))


def test_models_without_rope_are_refused_by_type() -> None:
    """ViT, NemotronH and Whisper: their model type has no RoPE, and the refusal says so for
    the dict, the dict read without transformers, and the config object."""
    assert len(NO_ROPE) == 7, NO_ROPE
    for name in NO_ROPE:
        raw = raw_file(name)
        for config, kw in ((raw, {}), (raw, {"use_transformers": False}), (build(raw), {})):
            with pytest.raises(ValueError, match="has no rotary position encoding"):
                rope_from_hf(config, **kw)


DS4 = sorted(n for n in FILES if n.startswith("deepseek-v4-"))


def test_deepseek_v4_files_are_in_the_corpus() -> None:
    assert DS4 == ["deepseek-v4-flash.json", "deepseek-v4-pro.json"]


@pytest.mark.parametrize("name", DS4)
def test_deepseek_v4_files_need_a_label(name: str) -> None:
    """Without a label rope_from_hf refuses the published DeepSeek-V4 files, naming the labels
    and layer types it takes (the raw dict and the config object)."""
    raw = raw_file(name)
    for config in (raw, build(raw)):
        with pytest.raises(
            ValueError, match=r"by label: pass one of \['compress', 'indexer', 'main'\]"
        ):
            rope_from_hf(config)


@pytest.mark.parametrize("name", DS4)
@pytest.mark.parametrize("label", ["main", "compress"])
def test_deepseek_v4_files_read_exactly_with_a_label(name: str, label: str) -> None:
    """With a label, cos/sin equal DeepseekV4RotaryEmbedding's for that label (raw dict and config
    object, positions to 4x max_position_embeddings), interleaved over the trailing rope slice
    (tests/test_hf_corpus.py compares the rotations, every label)."""
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as ds4

    raw = raw_file(name)
    obj = build(raw)
    top = 4 * raw["max_position_embeddings"]
    positions = torch.tensor([[0, 1, 7, 100, 65535, 65536, top // 2, top - 1]])  # [1, s]
    cos_t, sin_t = ds4.DeepseekV4RotaryEmbedding(obj)(torch.zeros(1), positions, layer_type=label)
    for config in (raw, obj):
        rope = rope_from_hf(config, label)
        assert rope.layout == "interleaved" and rope.rotary_dim == raw["qk_rope_head_dim"]
        cos, sin = rope.cos_sin(positions[0])  # [s, r/2]
        assert (cos - cos_t[0]).abs().max().item() <= 1e-6, (name, label)
        assert (sin - sin_t[0]).abs().max().item() <= 1e-6, (name, label)
