"""The fused Self-Extend and Dual Chunk Attention (:mod:`posenc.extend.methods.fused`: flash-kernel calls
over contiguous key slices merged by their log-sum-exp) against the explicit path
(:mod:`posenc.extend.methods.explicit`, itself tested against the papers' code in
``tests/test_extend_attention.py`` and ``tests/test_extend_hybrid.py``): prefill, a prefill after
a cache, decode, rows at different positions, inside plain and hybrid transformers models; where
the fused path does not apply (a padding mask, a soft cap) the explicit one runs; planted faults
(a neighbour band off by one, a wrong log-sum-exp merge) are caught.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import posenc.extend.methods.fused as fused
from _decode import hf_prefill_then_decode
from posenc.extend.methods.explicit import keyset_attention
from posenc.extend.methods.keysets import by_method
from posenc.hf import apply_posenc
from test_extend_attention import EXTENSIONS, tiny
from test_extend_hybrid import EXTENSIONS as HYBRID_EXTENSIONS
from test_extend_hybrid import tiny as hybrid_tiny

self_extend_attention = by_method(keyset_attention, "self_extend")
dual_chunk_attention = by_method(keyset_attention, "dual_chunk")

TOL = 1e-5
INV_FREQ = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
SELF_EXTEND = [(4, 8), (3, 7), (2, 1), (8, 64), (4, 300)]  # (group, window); 300: wider than t
DUAL_CHUNK = [(12, 4), (9, 2), (20, 3), (64, 8), (400, 3)]  # (chunk, local); 400: wider than t
SHAPES = [(45, 45), (200, 200), (30, 200), (5, 45), (1, 200), (1, 45)]  # (queries s, keys t)


def qkv(s: int, t: int, seed: int = 0, dv: int = 16) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 4, s, 16, generator=g),
        torch.randn(2, 2, t, 16, generator=g),
        torch.randn(2, 2, t, dv, generator=g),
    )


def both(method: str, s: int, t: int, shift: int = 0, dv: int = 16, **options: Any) -> float:
    """Largest difference of the fused and explicit paths: ``s`` queries, the last of ``t``
    keys, positions from 0 (batch row 1 ``shift`` later), values of ``dv`` channels."""
    q, k, v = qkv(s, t, dv=dv)
    pos = torch.arange(t - s, t).expand(2, -1) + torch.tensor([[0], [shift]])
    common = {"inv_freq": INV_FREQ, "scale": 0.25, **options}
    if method == "self_extend":
        want = self_extend_attention(q, k, v, pos, **common)
        got = by_method(fused.keyset, "self_extend")(q, k, v, pos, **common)
    else:
        want = dual_chunk_attention(q, k, v, pos, **common)
        got = by_method(fused.keyset, "dual_chunk")(q, k, v, pos, **common)
    return float((got - want).abs().max())


@pytest.fixture
def fused_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path or an error: nothing falls back to the explicit one unseen."""
    monkeypatch.setattr(fused, "PATH", "fused")


# --- attention level -----------------------------------------------------------------------------


@pytest.mark.parametrize("block", [512, 16, 7])
@pytest.mark.parametrize(("group", "window"), SELF_EXTEND)
def test_self_extend_fused_equals_explicit(
    monkeypatch: pytest.MonkeyPatch, fused_only: None, block: int, group: int, window: int
) -> None:
    monkeypatch.setattr(fused, "BLOCK", block)
    for s, t in SHAPES:
        diff = both("self_extend", s, t, group_size=group, neighbor_window=window)
        assert diff <= TOL, (s, t)


@pytest.mark.parametrize(("chunk", "local"), DUAL_CHUNK)
def test_dual_chunk_fused_equals_explicit(fused_only: None, chunk: int, local: int) -> None:
    for s, t in SHAPES:
        assert both("dual_chunk", s, t, chunk_size=chunk, local_size=local) <= TOL, (s, t)


@pytest.mark.parametrize("dv", [8, 24])
def test_values_narrower_or_wider_than_the_keys(fused_only: None, dv: int) -> None:
    """MiMo-V2's values are narrower than its keys, MLA's wider; the flash kernel takes one head
    size, so the fused path pads to it and gives the explicit path's ``[b, h, s, dv]``."""
    for s, t in SHAPES:
        assert both("self_extend", s, t, dv=dv, group_size=3, neighbor_window=7) <= TOL
        assert both("dual_chunk", s, t, dv=dv, chunk_size=12, local_size=4) <= TOL


@pytest.mark.parametrize("shift", [5, 13])
def test_rows_at_different_positions(fused_only: None, shift: int) -> None:
    """Batch rows whose positions start at different offsets (DCA's chunks then cut at
    different slots: one row at a time)."""
    for s, t in SHAPES:
        assert both("self_extend", s, t, shift, group_size=3, neighbor_window=7) <= TOL
        assert both("dual_chunk", s, t, shift, chunk_size=12, local_size=4) <= TOL


def test_planted_faults_are_caught(monkeypatch: pytest.MonkeyPatch, fused_only: None) -> None:
    """The comparisons above fail on a neighbour band one key too wide and on partial outputs
    merged without their log-sum-exp weights."""
    right_band, right_merge = fused._band, fused.merge

    def wide_band(rows: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return right_band(rows, w + 1, dtype, device)[:, : rows + w - 1]  # j = i - w too

    def plain_mean(parts: list[fused.Part], sinks: Any = None) -> torch.Tensor:
        return torch.stack([o.float() for o, _ in parts]).mean(0)

    monkeypatch.setattr(fused, "_band", wide_band)
    assert both("self_extend", 45, 45, group_size=3, neighbor_window=7) > 100 * TOL
    monkeypatch.setattr(fused, "_band", right_band)
    monkeypatch.setattr(fused, "merge", plain_mean)
    assert both("self_extend", 45, 45, group_size=3, neighbor_window=7) > 100 * TOL
    assert both("dual_chunk", 45, 45, chunk_size=12, local_size=4) > 100 * TOL
    monkeypatch.setattr(fused, "merge", right_merge)
    assert both("dual_chunk", 45, 45, chunk_size=12, local_size=4) <= TOL


def test_merge_is_the_softmax_over_the_union() -> None:
    q, k, v = qkv(6, 20)
    halves = [fused._call(q, k[:, :, a:b], v[:, :, a:b], 0.25) for a, b in ((0, 7), (7, 20))]
    whole = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), scale=0.25
    )
    assert float((fused.merge(halves) - whole).abs().max()) <= TOL


# --- inside transformers models ------------------------------------------------------------------


def prefill_and_decode(model: Any, ids: torch.Tensor, path: str) -> torch.Tensor:
    """Logits of a whole prefill, then of a 25-token prefill and one-token decode steps."""
    fused.PATH = path
    try:
        with torch.no_grad():
            whole = model(ids).logits
        steps = hf_prefill_then_decode(model, ids, 25)
    finally:
        fused.PATH = "auto"
    return torch.cat([whole, steps], 1)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("extension", EXTENSIONS, ids=lambda e: e["method"])
def test_patched_model_fused_equals_explicit(model_type: str, extension: dict) -> None:
    model = apply_posenc(tiny(model_type), extension=extension)
    ids = torch.randint(1, 64, (2, 40), generator=torch.Generator().manual_seed(3))
    got, want = (prefill_and_decode(model, ids, path) for path in ("fused", "explicit"))
    assert float((got - want).abs().max()) <= TOL


@pytest.mark.parametrize("model_type", ["gemma3_text", "smollm3"])
@pytest.mark.parametrize("extension", HYBRID_EXTENSIONS, ids=lambda e: e["method"])
def test_hybrid_fused_equals_explicit(model_type: str, extension: dict) -> None:
    """Eager hybrids: their causal ``[b, 1, s, t]`` masks run fused; sliding layers untouched."""
    model = apply_posenc(hybrid_tiny(model_type), extension=extension)
    ids = torch.randint(1, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    got, want = (prefill_and_decode(model, ids, path) for path in ("fused", "explicit"))
    assert float((got - want).abs().max()) <= TOL


def test_soft_cap_and_padding_run_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma-2's soft cap (the flash kernel takes none) and a padded batch fall back to the
    explicit path under ``"auto"`` and are refused under ``"fused"``."""
    gemma2 = apply_posenc(hybrid_tiny("gemma2"), extension=HYBRID_EXTENSIONS[0])
    ids = torch.randint(1, 97, (1, 30), generator=torch.Generator().manual_seed(5))
    got, want = (prefill_and_decode(gemma2, ids, path) for path in ("auto", "explicit"))
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="no soft cap"):
        prefill_and_decode(gemma2, ids, "fused")
    model = apply_posenc(tiny(), extension=EXTENSIONS[1])
    padded = torch.cat((torch.zeros(1, 7, dtype=torch.long), ids[:, :23] % 63 + 1), 1)
    mask = (padded != 0).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        auto = model(padded, attention_mask=mask, position_ids=positions).logits
        monkeypatch.setattr(fused, "PATH", "explicit")
        assert torch.equal(model(padded, attention_mask=mask, position_ids=positions).logits, auto)
        monkeypatch.setattr(fused, "PATH", "fused")
        with pytest.raises(ValueError, match="padding mask"):
            model(padded, attention_mask=mask, position_ids=positions)


def test_deepcopy_and_tables_keep_their_values() -> None:
    """The cached cos/sin tables are keyed by the frequencies' values, not only their memory."""
    q, k, v = qkv(20, 20)
    pos = torch.arange(20).expand(2, -1)
    for inv in (INV_FREQ, copy.deepcopy(INV_FREQ) * 3):
        common = {"inv_freq": inv, "scale": 0.25, "group_size": 3, "neighbor_window": 7}
        got = by_method(fused.keyset_fused, "self_extend")(q, k, v, pos, **common)
        assert float((got - self_extend_attention(q, k, v, pos, **common)).abs().max()) <= TOL


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head", [16, 20])  # 20: four dims past the rotary ones, passed through
def test_native_rotation_equals_the_reference(layout: str, dtype: torch.dtype, head: int) -> None:
    """The native CPU kernel's rotation (keys of a decode step: grouped, chunk-relative
    positions) is the reference's to the bit; with a gradient to record the reference runs."""
    if fused.cpu_kernel_status():
        pytest.skip(f"no native CPU kernel: {fused.cpu_kernel_status()}")
    x = torch.randn(2, 3, 300, head, generator=torch.Generator().manual_seed(1)).to(dtype)
    pos = torch.stack([torch.arange(300) // 3, torch.arange(300) % 37 + 5000])  # [2, 300]
    rope = {"inv_freq": INV_FREQ, "attention_scaling": 0.8, "layout": layout}
    cos, sin = fused._table(INV_FREQ, 0.8, 5037)
    want = fused.apply_rotary_reference(x, cos[0][pos][:, None], sin[0][pos][:, None], layout)
    assert fused._native(x)
    assert torch.equal(fused._rotate(x, pos, rope), want)
    leaf = x.float().requires_grad_()
    assert not fused._native(leaf)
    fused._rotate(leaf, pos, rope).sum().backward()
    assert leaf.grad is not None
