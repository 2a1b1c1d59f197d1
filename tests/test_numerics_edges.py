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


# --- float16 biases at far distances -----------------------------------------------------------


def _far_call(backend: str, dtype: torch.dtype) -> torch.Tensor:
    """One query at 2e6 whose visible keys (memory at 0..3) are all far: ALiBi's first head
    gives them -1.25e5, below float16's -65504. The query's own key is masked out."""
    from posenc import Attention
    from posenc.bias import ALiBi

    torch.manual_seed(0)
    attn = Attention(16, 2, causal=False, encoding=ALiBi(2), backend=backend)
    x, memory = torch.randn(1, 1, 16), torch.randn(1, 4, 16)
    keep = torch.tensor([[True, True, True, True, False]])  # [b, t]: memory keys only
    attn = attn.to(dtype)
    return attn(
        x.to(dtype), torch.tensor([2_000_000]), memory=memory.to(dtype),
        memory_positions=torch.arange(4), attn_mask=keep,
    ).float()  # fmt: skip


@pytest.mark.parametrize("backend", ["sdpa", "explicit"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_far_bias_in_half_precision_gives_the_float32_answer(
    backend: str, dtype: torch.dtype
) -> None:
    want = _far_call(backend, torch.float32)
    got = _far_call(backend, dtype)
    assert torch.isfinite(got).all(), got
    tol = 2e-2 if dtype == torch.float16 else 1e-1
    assert (got - want).abs().max() <= tol * want.abs().max()


def test_bias_in_dtype_keeps_far_rows_finite() -> None:
    from posenc.functional.bias import bias_in_dtype

    bias = -1e5 - torch.arange(4.0).expand(1, 2, 4)  # [h, s, t], every key far
    keep = torch.tensor([[True, True, True, False], [False] * 4])  # second row: nothing visible
    out = bias_in_dtype(bias, torch.float16, keep)
    assert torch.isfinite(out[0, 0, :3]).all() and out[0, 0, 3] == float("-inf")
    assert torch.isneginf(out[0, 1]).all()  # a row with no visible key stays fully masked
    want = torch.softmax(bias[0, 0, :3].double(), -1)
    assert (torch.softmax(out[0, 0, :3].double(), -1) - want).abs().max() <= 1e-3
    assert torch.equal(bias_in_dtype(bias, torch.float32), bias)  # float32: untouched


def test_attention_checks_the_encodings_head_count() -> None:
    from posenc import Attention
    from posenc.bias import ALiBi, T5RelativeBias

    with pytest.raises(ValueError, match=r"ALiBi was built for num_heads=1, but this Attention"):
        Attention(16, 2, encoding=ALiBi(1))
    with pytest.raises(ValueError, match="num_heads=4"):
        Attention(32, 4, encoding=T5RelativeBias(2))
    Attention(16, 2, encoding=ALiBi(2))  # the matching count builds


def test_rotary_head_dim_and_cache_len_are_capped() -> None:
    from posenc.hf import rope_from_hf
    from posenc.rotary.embedding import MAX_CACHE_LEN, MAX_HEAD_DIM

    with pytest.raises(ValueError, match=rf"head_dim must be <= {MAX_HEAD_DIM} "):
        RotaryEmbedding(2 * MAX_HEAD_DIM)
    with pytest.raises(ValueError, match=rf"cache_len must be <= {MAX_CACHE_LEN} "):
        RotaryEmbedding(64, cache_len=MAX_CACHE_LEN + 1)
    with pytest.raises(ValueError, match=rf"head_dim must be <= {MAX_HEAD_DIM}"):
        rope_from_hf({"model_type": "llama", "head_dim": 10**8, "rope_theta": 1e4})
    RotaryEmbedding(MAX_HEAD_DIM, cache_len=MAX_CACHE_LEN)  # the caps themselves build (lazily)
