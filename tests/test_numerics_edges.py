"""Edges of the numerics: the inverse rotation, extreme factors, bad segment arguments."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.functional import rope_inv_freq
from posenc.functional.rotary import rope_cos_sin
from posenc.kernels.reference import apply_rotary_reference
from posenc.rotary import RotaryEmbedding
from posenc.rotary.mrope import mrope_positions


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_reference_conj_is_the_inverse_rotation(layout: str) -> None:
    """Rotate by theta, then with conj=True: the input back (float64); conj alone equals the
    rotation by -theta computed independently."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 16, dtype=torch.float64)
    angles = torch.randn(5, 6, dtype=torch.float64) * 100  # [s, r/2], r = 12 of d = 16
    cos, sin = angles.cos(), angles.sin()
    rotated = apply_rotary_reference(x, cos, sin, layout, 12)
    assert (rotated - x).abs().max() > 0.1  # it did rotate
    back = apply_rotary_reference(rotated, cos, sin, layout, 12, conj=True)
    assert (back - x).abs().max() <= 1e-12
    minus = apply_rotary_reference(x, (-angles).cos(), (-angles).sin(), layout, 12)
    conj = apply_rotary_reference(x, cos, sin, layout, 12, conj=True)
    assert (conj - minus).abs().max() <= 1e-12


def test_dynamic_ntk_factor_is_bounded() -> None:
    sc = {"rope_type": "dynamic", "factor": 1e308, "original_max_position_embeddings": 16}
    with pytest.raises(ValueError, match=r"factor'\] must be <= 1e\+06 for rope_type 'dynamic'"):
        RotaryEmbedding(16, 1e4, sc)
    sc["factor"] = 1e6  # the bound itself: finite frequencies far past the original length
    inv_freq, _ = rope_inv_freq(16, 1e4, sc, seq_len=10**6)
    assert torch.isfinite(inv_freq).all() and (inv_freq > 0).all()
    cos, sin = rope_cos_sin(torch.arange(4), inv_freq)
    assert torch.isfinite(cos).all() and torch.isfinite(sin).all()


@pytest.mark.parametrize("interval", [float("nan"), float("inf"), -1.0, 0, "2", True])
def test_mrope_positions_checks_time_interval(interval: object) -> None:
    with pytest.raises(ValueError, match="time_interval must be a finite number > 0"):
        mrope_positions([("video", (2, 2, 2), interval)])


def test_mrope_positions_time_interval_scales_time() -> None:
    pos = mrope_positions([("video", (3, 2, 2), 2.5)], spatial_merge_size=2)  # [3, 3]
    assert pos[0].tolist() == [math.floor(i * 2.5) for i in range(3)]
