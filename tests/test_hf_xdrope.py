"""HunYuan-VL's XD-RoPE in transformers is not a rotation, and posenc refuses it.

``HunYuanVLRotaryEmbedding`` builds ``cat(freqs, freqs)`` over ``len(mrope_section)`` (4) axes and
splits *that* into chunks of ``2 * section``: with ``[s, s, s, s]`` the first half of the head
takes axes 0 and 1, the second half axes 2 and 3. ``apply_rotary_pos_emb`` pairs channel ``j``
with ``j + d/2`` (``rotate_half``), so on an image token (sequence index, width, height and image
ordinal differ) the two channels of a pair turn by the angles of different axes: the map is not a
rotation (it changes ``|q|``). posenc's tables hold one angle per pair, so ``rope_from_hf`` refuses
such a config (dict, dict without transformers, config object, ``xdrope_section`` or
``mrope_section``) instead of reading it as Qwen's M-RoPE, and its message says so. On text tokens every axis carries the
sequence index and the map is plain RoPE. The default config has no sections, and transformers'
own class cannot run it (``len(None)``), so the sweep of tests/test_hf_sweep.py skips the type.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
hunyuan = pytest.importorskip("transformers.models.hunyuan_vl.modeling_hunyuan_vl")

from transformers import CONFIG_MAPPING  # noqa: E402

from posenc.hf import rope_from_hf  # noqa: E402
from posenc.rotary import mrope_position_ids  # noqa: E402

KW = dict(hidden_size=64, num_attention_heads=2, head_dim=32)


def _config(key: str) -> Any:
    params = {"rope_type": "default", "rope_theta": 1e4, key: [4, 4, 4, 4]}
    return CONFIG_MAPPING["hunyuan_vl_text"](**KW, rope_parameters=params)


def _positions() -> torch.Tensor:
    """Text, one 4x4 image (merged 2x2, a newline column per row), text: ``[4, 1, 10]``."""
    types = torch.tensor([[0, 0] + [1] * 6 + [0, 0]])
    pos, _ = mrope_position_ids(
        "hunyuan_vl", types, image_grid_thw=[[1, 4, 4]], spatial_merge_size=2, num_axes=4
    )
    return pos


def test_xdrope_is_not_a_rotation_on_image_tokens() -> None:
    config, pos = _config("xdrope_section"), _positions()
    cos, sin = hunyuan.HunYuanVLRotaryEmbedding(config)(torch.zeros(1), pos)  # [1, s, 32]
    image = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    halves = (cos[0, :, :16] - cos[0, :, 16:]).abs().amax(-1)  # [s]: pair (j, j + 16)'s angles
    assert halves[~image].max() == 0 and halves[image].min() > 0.1
    q = torch.randn(1, 1, 10, 32, generator=torch.Generator().manual_seed(0))
    rotated, _ = hunyuan.apply_rotary_pos_emb(q, q, cos, sin)
    norm_change = (rotated.norm(dim=-1) - q.norm(dim=-1)).abs()[0, 0]  # [s]
    assert norm_change[~image].max() <= 1e-5 and norm_change[image].max() > 0.01


# what the refusal must say: why XD-RoPE is not one of posenc's rotations
WHY = (
    r"HunYuanVLRotaryEmbedding splits its 4 axis sections \[4, 4, 4, 4\] over cat\(freqs, freqs\)"
    r".*on image tokens the two channels of a half-split pair \(j, j \+ d/2\) turn by the angles"
    r" of different axes.*posenc's tables hold one angle per pair"
)


@pytest.mark.parametrize("key", ["xdrope_section", "mrope_section"])
@pytest.mark.parametrize("model_type", ["hunyuan_vl_text", "hunyuan_vl"])
def test_posenc_refuses_xdrope(key: str, model_type: str) -> None:
    config = _config(key)
    params = dict(config.rope_parameters)
    raw = {"model_type": "hunyuan_vl_text", **KW, "rope_parameters": params}
    if model_type == "hunyuan_vl":  # the full model's file: the text keys under text_config
        raw = {"model_type": "hunyuan_vl", "text_config": raw}
    for form, use_transformers in ((config, True), (raw, True), (raw, False)):
        with pytest.raises(ValueError, match=WHY):
            rope_from_hf(form, use_transformers=use_transformers)
