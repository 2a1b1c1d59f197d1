"""Where a RoPE scaling goes on a hybrid model: transformers' own rule, per architecture.

The reference is transformers itself: each config class built with a flat ``rope_scaling``
puts it where that model type's ``convert_rope_params_to_dict`` says (Gemma-3, OLMo-3: the
full-attention layers; Gemma-2, gpt-oss, Cohere2, a Mistral with a window: one set of rope
parameters for every layer), and the model it builds is what ``apply_posenc(scaling=)`` must
equal. Each test can fail: the scaling put on the sliding layers too moves the logits.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402

from _tiny import PARITY_SIZES, tiny_lm  # noqa: E402
from posenc.extend.methods.names import as_transformers, parse_method, resolve  # noqa: E402
from posenc.hf import apply_posenc  # noqa: E402
from posenc.hf.scaling import (  # noqa: E402
    FLAT_SCALING_LAYER_TYPES,
    rope_layer_types,
    scaling_by_layer_type,
    scaling_layer_types,
)

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
COMMON: dict[str, Any] = {
    **PARITY_SIZES,
    "num_hidden_layers": 4,
    "attn_implementation": "eager",
    "sliding_window": 4,
}
# (model type, extra config keys): the hybrids of the issue, each as its config class builds it.
HYBRIDS: list[tuple[str, dict[str, Any]]] = [
    ("gemma2", {}),
    ("gemma3_text", {"layer_types": ["sliding_attention"] * 3 + ["full_attention"]}),
    ("gpt_oss", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ("olmo3", {}),
    ("cohere2", {}),
    ("smollm3", {"no_rope_layers": [1, 1, 1, 0], "use_sliding_window": True}),
    ("mistral", {}),
]


def build(model_type: str, extra: dict[str, Any], **rope: Any) -> Any:
    """A tiny model of ``model_type``; ``rope``: ``rope_scaling=`` as a user's config.json gives
    it, read by the config class itself."""
    return tiny_lm(model_type, **{**COMMON, **extra, **rope})


def logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize(("model_type", "extra"), HYBRIDS, ids=[h[0] for h in HYBRIDS])
def test_a_flat_scaling_goes_where_transformers_puts_it(model_type: str, extra: dict) -> None:
    base = build(model_type, extra)
    reference = build(model_type, extra, rope_scaling=dict(YARN))  # transformers' own rule
    reference.load_state_dict(base.state_dict())
    ids = torch.randint(1, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    want = logits(reference, ids)
    got = logits(apply_posenc(copy.deepcopy(base), scaling=YARN), ids)
    assert (want - got).abs().max() <= 1e-5
    assert (want - logits(base, ids)).abs().max() > 1e-3  # the scaling changed the model
    if rope_layer_types(base.config):  # rope per layer type: "all" scales the sliding ones too
        every = logits(apply_posenc(copy.deepcopy(base), scaling=YARN, scaling_layers="all"), ids)
        assert (want - every).abs().max() > 1e-3
    elif model_type != "smollm3":  # one set for every layer, sliding ones included
        with pytest.raises(ValueError, match="one set of rope parameters"):
            apply_posenc(copy.deepcopy(base), scaling=YARN, scaling_layers="full")


def test_the_rule_table_is_transformers_rule() -> None:
    """Every config class with rope parameters per layer type, built with a flat
    ``rope_scaling``: the types it scaled are :data:`FLAT_SCALING_LAYER_TYPES`' entry (or, for a
    class that ignores the key, no entry)."""
    checked, wrong = set(), {}
    for model_type, cls in CONFIG_MAPPING.items():
        if "convert_rope_params_to_dict" not in vars(cls):
            continue  # the base class's rule: one set of parameters, scaled as a whole
        try:
            plain = cls()
            nested = rope_layer_types(plain)
            if not nested:
                continue
            scaled = cls(rope_scaling={"rope_type": "linear", "factor": 3.0})
        except Exception:  # a class that needs more arguments than its defaults
            continue
        params = scaled.rope_parameters
        got = tuple(t for t in nested if (params.get(t) or {}).get("factor") == 3.0)
        if set(FLAT_SCALING_LAYER_TYPES.get(model_type, ())) != set(got):
            wrong[model_type] = got
        checked.add(model_type)
    assert not wrong, f"transformers' rule differs: {wrong}"
    assert set(FLAT_SCALING_LAYER_TYPES) - checked == set()  # every entry was built and read


def test_ntk_takes_each_layer_types_own_theta() -> None:
    # Gemma-3-270M's rope: sliding layers theta 1e4, the full layers 1e6, head_dim 256.
    cfg = transformers.Gemma3TextConfig(
        num_hidden_layers=6, head_dim=256, max_position_embeddings=32768, sliding_window=512
    )
    method = parse_method("ntk")
    resolved = resolve(method, 32768, 65536, 128)
    params = as_transformers(resolved.scaling, cfg, resolved.layers)
    # the paper's base: theta * factor ** (d / (d - 2)), d the rotary dim, theta the type's own
    assert params == {
        "full_attention": {"rope_type": "default", "rope_theta": 1e6 * 2 ** (256 / 254)}
    }
    every = as_transformers(resolved.scaling, cfg, "all")
    assert every is not None
    assert every["sliding_attention"]["rope_theta"] == pytest.approx(1e4 * 2 ** (256 / 254))


def test_choices_and_refusals() -> None:
    gemma3 = transformers.Gemma3TextConfig(num_hidden_layers=6)
    assert scaling_layer_types(gemma3) == ("full_attention",)
    assert scaling_layer_types(gemma3, "full") == ("full_attention",)
    assert set(scaling_layer_types(gemma3, "all") or ()) == {"full_attention", "sliding_attention"}
    llama = transformers.LlamaConfig()
    assert scaling_layer_types(llama) is None
    assert scaling_by_layer_type(llama, {"rope_type": "linear", "factor": 2.0}) == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    with pytest.raises(ValueError, match="layers must be one of auto, full, all, got 'sliding'"):
        scaling_layer_types(gemma3, "sliding")
    with pytest.raises(ValueError, match="layers must be one of"):
        parse_method("yarn:layers=some")  # when the method is read, before any model loads
