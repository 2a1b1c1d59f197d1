"""This year's attention mechanisms under posenc: gpt-oss (learned sinks), Llama-4 text (chunked
and NoPE layers, query temperature, a complex rotation), Qwen3-Next (linear-attention layers beside
softmax ones) and Gemma-3n (a one-tensor rotation, shared keys and values).

``apply_posenc(model)`` gives each tiny model its stock logits (the rotation is posenc's fused
kernel; transformers' own rotation is the reference).
"""

from __future__ import annotations

import pytest
import torch

from _tiny_families import VOCAB, tiny_family
from posenc.hf import apply_posenc

FAMILIES = ["gpt_oss", "llama4_text", "qwen3_next", "gemma3n_text"]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_patched_rotation_gives_the_stock_logits(model_type: str) -> None:
    model = tiny_family(model_type)
    ids = torch.randint(3, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        got = apply_posenc(model)(ids).logits
    assert len(model.posenc_patch.attention) > 0
    assert float((got - want).abs().max()) <= 1e-5


def test_llama4_scaling_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"scaling= on llama4_text: .*freqs_cis"):
        apply_posenc(tiny_family("llama4_text"), scaling={"rope_type": "linear", "factor": 2.0})
