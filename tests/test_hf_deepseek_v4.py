"""DeepSeek-V4 against transformers' own classes: both rope sets, the trailing slice, the value
rotation undone on the output, and a tiny model's logits.

References (transformers' ``modeling_deepseek_v4``): ``DeepseekV4RotaryEmbedding`` (one cos/sin
column per pair, per label ``main`` / ``compress``), ``apply_rotary_pos_emb(x, cos, sin)``
(interleaved pairs on the last ``2 * cos.shape[-1]`` channels) and the attention's
``apply_rotary_pos_emb(out, cos, -sin)`` on its output.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
ds4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

from _tiny import DEEPSEEK_V4_TINY as TINY  # noqa: E402
from posenc.hf import hf_rope_kwargs, position_plan, rope_from_hf  # noqa: E402
from posenc.hf.rotary import HFRotaryEmbedding  # noqa: E402
from posenc.kernels import apply_rotary_reference  # noqa: E402
from posenc.rotary import rotate_trailing  # noqa: E402

# The shape of DeepSeek-V4-Flash's published config.json (its rope keys verbatim: qk_rope_head_dim,
# compress_rope_theta, compress_ratios and a flat YaRN rope_scaling), shortened to 5 layers.
RAW = {
    "model_type": "deepseek_v4", "hidden_size": 4096, "num_attention_heads": 64,
    "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64, "rope_theta": 10000,
    "compress_rope_theta": 160000, "max_position_embeddings": 1048576, "num_hidden_layers": 5,
    "compress_ratios": [0, 0, 4, 128, 0], "sliding_window": 128,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                     "original_max_position_embeddings": 65536, "type": "yarn"},
}  # fmt: skip
LABELS = ("main", "compress")
LAYER_LABEL = {
    "sliding_attention": "main",
    "compressed_sparse_attention": "compress",
    "heavily_compressed_attention": "compress",
}


def _configs() -> dict[str, Any]:
    obj = transformers.DeepseekV4Config.from_dict(copy.deepcopy(RAW))
    # Already nested: transformers keeps the sets as given (no forced attention_factor), so YaRN
    # derives its own 0.1 ln(16) + 1 on compress.
    nested = copy.deepcopy(RAW)
    nested.pop("rope_scaling")
    nested["rope_parameters"] = {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0,
                     "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                     "partial_rotary_factor": 0.125},
    }  # fmt: skip
    return {"dict": RAW, "object": obj, "nested": nested}


def _positions() -> torch.Tensor:
    top = 4 * RAW["max_position_embeddings"]
    return torch.tensor([[0, 1, 7, 100, 65535, 65536, 1048575, top - 1]])  # [1, s]


@pytest.mark.parametrize("which", ["dict", "object", "nested"])
@pytest.mark.parametrize("label", [*LABELS, "indexer"])
def test_cos_sin_and_rotations_match_transformers(which: str, label: str) -> None:
    """Each label against the class's own tables; "indexer" is DeepseekV4Indexer's rotary,
    which reads "compress" (its heads are index_head_dim wide, the rope slice trailing)."""
    cfg = _configs()[which]
    obj = cfg if not isinstance(cfg, dict) else transformers.DeepseekV4Config.from_dict(cfg)
    theirs = ds4.DeepseekV4RotaryEmbedding(obj)
    positions = _positions()
    their_label = ds4.DeepseekV4Indexer.rope_layer_type if label == "indexer" else label
    cos_t, sin_t = theirs(torch.zeros(1), positions, layer_type=their_label)  # [1, s, 32]
    rope = rope_from_hf(cfg, label)
    head = obj.index_head_dim if label == "indexer" else obj.head_dim  # the whole head
    assert (rope.head_dim, rope.rotary_dim, rope.layout) == (head, 64, "interleaved")
    cos, sin = rope.cos_sin(positions[0])  # [s, 32]
    assert (cos - cos_t[0]).abs().max().item() <= 1e-6
    assert (sin - sin_t[0]).abs().max().item() <= 1e-6
    if label != "main":  # YaRN; attention factor 1.0 forced unless the file nests the sets
        assert rope.attention_factor == pytest.approx(1.2772588722 if which == "nested" else 1.0)
    # The rotated heads: q [b, h, s, 512] and the shared kv, then the output's inverse rotation.
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 3, positions.shape[1], 512, generator=g)
    c, s = cos[None, None], sin[None, None]  # [1, 1, s, 32]
    for x in (q, q[:, :1], q[..., :128]):  # queries, the shared kv head, an indexer head
        want = ds4.apply_rotary_pos_emb(x, cos_t, sin_t)
        assert (rotate_trailing(x, c, s, "interleaved") - want).abs().max().item() <= 1e-5
        undo = ds4.apply_rotary_pos_emb(x, cos_t, -sin_t)
        got = rotate_trailing(x, c, s, "interleaved", conj=True)
        assert (got - undo).abs().max().item() <= 1e-5
        nope = x.shape[-1] - 64
        assert torch.equal(got[..., :nope], x[..., :nope])  # the nope channels pass untouched


@pytest.mark.parametrize("layer_type", sorted(LAYER_LABEL))
def test_layer_types_read_their_label(layer_type: str) -> None:
    for use_transformers in (True, False):
        kw = hf_rope_kwargs(RAW, layer_type, use_transformers=use_transformers)
        assert kw == hf_rope_kwargs(RAW, LAYER_LABEL[layer_type])
        assert kw["rope_slice"] == "trailing"
    plan = position_plan(RAW)
    assert [x.base for x in plan.layers] == [1e4, 1e4, 1.6e5, 1.6e5, 1e4]
    assert all(x.uses_rope and x.layout == "interleaved" for x in plan.layers)
    for use_transformers in (True, False):  # posenc's own reader: the class's derivation
        compress = hf_rope_kwargs(RAW, "compress", use_transformers=use_transformers)
        assert compress["scaling"]["attention_factor"] == 1.0
    with pytest.raises(ValueError, match="by label: pass one of"):
        rope_from_hf(RAW)


def test_rotate_trailing_inverse_and_checks() -> None:
    """``conj=True`` undoes the rotation (float64: to rounding); the inputs are checked."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, 12, dtype=torch.float64, generator=g)
    angle = torch.randn(5, 4, dtype=torch.float64, generator=g) * 10  # [s, r/2]
    for layout in ("half", "interleaved"):
        y = rotate_trailing(x, angle.cos(), angle.sin(), layout)
        assert not torch.allclose(y[..., 4:], x[..., 4:])
        assert torch.equal(y[..., :4], x[..., :4])
        back = rotate_trailing(y, angle.cos(), angle.sin(), layout, conj=True)
        assert (back - x).abs().max().item() <= 1e-12
    with pytest.raises(ValueError, match="rotary_dim"):
        rotate_trailing(x[..., :6], angle.cos(), angle.sin())
    with pytest.raises(ValueError, match="layout"):
        rotate_trailing(x, angle.cos(), angle.sin(), "pairs")


# --- a tiny model: transformers' against the same weights with posenc doing the positions --------


def _trailing(layout: str, undo: bool, leading: bool = False) -> Any:
    """posenc's rotation of DeepSeek-V4's slices; the faults: another layout, the leading slice,
    no inverse rotation on the output."""

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, conj: bool = False) -> Any:
        if conj and not undo:
            return x
        if leading:
            return apply_rotary_reference(x, cos, sin, layout, 2 * cos.shape[-1], conj)
        return rotate_trailing(x, cos, sin, layout, conj=conj)

    return rotate


def _posenc_attention(rotate: Any, ropes: dict[str, Any]) -> Any:
    """DeepseekV4Attention.forward (no cache) with every rotation posenc's: the layer's rope set
    from rope_from_hf, its queries and shared key/value rotated on the trailing slice, the output
    rotated back with ``conj=True``."""

    def forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any,
                position_ids: torch.Tensor, attention_mask: Any, cache: Any = None,
                **kwargs: Any) -> Any:  # fmt: skip
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        cos, sin = ropes[self.rope_layer_type].cos_sin(position_ids)  # [b, s, n]
        cos, sin = cos[:, None], sin[:, None]  # [b, 1, s, n]
        q_residual = self.q_a_norm(self.q_a_proj(hidden_states))
        q = self.q_b_norm(self.q_b_proj(q_residual).view(shape).transpose(1, 2))  # [b, h, s, d]
        q = rotate(q, cos, sin)
        kv = self.kv_norm(self.kv_proj(hidden_states)).view(shape).transpose(1, 2)  # [b, 1, s, d]
        kv = rotate(kv, cos, sin)
        if self.compressor is not None:
            compressed, bias = self.compressor(hidden_states, q_residual, position_ids, None, 0)
            kv = torch.cat([kv, compressed], dim=2)
            attention_mask = torch.cat([attention_mask, bias.to(attention_mask.dtype)], dim=-1)
        out, weights = ds4.eager_attention_forward(
            self, q, kv, kv, attention_mask, scaling=self.scaling, s_aux=self.sinks
        )  # out [b, s, h, d]
        out = rotate(out.transpose(1, 2), cos, sin, conj=True).transpose(1, 2)
        grouped = self.o_a_proj(out.reshape(*hidden_states.shape[:-1], self.config.o_groups, -1))
        return self.o_b_proj(grouped.flatten(2)), weights

    return forward


def _logits_diff(monkeypatch: Any, rotate: Any) -> float:
    config = transformers.DeepseekV4Config(**TINY)
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM(config).eval()
    ids = torch.randint(0, TINY["vocab_size"], (2, 24))
    with torch.no_grad():
        want = model(ids).logits
    ropes = {label: rope_from_hf(config, label) for label in LABELS}
    with monkeypatch.context() as m:
        m.setattr(ds4.DeepseekV4Attention, "forward", _posenc_attention(rotate, ropes))
        # The compressors and indexers call the module's apply function with their own rotary.
        m.setattr(
            ds4,
            "apply_rotary_pos_emb",
            lambda x, c, s, unsqueeze_dim=1: rotate(
                x, c.float().unsqueeze(unsqueeze_dim), s.float().unsqueeze(unsqueeze_dim)
            ),
        )
        for module in list(model.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, ds4.DeepseekV4RotaryEmbedding):
                    setattr(module, name, HFRotaryEmbedding(config, table_layout="half"))
        with torch.no_grad():
            got = model(ids).logits
    return (got - want).abs().max().item()


def test_tiny_model_logits_match_transformers(monkeypatch: Any) -> None:
    assert _logits_diff(monkeypatch, _trailing("interleaved", undo=True)) <= 1e-5


@pytest.mark.parametrize(
    "fault",
    [
        {"layout": "half", "undo": True},  # the wrong pairing
        {"layout": "interleaved", "undo": True, "leading": True},  # the wrong slice
        {"layout": "interleaved", "undo": False},  # the value rotation left on the output
    ],
)
def test_planted_faults_are_caught(monkeypatch: Any, fault: dict[str, Any]) -> None:
    assert _logits_diff(monkeypatch, _trailing(**fault)) > 1e-3
