"""This year's attention mechanisms under posenc: gpt-oss (learned sinks), Llama-4 text (chunked
and NoPE layers, query temperature, a complex rotation), Qwen3-Next (linear-attention layers beside
softmax ones) and Gemma-3n (a one-tensor rotation, shared keys and values).

* ``apply_posenc(model)`` gives each tiny model its stock logits (the rotation is posenc's fused
  kernel; transformers' own rotation is the reference).
* Every key-set method, on each family, against transformers' own forward whose full-attention RoPE
  layers attend by the naive full-matrix method (``tests/_keyset_naive.py``: the layer's softmax
  scale, gpt-oss's sinks as one more softmax column) and whose other layers are transformers'
  eager attention with their chunked, sliding or causal masks: prefill, and a shorter prefill
  then one-token decode steps through transformers' KV cache.
* Where a method's window covers the whole sequence it is plain attention: the stock model's
  logits (sinks merged as transformers merges them; Llama-4's q/k norms before the rotation and
  its NoPE layer's temperature as transformers has them).
* Each layer says what the method does there; a Llama-4 whose RoPE layers are all chunked (the
  released configs) has none to extend and is refused by name.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from _keyset_naive import prefill_and_decode, reference_logits
from _tiny_families import VOCAB, tiny_family
from posenc.hf import apply_posenc, remove_posenc

FAMILIES = ["gpt_oss", "llama4_text", "qwen3_next", "gemma3n_text"]
TOL = 1e-5
METHODS = [
    {"method": "self_extend", "group_size": 3, "neighbor_window": 4},
    {"method": "dual_chunk", "chunk_size": 12, "local_size": 3},
    {"method": "string", "shifted_offset": 12, "local_window": 3},
    {"method": "leaky_rerope", "window": 6, "k": 4, "logn": 8},
]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_patched_rotation_gives_the_stock_logits(model_type: str) -> None:
    model = tiny_family(model_type)
    ids = torch.randint(3, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        got = apply_posenc(model)(ids).logits
    assert len(model.posenc_patch.attention) > 0
    assert float((got - want).abs().max()) <= 1e-5


@pytest.mark.parametrize("model_type", FAMILIES)
def test_key_set_methods_equal_the_naive_reference(
    model_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_family(model_type)
    ids = torch.randint(3, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stock = model(ids).logits
    for extension in METHODS:
        options = {k: v for k, v in extension.items() if k != "method"}
        want = reference_logits(model, ids, extension["method"], options, monkeypatch)
        assert float((want - stock).abs().max()) > 1e-3, extension  # the method changes it
        got = prefill_and_decode(apply_posenc(copy.deepcopy(model), extension=extension), ids, 25)
        assert float((got[:, :40] - want).abs().max()) <= TOL, extension
        assert float((got[:, 40:] - want[:, 25:]).abs().max()) <= TOL, extension


@pytest.mark.parametrize("model_type", ["gpt_oss", "llama4_text"])
def test_a_window_over_the_whole_sequence_is_the_stock_model(model_type: str) -> None:
    model = tiny_family(model_type)
    ids = torch.randint(3, VOCAB, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        whole = model(ids).logits
    stock = torch.cat([whole, whole[:, 20:]], 1)  # as prefill_and_decode lays them out
    for extension in (
        {"method": "self_extend", "group_size": 4, "neighbor_window": 30},
        {"method": "string", "shifted_offset": 30, "local_window": 5},
    ):
        got = prefill_and_decode(apply_posenc(copy.deepcopy(model), extension=extension), ids, 20)
        assert float((got - stock).abs().max()) <= TOL, extension


def test_each_layer_says_what_the_method_does_there() -> None:
    llama4 = apply_posenc(tiny_family("llama4_text"), extension=METHODS[2])
    assert [a.layer_idx for a in llama4.posenc_patch.attention] == [1]
    assert llama4.posenc_patch.layers == (
        "layer 0 (chunked_attention): untouched: its chunk window 8 never sees a longer distance",
        "layer 1 (full_attention): string (full attention with RoPE)",
        "layer 2 (full_attention): untouched: no RoPE, no positions to change, its query "
        "temperature kept",
        "layer 3 (chunked_attention): untouched: its chunk window 8 never sees a longer distance",
    )
    qwen = apply_posenc(tiny_family("qwen3_next"), extension=METHODS[0])
    assert qwen.posenc_patch.layers[0] == (
        "layer 0 (linear_attention): untouched: it attends to no keys by softmax"
    )
    gemma = apply_posenc(tiny_family("gemma3n_text"), extension=METHODS[1])
    assert [a.layer_idx for a in gemma.posenc_patch.attention] == [1, 3]  # 3 reads 1's keys
    state = gemma.model.layers[3].self_attn.posenc_extension
    assert torch.equal(state.inv_freq, gemma.model.rotary_emb.full_attention_inv_freq)


def test_refusals_name_what_the_model_lacks() -> None:
    released = tiny_family(  # Llama-4 as released: every RoPE layer chunked, NoPE layers full
        "llama4_text", layer_types=None, no_rope_layers=[1, 1, 1, 0]
    )
    with pytest.raises(ValueError, match=r"this llama4_text has none \(chunk window 8, full "):
        apply_posenc(released, extension=METHODS[0])


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
])  # fmt: skip
def test_llama4_scaled_through_its_complex_table_equals_transformers(scaling: dict) -> None:
    """Llama-4's attention reads one complex ``freqs_cis`` table: posenc's rescaled rotary
    gives it as ``cos + i sin``, and the model equals transformers built with the same
    ``rope_parameters`` (prefill and a KV-cache decode step)."""
    from posenc.testing.coverage import scaled_reference

    model = tiny_family("llama4_text")
    reference = scaled_reference(model, scaling)
    ids = torch.randint(3, VOCAB, (1, 24), generator=torch.Generator().manual_seed(2))
    want = prefill_and_decode(reference, ids, 20)
    got = prefill_and_decode(apply_posenc(model, scaling=scaling), ids, 20)
    assert (got - want).abs().max() <= 1e-5
    assert (got - prefill_and_decode(tiny_family("llama4_text"), ids, 20)).abs().max() > 1e-3


@pytest.mark.parametrize("model_type", ["deepseek_v2", "longcat_flash"])
def test_mla_rotation_and_softmax_scale_equal_transformers(model_type: str) -> None:
    """DeepSeek-V2 rotates its MLA rope slices ``[b, h, s, d]`` by one complex table (LongCat-
    Flash: DeepSeek-V3's de-interleaved pairs), and YaRN's ``mscale_all_dim`` scales their
    softmax too (``yarn_apply_mscale``): with both, the patched model equals transformers built
    with the same ``rope_parameters``."""
    from posenc.testing.coverage import prefill_and_decode as whole_then_step
    from posenc.testing.coverage import scaled_reference, tiny_model

    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
               "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
    model = tiny_model(model_type)
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(3))
    stock = whole_then_step(model, ids)
    want = whole_then_step(scaled_reference(model, scaling), ids)
    got = whole_then_step(apply_posenc(model, scaling=scaling), ids)
    assert (got - want).abs().max() <= 1e-5
    assert (got - stock).abs().max() > 1e-3
    attention = model.model.layers[0].self_attn
    attention = attention[0] if isinstance(attention, torch.nn.ModuleList) else attention
    assert attention.scaling != attention.qk_head_dim**-0.5  # mscale_all_dim read


def test_nanochat_scales_through_its_own_clockwise_rotation_and_no_module_rotates_it() -> None:
    """NanoChat's tables are RoPE's and its rotation is by minus the angle: a scaling replaces
    its tables (exact against transformers built with the scaling), while a posenc rotary module
    of its config, which would rotate the other way, stays refused by name."""
    from posenc.hf import rope_from_hf
    from posenc.testing.coverage import prefill_and_decode as whole_then_step
    from posenc.testing.coverage import scaled_reference, tiny_model

    scaling = {"rope_type": "linear", "factor": 4.0}
    model = tiny_model("nanochat")
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(4))
    stock = whole_then_step(model, ids)
    want = whole_then_step(scaled_reference(model, scaling), ids)
    got = whole_then_step(apply_posenc(model, scaling=scaling), ids)
    assert (got - want).abs().max() <= 1e-5 < (got - stock).abs().max()
    with pytest.raises(ValueError, match=r"nanochat.*rotates by minus the angle"):
        rope_from_hf(model.config)


@pytest.mark.parametrize("original", [8, None])
def test_ministral3_query_temperature_follows_the_scaling_as_transformers_reads_it(
    original: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ministral-3 scales its queries by ``1 + beta log(1 + floor(p / original length))``, both
    read from the rope parameters: under ``scaling=`` the patched model equals transformers built
    with those parameters (a scaling's own original length, 8 here: positions 8-23 scaled;
    without one, the model's), and a patch that left the temperature on the old parameters is
    caught."""
    from posenc.hf import patch as patch_module
    from posenc.testing.coverage import prefill_and_decode as whole_then_step
    from posenc.testing.coverage import scaled_reference, tiny_model

    scaling: dict[str, Any] = {"rope_type": "yarn", "factor": 4.0}
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    model = tiny_model("ministral3")
    model.config.rope_parameters["llama_4_scaling_beta"] = 0.5  # a temperature that shows
    if original is None:  # the model's own original length, short enough to act
        model.config.rope_parameters["original_max_position_embeddings"] = 6
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(5))
    want = whole_then_step(scaled_reference(model, scaling), ids)
    patched = apply_posenc(copy.deepcopy(model), scaling=scaling)
    got = whole_then_step(patched, ids)
    assert (got - want).abs().max() <= 1e-5
    # the layers read their own rope parameters and the live config for the rest; restored
    view, shared = patched.model.layers[0].self_attn.config, patched.config
    shared.sliding_window = 5  # a later edit of the model's config reaches the layer
    assert view.sliding_window == 5 and view.rope_parameters is not shared.rope_parameters
    assert remove_posenc(patched).model.layers[0].self_attn.config is shared
    monkeypatch.setattr(patch_module, "temperature_parameters", lambda m, s: None)
    if original is not None:  # the old parameters' length (16384): no temperature at all
        stale = whole_then_step(apply_posenc(copy.deepcopy(model), scaling=scaling), ids)
        assert (stale - want).abs().max() > 1e-3
