"""Sinusoidal tables against the paper's formula (float64, written out here) and the recipes."""

import math

import numpy as np
import pytest
import torch

from posenc.absolute import SinusoidalEncoding
from posenc.functional import sinusoidal_table

# The table is computed from float64 angles and rounded once to float32, so the only error
# against the float64 formula is float32 rounding of values in [-1, 1]: half an ulp at 1 = 2**-24.
# (A float32 *angle* would be off by up to |angle| * 2**-24, ~0.06 rad at position 1e6.)
F32_VALUE_TOL = 2.0**-24 * 1.01

POSITIONS = torch.tensor([0, 1, 2, 3, 7, 100, 511, 4095, 65_537, 999_999, 1_000_000])
DIMS = [4, 6, 8, 10, 16, 62, 64, 100, 128, 256, 512, 768, 1024]


def paper_formula(pos: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), in float64."""
    out = torch.zeros(len(pos), d, dtype=torch.float64)
    for i in range(d // 2):
        angle = pos.double() / base ** (2 * i / d)
        out[:, 2 * i] = torch.sin(angle)
        out[:, 2 * i + 1] = torch.cos(angle)
    return out


@pytest.mark.parametrize("d", DIMS)
def test_interleaved_equals_paper_formula(d: int) -> None:
    got = sinusoidal_table(POSITIONS, d)
    assert got.dtype == torch.float32 and got.shape == (len(POSITIONS), d)
    err = (got.double() - paper_formula(POSITIONS, d)).abs().max().item()
    assert err <= F32_VALUE_TOL, err


@pytest.mark.parametrize("d", DIMS)
def test_concat_is_sin_then_cos_with_paper_frequencies(d: int) -> None:
    ref = paper_formula(POSITIONS, d)
    want = torch.cat((ref[:, 0::2], ref[:, 1::2]), dim=1)
    err = (sinusoidal_table(POSITIONS, d, layout="concat").double() - want).abs().max().item()
    assert err <= F32_VALUE_TOL


@pytest.mark.parametrize("d", [4, 5, 7, 8, 9, 63, 64, 511, 512, 1023, 1024])
def test_fairseq_layout_equals_fairseq_get_embedding(d: int) -> None:
    # fairseq SinusoidalPositionalEmbedding.get_embedding, re-stated in float64 with numpy.
    half = d // 2
    freq = np.exp(np.arange(half) * -(math.log(10000) / (half - 1)))
    ang = POSITIONS.numpy().astype(np.float64)[:, None] * freq[None, :]
    want = np.concatenate([np.sin(ang), np.cos(ang)], axis=1)
    if d % 2:
        want = np.concatenate([want, np.zeros((len(POSITIONS), 1))], axis=1)
    got = sinusoidal_table(POSITIONS, d, layout="fairseq").double().numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= F32_VALUE_TOL


@pytest.mark.parametrize("d", [4, 64, 512])
def test_interleaved_equals_the_common_pytorch_recipe(d: int) -> None:
    # The well-known recipe (annotated transformer / PyTorch tutorial), evaluated in float64 for
    # an exact layout check, and in float32 as usually written, where its float32 angle is off.
    # The recipe builds rows 0..max_len-1; its rows at POSITIONS are the same expressions with
    # `position` restricted to POSITIONS, which keeps the float64 check at 1e6 cheap.
    for dtype in (torch.float64, torch.float32):
        pos = POSITIONS if dtype == torch.float64 else POSITIONS[POSITIONS < 2048]
        position = pos.to(dtype).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d, 2, dtype=dtype) * (-math.log(10000.0) / d))
        pe = torch.zeros(len(pos), d, dtype=dtype)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        got = sinusoidal_table(pos, d).double()
        # float32 recipe: its angle pos*div_term carries a few ulp of |angle| of error.
        tol = F32_VALUE_TOL if dtype == torch.float64 else 4 * 2.0**-23 * 2048 + 1e-6
        assert (got - pe.double()).abs().max().item() <= tol


def test_any_shape_of_positions_and_dtype() -> None:
    pos = torch.randint(0, 10_000, (2, 3, 5))
    got = sinusoidal_table(pos, 16, dtype=torch.float64)
    assert got.shape == (2, 3, 5, 16) and got.dtype == torch.float64
    assert torch.equal(got[1, 2], sinusoidal_table(pos[1, 2], 16, dtype=torch.float64))


def test_module_works_past_its_cache_and_with_batched_positions() -> None:
    enc = SinusoidalEncoding(32, cache_len=16)
    x = torch.randn(2, 5, 32)
    pos = torch.tensor([[0, 1, 2, 3, 4], [100_000, 100_001, 100_002, 100_003, 100_004]])
    out = enc(x, pos)
    want = x + paper_formula(pos.flatten(), 32).view(2, 5, 32).float()
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)
    # default positions = arange(s), and explicit arange equals the default
    torch.testing.assert_close(enc(x), enc(x, torch.arange(5)))
    assert "cache" not in enc.state_dict()


def test_scale_input_multiplies_by_sqrt_dim() -> None:
    enc = SinusoidalEncoding(16, scale_input=True)
    x = torch.randn(1, 3, 16)
    want = x * 4.0 + sinusoidal_table(torch.arange(3), 16)
    torch.testing.assert_close(enc(x), want)


@pytest.mark.parametrize(
    ("call", "exc", "words"),
    [
        (lambda: sinusoidal_table(torch.arange(3), 7), ValueError, "dim must be even"),
        (
            lambda: sinusoidal_table(torch.arange(3.0), 8),
            TypeError,
            "positions must have an integer",
        ),
        (lambda: sinusoidal_table(torch.tensor([-1, 0]), 8), ValueError, "non-negative"),
        (
            lambda: sinusoidal_table(torch.arange(3), 8, layout="x"),
            ValueError,
            "layout must be one of",
        ),
        (
            lambda: sinusoidal_table([0, 1], 8),
            TypeError,
            "positions must be an integer torch.Tensor",
        ),
        (lambda: sinusoidal_table(torch.arange(3), 0), ValueError, "dim must be a positive"),
        (
            lambda: sinusoidal_table(torch.arange(3), 2, layout="fairseq"),
            ValueError,
            "dim must be >= 4",
        ),
        (lambda: SinusoidalEncoding(8)(torch.randn(2, 3)), ValueError, "x must be 3-D"),
        (
            lambda: SinusoidalEncoding(8)(torch.randn(1, 3, 8), torch.arange(4)),
            ValueError,
            "positions must have shape",
        ),
        (lambda: SinusoidalEncoding(8)(torch.randn(1, 3, 6)), ValueError, "last dimension"),
        (lambda: SinusoidalEncoding(8, cache_len=-1), ValueError, "cache_len must be a non-neg"),
        # Options that used to give NaN tables, or a 17 GB allocation, without a word.
        (lambda: SinusoidalEncoding(8, base=float("nan")), ValueError, "base must be a finite"),
        (lambda: SinusoidalEncoding(8, base=float("inf")), ValueError, "base must be a finite"),
        (lambda: SinusoidalEncoding(8, base="1e4"), TypeError, "base must be a finite number"),
        (lambda: sinusoidal_table(torch.arange(3), 8, base=math.nan), ValueError, "base must"),
        (lambda: SinusoidalEncoding(8, cache_len=2**31), ValueError, "cache_len must be <= "),
        (
            lambda: SinusoidalEncoding(8)(torch.arange(24).view(1, 3, 8)),
            TypeError,
            "x must be a floating-point tensor",
        ),
    ],
)
def test_bad_input_is_a_clear_error(call, exc, words) -> None:
    with pytest.raises(exc, match=words):
        call()


def test_every_dim_from_4_to_1024_in_every_layout() -> None:
    # Vectorised statement of the same formulas (pow, not exp/log as the code under test uses).
    pos = POSITIONS.double()[:, None]
    for d in range(4, 1025):
        half = d // 2
        i = torch.arange(half, dtype=torch.float64)
        if d % 2 == 0:
            ang = pos / 10000.0 ** (2 * i / d)
            inter = torch.stack((ang.sin(), ang.cos()), -1).flatten(1)
            got = sinusoidal_table(POSITIONS, d).double()
            assert (got - inter).abs().max() <= F32_VALUE_TOL, d
            got = sinusoidal_table(POSITIONS, d, layout="concat").double()
            assert (got - torch.cat((ang.sin(), ang.cos()), 1)).abs().max() <= F32_VALUE_TOL, d
        ang = pos / 10000.0 ** (i / (half - 1))
        fair = torch.nn.functional.pad(torch.cat((ang.sin(), ang.cos()), 1), (0, d % 2))
        got = sinusoidal_table(POSITIONS, d, layout="fairseq").double()
        assert (got - fair).abs().max() <= F32_VALUE_TOL, d


def test_a_cast_module_still_serves_the_float32_table() -> None:
    enc = SinusoidalEncoding(16, cache_len=8).to(torch.bfloat16)
    assert enc.table(torch.arange(3)).dtype == torch.float32
    torch.testing.assert_close(enc.table(torch.arange(3)), sinusoidal_table(torch.arange(3), 16))
