"""position_plan against the transformers model built from the same config.

For each config (every published file of ``tests/data/hf_configs`` and the class defaults of the
architectures whose layers differ: SmolLM3, Cohere2, EXAONE-4, OLMo-3, Gemma-3n/4, Qwen2/3 with
``use_sliding_window``, Llama-4, Mistral with a window, Ministral, gpt-oss) a tiny model is built
with the same position keys (windows and chunks shrunk so a 16-token mask shows them) and run
once; per layer, whether it rotated, what its mask lets each query see, its query temperature and
its rotary frequencies must equal the plan's.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402

from _hf_corpus_paths import config_path, top_level_files  # noqa: E402
from _hf_probe import probe, text_config, tiny_text_config  # noqa: E402
from posenc.hf import (  # noqa: E402
    LayerPositions,
    PositionPlan,
    attention_temperature_from_hf,
    position_plan,
    rope_from_hf,
)

NAMES = sorted(p.stem for p in top_level_files())
# files this probe cannot build a tiny model of (checked elsewhere), with the reason
PROBE_SKIPS = {
    name: (
        "DeepSeek-V4 (rope sets by label, trailing slice): _hf_probe does not shrink its "
        "config; its tiny model is checked by tests/test_hf_ds4_logits.py"
    )
    for name in NAMES
    if name.startswith("deepseek-v4-")
}


def load(name: str) -> dict[str, Any]:
    raw = json.loads(config_path(name).read_text())
    return {k: v for k, v in raw.items() if not k.startswith("_")}


def missing_model_types(raw: dict[str, Any]) -> list[str]:
    """The model type of ``raw``, or of the text model its config class asks for, that the
    installed transformers lacks (a model newer than it: 4.56 has no qwen3_5, olmo3, ...)."""
    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return [str(model_type)]
    try:
        CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(raw))
    except KeyError as err:  # 4.56's mistral3 asks for its text model, ministral3, by name
        if err.args and isinstance(err.args[0], str) and err.args[0] not in CONFIG_MAPPING:
            return [err.args[0]]
        raise
    return []


def require_model_types(*model_types: str) -> None:
    """Skip unless the installed transformers has every one of ``model_types``."""
    missing = [t for t in model_types if t not in CONFIG_MAPPING]
    if missing:
        pytest.skip(f"transformers {transformers.__version__} has no {', '.join(missing)}")


def defaults(model_type: str, **changes: Any) -> dict[str, Any]:
    require_model_types(model_type)
    raw = CONFIG_MAPPING[model_type]().to_dict()
    raw.update(changes)
    return raw


def _olmo3_yarn_4x() -> dict[str, Any]:
    raw = {k: v for k, v in defaults("olmo3").items() if k != "rope_parameters"}
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192}
    return {**raw, "rope_theta": 5e5, "rope_scaling": scaling, "max_position_embeddings": 65536}


CASES: dict[str, Any] = {
    "smollm3": lambda: defaults("smollm3"),
    "smollm3-sliding": lambda: defaults("smollm3", use_sliding_window=True, sliding_window=4096),
    "cohere2": lambda: defaults("cohere2"),
    "exaone4": lambda: defaults("exaone4"),
    "olmo3-yarn-4x": _olmo3_yarn_4x,
    "gemma3n": lambda: defaults("gemma3n_text"),
    "gemma4": lambda: defaults("gemma4_text"),
    "qwen3-sliding": lambda: defaults(
        "qwen3", use_sliding_window=True, sliding_window=4096, max_window_layers=3
    ),
    "qwen2-sliding": lambda: defaults(
        "qwen2", use_sliding_window=True, sliding_window=4096, max_window_layers=3
    ),
    "qwen2-window-off": lambda: defaults("qwen2", use_sliding_window=False, sliding_window=4096),
    "llama4": lambda: defaults("llama4_text"),
    "mistral-sliding": lambda: defaults("mistral", sliding_window=4096),
    "ministral": lambda: defaults("ministral"),
    "gpt_oss": lambda: defaults("gpt_oss"),
    **{name: (lambda name=name: load(name)) for name in NAMES},
}


def _temperature(layer: LayerPositions) -> tuple[str, float, int] | None:
    t = layer.temperature
    return None if t is None else (t.kind, float(t.beta), t.length)


def cross_attention_layers(cfg: Any) -> frozenset[int]:
    """Mllama's cross-attention layers. They attend to the image's states (keys without text
    positions, no rotation) and a text-only forward skips them, so the model shows nothing to
    compare the plan's entry with: the plan is checked on the self-attention layers."""
    return frozenset(getattr(cfg, "cross_attention_layers", None) or ())


def check_against_model(
    plan: PositionPlan,
    seen: dict[int, dict[str, Any]],
    span: bool,
    skip: frozenset[int] = frozenset(),
) -> None:
    """``skip``: layers the model does not run (asserted), left out of the comparison."""
    for layer in plan.layers:
        got = seen.get(layer.index)
        if layer.index in skip:
            assert got is None, f"layer {layer.index} attended"
            continue
        if layer.span == "none":
            assert got is None, layer
            continue
        assert got is not None, f"layer {layer.index} did not attend"
        where = f"layer {layer.index} ({layer.layer_type})"
        assert got["rope"] == layer.uses_rope, where
        assert got["temperature"] == _temperature(layer), where
        if span:
            assert got["span"] == layer.span, where
        if layer.rope is not None and got["inv_freq"] is not None:
            ours = layer.rope.frequencies()[0]
            theirs = got["inv_freq"].float()
            assert ours.shape == theirs.shape, where
            torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0, msg=where)


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_the_model_built_from_the_config(case: str) -> None:
    if case in PROBE_SKIPS:
        pytest.skip(PROBE_SKIPS[case])
    raw = CASES[case]()
    require_model_types(*missing_model_types(raw))
    cfg = tiny_text_config(raw, window=5, chunk=6)
    plan = position_plan(cfg)
    check_against_model(plan, probe(cfg), span=True, skip=cross_attention_layers(cfg))


def test_the_cases_cover_every_kind_of_layer() -> None:
    kinds: set[Any] = set()
    for case in ("smollm3", "cohere2", "llama4", "gemma3n", "qwen3.6-35b-a3b", "gemma-2-9b"):
        raw = CASES[case]()
        require_model_types(*missing_model_types(raw))
        for layer in position_plan(text_config(raw)).layers:
            span = layer.span if isinstance(layer.span, str) else layer.span[0]
            kinds.add((span, layer.uses_rope, layer.temperature is not None))
    assert kinds >= {
        ("full", True, False), ("full", False, False), ("sliding", True, False),
        ("chunk", True, False), ("full", False, True), ("none", False, False),
    }  # fmt: skip


def test_named_architectures() -> None:
    smol = position_plan(defaults("smollm3"))
    assert [x.uses_rope for x in smol.layers[:8]] == [True, True, True, False] * 2
    assert smol.layers[3].rope is None and smol.layers[3].span == "full"
    cohere = position_plan(defaults("cohere2"))
    assert [(x.uses_rope, x.span) for x in cohere.layers[:4]] == [
        (True, ("sliding", 4096)), (True, ("sliding", 4096)), (True, ("sliding", 4096)),
        (False, "full"),
    ]  # fmt: skip
    exaone = position_plan(defaults("exaone4", sliding_window=None))
    assert all(x.uses_rope and x.span == "full" for x in exaone.layers)
    llama4 = position_plan(defaults("llama4_text"))
    assert [x.span for x in llama4.layers[:4]] == [("chunk", 8192)] * 3 + ["full"]
    assert [x.temperature is not None for x in llama4.layers[:4]] == [False] * 3 + [True]
    qwen = position_plan(defaults("qwen2", use_sliding_window=False, sliding_window=4096))
    assert all(x.span == "full" for x in qwen.layers)
    # last: the architectures transformers 4.x lacks (defaults skips there)
    olmo = position_plan(_olmo3_yarn_4x())
    types = {x.layer_type: x.scaling for x in olmo.layers}
    assert types["sliding_attention"] is None and types["full_attention"]["rope_type"] == "yarn"
    assert olmo.original_max_position_embeddings == 8192
    gemma4 = position_plan(defaults("gemma4_text"))
    dims = {x.layer_type: (x.head_dim, x.rotary_dim) for x in gemma4.layers}
    assert dims["full_attention"] != dims["sliding_attention"]


def test_rope_and_temperature_readers_agree_with_the_plan() -> None:
    # olmo3-yarn-4x last: its defaults need transformers 5 (a skip at 4.x after the others)
    for case in ("gemma-3-1b-it", "llama-4-maverick-17b-128e", "ministral-3-3b-reasoning-2512",
                 "qwen3.6-35b-a3b", "gpt-oss-20b", "olmo3-yarn-4x"):  # fmt: skip
        raw = CASES[case]()
        plan = position_plan(raw)
        temperature = attention_temperature_from_hf(raw)
        for layer in plan.layers:
            want_t = temperature if temperature and temperature.applies_to(layer.index) else None
            assert layer.temperature == want_t
            if layer.rope is not None:
                rope = rope_from_hf(raw, layer.layer_type)
                assert repr(rope) == repr(layer.rope)
                torch.testing.assert_close(rope.frequencies()[0], layer.rope.frequencies()[0])


def test_plan_is_frozen_and_groups_equal_layers() -> None:
    plan = position_plan(load("gemma-2-9b"))
    with pytest.raises(AttributeError):
        plan.layers[0].span = "full"  # type: ignore[misc]
    groups = plan.groups()
    assert [g[0][:3] for g in groups] == [(0, 2, 4), (1, 3, 5)]
    assert sum(len(g[0]) for g in groups) == plan.num_layers == 42
    same_type = [x for x in plan.layers if x.layer_type == "full_attention"]
    assert len({id(x.rope) for x in same_type}) == 1  # one module per layer type


def test_fallback_reader_plans_the_corpus_as_transformers_does() -> None:
    for name in NAMES:
        raw = load(name)
        if missing_model_types(raw):  # transformers 4.x lacks the model: nothing to compare with
            continue
        # The layers as values (the rope module aside): transformers 4.x's DeepSeek-V3 config
        # makes the yarn numbers floats (32.0 for the file's 32), equal to the file's ints.
        want = position_plan(raw).layers
        try:
            got = position_plan(raw, use_transformers=False).layers
        except ValueError as err:
            assert '.[hf]"' in str(err), name
            continue
        assert got == want, name


def test_per_layer_type_truncate_follows_transformers() -> None:
    raw = copy.deepcopy(_olmo3_yarn_4x())
    scaling = raw.pop("rope_scaling")
    raw["rope_parameters"] = {
        "full_attention": {**scaling, "rope_theta": 5e5, "truncate": False},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
    }
    cfg = tiny_text_config(raw)
    seen = probe(cfg)
    check_against_model(position_plan(cfg), seen, span=False)
    full = next(x for x in position_plan(raw).layers if x.layer_type == "full_attention")
    assert "truncate" not in (full.scaling or {})


def test_layer_types_of_the_wrong_length_raise() -> None:
    raw = defaults("llama", num_hidden_layers=4)
    raw["layer_types"] = ["full_attention"] * 3
    with pytest.raises(ValueError, match="layer_types has 3 entries but num_hidden_layers is 4"):
        position_plan(raw, use_transformers=False)
