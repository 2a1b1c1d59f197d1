"""The scaling table against each method's own reference code, restated here in plain Python
(float64, no torch, no transformers): Meta's Llama-3.1 ``apply_scaling``, the YaRN paper's
reference implementation (``jquesnelle/yarn``, ``LlamaYaRNScaledRotaryEmbedding``), Phi-3's
LongRoPE switch (``Phi3LongRoPEScaledRotaryEmbedding``: the long factors once ``seq_len >
original_max_position_embeddings``), the NTK-aware base change and dynamic NTK (``/u/bloc97``'s
and transformers' ``DynamicNTKScalingRotaryEmbedding``).

These are independent of the transformers parity tests (``test_rotary_hf_parity.py``,
``test_hf_corpus.py``): a formula error shared with transformers would pass those and fail here,
and the swaps the issue names (YaRN's betas, Llama-3's smoothing weights, the LongRoPE switch
moved by one position) each fail both.
"""

from __future__ import annotations

import math

import pytest
import torch

from posenc.functional import rope_inv_freq
from posenc.rotary import RotaryEmbedding

ORIG = "original_max_position_embeddings"


def _plain(dim: int, base: float) -> list[float]:
    return [1.0 / base ** (2 * i / dim) for i in range(dim // 2)]


def meta_llama3(dim: int, base: float, factor: float, low: float, high: float, orig: int) -> list:
    """``apply_scaling`` of Meta's llama-models (``models/llama3/reference_impl/model.py``)."""
    low_freq_wavelen, high_freq_wavelen = orig / low, orig / high
    out = []
    for freq in _plain(dim, base):
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(freq)
        elif wavelen > low_freq_wavelen:
            out.append(freq / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * freq / factor + smooth * freq)
    return out


def yarn_reference(
    dim: int, base: float, factor: float, orig: int, beta_fast: float = 32, beta_slow: float = 1
) -> list:
    """The YaRN paper's ``_yarn_find_correction_range`` and ``_yarn_linear_ramp_mask``."""

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i, freq in enumerate(_plain(dim, base)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        mask = 1 - ramp  # extrapolation weight: 1 for the fast-turning pairs
        out.append(freq / factor * (1 - mask) + freq * mask)
    return out


def _ours(dim: int, base: float, scaling: dict, seq_len: int | None = None) -> list[float]:
    inv, _ = rope_inv_freq(dim, base, scaling, seq_len=seq_len, dtype=torch.float64)
    return inv.tolist()


def _close(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert math.isclose(x, y, rel_tol=1e-12, abs_tol=0.0), (x, y)


@pytest.mark.parametrize(
    ("dim", "base", "factor", "low", "high", "orig"),
    [(128, 500000.0, 8.0, 1.0, 4.0, 8192), (128, 500000.0, 32.0, 1.0, 4.0, 8192),
     (64, 10000.0, 4.0, 2.0, 8.0, 512), (96, 1e6, 16.0, 1.0, 2.0, 4096)],
)  # fmt: skip
def test_llama3_equals_metas_apply_scaling(dim, base, factor, low, high, orig) -> None:
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
               "high_freq_factor": high, ORIG: orig}  # fmt: skip
    want = meta_llama3(dim, base, factor, low, high, orig)
    _close(_ours(dim, base, scaling), want)
    # The band in the middle is populated, so swapped smoothing weights would show.
    plain = _plain(dim, base)
    assert any(plain[i] / factor < w < plain[i] for i, w in enumerate(want))


@pytest.mark.parametrize(
    ("dim", "base", "factor", "orig", "betas"),
    [(128, 10000.0, 16.0, 4096, (32, 1)), (64, 10000.0, 4.0, 2048, (32, 1)),
     (128, 1e6, 4.0, 32768, (32, 1)), (64, 10000.0, 8.0, 4096, (16, 2))],
)  # fmt: skip
def test_yarn_equals_the_papers_reference(dim, base, factor, orig, betas) -> None:
    scaling = {"rope_type": "yarn", "factor": factor, ORIG: orig, "beta_fast": betas[0],
               "beta_slow": betas[1]}  # fmt: skip
    _close(_ours(dim, base, scaling), yarn_reference(dim, base, factor, orig, *betas))
    # Swapped betas are not the same function (and are refused outright).
    assert yarn_reference(dim, base, factor, orig, betas[1], betas[0]) != yarn_reference(
        dim, base, factor, orig, *betas
    )
    with pytest.raises(ValueError, match="beta_fast"):
        _ours(dim, base, scaling | {"beta_fast": betas[1], "beta_slow": betas[0]})
    # The attention temperature of the paper: 0.1 ln(s) + 1.
    _, attention = rope_inv_freq(dim, base, scaling, dtype=torch.float64)
    assert math.isclose(attention, 0.1 * math.log(factor) + 1.0, rel_tol=1e-15)


def test_longrope_switches_exactly_past_the_original_length() -> None:
    """Phi-3: short factors while ``max(position) + 1 <= original``, long factors after."""
    dim, base, orig = 16, 10000.0, 32
    short, long = [1.0 + i / 8 for i in range(8)], [2.0 + i for i in range(8)]
    scaling = {"rope_type": "longrope", "factor": 4.0, ORIG: orig, "short_factor": short,
               "long_factor": long}  # fmt: skip
    plain = _plain(dim, base)
    attention = math.sqrt(1 + math.log(4.0) / math.log(orig))
    rope = RotaryEmbedding(dim, base, scaling)
    for top, factors in ((orig - 1, short), (orig, long)):  # seq_len = top + 1
        positions = torch.tensor([0, top])
        cos, sin = rope.cos_sin(positions)
        for i, f in enumerate(factors):
            angle = top * plain[i] / f
            assert math.isclose(float(cos[1, i]), attention * math.cos(angle), abs_tol=1e-6)
            assert math.isclose(float(sin[1, i]), attention * math.sin(angle), abs_tol=1e-6)
    # The forward path (table, kernel) switches at the same position.
    q = torch.randn(1, 1, 2, dim, dtype=torch.float64)
    for top in (orig - 1, orig):
        got, _ = rope(q, q, torch.tensor([0, top]))
        cos, sin = rope.cos_sin(torch.tensor([0, top]))
        x1, x2 = q[..., : dim // 2], q[..., dim // 2 :]
        want = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_ntk_and_dynamic_ntk_bases() -> None:
    dim, base, factor, orig = 64, 10000.0, 4.0, 256
    ntk = {"rope_type": "ntk", "factor": factor}
    _close(_ours(dim, base, ntk), _plain(dim, base * factor ** (dim / (dim - 2))))
    dynamic = {"rope_type": "dynamic", "factor": factor, ORIG: orig}
    _close(_ours(dim, base, dynamic, seq_len=orig), _plain(dim, base))  # within: plain
    for seq_len in (orig + 1, 3 * orig):
        grown = base * (factor * seq_len / orig - (factor - 1)) ** (dim / (dim - 2))
        _close(_ours(dim, base, dynamic, seq_len=seq_len), _plain(dim, grown))
