"""Whole modules survive ``torch.save`` / ``torch.load`` (pickle): users save a model object, not
only its state dict. A rotary module holds its scaling type's spec, whose functions include
closures that pickle cannot write; a registered spec pickles by its name.

Reference: the module before saving (its outputs on the same inputs, exactly)."""

from __future__ import annotations

import io

import pytest
import torch

from posenc import registry
from posenc.functional.rope_scaling import ROPE_SCALING
from posenc.rotary import RotaryEmbedding


def _roundtrip(module: torch.nn.Module) -> torch.nn.Module:
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("name", registry.names())
def test_every_registered_encoding_saves_whole(name: str) -> None:
    module = registry.build(name, dim=32, num_heads=4, max_len=16)
    loaded = _roundtrip(module)
    assert type(loaded) is type(module)
    want, got = module.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[key], got[key]) for key in want)


@pytest.mark.parametrize("rope_type", list(ROPE_SCALING))
def test_a_rotary_module_of_every_scaling_saves_and_rotates_alike(rope_type: str) -> None:
    spec = ROPE_SCALING[rope_type]
    scaling = spec.extension(4.0, 16, 8)  # 16 dims: 8 pairs
    rope = RotaryEmbedding(16, scaling=scaling, cache_len=256)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 2, 3, 16, generator=g)
    positions = torch.tensor([[0, 1, 2], [40, 41, 42]])
    want = rope(q, k, positions)
    rope(q, k, positions)  # a decode plan is kept; it is saved with the module
    loaded = _roundtrip(rope)
    assert loaded.spec is spec  # the registered spec, by name
    got = loaded(q, k, positions)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
