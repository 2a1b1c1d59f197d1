"""The published config files themselves: their sources, transformers' reading, posenc's refusals.

``tests/data/hf_configs/SOURCES.jsonl`` names, for each file of the folder (and of ``refused/``),
the Hub model and the public copy it came from. A file marked ``verbatim`` is that copy byte for
byte: no provenance keys inside, nothing reformatted. For every file:

* transformers' config class for its ``model_type`` builds it, and keeps every key it holds
  (``to_dict()`` or an attribute, after transformers' documented moves: ``rope_scaling`` ->
  ``rope_parameters``, ``rope_theta`` / ``partial_rotary_factor`` / ``rope_local_base_freq`` /
  ``rotary_emb_base`` / ``rotary_pct`` into ``rope_parameters``, ``torch_dtype`` -> ``dtype``,
  Qwen2.5-VL's top-level text keys into ``text_config``); a key it drops is a failure unless
  :data:`DROPPED` lists it with the reason;
* posenc's :func:`posenc.hf.position_plan` reads it (the cos/sin and rotation parity against
  transformers' rotary classes is ``tests/test_hf_corpus.py``, which runs over the same folder);
* a file under ``refused/`` is refused by :func:`posenc.hf.rope_from_hf` with a reason that names
  its model type, never read silently.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402

from posenc.hf import position_plan, rope_from_hf  # noqa: E402

CORPUS = Path(__file__).parent / "data" / "hf_configs"
SOURCES = {
    e["name"]: e for e in map(json.loads, (CORPUS / "SOURCES.jsonl").read_text().splitlines())
}
FILES = sorted(p.name for p in CORPUS.glob("*.json")) + sorted(
    f"pending/{p.name}" for p in CORPUS.glob("pending/*.json")
)
REFUSED = sorted(f"refused/{p.name}" for p in (CORPUS / "refused").glob("*.json"))
METADATA = ("_source", "_via", "_notes")

# transformers' own moves of a key (the key survives under the new name)
RENAMES = {"rope_scaling": "rope_parameters", "torch_dtype": "dtype"}
ROPE_KEYS = {  # keys transformers 5 folds into rope_parameters (flat or per layer type)
    "rope_theta", "partial_rotary_factor", "rope_local_base_freq", "rotary_emb_base", "rotary_pct",
}  # fmt: skip
GENERATION = {  # generation settings: transformers 5 keeps them in GenerationConfig
    "bad_words_ids", "begin_suppress_tokens", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "forced_bos_token_id",
    "forced_eos_token_id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size",
    "num_beam_groups", "num_beams", "num_return_sequences", "output_scores",
    "remove_invalid_values", "repetition_penalty", "return_dict_in_generate", "suppress_tokens",
    "temperature", "top_k", "top_p", "typical_p",
}  # fmt: skip
DROPPED: dict[tuple[str, str], str] = {
    **{
        ("pending/kimi-k2.5.json", f"text_config.{k}"): "a generation setting (GenerationConfig's)"
        for k in GENERATION
    },
    ("lfm2.5-vl-1.6b.json", "text_config.block_ff_dim"): (
        "LFM2 training-side width; Lfm2Config reads intermediate_size (same 12288)"
    ),
    ("pending/gemma-4-26b-a4b.json", "text_config.global_head_dim"): (
        "Gemma4TextConfig (transformers 5.24) keeps no global_head_dim attribute or to_dict key"
    ),
    ("pending/gemma-4-26b-a4b.json", "text_config.num_global_key_value_heads"): (
        "Gemma4TextConfig (transformers 5.24) keeps no num_global_key_value_heads"
    ),
    ("pending/gemma-4-31b-it-nvfp4.json", "text_config.global_head_dim"): (
        "Gemma4TextConfig (transformers 5.24) keeps no global_head_dim attribute or to_dict key"
    ),
    ("pending/gemma-4-31b-it-nvfp4.json", "text_config.num_global_key_value_heads"): (
        "Gemma4TextConfig (transformers 5.24) keeps no num_global_key_value_heads"
    ),
    ("refused/deepseek-v4-flash.json", "num_hash_layers"): "DeepseekV4Config has no such field",
    ("refused/deepseek-v4-pro.json", "num_hash_layers"): "DeepseekV4Config has no such field",
    (
        "refused/deepseek-v4-flash.json",
        "compress_ratios",
    ): "DeepseekV4Config calls it compress_rates",
    ("refused/deepseek-v4-pro.json", "compress_ratios"): "DeepseekV4Config calls it compress_rates",
}
# Files posenc reads wrongly today (a defect, not a refusal): the test below fails for them
# until posenc refuses them or reads them right; strict, so a fix shows at once.
READ_WRONGLY = {
    "refused/nemotron-3-nano-30b-a3b-bf16.json": (
        "NemotronH attention has no position encoding, yet rope_from_hf returns a RoPE"
    ),
}


def raw_file(name: str) -> dict[str, Any]:
    """The file's dict without the provenance keys older files carry."""
    raw = json.loads((CORPUS / name).read_text())
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
    assert sorted(SOURCES) == sorted(FILES + REFUSED)
    verbatim = [n for n, e in SOURCES.items() if e["verbatim"]]
    assert len(verbatim) >= 40, len(verbatim)
    for name, entry in SOURCES.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["model"]), name
        raw = json.loads((CORPUS / name).read_text())
        assert isinstance(raw.get("model_type"), str), name
        if entry["verbatim"]:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repo"]), name
            assert entry["path"].endswith(".json") and re.fullmatch("[0-9a-f]{40}", entry["commit"])
            assert not set(raw) & set(METADATA), name  # the published text, nothing added
        else:
            assert raw["_via"] == entry["via"], name
        assert name.startswith("refused/") == ("status" in entry), name


@pytest.mark.parametrize("name", FILES + REFUSED)
def test_transformers_builds_it_and_keeps_every_key(name: str) -> None:
    raw = raw_file(name)
    lost = dropped_keys(raw, build(raw))
    unexplained = [k for k in lost if (name, k) not in DROPPED]
    assert not unexplained, f"{name}: transformers drops {unexplained}"
    stale = [k for (n, k) in DROPPED if n == name and k not in lost]
    assert not stale, f"{name}: DROPPED lists {stale}, which transformers now keeps"


# --- posenc's reading ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", FILES)
def test_position_plan_reads_it(name: str) -> None:
    raw = raw_file(name)
    plan = position_plan(raw)
    text = build(raw).get_text_config(decoder=True)
    assert len(plan.layers) == text.num_hidden_layers, name


@pytest.mark.parametrize("name", REFUSED)
def test_refused_with_a_reason(name: str) -> None:
    if name in READ_WRONGLY:
        pytest.xfail(READ_WRONGLY[name])
    raw = raw_file(name)
    with pytest.raises(ValueError, match=re.escape(raw["model_type"])):
        rope_from_hf(raw)
    with pytest.raises(ValueError):
        rope_from_hf(build(raw))


@pytest.mark.parametrize("name", sorted(READ_WRONGLY))
def test_read_wrongly_today(name: str) -> None:
    """The defect is still there: posenc builds a RoPE for a model that has none. When this
    fails, posenc refuses (or reads right) and the file leaves READ_WRONGLY."""
    assert rope_from_hf(raw_file(name)) is not None
