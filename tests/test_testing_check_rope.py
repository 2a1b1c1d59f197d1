"""posenc.testing.check_rope on real implementations.

(a) transformers' own rotary class and its modeling module's rotation pass for every published
config of tests/data/hf_configs, every layer type, float32 and bf16;
(b) copies of them with one planted fault each fail, and the report names the probe;
(c) rotary-embedding-torch and torchtune, where they claim what a config says (skipped cleanly
when the library is missing).
"""

from __future__ import annotations

import copy
import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from posenc.hf import rope_from_hf
from posenc.kernels.reference import apply_rotary_reference
from posenc.testing import RopeReport, check_rope, rope_layer_types, rope_probes

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from test_hf_corpus import (  # noqa: E402  (the corpus and transformers' side of its parity test)
    NAMES,
    hf_text_config,
    is_flagged_interleave,
    load,
    modeling,
    reference_rotation,
    rotary_class,
)

Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], Any]
# Small probes keep the corpus fast: one row, one head pair, short dense switch probes.
FAST = {"batch": 2, "heads": 2, "kv_heads": 1, "dense_limit": 4097}


# --- transformers as an implementation ----------------------------------------------------------


def _rotary_dim(out: Any) -> int:
    """The rotated channels of a rotary class's output at positions 1..8 (not 0: all cos 1)."""
    if isinstance(out, torch.Tensor):  # complex e^{i angle}, one per pair
        return 2 * out.shape[-1]
    t = out[0]
    n = t.shape[-1] // 2
    doubled = torch.equal(t[..., :n], t[..., n:]) or torch.equal(t[..., ::2], t[..., 1::2])
    return t.shape[-1] if doubled else 2 * t.shape[-1]


def _interleave(x: torch.Tensor, r: int) -> torch.Tensor:
    """transformers' de-interleaved MLA output ``[x0' x2' | x1' x3']`` back to pair order."""
    rot = x[..., :r]
    pairs = torch.stack((rot[..., : r // 2], rot[..., r // 2 :]), dim=-1).flatten(-2)
    return torch.cat((pairs, x[..., r:]), dim=-1)


def transformers_impl(raw: dict[str, Any], kind: str = "qk") -> Impl:
    """The model's ``*RotaryEmbedding`` (built fresh per call: dynamic NTK keeps the longest
    length it has seen) and its modeling module's apply function, as a check_rope impl."""
    text = hf_text_config(raw)
    module, rotary = modeling(text), rotary_class(modeling(text))
    dims: dict[Any, int] = {}

    def impl(q: torch.Tensor, k: torch.Tensor, position_ids: torch.Tensor, layer_type: Any):
        extra = () if layer_type is None else (layer_type,)
        if layer_type not in dims:
            dims[layer_type] = _rotary_dim(
                rotary(text)(torch.zeros(1), torch.arange(1, 9)[None], *extra)
            )
        out = rotary(text)(q, position_ids, *extra)
        if kind == "cos_sin":
            if text.model_type in ("gptj", "codegen"):
                return out[1], out[0]  # GPT-J returns (sin, cos)
            return out
        r = dims[layer_type]
        qr, kr = reference_rotation(module, text, r, q, k, out)
        if is_flagged_interleave(text):
            qr, kr = _interleave(qr, r), _interleave(kr, r)
        return qr, kr

    return impl


def _max_position(raw: dict[str, Any]) -> int | None:
    """GPT-J's sin/cos table has max_position_embeddings rows: nothing exists past it."""
    text = hf_text_config(raw)
    return text.max_position_embeddings - 1 if text.model_type in ("gptj", "codegen") else None


@pytest.mark.parametrize("name", NAMES)
def test_transformers_passes_on_the_corpus(name: str) -> None:
    raw = load(name)
    report = check_rope(transformers_impl(raw), raw, max_position=_max_position(raw), **FAST)
    assert report.ok, report
    assert {r.layer_type for r in report.results} == {lt for lt, _ in rope_layer_types(raw)}
    assert {r.dtype for r in report.results} == {"float32", "bfloat16"}


@pytest.mark.parametrize(
    "name", ["llama-3.1-8b-instruct", "phi-3.5-mini-instruct", "gemma-3-4b-it", "qwen3-vl-8b-instruct",
             "deepseek-v2-lite", "gpt-j-6b", "gpt-neox-20b"]
)  # fmt: skip
def test_transformers_cos_sin_passes(name: str) -> None:
    """The rotary class alone, as a cos/sin implementation (tables and the rotation by them)."""
    raw = load(name)
    impl = transformers_impl(raw, kind="cos_sin")
    report = check_rope(impl, raw, max_position=_max_position(raw), kind="cos_sin", **FAST)
    assert report.ok, report
    assert all(r.cos_sin_err is not None for r in report.results)


def test_dynamic_ntk_switch_against_transformers() -> None:
    """No corpus file uses dynamic NTK: a Llama config with it, switch at max_position."""
    raw = {
        "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4,
        "max_position_embeddings": 2048, "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "dynamic", "factor": 4.0},
    }  # fmt: skip
    report = check_rope(transformers_impl(raw), raw, **FAST)
    assert report.ok, report
    names = {r.probe for r in report.results}
    assert {"dynamic_switch_M", "dynamic_switch_M+1", "dynamic_grown_2M"} <= names


# --- (b) planted faults -----------------------------------------------------------------------


def _failed_first(report: RopeReport) -> str:
    assert not report.ok, report
    return report.failures[0].probe


def test_fault_half_and_interleaved_swapped() -> None:
    raw = load("llama-3.1-8b-instruct")
    text = hf_text_config(raw)
    rotary = rotary_class(modeling(text))

    def interleaved(q, k, position_ids, layer_type):  # Llama's tables, GPT-J's pairing
        cos, sin = rotary(text)(q, position_ids)
        n = cos.shape[-1] // 2
        c = cos[..., :n].repeat_interleave(2, -1)[:, None]
        s = sin[..., :n].repeat_interleave(2, -1)[:, None]

        def turn(x):  # [x0 x1 x2 x3] -> [-x1 x0 -x3 x2]
            return torch.stack((-x[..., 1::2], x[..., 0::2]), -1).flatten(-2)

        return q * c + turn(q) * s, k * c + turn(k) * s

    report = check_rope(interleaved, raw, **FAST)
    assert _failed_first(report) == "first_64", report
    assert all(r.passed for r in report.results if r.probe == "position_0")
    assert report.failures[0].first_failing_position == 1


def test_fault_theta_10000() -> None:
    raw = load("llama-3.1-8b-instruct")  # rope_theta 500000
    wrong = copy.deepcopy(raw)
    wrong["rope_theta"] = 10000.0
    report = check_rope(transformers_impl(wrong), raw, **FAST)
    assert _failed_first(report) == "first_64", report
    assert "first_64" in str(report).splitlines()[0]


def test_fault_position_ids_ignored() -> None:
    """arange(s) instead of the position ids: right on first_64, wrong on sparse positions."""
    raw = load("qwen3-0.6b")
    good = transformers_impl(raw)

    def arange(q, k, position_ids, layer_type):
        return good(q, k, torch.arange(q.shape[2]).expand_as(position_ids), layer_type)

    report = check_rope(arange, raw, **FAST)
    assert _failed_first(report) == "max_position-1", report
    failed = {r.probe for r in report.failures}
    assert {"random_far", "decode_far", "batched_offsets", "left_padded"} <= failed
    assert "first_64" not in failed


OLMO3_STYLE = {
    "model_type": "olmo3", "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 4, "num_hidden_layers": 4, "max_position_embeddings": 65536,
    "layer_types": ["sliding_attention"] * 3 + ["full_attention"], "sliding_window": 4096,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
        "full_attention": {
            "rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
            "original_max_position_embeddings": 8192, "attention_factor": 1.2079441541679836,
            "beta_fast": 32.0, "beta_slow": 1.0,
        },
    },
}  # fmt: skip


def test_fault_yarn_on_the_sliding_layers() -> None:
    assert [lt for lt, _ in rope_layer_types(OLMO3_STYLE)] == [
        "sliding_attention",
        "full_attention",
    ]
    good = transformers_impl(OLMO3_STYLE)
    assert check_rope(good, OLMO3_STYLE, **FAST).ok

    def yarn_everywhere(q, k, position_ids, layer_type):
        return good(q, k, position_ids, "full_attention")

    report = check_rope(yarn_everywhere, OLMO3_STYLE, **FAST)
    first = report.failures[0]
    assert (first.layer_type, first.probe) == ("sliding_attention", "position_0"), report
    assert all(r.passed for r in report.results if r.layer_type == "full_attention")


def _longrope_switch(name: str, shift: int) -> Impl:
    """transformers' LongRoPE with the switch to the long factors moved by ``shift`` positions:
    long factors when ``max(position_ids) + 1 > L + shift``."""
    raw = load(name)
    text = hf_text_config(raw)
    module, rotary = modeling(text), rotary_class(modeling(text))
    orig = text.rope_parameters["original_max_position_embeddings"]

    def impl(q, k, position_ids, layer_type):
        rot = rotary(text)
        rot(q, torch.tensor([[orig]]))  # a long call: rot.inv_freq now holds the long set
        long = int(position_ids.max()) + 1 > orig + shift
        inv = rot.inv_freq if long else rot.original_inv_freq
        freqs = position_ids[..., None].float() * inv  # [b, s, n]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * rot.attention_scaling).to(q.dtype)
        sin = (emb.sin() * rot.attention_scaling).to(q.dtype)
        return module.apply_rotary_pos_emb(q, k, cos, sin)

    return impl


@pytest.mark.parametrize("name", ["phi-3.5-mini-instruct", "phi-4-mini-instruct"])
def test_fault_longrope_switch_one_position_off(name: str) -> None:
    raw = load(name)
    assert check_rope(_longrope_switch(name, 0), raw, **FAST).ok
    late = check_rope(_longrope_switch(name, 1), raw, **FAST)
    assert _failed_first(late) == "longrope_switch_L+1", late
    assert {r.probe for r in late.failures} == {"longrope_switch_L+1"}, late
    early = check_rope(_longrope_switch(name, -1), raw, **FAST)
    assert {r.probe for r in early.failures} == {"longrope_switch_L"}, early


def test_phi3_mini_4k_is_not_longrope() -> None:
    names = {
        p.name for p in rope_probes(4096, rope_from_hf(load("phi-3-mini-4k-instruct")).scaling)[0]
    }
    assert not any(n.startswith("longrope") for n in names)


# --- (c) other libraries ----------------------------------------------------------------------


def _torchtune_module(path: str) -> Any:
    """A torchtune source file loaded alone: its package __init__ needs torchao (and more),
    the position-embedding files only torch."""
    spec = importlib.util.find_spec("torchtune")
    if spec is None or spec.origin is None:
        pytest.skip("torchtune is not installed")
    file = Path(spec.origin).parent / path
    module_spec = importlib.util.spec_from_file_location(f"_torchtune_{file.stem}", file)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


PLAIN = {
    "model_type": "llama", "hidden_size": 512, "num_attention_heads": 4,
    "max_position_embeddings": 4096, "rope_theta": 10000.0,
}  # fmt: skip


def test_rotary_embedding_torch_is_gptj_rope() -> None:
    """lucidrains' RotaryEmbedding(dim=64): GPT-J-6B's rotation (64 of 256 channels, pairs
    (x[2i], x[2i+1]), theta 10000), fed the position ids through ``forward(positions)``."""
    ret = pytest.importorskip("rotary_embedding_torch")
    rot = ret.RotaryEmbedding(dim=64)

    def impl(q, k, position_ids, layer_type):
        freqs = rot(position_ids.float())[:, None]  # [b, 1, s, 64] angles
        return ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)

    report = check_rope(impl, load("gpt-j-6b"), **FAST)
    assert report.ok, report


def test_rotary_embedding_torch_interpolate_factor_is_linear_scaling() -> None:
    ret = pytest.importorskip("rotary_embedding_torch")
    rot = ret.RotaryEmbedding(dim=128, interpolate_factor=4.0)
    config = {**PLAIN, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}

    def impl(q, k, position_ids, layer_type):
        freqs = rot(position_ids.float() / 4.0)[:, None]  # forward() does not divide
        return ret.apply_rotary_emb(freqs, q), ret.apply_rotary_emb(freqs, k)

    assert check_rope(impl, config, layout="interleaved", **FAST).ok


def test_rotary_embedding_torch_rotate_queries_or_keys_in_bf16() -> None:
    """rotate_queries_or_keys(t, offset=) builds its positions in t's dtype: in bf16 a position
    past 256 is rounded (to a multiple of 2, 4, ...), so far positions fail in bf16 only."""
    ret = pytest.importorskip("rotary_embedding_torch")
    rot = ret.RotaryEmbedding(dim=128, cache_if_possible=False)

    def impl(q, k, position_ids, layer_type):
        rows = []
        for b in range(q.shape[0]):
            start = int(position_ids[b, 0])
            if not torch.equal(position_ids[b], torch.arange(start, start + q.shape[2])):
                raise NotImplementedError("rotate_queries_or_keys takes contiguous positions")
            rows.append(
                tuple(rot.rotate_queries_or_keys(x[b : b + 1], offset=start) for x in (q, k))
            )
        return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])

    contiguous = ("position_0", "first_64", "batched_offsets", "decode_far")
    report = check_rope(impl, PLAIN, layout="interleaved", probes=contiguous, **FAST)
    fails = {(r.dtype, r.probe) for r in report.failures}
    assert fails == {("bfloat16", "batched_offsets"), ("bfloat16", "decode_far")}, report
    decode, offsets = report.failures  # the figures docs/testing.md gives
    assert (decode.probe, decode.first_failing_position) == ("decode_far", 15887)
    assert offsets.first_failing_position == 8193
    assert 0.4 < decode.q_err < 0.6 and 0.4 < offsets.q_err < 0.6


def test_torchtune_rope_is_plain_interleaved_rope() -> None:
    tt = _torchtune_module("modules/position_embeddings.py")
    rope = tt.RotaryPositionalEmbeddings(dim=128, max_seq_len=4 * 4096, base=10000)

    def impl(q, k, position_ids, layer_type):  # torchtune rotates [b, s, h, d]
        def one(x):
            return rope(x.transpose(1, 2), input_pos=position_ids).transpose(1, 2)

        return one(q), one(k)

    assert check_rope(impl, PLAIN, layout="interleaved", **FAST).ok


def test_torchtune_llama3_scaled_rope_is_llama_3_1() -> None:
    tt = _torchtune_module("models/llama3_1/_position_embeddings.py")
    raw = load("llama-3.1-8b-instruct")
    n = raw["max_position_embeddings"]
    rope = tt.Llama3ScaledRoPE(dim=128, max_seq_len=n, base=500000, scale_factor=8)

    def impl(q, k, position_ids, layer_type):
        def one(x):
            return rope(x.transpose(1, 2), input_pos=position_ids).transpose(1, 2)

        return one(q), one(k)

    # Meta's layout (pairs x[2i], x[2i+1]); its cache holds max_seq_len rows.
    report = check_rope(impl, raw, layout="interleaved", max_position=n - 1, **FAST)
    assert report.ok, report


def test_float32_slack_covers_another_frequency_formula() -> None:
    """exp(-ln(base) 2i / d) in float32: 2-3x the reference's own float32 error far out, inside
    the default slack (4), outside a slack of 2 (the figure SLACK's comment gives)."""

    def exp_formula(q, k, position_ids, layer_type):
        d = q.shape[-1]
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float32) / d)
        angles = position_ids[..., None].float() * inv_freq  # [b, s, d/2]
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        return tuple(apply_rotary_reference(x, cos, sin) for x in (q, k))

    report = check_rope(exp_formula, PLAIN, dtypes=(torch.float32,), **FAST)
    assert report.ok, report
    ratio = max(
        max(r.q_err, r.k_err) / (r.threshold / 4) for r in report.results if r.threshold > 1e-6
    )
    assert 2 < ratio < 3, ratio
    assert not check_rope(exp_formula, PLAIN, dtypes=(torch.float32,), slack=2.0, **FAST).ok


def test_arguments_are_checked() -> None:
    rope = rope_from_hf(PLAIN)

    def impl(q, k, position_ids, layer_type):
        return rope(q, k, position_ids)

    with pytest.raises(ValueError, match="kind must be one of"):
        check_rope(impl, PLAIN, kind="angles")
    with pytest.raises(ValueError, match="dtypes must be among"):
        check_rope(impl, PLAIN, dtypes=(torch.float64,))
    with pytest.raises(ValueError, match=r"layer_types \['full_attention'\] are not in the config"):
        check_rope(impl, PLAIN, layer_types=["full_attention"])
    report = check_rope(impl, PLAIN, kind="cos_sin", probes=["first_64"])
    assert [r.note for r in report.results] == ["did not return cos, sin [b, s, w] tensors"] * 2


# --- the report ---------------------------------------------------------------------------------


def test_report_names_the_first_failure_and_nope_layers() -> None:
    """A layer type whose rope parameters are None must leave q, k unchanged. (transformers'
    config classes fill such entries in, so the dict has no model_type: read as written.)"""
    full = dict(OLMO3_STYLE["rope_parameters"]["full_attention"])
    config = {
        k: v for k, v in OLMO3_STYLE.items() if k not in ("model_type", "rope_parameters")
    } | {"rope_parameters": {"sliding_attention": None, "full_attention": full}}
    assert rope_layer_types(config) == [("sliding_attention", False), ("full_attention", True)]
    rope = rope_from_hf(config, "full_attention")

    def impl(q, k, position_ids, layer_type):
        if layer_type == "sliding_attention":
            return q.clone(), k.clone()
        return rope(q, k, position_ids)

    assert check_rope(impl, config, **FAST).ok

    def rotates_everywhere(q, k, position_ids, layer_type):
        return rope(q, k, position_ids)

    report = check_rope(rotates_everywhere, config, **FAST)
    lines = str(report).splitlines()
    assert lines[0].startswith("RopeReport for config (qk): FAIL"), report
    assert "[sliding_attention float32] position_0" in lines[0], report  # YaRN's factor at 0
    assert lines[2].startswith("FAIL"), report
    assert all(r.passed for r in report.results if r.layer_type == "full_attention")
