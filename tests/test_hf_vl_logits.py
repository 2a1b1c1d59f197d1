"""Tiny multimodal text decoders against transformers: logits with posenc's M-RoPE.

For GLM-4V, Qwen2.5-VL and Qwen2.5-Omni's thinker, a 2-layer text model is built from a small
config with seeded random weights and fed multimodal position ids (``[3, b, s]`` from
:func:`~posenc.rotary.mrope_position_ids`: text, an image, a video, left padding). The same model
with posenc's RoPE (its rotary module :class:`~posenc.hf.rotary.HFRotaryEmbedding`, and
:func:`~posenc.hf.apply_posenc`'s rotation in every attention layer) must give the stock logits.
Planted faults (another section split, swapped axes, half pairs for GLM-4V) must be caught.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from posenc.hf import apply_posenc  # noqa: E402
from posenc.hf.rotary import HFRotaryEmbedding  # noqa: E402
from posenc.rotary import mrope_position_ids  # noqa: E402

TOL = 2e-5  # float32 logits of a 2-layer model, |logit| ~ 1
SMALL = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "max_position_embeddings": 256}  # fmt: skip


def _models() -> dict[str, tuple[Any, Any, str, str]]:
    """name -> (config class, model class, table layout, model_type of the position layout)."""
    from transformers.models.glm4v import configuration_glm4v as gc
    from transformers.models.glm4v import modeling_glm4v as gm
    from transformers.models.qwen2_5_omni import configuration_qwen2_5_omni as oc
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as om
    from transformers.models.qwen2_5_vl import configuration_qwen2_5_vl as qc
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qm

    return {
        "qwen2_5_vl": (qc.Qwen2_5_VLTextConfig, qm.Qwen2_5_VLTextModel, "cat", "qwen2_5_vl"),
        "glm4v": (gc.Glm4vTextConfig, gm.Glm4vTextModel, "repeat", "glm4v"),
        "qwen2_5_omni": (oc.Qwen2_5OmniTextConfig, om.Qwen2_5OmniThinkerTextModel, "cat",
                         "qwen2_5_omni"),
    }  # fmt: skip


def _config(name: str, sections: list[int]) -> Any:
    cfg_cls = _models()[name][0]
    extra: dict[str, Any] = {"partial_rotary_factor": 1.0} if name == "glm4v" else {}
    params = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    return cfg_cls(**SMALL, rope_parameters=params, **extra)


def _inputs(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``input_ids [2, s]``, ``attention_mask [2, s]`` (row 1 left-padded) and position ids
    ``[3, 2, s]`` of a text + image + text + video + text sequence (and a shorter one)."""
    layout = _models()[name][3]
    m = 2
    # GLM-4V: each video frame its own run, timestamp text between; else 2 frames in one run
    video_run = [2] * 4 + [0] * 2 + [2] * 4 if layout == "glm4v" else [2] * 8
    row0 = [0] * 3 + [1] * 6 + [0] * 4 + video_run + [0] * 3
    pad = len(row0) - 14
    types = torch.tensor([row0, [0] * pad + [0] * 3 + [1] * 4 + [0] * 7])  # [2, s]
    mask = torch.ones_like(types)
    mask[1, :pad] = 0  # left padding
    images, videos = [[1, 4, 6], [1, 4, 4]], [[2, 4, 4]]
    kw: dict[str, Any] = {"spatial_merge_size": m, "attention_mask": mask}
    if layout == "qwen2_5_vl":
        kw.update(positions_per_second=2, seconds_per_grid=[1.5])
    if layout == "qwen2_5_omni":
        # markers around each block are text; the video is 2 frames 0.5 s apart
        kw.update(positions_per_second=25, seconds_per_grid=[0.5], seconds_per_chunk=2)
    pos, _ = mrope_position_ids(layout, types, image_grid_thw=images, video_grid_thw=videos, **kw)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, SMALL["vocab_size"], types.shape, generator=g)
    return ids, mask, pos


def _stock(name: str, sections: list[int]) -> tuple[Any, torch.nn.Linear]:
    torch.manual_seed(0)
    model = _models()[name][1](_config(name, sections)).eval()
    head = torch.nn.Linear(SMALL["hidden_size"], SMALL["vocab_size"], bias=False)
    return model, head


def _posenc(model: Any, name: str, config: Any | None = None) -> Any:
    """A copy of ``model`` whose RoPE is posenc's: rotary module and rotation."""
    ours = copy.deepcopy(model)
    ours.rotary_emb = HFRotaryEmbedding(config or ours.config, table_layout=_models()[name][2])
    return apply_posenc(ours)


def _logits(model: Any, head: torch.nn.Linear, name: str) -> torch.Tensor:
    ids, mask, pos = _inputs(name)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos)
        return head(out.last_hidden_state)[mask.bool()]  # [tokens, vocab]


SECTIONS = [2, 3, 3]  # 8 pairs of head_dim 16, (T, H, W)


@pytest.mark.parametrize("name", ["qwen2_5_vl", "glm4v", "qwen2_5_omni"])
def test_logits_equal_transformers(name: str) -> None:
    model, head = _stock(name, SECTIONS)
    ours = _posenc(model, name)
    assert len(ours.posenc_patch.attention) == SMALL["num_hidden_layers"]
    want, got = _logits(model, head, name), _logits(ours, head, name)
    assert want.abs().max() > 0.1
    err = (want - got).abs().max().item()
    assert err <= TOL, (name, err)


def test_positions_are_multimodal() -> None:
    """The inputs exercise M-RoPE: the three axes differ, so plain RoPE would not do."""
    for name in _models():
        pos = _inputs(name)[2]
        assert not torch.equal(pos[0], pos[1]) and not torch.equal(pos[1], pos[2]), name


@pytest.mark.parametrize("name", ["qwen2_5_vl", "glm4v"])
def test_planted_faults_are_caught(name: str) -> None:
    """posenc's rotary module built for another section split, or with the height and width
    rows of the positions swapped, gives other logits."""
    model, head = _stock(name, SECTIONS)
    want = _logits(model, head, name)
    wrong_split = _posenc(model, name, _config(name, [4, 2, 2]))
    assert (_logits(wrong_split, head, name) - want).abs().max() > 1e-3
    ours = _posenc(model, name)
    ids, mask, pos = _inputs(name)
    with torch.no_grad():
        swapped = head(ours(input_ids=ids, attention_mask=mask,
                            position_ids=pos[[0, 2, 1]]).last_hidden_state)[mask.bool()]  # fmt: skip
    assert (swapped - want).abs().max() > 1e-3


def test_glm4v_half_pairs_are_caught(monkeypatch: Any) -> None:
    """GLM-4V's rotation over half pairs instead of interleaved ones gives other logits."""
    from posenc.hf import patch, shadow

    model, head = _stock("glm4v", SECTIONS)
    want = _logits(model, head, "glm4v")
    module, rotations = patch.SUPPORTED["glm4v_text"]
    half = {k: patch.Rotation(table_layout="repeat", partial=True) for k in rotations}
    stock = patch._modeling("glm4v_text")[0].apply_rotary_pos_emb
    with pytest.raises(RuntimeError, match="no longer rotates as posenc expects"):
        patch.check_rotation(stock, half["apply_rotary_pos_emb"], "glm4v")
    monkeypatch.setitem(patch.SUPPORTED, "glm4v_text", (module, half))
    monkeypatch.setattr(patch, "check_rotation", lambda *a: None)  # the check would refuse it
    monkeypatch.setattr(shadow, "_SHADOWS", {})  # a shadow module of its own
    ours = _posenc(model, "glm4v")
    assert (_logits(ours, head, "glm4v") - want).abs().max() > 1e-3
