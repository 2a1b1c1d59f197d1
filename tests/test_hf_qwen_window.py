"""The Qwen window switch of a raw ``config.json`` dict read without transformers
(``use_transformers=False``): ``use_sliding_window``, ``sliding_window`` and
``max_window_layers`` give the window of each layer exactly as transformers' model built from the
same dict does (each attention module's own ``sliding_window``, which its forward hands the
attention function). A switch inverted or ignored, or a rule of one Qwen borrowed for another
(Qwen2-MoE windows the even-indexed layers *below* max_window_layers, Qwen3-MoE every layer),
changes some row of this grid."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING, AutoModelForCausalLM  # noqa: E402

from posenc.hf import position_plan  # noqa: E402

TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
GRID = list(itertools.product((True, False, None), (None, 16), (0, 3, None)))


def _raw(
    model_type: str, use: bool | None, window: int | None, start: int | None
) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model_type": model_type, "hidden_size": 32, "intermediate_size": 32,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 5,
        "vocab_size": 32, "max_position_embeddings": 256, "rope_theta": 1e4,
        "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16, "sliding_window": window,
    }  # fmt: skip
    if use is not None:
        raw["use_sliding_window"] = use
    if start is not None:
        raw["max_window_layers"] = start
    return raw


def _model_windows(raw: dict[str, Any]) -> tuple[list[Any], list[str] | None]:
    """Each decoder layer's span in transformers' model (its attention's ``sliding_window``),
    and the config class's ``layer_types`` (None where the class has none: Qwen3-MoE)."""
    config = CONFIG_MAPPING[raw["model_type"]].from_dict(dict(raw))
    model = AutoModelForCausalLM.from_config(config)
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers]
    spans = [("sliding", w) if w else "full" for w in windows]
    return spans, getattr(config, "layer_types", None)


@pytest.mark.parametrize("model_type", TYPES)
def test_raw_dict_windows_equal_the_transformers_model(model_type: str) -> None:
    seen = set()
    for use, window, start in GRID:
        raw = _raw(model_type, use, window, start)
        want, layer_types = _model_windows(raw)
        plan = position_plan(raw, use_transformers=False)
        assert [x.span for x in plan.layers] == want, (model_type, use, window, start)
        if layer_types is not None:  # the switch decides the layer types too
            assert [x.layer_type for x in plan.layers] == layer_types, (use, window, start)
        assert [x.span for x in position_plan(raw).layers] == want  # the config object's too
        seen.add(tuple(want))
    assert len(seen) >= 2  # the grid turns the switch: windows on some layers, on none
