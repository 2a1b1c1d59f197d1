"""Deferred initialization: every posenc module built under ``torch.device("meta")``,
materialized with ``to_empty()`` and ``reset_parameters()``, equals a direct build.

Deterministic buffers and rotary frequency sets must be equal exactly (values and dtype); learned
weights too, with the same seed, because each ``reset_parameters`` draws in its constructor's
order. The reference is the direct build, which these changes must leave as it was.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posenc import registry
from posenc.absolute import Learned2D
from posenc.attention import Attention
from posenc.deferred import materialize, reset_module, reset_submodules
from posenc.model import ModelConfig, TransformerLM
from posenc.rotary import Axial2DRoPE, DecoupledRoPE, MRoPE, RotaryEmbedding, XPos

DIM, HEADS, LEN = 32, 4, 16
NAMES = registry.names()
LONGROPE = {
    "rope_type": "longrope",
    "factor": 4.0,
    "original_max_position_embeddings": 8,
    "short_factor": [1.0, 1.5, 2.0, 2.5],
    "long_factor": [2.0, 3.0, 4.0, 5.0],
}
DYNAMIC = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8}


def both(build, seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """``(direct, meta-built then materialized)``, each after ``manual_seed(seed)``."""
    torch.manual_seed(seed)
    direct = build()
    with torch.device("meta"):
        deferred = build()
    assert all(p.device.type == "meta" for p in deferred.parameters())
    deferred.to_empty(device="cpu")
    torch.manual_seed(seed)
    deferred.reset_parameters()
    return direct, deferred


def assert_same_state(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and sa[key].device == sb[key].device, key
        assert torch.equal(sa[key], sb[key]), key
    ba, bb = dict(a.named_buffers()), dict(b.named_buffers())
    assert ba.keys() == bb.keys()
    for key in ba:  # non-persistent: frequencies, slopes, tables
        assert ba[key].dtype == bb[key].dtype and ba[key].device.type == "cpu", key
        assert torch.equal(ba[key], bb[key]), key
    for (name, ma), mb in zip(a.named_modules(), b.modules(), strict=True):
        sets_a, sets_b = getattr(ma, "_sets", {}), getattr(mb, "_sets", {})
        assert sets_a.keys() == sets_b.keys(), name
        for key, (freq, factor) in sets_a.items():
            other, other_factor = sets_b[key]
            assert other.device.type == "cpu" and other.dtype == freq.dtype, (name, key)
            assert torch.equal(freq, other) and factor == other_factor, (name, key)


def outputs(enc: nn.Module, family: str) -> list[torch.Tensor]:
    """What the encoding computes, through its own API (positions with an offset and a gap)."""
    g = torch.Generator().manual_seed(1)
    pos = torch.tensor([0, 1, 2, 5, 6, 9, 10, 11])
    if family == "rotary":
        q = torch.randn(2, HEADS, 8, DIM // HEADS, generator=g)
        out = list(enc(q, q.flip(2), pos))
        return [*out, *enc.cos_sin(pos)] if hasattr(enc, "cos_sin") else out
    if family == "bias":
        return [enc.bias(pos, pos), enc.bias(pos[-3:], pos)]
    if family == "absolute":
        return [enc(torch.randn(2, 8, DIM, generator=g), pos)]
    if family == "relative":
        torch.manual_seed(2)
        attn = Attention(DIM, HEADS, encoding=enc)
        return [attn(torch.randn(2, 8, DIM, generator=g), pos)]
    return [enc(torch.randn(2, 8, DIM, generator=g))]


@pytest.mark.parametrize("name", NAMES)
def test_each_registered_encoding(name: str) -> None:
    family = registry.entry(name).family
    direct, deferred = both(
        lambda: registry.build(name, dim=DIM, num_heads=HEADS, max_len=LEN), seed=3
    )
    assert_same_state(direct, deferred)
    for want, got in zip(outputs(direct, family), outputs(deferred, family), strict=True):
        assert torch.equal(want, got)


@pytest.mark.parametrize("name", NAMES)
def test_each_registered_encoding_in_a_model(name: str) -> None:
    cfg = ModelConfig(encoding=name, vocab_size=32, dim=DIM, num_heads=HEADS, max_len=LEN)
    direct, deferred = both(lambda: TransformerLM(cfg))
    assert_same_state(direct, deferred)
    tokens = torch.randint(0, 32, (2, LEN), generator=torch.Generator().manual_seed(0))
    assert torch.equal(direct(tokens), deferred(tokens))


@pytest.mark.parametrize(
    "build",
    [
        lambda: RotaryEmbedding(8, scaling=LONGROPE, angle_dtype="float32"),
        lambda: RotaryEmbedding(8, scaling=DYNAMIC),
        lambda: MRoPE(16, [4, 2, 2], interleaved=True),
        lambda: XPos(8, center=4),
        lambda: Axial2DRoPE(8, (2, 4), num_prefix_tokens=1, arrangement="blocks"),
        lambda: DecoupledRoPE(8, 4, scaling=LONGROPE),
        lambda: Learned2D(2, 3, DIM),
        lambda: Attention(DIM, HEADS, 2, encoding=RotaryEmbedding(8, scaling=DYNAMIC)),
    ],
    ids=["longrope-f32", "dynamic", "mrope", "xpos", "axial", "mla", "learned2d", "attention"],
)
def test_modules_outside_the_registry(build) -> None:
    direct, deferred = both(build)
    assert_same_state(direct, deferred)
    if isinstance(direct, (RotaryEmbedding, XPos, Axial2DRoPE, DecoupledRoPE)):
        head = {MRoPE: 16, DecoupledRoPE: 12}.get(type(direct), 8)
        q = torch.randn(1, 2, 7, head)
        for want, got in zip(direct(q, q + 1), deferred(q, q + 1), strict=True):
            assert torch.equal(want, got)
        if not isinstance(direct, Axial2DRoPE):  # its positions index a 2 x 4 grid
            # Past the original length: dynamic NTK and LongRoPE switch frequencies.
            pos = torch.arange(20, 27)
            for want, got in zip(direct(q, q, pos), deferred(q, q, pos), strict=True):
                assert torch.equal(want, got)


def test_frequencies_stay_exact_through_dtype_casts() -> None:
    """A meta-built model cast to bf16 keeps float64 frequencies and float32 constants."""
    cfg = ModelConfig(encoding="rope", vocab_size=32, dim=DIM, num_heads=HEADS, max_len=LEN)
    with torch.device("meta"):
        model = TransformerLM(cfg)
    materialize(model).to(torch.bfloat16)
    rope = model.blocks[0].attn.encoding
    freq, _ = rope.frequencies()
    assert freq.dtype == torch.float64 and freq.device.type == "cpu"
    assert torch.equal(freq, RotaryEmbedding(DIM // HEADS).frequencies()[0])
    with torch.device("meta"):
        sandwich = registry.build("sandwich", dim=DIM, num_heads=HEADS)
    materialize(sandwich).to(torch.bfloat16)
    assert sandwich.constants.table.dtype == torch.float32
    assert torch.equal(
        sandwich.constants.table,
        registry.build("sandwich", dim=DIM, num_heads=HEADS).constants.table,
    )


def test_a_shared_encoding_is_reset_once() -> None:
    """``reset_submodules`` on a container of one's own: the T5 bias shared by two layers draws
    once, as it was built once, so the weights equal a direct build's."""

    def build() -> nn.Module:
        t5 = registry.build("t5", dim=DIM, num_heads=HEADS)
        return nn.ModuleList(Attention(DIM, HEADS, encoding=t5) for _ in range(2))

    torch.manual_seed(0)
    direct = build()
    with torch.device("meta"):
        deferred = build()
    deferred.to_empty(device="cpu")
    torch.manual_seed(0)
    reset_submodules(deferred)
    assert_same_state(direct, deferred)
    assert deferred[0].encoding is deferred[1].encoding
    torch.manual_seed(0)
    assert_same_state(direct, materialize(deferred))  # to_empty again, then reset_module
    torch.manual_seed(0)
    assert_same_state(direct, reset_module(deferred))


def test_reset_parameters_without_meta_restores_a_direct_build() -> None:
    """``reset_parameters`` is an init, not a no-op: trained (changed) weights go back."""
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(encoding="kerple", vocab_size=32, dim=DIM, num_heads=HEADS))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.manual_seed(0)
    model.reset_parameters()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
