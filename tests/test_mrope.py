"""M-RoPE against Qwen2-VL and Qwen3-VL in transformers, and the positions helper against their
``get_rope_index``."""

from __future__ import annotations

import functools
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig  # noqa: E402
from transformers.models.qwen2_vl.modeling_qwen2_vl import (  # noqa: E402
    Qwen2VLModel,
    Qwen2VLRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import (  # noqa: E402
    Qwen3VLModel,
    Qwen3VLTextRotaryEmbedding,
)

from posenc.functional import mrope_axis_index  # noqa: E402
from posenc.hf import rope_from_hf  # noqa: E402
from posenc.rotary import MRoPE, RotaryEmbedding, mrope_positions  # noqa: E402

TOL = 1e-6


def _sections(draw: st.DrawFn, n: int) -> list[int]:
    a = draw(st.integers(1, n - 2))
    b = draw(st.integers(1, n - a - 1))
    return [a, b, n - a - b]


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_mrope_matches_qwen2_vl(data: st.DataObject) -> None:
    head_dim = data.draw(st.sampled_from([8, 16, 32]))
    section = _sections(data.draw, head_dim // 2)
    base = data.draw(st.floats(100.0, 1e6))
    config = Qwen2VLTextConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "mrope_section": section, "rope_theta": base},
    )
    b, s = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 6))
    positions = torch.randint(0, 5000, (3, b, s))
    q, k = torch.randn(b, 2, s, head_dim), torch.randn(b, 1, s, head_dim)
    cos, sin = Qwen2VLRotaryEmbedding(config)(torch.zeros(1), positions)  # [b, s, d]
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = rope_from_hf(config)
    assert isinstance(rope, MRoPE) and not rope.interleaved
    got_q, got_k = rope(q, k, positions)
    assert (got_q - ref_q).abs().max() <= TOL
    assert (got_k - ref_k).abs().max() <= TOL


def _apply_multimodal_rotary_pos_emb_4x(q, k, cos, sin, mrope_section):
    """transformers 4.x ``apply_multimodal_rotary_pos_emb`` (Qwen2-VL), cos/sin ``[3, b, s, d]``."""
    mrope_section = mrope_section * 2
    cos = torch.cat(
        [m[i % 3] for i, m in enumerate(cos.split(mrope_section, dim=-1))], dim=-1
    ).unsqueeze(1)
    sin = torch.cat(
        [m[i % 3] for i, m in enumerate(sin.split(mrope_section, dim=-1))], dim=-1
    ).unsqueeze(1)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def test_mrope_matches_transformers_4x_apply_multimodal_rotary_pos_emb() -> None:
    head_dim, section = 32, [4, 6, 6]
    positions = torch.randint(0, 3000, (3, 2, 5))
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = positions[..., None].double() * inv_freq  # [3, b, s, d/2], float64 reference angles
    emb = torch.cat((angles, angles), -1)
    q, k = (
        torch.randn(2, 4, 5, head_dim, dtype=torch.float64),
        torch.randn(2, 4, 5, head_dim, dtype=torch.float64),
    )
    ref_q, ref_k = _apply_multimodal_rotary_pos_emb_4x(q, k, emb.cos(), emb.sin(), section)
    got_q, got_k = MRoPE(head_dim, section, base=1e6)(q, k, positions)  # float64 angles
    assert (got_q - ref_q).abs().max() <= 1e-6
    assert (got_k - ref_k).abs().max() <= 1e-6


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_interleaved_mrope_matches_qwen3_vl(data: st.DataObject) -> None:
    head_dim = data.draw(st.sampled_from([16, 32, 64]))
    n = head_dim // 2
    h = data.draw(st.integers(1, n // 3))
    w = data.draw(st.integers(1, n // 3))
    section = [n - h - w, h, w]
    config = Qwen3VLTextConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": section,
            "mrope_interleaved": True,
            "rope_theta": 5e6,
        },
    )
    positions = torch.randint(0, 4000, (3, 2, 4))
    q, k = torch.randn(2, 2, 4, head_dim), torch.randn(2, 2, 4, head_dim)
    cos, sin = Qwen3VLTextRotaryEmbedding(config)(torch.zeros(1), positions)
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = rope_from_hf(config)
    assert isinstance(rope, MRoPE) and rope.interleaved
    got_q, got_k = rope(q, k, positions)
    assert (got_q - ref_q).abs().max() <= TOL
    assert (got_k - ref_k).abs().max() <= TOL


def test_axis_index_layouts() -> None:
    assert mrope_axis_index([2, 1, 1]).tolist() == [0, 0, 1, 2]
    assert mrope_axis_index([2, 1, 1], interleaved=True).tolist() == [0, 1, 2, 0]
    assert mrope_axis_index([24, 20, 20], interleaved=True).bincount().tolist() == [24, 20, 20]
    with pytest.raises(ValueError, match="3 non-negative"):
        mrope_axis_index([4, 4])
    with pytest.raises(ValueError, match="does not fit"):
        mrope_axis_index([1, 5, 5], interleaved=True)


def test_text_positions_make_mrope_plain_rope() -> None:
    q, k = torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    mrope, rope = MRoPE(16, [2, 3, 3]), RotaryEmbedding(16)
    for got, ref in zip(mrope(q, k, positions), rope(q, k, positions), strict=True):
        assert torch.equal(got, ref)
    three = positions.expand(3, -1, -1)  # [3, b, s], all axes equal
    for got, ref in zip(mrope(q, k, three), rope(q, k, positions), strict=True):
        assert torch.equal(got, ref)


def test_mrope_errors() -> None:
    with pytest.raises(ValueError, match="sum\\(mrope_section\\) must equal rotary_dim / 2 = 8"):
        MRoPE(16, [2, 2, 2])
    q = torch.randn(1, 2, 4, 16)
    with pytest.raises(ValueError, match=r"\[3, 1, 4\]"):
        MRoPE(16, [2, 3, 3])(q, q, torch.zeros(2, 1, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="integer dtype"):
        MRoPE(16, [2, 3, 3])(q, q, torch.zeros(3, 1, 4))


def _fake_model(cls: type, merge: int) -> types.SimpleNamespace:
    vision = types.SimpleNamespace(spatial_merge_size=merge)
    return types.SimpleNamespace(
        config=types.SimpleNamespace(vision_config=vision),
        get_vision_position_ids=functools.partial(cls.get_vision_position_ids, None),
    )


@pytest.mark.parametrize("cls", [Qwen2VLModel, Qwen3VLModel])
def test_mrope_positions_match_get_rope_index(cls: type) -> None:
    merge = 2
    image, video = (1, 4, 6), (3, 4, 2)  # (t, h, w) patch grids before merging
    if cls is Qwen3VLModel:
        # Qwen3-VL separates video frames by timestamp text; each frame is a (1, h, w) grid.
        frames = [seg for _ in range(3) for seg in (("text", 2), ("video", (1, 4, 2)))]
    else:
        frames = [("video", video)]
    segments = [("text", 3), ("image", image), ("text", 4), *frames, ("text", 2)]
    kinds = {"text": 0, "image": 1, "video": 2}
    token_types = [
        kinds[kind]
        for kind, size in segments
        for _ in range(size if kind == "text" else size[0] * size[1] * size[2] // merge**2)
    ]
    ids = torch.zeros(1, len(token_types), dtype=torch.long)
    ref, _ = cls.get_rope_index(
        _fake_model(cls, merge),
        ids,
        torch.tensor([token_types]),
        image_grid_thw=torch.tensor([image]),
        video_grid_thw=torch.tensor([video]),
    )
    got = mrope_positions(segments, spatial_merge_size=merge)
    assert torch.equal(got, ref[:, 0])


def test_ernie_mrope_matches_its_rotary_class() -> None:
    """ERNIE-4.5-VL's M-RoPE (its rotary class pre-permutes the frequencies and recomposes
    [H W H W .. | T ..] over interleaved pairs): cos/sin and rotated q/k on distinct 3-D
    positions, published sections [22, 22, 20] and a small [3, 3, 2]."""
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as ernie
    from transformers.models.ernie4_5_vl_moe.configuration_ernie4_5_vl_moe import (
        Ernie4_5_VLMoeTextConfig,
    )

    torch.manual_seed(0)
    for head_dim, sections in ((128, [22, 22, 20]), (16, [3, 3, 2])):
        cfg = Ernie4_5_VLMoeTextConfig(
            hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                             "mrope_section": sections},
        )  # fmt: skip
        ref = ernie.Ernie4_5_VLMoeTextRotaryEmbedding(cfg)
        rope = rope_from_hf(cfg)
        assert isinstance(rope, MRoPE) and rope.allocation == "hw_alternating"
        pos = torch.randint(0, 4 * cfg.max_position_embeddings, (3, 2, 7))  # [3, b, s]
        cos_ref, sin_ref = ref(torch.zeros(1), pos)  # [b, s, d], each pair's value twice
        inv_freq, factor = rope.frequencies(int(pos.max()) + 1)
        from posenc.functional import mrope_cos_sin

        cos, sin = mrope_cos_sin(pos, inv_freq, rope.mrope_section, rope.allocation, factor)
        err = max(
            (cos.repeat_interleave(2, -1) - cos_ref).abs().max().item(),
            (sin.repeat_interleave(2, -1) - sin_ref).abs().max().item(),
        )
        assert err <= 1e-6, (sections, err)
        q, k = torch.randn(2, 2, 7, head_dim), torch.randn(2, 1, 7, head_dim)
        want = ernie.apply_rotary_pos_emb(q, k, cos_ref, sin_ref)
        got = rope(q, k, pos)
        err = max((w - g).abs().max().item() for w, g in zip(want, got, strict=True))
        assert err <= 4e-6, (sections, err)
        assert (got[0] - rope.with_scaling(None)(q, k, pos[[0, 2, 1]])[0]).abs().max() > 0.1


def test_mrope_allocation_names() -> None:
    assert mrope_axis_index([2, 2, 1], "hw_alternating").tolist() == [1, 2, 1, 2, 0]
    assert (
        mrope_axis_index([2, 1, 1], False).tolist()
        == mrope_axis_index([2, 1, 1], "contiguous").tolist()
    )
    with pytest.raises(ValueError, match="H must equal W"):
        mrope_axis_index([2, 1, 1], "hw_alternating")
    with pytest.raises(ValueError, match="allocation must be"):
        MRoPE(8, [2, 1, 1], interleaved="spiral")


def test_qwen3_omni_thinker_mrope_matches_its_rotary_class() -> None:
    """Qwen3-Omni's thinker text model: Qwen3-VL's interleaved sections, read from its config
    (its default config has an odd head_dim, so a small consistent one), against its rotary class
    and apply function on distinct 3-D positions; the contiguous allocation is caught."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as om
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeTextConfig,
    )

    torch.manual_seed(0)
    cfg = Qwen3OmniMoeTextConfig(
        hidden_size=64, num_attention_heads=4, head_dim=16,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2],
                         "mrope_interleaved": True},
    )  # fmt: skip
    rope = rope_from_hf(cfg)
    assert isinstance(rope, MRoPE) and rope.allocation == "interleaved"
    ref = om.Qwen3OmniMoeThinkerTextRotaryEmbedding(cfg)
    pos = torch.randint(0, 4 * cfg.max_position_embeddings, (3, 2, 7))  # [3, b, s]
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16)
    cos, sin = ref(q, pos)
    want = om.apply_rotary_pos_emb(q, k, cos, sin)
    err = max((w - g).abs().max().item() for w, g in zip(want, rope(q, k, pos), strict=True))
    assert err <= 4e-6, err
    wrong = MRoPE(16, [4, 2, 2], 1e6, interleaved=False, angle_dtype=torch.float32)
    assert (
        max((w - g).abs().max().item() for w, g in zip(want, wrong(q, k, pos), strict=True)) > 0.1
    )
