"""Learned tables: limits, 1-D interpolation, ViT grid resampling against timm, 2-D sin-cos."""

import numpy as np
import pytest
import torch

from _timm_ref import timm_module
from posenc.absolute import Learned2D, LearnedEncoding
from posenc.functional import resample_1d, sincos_2d

timm_pos_embed = timm_module("pos_embed")
timm_sincos = timm_module("pos_embed_sincos")
needs_timm = pytest.mark.skipif(timm_pos_embed is None, reason="timm is not installed")


def test_learned_adds_rows_and_names_the_limit() -> None:
    enc = LearnedEncoding(8, 4)
    x = torch.randn(2, 3, 4)
    pos = torch.tensor([[0, 1, 2], [5, 6, 7]])
    torch.testing.assert_close(enc(x, pos), x + enc.weight[pos])
    torch.testing.assert_close(enc(x), x + enc.weight[:3])
    with pytest.raises(
        ValueError,
        match=r"positions must be in 0..7 for a learned table of max_positions=8, got position 8",
    ):
        enc(x, torch.tensor([6, 7, 8]))
    assert list(enc.state_dict()) == ["weight"]


def test_learned_resized_interpolates_linearly() -> None:
    enc = LearnedEncoding(4, 3)
    big = enc.resized(8)
    assert big.max_positions == 8 and big.weight.shape == (8, 3)
    # align_corners=False, factor 2: new row j samples old coordinate (j + 0.5) / 2 - 0.5,
    # clamped at the ends; written out as a naive loop.
    w = enc.weight.detach()
    for j in range(8):
        c = min(max((j + 0.5) / 2 - 0.5, 0.0), 3.0)
        lo = int(np.floor(c))
        hi = min(lo + 1, 3)
        want = w[lo] * (1 - (c - lo)) + w[hi] * (c - lo)
        torch.testing.assert_close(big.weight[j], want)
    with pytest.raises(ValueError, match="mode must be one of"):
        resample_1d(w, 8, mode="cubic")


@needs_timm
@pytest.mark.parametrize(
    ("old", "new", "prefix", "mode", "antialias"),
    [
        ((14, 14), (16, 16), 1, "bicubic", True),
        ((14, 14), (7, 7), 1, "bicubic", True),
        ((14, 14), (7, 7), 1, "bicubic", False),
        ((8, 6), (12, 10), 0, "bilinear", True),
        ((4, 4), (9, 5), 5, "nearest", False),
        ((6, 6), (3, 3), 2, "area", False),
    ],
)
def test_learned2d_resample_equals_timm(old, new, prefix, mode, antialias) -> None:
    assert timm_pos_embed is not None
    enc = Learned2D(old[0], old[1], 24, num_prefix_tokens=prefix)
    got = enc.resample(new, mode=mode, antialias=antialias).weight
    want = timm_pos_embed.resample_abs_pos_embed(
        enc.weight.detach()[None],
        list(new),
        old_size=list(old),
        num_prefix_tokens=prefix,
        interpolation=mode,
        antialias=antialias,
    )[0]
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[:prefix], enc.weight[:prefix])  # prefix rows unchanged


def test_learned2d_checks_its_input() -> None:
    enc = Learned2D(2, 3, 8, num_prefix_tokens=1)
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(enc(x), x + enc.weight)
    with pytest.raises(ValueError, match=r"x must be \[batch, 7, 8\]"):
        enc(torch.randn(2, 8, 8))
    with pytest.raises(ValueError, match="num_prefix_tokens=2 does not match"):
        enc.resample((3, 3), num_prefix_tokens=2)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="num_prefix_tokens must be an integer >= 0"):
            Learned2D(2, 3, 8, num_prefix_tokens=bad)


def mae_2d(dim: int, gh: int, gw: int) -> np.ndarray:
    """MAE's get_2d_sincos_pos_embed, re-stated with numpy (meshgrid(w, h): column first)."""

    def one_d(d: int, pos: np.ndarray) -> np.ndarray:
        omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid = np.stack(np.meshgrid(np.arange(gw, dtype=np.float64), np.arange(gh, dtype=np.float64)))
    return np.concatenate([one_d(dim // 2, grid[0]), one_d(dim // 2, grid[1])], axis=1)


@pytest.mark.parametrize(("gh", "gw", "dim"), [(4, 4, 16), (14, 14, 768), (3, 5, 32)])
def test_sincos_2d_mae_layout(gh: int, gw: int, dim: int) -> None:
    got = sincos_2d(gh, gw, dim, layout="mae").double().numpy()
    assert np.abs(got - mae_2d(dim, gh, gw)).max() <= 2.0**-24 * 1.01


@pytest.mark.skipif(timm_sincos is None, reason="timm is not installed")
@pytest.mark.parametrize(("gh", "gw", "dim"), [(4, 4, 16), (7, 5, 64)])
def test_sincos_2d_timm_layout(gh: int, gw: int, dim: int) -> None:
    assert timm_sincos is not None
    want = timm_sincos.build_sincos2d_pos_embed([gh, gw], dim=dim)
    torch.testing.assert_close(sincos_2d(gh, gw, dim, layout="timm"), want, atol=1e-6, rtol=0)


def test_sincos_2d_bad_input() -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        sincos_2d(4, 4, 18)
    with pytest.raises(ValueError, match="grid_h must be a positive integer"):
        sincos_2d(0, 4, 16)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: LearnedEncoding(8, 4, init_std=float("nan")), "init_std must be a finite"),
        (lambda: LearnedEncoding(8, 4, init_std=-0.5), "init_std must be a finite number >= 0"),
        (lambda: Learned2D(2, 2, 4, init_std=float("inf")), "init_std must be a finite"),
        # A table sized past 2**28 values is an error naming the option, not a 17 GB allocation.
        (lambda: LearnedEncoding(2**40, 4), "max_positions must be <= 67108864"),
        (lambda: Learned2D(2**20, 2**20, 4), r"grid_h \* grid_w must be <= 67108864"),
    ],
)
def test_bad_options_are_clear_errors(call, words) -> None:
    with pytest.raises(ValueError, match=words):
        call()
