"""``linear_memory``: transformers' own models, with attention in memory linear in the length, give
their own logits (eager and SDPA, sliding windows, Gemma-2's soft cap, several query blocks), build
no ``[s, t]`` mask for a fresh prefill, and fall back to the model's own mask and attention for a
decode step or a padded batch."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: E402

import posenc.hf.linear_memory as lm  # noqa: E402
from _tiny import tiny_lm  # noqa: E402
from posenc.hf import apply_posenc  # noqa: E402

# _tiny.TINY_SIZES with head_dim 16 and large weights (no padding token: all 97 rows drawn)
COMMON: dict[str, Any] = {
    "vocab_size": 97,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "initializer_range": 0.3,
}
MODELS = {
    "gemma3_text": {
        "num_hidden_layers": 3,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    "gemma2": {"num_hidden_layers": 2, "sliding_window": 8, "attn_logit_softcapping": 2.0},
    "mistral": {"num_hidden_layers": 2, "sliding_window": 8},
    "llama": {"num_hidden_layers": 2},
}
# Gemma-2 refuses SDPA in transformers (its soft cap): eager only.
CASES = [(t, impl) for t in MODELS for impl in ("eager", "sdpa") if (t, impl) != ("gemma2", "sdpa")]


def tiny(model_type: str, impl: str) -> Any:
    return tiny_lm(model_type, attn=impl, **{**COMMON, **MODELS[model_type]})


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lm, "BLOCK", 16)  # 50 tokens: four blocks, windows across their edges


@pytest.mark.parametrize(("model_type", "impl"), CASES)
def test_the_models_own_logits_with_no_mask_built(
    model_type: str, impl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny(model_type, impl)
    ids = torch.randint(1, 97, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        built: list[int] = []
        for name in ("sdpa", "eager"):
            own = ALL_MASK_ATTENTION_FUNCTIONS[name]
            spy = lambda *a, _own=own, **kw: built.append(kw["q_length"]) or _own(*a, **kw)  # noqa: E731
            monkeypatch.setitem(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, name, spy)
        with lm.linear_memory(model):
            got = model(ids).logits
        monkeypatch.undo()
    assert (want - got).abs().max() <= 1e-5
    assert built == []  # no [s, t] mask for any layer
    assert model.config._attn_implementation == impl  # restored
    assert not hasattr(model.config, lm.BASE)


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_decode_and_padding_take_the_models_own_path(model_type: str) -> None:
    model = tiny(model_type, "eager")
    ids = torch.randint(1, 97, (2, 30), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        padded = model(ids, attention_mask=mask).logits
        with lm.linear_memory(model):
            got = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
            assert (model(ids, attention_mask=mask).logits - padded).abs().max() <= 1e-5
    assert torch.equal(want, got)


def test_an_extended_hybrid_is_unchanged_inside() -> None:
    model = apply_posenc(
        tiny("gemma3_text", "sdpa"),
        extension={"method": "self_extend", "group_size": 3, "neighbor_window": 4},
    )
    ids = torch.randint(1, 97, (1, 50), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids).logits
        with lm.linear_memory(copy.deepcopy(model)) as inside:
            got = inside(ids).logits
    assert (want - got).abs().max() <= 1e-5
