"""FoPE against the code Intern-S1-Pro ships (transformers has no FoPE class).

The reference is the released remote code (``modeling_interns1_pro.py`` of internlm/Intern-S1-Pro,
with its ``modeling_rope_utils.py``), restated here independently of posenc:
``_compute_fope_parameters`` (keep ``inv_freq > 2 pi / max_position_embeddings`` or the first
``num_inv_freq``), ``InternS1ProMoeTextFourierEmbedding.forward`` (cos/sin of the kept waves times
learned coefficients, one set per KV head with ``fope_sep_head``, padded with ones to ``d/2``,
then ``cat(x, x)``) and ``apply_rotary_pos_emb_sep`` (``repeat_kv`` of the tables for the query
heads, then ``x * cos + rotate_half(x) * sin``).
"""

from __future__ import annotations

import math
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from posenc.hf import fope_from_hf, rope_from_hf
from posenc.kernels import apply_rotary_reference
from posenc.rotary import FoPE, apply_fope

# Intern-S1-Pro's config.json (internlm/Intern-S1-Pro), its text_config's position keys verbatim.
INTERN_S1_PRO_TEXT = {
    "head_dim": 128, "hidden_size": 4096, "max_position_embeddings": 262144,
    "model_type": "interns1_pro_text", "num_attention_heads": 64, "num_key_value_heads": 4,
    "rope_scaling": {"rope_type": "default", "fope_init_factor": 0.5, "fope_sep_head": True,
                     "num_inv_freq": None},
    "rope_theta": 5000000,
}  # fmt: skip


# --- the released code, restated --------------------------------------------------------------


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ReferenceFoPE(nn.Module):
    """Intern-S1-Pro's Fourier embedding: ``forward(x [b, s, *], position_ids [b, s])`` ->
    cat-layout ``cos, sin [b, hk, s, d]`` (``[b, s, d]`` without sep_head)."""

    def __init__(self, head_dim: int, hk: int, base: float, max_pos: int,
                 num_inv_freq: int | None, sep_head: bool, seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim
        inv_freq = 1.0 / (base**exps)
        if num_inv_freq is not None:
            inv_freq = inv_freq[:num_inv_freq]
        else:
            inv_freq = inv_freq[inv_freq > (2.0 * torch.pi / max_pos)]
        self.inv_freq, self.head_dim, self.hk, self.sep_head = inv_freq, head_dim, hk, sep_head
        m = inv_freq.shape[-1]
        g = torch.Generator().manual_seed(seed)
        shape = (hk, m, m) if sep_head else (m, m)
        # a trained model's coefficients: identity plus noise, distinct per head
        self.sin_coef = torch.eye(m) + 0.3 * torch.randn(shape, generator=g)
        self.cos_coef = torch.eye(m) + 0.3 * torch.randn(shape, generator=g)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        b, s = position_ids.shape
        f = self.inv_freq[None, :, None].float().expand(b, -1, 1)
        freqs = (f @ position_ids[:, None, :].float()).transpose(1, 2)  # [b, s, m]
        if self.sep_head:
            pc = freqs.cos().unsqueeze(1).expand(b, self.hk, s, -1)
            ps = freqs.sin().unsqueeze(1).expand(b, self.hk, s, -1)
            sin = torch.einsum("bhtD, hDd -> bhtd", ps, self.sin_coef.float())
            cos = torch.einsum("bhtD, hDd -> bhtd", pc, self.cos_coef.float())
        else:
            sin = torch.einsum("btD, Dd -> btd", freqs.sin(), self.sin_coef.float())
            cos = torch.einsum("btD, Dd -> btd", freqs.cos(), self.cos_coef.float())
        pad = (0, self.head_dim // 2 - sin.size(-1))
        sin, cos = F.pad(sin, pad, mode="constant", value=1), F.pad(cos, pad, value=1)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def reference_apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    *_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``apply_rotary_pos_emb_sep`` (tables [b, hk, s, d]) or ``apply_rotary_pos_emb`` ([b, s, d])."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    groups = q.shape[1] // cos.shape[1]
    cq = cos[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)  # repeat_kv
    sq = sin[:, :, None].expand(-1, -1, groups, -1, -1).flatten(1, 2)
    return q * cq + _rotate_half(q) * sq, k * cos + _rotate_half(k) * sin


def _loaded(ref: ReferenceFoPE, fope: FoPE) -> FoPE:
    """posenc's module with the reference's coefficients, loaded by their checkpoint names."""
    fope.load_state_dict({"cos_coef": ref.cos_coef, "sin_coef": ref.sin_coef})
    return fope


# --- parity -----------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["dict", "object", "full"])
def test_intern_s1_pro_config_matches_the_released_code(source: str) -> None:
    text = INTERN_S1_PRO_TEXT
    cfg: Any = {
        "dict": text,
        "object": types.SimpleNamespace(**text),
        "full": {"model_type": "interns1_pro", "text_config": text},
    }[source]
    fope = fope_from_hf(cfg)
    ref = ReferenceFoPE(128, 4, 5000000, 262144, None, True)
    assert fope.inv_freq.numel() == ref.inv_freq.numel() == 45  # 2 pi / f < 262144
    assert torch.equal(fope.inv_freq, ref.inv_freq)
    _loaded(ref, fope)
    positions = torch.tensor([[0, 1, 9, 1000, 262143, 4 * 262144 - 1]])
    cos_t, sin_t = ref(torch.zeros(1, 6, 1), positions)  # [1, 4, s, 128]
    cos, sin = fope.cos_sin(positions)  # [1, 4, s, 64]
    assert (cos - cos_t[..., :64]).abs().max().item() <= 1e-6
    assert (sin - sin_t[..., :64]).abs().max().item() <= 1e-6
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(1, 8, 6, 128, generator=g), torch.randn(1, 4, 6, 128, generator=g)
    for ours, theirs in zip(
        fope(q, k, positions), reference_apply(q, k, cos_t, sin_t), strict=True
    ):
        assert (ours - theirs).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="FoPE"):
        rope_from_hf(cfg if source != "object" else text)  # refused: learned cos/sin


@pytest.mark.parametrize("sep_head", [True, False])
@pytest.mark.parametrize("num_inv_freq", [None, 5])
def test_fope_variants_match_the_released_code(sep_head: bool, num_inv_freq: int | None) -> None:
    ref = ReferenceFoPE(32, 2, 10000.0, 512, num_inv_freq, sep_head, seed=3)
    fope = _loaded(ref, FoPE(32, 2, 10000.0, 512, num_inv_freq=num_inv_freq, sep_head=sep_head))
    positions = torch.tensor([[0, 3, 511, 2047], [5, 6, 7, 8]])  # [b, s]
    cos_t, sin_t = ref(torch.zeros(2, 4, 1), positions)
    q, k = torch.randn(2, 6, 4, 32), torch.randn(2, 2, 4, 32)
    for ours, theirs in zip(
        fope(q, k, positions), reference_apply(q, k, cos_t, sin_t), strict=True
    ):
        assert (ours - theirs).abs().max().item() <= 1e-5


def test_identity_coefficients_are_rope_on_the_kept_frequencies() -> None:
    """Independent of the released code: ``C = S = I`` rotates the kept pairs by ``p f`` (float64
    formula) and maps each dropped pair (x, y) to (x - y, y + x), the padded ones' cos = sin = 1."""
    fope = FoPE(16, 1, 10000.0, 64, init_factor=0.0)
    m = fope.inv_freq.numel()
    assert m == 3  # 10000^(-2i/16) > 2 pi / 64 for i = 0, 1, 2
    x = torch.randn(1, 1, 5, 16, dtype=torch.float64)
    p = torch.arange(5, dtype=torch.float64)[:, None]
    f = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    c, s = torch.cos(p * f), torch.sin(p * f)  # [s, 8]
    c[:, m:], s[:, m:] = 1.0, 1.0
    x1, x2 = x[..., :8], x[..., 8:]
    want = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    got, _ = fope(x.float(), x.float())
    assert (got.double() - want).abs().max().item() <= 1e-5
    assert math.isclose(float(fope.inv_freq[-1]), 0.1, rel_tol=1e-6)


def test_errors_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="num_inv_freq must be <="):
        FoPE(16, 1, num_inv_freq=9)
    with pytest.raises(ValueError, match="KV heads"):
        FoPE(16, 2)(torch.randn(1, 4, 3, 16), torch.randn(1, 1, 3, 16))
    with pytest.raises(ValueError, match="no FoPE"):
        fope_from_hf({**INTERN_S1_PRO_TEXT, "rope_scaling": {"rope_type": "default"}})
    with pytest.raises(ValueError, match="rope_type 'default'"):
        fope_from_hf({**INTERN_S1_PRO_TEXT, "rope_scaling": {
            **INTERN_S1_PRO_TEXT["rope_scaling"], "rope_type": "yarn"}})  # fmt: skip


# --- a tiny model: transformers' Qwen3 with the released FoPE, against posenc's -----------------

transformers = pytest.importorskip("transformers")


class _PosencTables(nn.Module):
    """The model's rotary module replaced: posenc's FoPE tables (optionally with a fault)."""

    def __init__(self, fope: FoPE, fault: str | None) -> None:
        super().__init__()
        self.fope, self.fault = fope, fault

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> Any:
        cos, sin = self.fope.cos_sin(position_ids)  # [b, hk, s, d/2]
        m = self.fope.inv_freq.numel()
        if self.fault == "zero_pad":  # dropped pairs left unrotated (cos 1, sin 0)
            sin = torch.cat((sin[..., :m], torch.zeros_like(sin[..., m:])), -1)
        if self.fault == "swapped":
            cos, sin = self.fope.cos_sin(position_ids)[::-1]
        return cos, sin


def _posenc_apply(fault: str | None) -> Any:
    def apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *_: Any,
              **__: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        if fault == "tiled":  # query head j given KV head j % hk instead of j // (h / hk)
            reps = q.shape[1] // cos.shape[1]
            cq, sq = cos.repeat(1, reps, 1, 1), sin.repeat(1, reps, 1, 1)  # [b, h, s, d/2]
            q_rot = apply_rotary_reference(q, cq, sq, "half")
            return q_rot, apply_rotary_reference(k, cos, sin, "half")
        return apply_fope(q, k, cos, sin)

    return apply


def _logits_diff(monkeypatch: Any, fault: str | None = None) -> float:
    from transformers.models.qwen3 import modeling_qwen3

    config = transformers.Qwen3Config(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 40))
    positions = torch.arange(40)[None].expand(2, -1) + torch.tensor([[0], [100]])  # past 64
    ref = ReferenceFoPE(16, 2, config.rope_parameters["rope_theta"], 64, None, True, seed=5)
    fope = _loaded(ref, FoPE(16, 2, config.rope_parameters["rope_theta"], 64))
    logits = []
    for rotary, apply in (
        (ref, reference_apply),
        (_PosencTables(fope, fault), _posenc_apply(fault)),
    ):
        model.model.rotary_emb = rotary  # (a local model: monkeypatch would delete it after)
        with monkeypatch.context() as m:
            m.setattr(modeling_qwen3, "apply_rotary_pos_emb", apply)
            with torch.no_grad():
                logits.append(model(ids, position_ids=positions, use_cache=False).logits)
    return (logits[0] - logits[1]).abs().max().item()


def test_tiny_model_logits_match_the_released_fope(monkeypatch: Any) -> None:
    assert _logits_diff(monkeypatch) <= 1e-5


@pytest.mark.parametrize("fault", ["zero_pad", "swapped", "tiled"])
def test_planted_faults_are_caught(monkeypatch: Any, fault: str) -> None:
    assert _logits_diff(monkeypatch, fault) > 1e-3
