"""Qwen2.5-Omni's M-RoPE (thinker and talker text models) against transformers' own
``Qwen2_5OmniRotaryEmbedding`` and ``apply_rotary_pos_emb``, on text and on 3-D positions."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
omni = pytest.importorskip("transformers.models.qwen2_5_omni.modeling_qwen2_5_omni")

from transformers import CONFIG_MAPPING  # noqa: E402

from posenc.hf import hf_rope_kwargs, rope_from_hf  # noqa: E402
from posenc.rotary import MRoPE  # noqa: E402

TYPES = ["qwen2_5_omni", "qwen2_5_omni_text", "qwen2_5_omni_thinker", "qwen2_5_omni_talker"]
SMALL = {"hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}  # head 128


def _text(model_type: str, **rope: object) -> object:
    cfg = CONFIG_MAPPING[model_type]().get_text_config(decoder=True)
    kwargs = {**cfg.to_dict(), **SMALL}
    if rope:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, **rope}
    return type(cfg)(**kwargs)


def _errors(text: object, positions: torch.Tensor) -> float:
    rope = rope_from_hf(text)
    assert isinstance(rope, MRoPE)
    rotary = omni.Qwen2_5OmniRotaryEmbedding(text)
    b, s, d = positions.shape[-2], positions.shape[-1], rope.head_dim
    q, k = torch.randn(b, 2, s, d), torch.randn(b, 1, s, d)
    cos, sin = rotary(q, positions)
    theirs = omni.apply_rotary_pos_emb(q, k, cos, sin)
    return max(
        (o - t).abs().max().item() for o, t in zip(rope(q, k, positions), theirs, strict=True)
    )


@pytest.mark.parametrize("model_type", TYPES)
def test_default_sections_match_the_rotary_class(model_type: str) -> None:
    """No mrope_section in the config: the rotary class falls back to [16, 24, 24]."""
    torch.manual_seed(0)
    text = _text(model_type)
    assert "mrope_section" not in text.rope_parameters
    kw = hf_rope_kwargs(text)
    assert kw["mrope_section"] == [16, 24, 24] and kw["mrope_interleaved"] is False
    top = 4 * text.max_position_embeddings
    three_d = torch.randint(0, top, (3, 1, 7))
    text_pos = torch.tensor([[0, 1, 7, 100, top - 1]])
    assert _errors(text, three_d) <= 4e-6
    assert _errors(text, text_pos) <= 4e-6


@pytest.mark.parametrize("section", [[16, 24, 24], [8, 28, 28], [32, 16, 16]])
def test_configured_sections_match_the_rotary_class(section: list[int]) -> None:
    torch.manual_seed(1)
    text = _text("qwen2_5_omni_thinker", mrope_section=section)
    assert hf_rope_kwargs(text)["mrope_section"] == section
    assert _errors(text, torch.randint(0, 50_000, (3, 2, 6))) <= 4e-6


def test_wrong_sections_are_caught() -> None:
    """Negative control: the same config read with Qwen3-VL's sections differs."""
    torch.manual_seed(2)
    text = _text("qwen2_5_omni_text", mrope_section=[8, 28, 28])
    positions = torch.randint(0, 50_000, (3, 1, 6))
    ref = omni.Qwen2_5OmniRotaryEmbedding(text)
    wrong = _text("qwen2_5_omni_text", mrope_section=[16, 24, 24])
    rope = rope_from_hf(wrong)
    q, k = torch.randn(1, 2, 6, rope.head_dim), torch.randn(1, 1, 6, rope.head_dim)
    theirs = omni.apply_rotary_pos_emb(q, k, *ref(q, positions))
    assert (rope(q, k, positions)[0] - theirs[0]).abs().max() > 0.1


def test_raw_dict_without_transformers() -> None:
    raw = {"model_type": "qwen2_5_omni_text", "hidden_size": 256, "num_attention_heads": 2,
           "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}  # fmt: skip
    kw = hf_rope_kwargs(raw, use_transformers=False)
    assert kw["mrope_section"] == [16, 24, 24] and kw["head_dim"] == 128
