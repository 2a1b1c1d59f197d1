"""The transformers-shaped pieces of ``posenc.hf.rotary``: ``HFRotaryEmbedding`` equals each
corpus model's own rotary class; ``apply_rotary_pos_emb`` equals transformers' functions;
``apply_rotary_emb`` equals a naive per-pair rotation loop in float64."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf import HFRotaryEmbedding, apply_rotary_emb, apply_rotary_pos_emb  # noqa: E402
from posenc.hf.rotary import FLOAT32_TABLE_TYPES  # noqa: E402
from test_hf_corpus import (  # noqa: E402
    NAMES,
    hf_text_config,
    load,
    modeling,
    rope_keys,
    rotary_class,
    transformers_key,
)


def naive(x: torch.Tensor, angle: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """The 2x2 rotation of each pair, one element at a time, in float64.

    ``x [b, h, s, d]``, ``angle [b, s, n]``; pairs ``(i, i + n)`` or ``(2i, 2i + 1)``."""
    out = x.double().clone()
    b, h, s, _ = x.shape
    n = angle.shape[-1]
    for bi in range(b):
        for si in range(s):
            for i in range(n):
                a = float(angle[bi, si, i])
                j1, j2 = (2 * i, 2 * i + 1) if interleaved else (i, i + n)
                for hi in range(h):
                    x1, x2 = float(x[bi, hi, si, j1]), float(x[bi, hi, si, j2])
                    out[bi, hi, si, j1] = x1 * math.cos(a) - x2 * math.sin(a)
                    out[bi, hi, si, j2] = x2 * math.cos(a) + x1 * math.sin(a)
    return out


def table(angle: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "cat":
        angle = torch.cat((angle, angle), dim=-1)
    elif layout == "repeat":
        angle = angle.repeat_interleave(2, dim=-1)
    return angle.cos(), angle.sin()


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("layout", ["cat", "repeat", "half"])
@pytest.mark.parametrize("seq_layout", ["bhsd", "bshd"])
def test_apply_rotary_emb_is_the_rotation_of_each_pair(
    interleaved: bool, layout: str, seq_layout: str
) -> None:
    x = torch.randn(2, 3, 4, 10)  # d = 10, r = 6: channels 6.. pass through
    angle = torch.randn(2, 4, 3) * 5
    want = naive(x[..., :6], angle, interleaved)
    want = torch.cat((want, x[..., 6:].double()), dim=-1)
    cos, sin = table(angle, layout)
    xin = x if seq_layout == "bhsd" else x.transpose(1, 2)
    before = xin.clone()
    got = apply_rotary_emb(
        xin, cos, sin, interleaved=interleaved, table_layout=layout, seq_layout=seq_layout
    )
    got = got if seq_layout == "bhsd" else got.transpose(1, 2)
    assert torch.equal(xin, before)  # not modified
    assert float((got.double() - want).abs().max()) <= 1e-6


@pytest.mark.parametrize("interleaved", [False, True])
def test_apply_rotary_emb_with_position_ids_looks_up_table_rows(interleaved: bool) -> None:
    # PyTorch's proposed convention: a [N, d/2] table and [b, s] position ids.
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2).double() / 8)
    rows = torch.arange(64).double()[:, None] * inv_freq  # [N, n]
    position_ids = torch.tensor([[5, 6, 7], [40, 0, 63]])
    x = torch.randn(2, 2, 3, 8)
    want = naive(x, rows[position_ids], interleaved)
    got = apply_rotary_emb(
        x,
        rows.cos().float(),
        rows.sin().float(),
        position_ids,
        interleaved=interleaved,
        table_layout="half",
    )
    assert float((got.double() - want).abs().max()) <= 1e-6


MODULES = {
    "llama": ("half", "cat"),
    "gpt_neox": ("half", "cat"),  # partial rotary inside its function
    "glm": ("interleaved", "cat"),
    "cohere": ("interleaved", "repeat"),
}


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_rotary_pos_emb_equals_transformers(name: str, dtype: torch.dtype) -> None:
    stock = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    pairing, layout = MODULES[name]
    r = 8 if name in ("gpt_neox", "glm") else 16
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 5, 16)
    cos, sin = table(torch.randn(2, 5, r // 2) * 4, layout)
    want = stock.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    got = apply_rotary_pos_emb(
        q.to(dtype),
        k.to(dtype),
        cos.to(dtype),
        sin.to(dtype),
        interleaved=pairing == "interleaved",
        table_layout=layout,
    )
    if dtype == torch.float32:
        tol = 1e-6
    else:  # no worse than transformers' own arithmetic in bfloat16
        own = stock.apply_rotary_pos_emb(q.to(dtype), k.to(dtype), cos.to(dtype), sin.to(dtype))
        tol = max(float((o.double() - w).abs().max()) for o, w in zip(own, want, strict=True))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        assert float((g.double() - w).abs().max()) <= tol


def test_apply_rotary_pos_emb_bshd_with_unsqueeze_dim_2() -> None:
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as stock

    q, k = torch.randn(2, 5, 4, 16), torch.randn(2, 5, 2, 16)  # [b, s, h, d]
    cos, sin = table(torch.randn(2, 5, 8), "cat")
    want = stock(q, k, cos, sin, unsqueeze_dim=2)
    got = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and float((g - w).abs().max()) <= 1e-6


def _cases() -> list[tuple[str, str | None]]:
    out = []
    for name in NAMES:
        text = hf_text_config(load(name))
        if text.model_type in ("gptj", "codegen", "deepseek_v2", "llama4_text", "llama4"):
            continue  # (sin, cos) order or complex e^{i angle}: no cos/sin pair to match
        # A label read from another set (DeepSeek-V4's indexer reads compress) is not one of the
        # module's layer types; test_hf_corpus compares it through rope_from_hf.
        out += [(name, t) for t in rope_keys(text) if transformers_key(text, t) in ((), (t,))]
    return out


@pytest.mark.parametrize(("name", "layer_type"), _cases())
def test_hf_rotary_embedding_equals_the_models_own_class(name: str, layer_type: str | None) -> None:
    text = hf_text_config(load(name))
    own = rotary_class(modeling(text))(text)
    extra = () if layer_type is None else (layer_type,)
    ours = HFRotaryEmbedding(text)
    probe = own(torch.zeros(1), torch.arange(2)[None], *extra)[0]  # [1, 2, w]
    if probe.shape[-1] == ours.rope(layer_type).span // 2:
        ours.table_layout = "half"  # gpt-oss: one column per pair
    elif not torch.equal(probe[..., 0], probe[..., probe.shape[-1] // 2]):
        ours.table_layout = "repeat"  # Cohere: [f0 f0 f1 f1 ..]
    length = text.max_position_embeddings
    positions = torch.tensor([[0, 1, 7, length - 1, length, 2 * length + 3, 4 * length - 1]])
    if text.model_type.startswith(("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5")):
        positions = torch.stack([positions, positions // 2, positions % 5])  # [3, 1, s]
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.zeros(1, dtype=dtype)
        want = own(x, positions, *extra)
        got = ours(x, positions, layer_type)
        for g, w in zip(got, want, strict=True):
            # OLMo-3's class (and Beam's, LFM3's) keeps float32 tables for any x.
            keeps_f32 = text.model_type in FLOAT32_TABLE_TYPES
            assert g.dtype == w.dtype == (torch.float32 if keeps_f32 else dtype)
            assert g.shape == w.shape
            assert float((g.float() - w.float()).abs().max()) <= (
                1e-6 if dtype == torch.float32 else 0
            )


def test_hf_rotary_embedding_has_no_state() -> None:
    text = hf_text_config(load("llama-3.1-8b-instruct"))
    module = HFRotaryEmbedding(text)
    assert module.state_dict() == {} and list(module.buffers()) == []


def test_bad_calls_name_what_is_wrong() -> None:
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    cos, sin = table(torch.randn(1, 3, 4), "cat")
    with pytest.raises(ValueError, match=r"unsqueeze_dim must be 1 .* or 2"):
        apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)
    with pytest.raises(ValueError, match="table_layout must be one of"):
        apply_rotary_pos_emb(q, k, cos, sin, table_layout="complex")
    with pytest.raises(ValueError, match="even last dim"):
        apply_rotary_pos_emb(q, k, cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="cos and sin must have one shape"):
        apply_rotary_pos_emb(q, k, cos, sin[..., :4])
    with pytest.raises(ValueError, match="with position_ids, cos and sin must be tables"):
        apply_rotary_emb(q, cos, sin, torch.arange(3))
    text = hf_text_config(load("gemma-3-1b-it"))
    with pytest.raises(ValueError, match="layer_type must be one of"):
        HFRotaryEmbedding(text)(torch.zeros(1), torch.arange(3)[None])


@pytest.mark.parametrize("model_type", sorted(FLOAT32_TABLE_TYPES))
def test_float32_table_types_keep_float32_tables_as_their_own_class(model_type: str) -> None:
    from transformers import CONFIG_MAPPING

    text = CONFIG_MAPPING[model_type]().get_text_config(decoder=True)
    own = rotary_class(modeling(text))(text)
    ours = HFRotaryEmbedding(text)
    x, positions = torch.zeros(1, dtype=torch.bfloat16), torch.arange(40)[None]
    extra = () if not ours.layer_types else (ours.layer_types[0],)
    want = own(x, positions, *extra)
    got = ours(x, positions, *extra)
    for g, w in zip(got, want, strict=True):
        assert w.dtype == g.dtype == torch.float32  # the stock class skips the cast to bf16
        assert float((g - w).abs().max()) <= 1e-6
