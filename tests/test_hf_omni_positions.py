"""Qwen3-Omni's fractional M-RoPE positions against transformers.

Qwen3-Omni's ``get_rope_index`` puts a video's frames at ``i * seconds_per_grid *
position_id_per_seconds`` in float32 (0.03 s * 25 = 0.75 apart), and the text after them at the
largest position + 1 (5.5, 6.5, ...). posenc's :func:`~posenc.rotary.mrope_position_ids` builds
them (``audio_merged``; equal to ``get_rope_index`` in tests/test_mrope_positions.py) and
:class:`~posenc.hf.rotary.HFRotaryEmbedding` takes them as they are for the model types of
:data:`~posenc.hf.rotary.FRACTIONAL_POSITION_MODEL_TYPES`. Checked against
``Qwen3OmniMoeThinkerTextRotaryEmbedding`` (cos/sin, rotated q/k) and a tiny thinker text model
with posenc's rotary module and rotation; planted faults (positions floored, the sections
contiguous instead of interleaved) move its outputs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
omni = pytest.importorskip("transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe")

from transformers import CONFIG_MAPPING  # noqa: E402

from posenc.hf import apply_posenc, rope_from_hf  # noqa: E402
from posenc.hf import rotary as hf_rotary  # noqa: E402
from posenc.hf.rotary import FRACTIONAL_POSITION_MODEL_TYPES, HFRotaryEmbedding  # noqa: E402
from posenc.rotary import MROPE_POSITION_MODEL_TYPES, mrope_position_ids  # noqa: E402

TINY = dict(
    vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, num_experts=4,
    num_experts_per_tok=2, max_position_embeddings=256, attn_implementation="eager",
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [6, 5, 5]},
)  # fmt: skip
# Row 0: text, a 3-frame video (0.03 s per grid: frames 0.75 apart), text, audio, text;
# row 1: text, a 2-frame video (0.5 s: 12.5 apart), text.
TYPES = torch.tensor([[0] * 3 + [2] * 12 + [0] + [3] * 5 + [0] * 2, [0] + [2] * 8 + [0] * 14])


def _text() -> Any:
    return CONFIG_MAPPING["qwen3_omni_moe_text"](**TINY)


def _positions() -> torch.Tensor:
    pos, _ = mrope_position_ids(
        "qwen3_omni_moe", TYPES, video_grid_thw=[[3, 4, 4], [2, 4, 4]], spatial_merge_size=2,
        positions_per_second=25, seconds_per_grid=[0.03, 0.5],
    )  # fmt: skip
    assert pos.dtype == torch.float32 and (pos % 1 != 0).any()  # [3, b, s], fractional
    return pos


def test_fractional_types_are_the_float_layouts() -> None:
    """Every model type whose position layout is float32 (and its text config) is listed."""
    float_types = {t for t, lay in MROPE_POSITION_MODEL_TYPES.items() if lay == "audio_merged"}
    assert float_types and float_types <= FRACTIONAL_POSITION_MODEL_TYPES
    assert _text().model_type in FRACTIONAL_POSITION_MODEL_TYPES


def test_cos_sin_and_rotations_match_transformers() -> None:
    text, pos = _text(), _positions()
    assert rope_from_hf(text).allocation == "interleaved"
    x = torch.zeros(1)
    cos_t, sin_t = omni.Qwen3OmniMoeThinkerTextRotaryEmbedding(text)(x, pos)  # [b, s, 32]
    cos, sin = HFRotaryEmbedding(text)(x, pos)
    assert (cos - cos_t).abs().max().item() <= 1e-6
    assert (sin - sin_t).abs().max().item() <= 1e-6
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 2, pos.shape[-1], 32, generator=g), torch.randn(2, 1, pos.shape[-1], 32)
    want = omni.apply_rotary_pos_emb(q, k, cos_t, sin_t)
    got = hf_rotary.apply_rotary_pos_emb(q, k, cos, sin)
    assert max((a - b).abs().max().item() for a, b in zip(want, got, strict=True)) <= 1e-5
    # integer positions stay the rule elsewhere: float32 is taken for these types only
    with pytest.raises(TypeError, match="integer dtype"):
        HFRotaryEmbedding(CONFIG_MAPPING["qwen2_5_omni_text"](**TINY))(x, pos)
    with pytest.raises(ValueError, match="float32"):
        HFRotaryEmbedding(text)(x, pos.double())


def _model() -> Any:
    torch.manual_seed(0)
    model = omni.Qwen3OmniMoeThinkerTextModel(_text())
    with torch.no_grad():  # unit-variance projections: attention sharp enough to see positions
        for m in model.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.normal_(0.0, m.in_features**-0.5)
    return model.eval()


def _outputs(model: Any, pos: torch.Tensor) -> torch.Tensor:
    ids = torch.randint(0, 64, TYPES.shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=ids, position_ids=pos).last_hidden_state  # [b, s, hidden]


def _posenc_model(fault: str | None = None) -> Any:
    """The tiny model with posenc's rotary module (both tables) and fused rotation."""
    model = apply_posenc(_model())
    model.rotary_emb = HFRotaryEmbedding(model.config)
    if fault == "sections contiguous":
        model.rotary_emb.rope().allocation = "contiguous"
    return model


def test_tiny_model_outputs_match_transformers() -> None:
    """The thinker text model (no LM head: its last hidden states), float32: equal (0.0)."""
    pos = _positions()
    want = _outputs(_model(), pos)
    assert (_outputs(_posenc_model(), pos) - want).abs().max().item() <= 1e-5


@pytest.mark.parametrize("fault", ["positions floored", "sections contiguous"])
def test_planted_faults_move_the_outputs(fault: str) -> None:
    pos = _positions()
    want = _outputs(_model(), pos)
    got = _outputs(_posenc_model(fault), pos.floor() if fault == "positions floored" else pos)
    assert (got - want).abs().max().item() > 0.05, fault
