"""STRING, ReRoPE, Leaky ReRoPE and log-n as key-set methods, against naive full-matrix references
written from the authors' formulas (``tests/_keyset_naive.py``, transformers' rotary module and
rotation for every rotation), at the attention level and inside transformers models (a Llama and
the hybrid Gemma-3: prefill, and one-token decode steps through transformers' KV cache); the
fused and FlexAttention paths against the explicit one (learned sinks included); each method's
relative distances against the authors' figures; planted faults (a boundary off by one, a far
position or frequency wrong, an uncapped DCA position, log n at the wrong position) caught; the
options, their defaults and refusals as ``posenc extend --methods`` and ``apply_posenc`` take them.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any

import pytest
import torch
import transformers
from transformers.models.llama import modeling_llama

import posenc.extend.methods.explicit as explicit
import posenc.extend.methods.flex as flex
import posenc.extend.methods.fused as fused
from _keyset_naive import (
    left_padded,
    logn_factor,
    naive_attention,
    prefill_and_decode,
    reference_logits,
)
from posenc.extend.methods.keysets import key_sets, relative_positions
from posenc.extend.methods.names import parse_method, resolve
from posenc.hf import apply_posenc, normalize_extension
from posenc.rotary import temperature
from posenc.rotary.temperature import QueryTemperature, logn_scale

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

TOL = 1e-5
L = 45
CASES: list[tuple[str, dict[str, Any]]] = [
    ("string", {"shifted_offset": 12, "local_window": 3}),
    ("string", {"shifted_offset": 7, "local_window": 0, "attention_factor": 1 + 0.1 * math.log(2)}),
    ("rerope", {"window": 8}),
    ("rerope", {"window": 1, "logn": 16}),
    ("leaky_rerope", {"window": 8, "k": 4}),
    ("leaky_rerope", {"window": 5, "k": 16, "logn": 16}),  # bojone/rerope's k with its log n
    ("logn", {"length": 16}),
]
IDS = [f"{m}-{'-'.join(f'{k}{v:g}' for k, v in o.items())}" for m, o in CASES]


def llama_rotary(theta: float = 10000.0) -> Any:
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=theta)
    return modeling_llama.LlamaRotaryEmbedding(cfg)


ROTARY = llama_rotary()
INV_FREQ = ROTARY.inv_freq.float()


def rot_at(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """transformers' Llama rotation of ``x [b, h, n, d]`` at positions ``p [n]`` (floats too)."""
    cos, sin = ROTARY(x, p[None])
    return modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)[0]


def qkv(s: int, t: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, n, m, 16, generator=g) for n, m in ((4, s), (2, t), (2, t)))


def run(path: Any, method: str, options: dict[str, Any], q, k, v, q_pos, **extra: Any):
    sets = key_sets(method, options)
    return path(q, k, v, q_pos, sets=sets, inv_freq=INV_FREQ, scale=0.25, **extra)


# --- the definitions --------------------------------------------------------------------------------


def test_relative_distances_are_the_authors_figures() -> None:
    """The small matrices of the notes: STRING (S 4, W 1: the figure's d - S + W past S), ReRoPE
    (w 3: min(d, w)), Leaky ReRoPE (w 3, k 2: w + (d - w) / k past w); Self-Extend (G 2, W 2)."""
    string = [[0], [1, 0], [2, 1, 0], [3, 2, 1, 0], [1, 3, 2, 1, 0], [2, 1, 3, 2, 1, 0]]
    rerope = [[0], [1, 0], [2, 1, 0], [3, 2, 1, 0], [3, 3, 2, 1, 0], [3, 3, 3, 2, 1, 0]]
    leaky = [[0], [1, 0], [2, 1, 0], [3, 2, 1, 0], [3.5, 3, 2, 1, 0], [4, 3.5, 3, 2, 1, 0]]
    self_extend = [[0], [1, 0], [2, 1, 0], [2, 2, 1, 0], [3, 3, 2, 1, 0], [3, 3, 2, 2, 1, 0]]
    for method, options, rows in (
        ("string", {"shifted_offset": 4, "local_window": 1}, string),
        ("rerope", {"window": 3}, rerope),
        ("leaky_rerope", {"window": 3, "k": 2}, leaky),
        ("self_extend", {"group_size": 2, "neighbor_window": 2}, self_extend),
    ):
        got = relative_positions(key_sets(method, options), 6)
        want = torch.full((6, 6), math.nan, dtype=torch.float64)
        for i, row in enumerate(rows):
            want[i, : i + 1] = torch.tensor(row, dtype=torch.float64)
        assert torch.equal(got.nan_to_num(-1), want.nan_to_num(-1)), method


@pytest.mark.parametrize("length", [2, 16, 4096])
def test_logn_scale_is_sus_formula(length: int) -> None:
    """``max(1, ln(p + 1) / ln(L))`` evaluated independently in float64: 1 up to p = L - 1."""
    p = torch.arange(0, 3 * length + 5)
    want = logn_factor(p, length)
    assert float((logn_scale(p, length).double() - want).abs().max()) <= 1e-6
    assert (
        float((QueryTemperature("logn", 1.0, length).scale(p).double() - want).abs().max()) <= 1e-6
    )
    assert bool((logn_scale(p[:length], length) == 1).all()) and logn_scale(p, length)[-1] > 1
    with pytest.raises(ValueError, match="logn takes no slope"):
        QueryTemperature("logn", 0.5, length)


# --- attention level: explicit against naive ----------------------------------------------------


@pytest.mark.parametrize("rows", [1 << 24, 1])  # one block of query rows; the smallest (16)
@pytest.mark.parametrize(("method", "options"), CASES, ids=IDS)
def test_explicit_equals_the_naive_reference(
    monkeypatch: pytest.MonkeyPatch, rows: int, method: str, options: dict[str, Any]
) -> None:
    monkeypatch.setattr(explicit, "BLOCK_ELEMENTS", rows)
    q, k, v = qkv(L, L)
    got = run(explicit.keyset_attention, method, options, q, k, v, torch.arange(L).expand(2, -1))
    want = naive_attention(q, k, v, rot_at, method, options, 0.25)
    assert float((got - want).abs().max()) <= TOL


def test_sinks_and_float64() -> None:
    """Learned sinks (one more softmax column per head) and float64 inputs, where the naive
    reference and the method agree to 1e-12."""
    q, k, v = (x.double() for x in qkv(L, L))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    pos = torch.arange(L).expand(2, -1)
    for method, options in CASES[::2]:
        sets = key_sets(method, options)
        got = explicit.keyset_attention(
            q, k, v, pos, sets=sets, inv_freq=INV_FREQ.double(), scale=0.25, sinks=sinks
        )
        want = naive_attention(q, k, v, rot_at, method, options, 0.25, sinks=sinks)
        assert float((got.float() - want.float()).abs().max()) <= TOL, method


def test_limits_are_plain_rope_attention() -> None:
    """STRING with S past the sequence, ReRoPE with w past it, Leaky ReRoPE with k = 1 and log n
    with L past it are RoPE attention as it is (SDPA over transformers' rotation)."""
    q, k, v = qkv(L, L)
    pos = torch.arange(L)
    plain = torch.nn.functional.scaled_dot_product_attention(
        rot_at(q, pos), rot_at(k, pos).repeat_interleave(2, 1), v.repeat_interleave(2, 1),
        is_causal=True, scale=0.25,
    )  # fmt: skip
    for method, options in (
        ("string", {"shifted_offset": L, "local_window": 3}),
        ("rerope", {"window": L}),
        ("leaky_rerope", {"window": 4, "k": 1}),
        ("logn", {"length": L}),
    ):
        got = run(explicit.keyset_attention, method, options, q, k, v, pos.expand(2, -1))
        assert float((got - plain).abs().max()) <= TOL, method


def test_planted_faults_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The naive comparison fails on each: STRING's boundary one key off (d <= S near), its far
    query unshifted; ReRoPE's far key rotated by its position; Leaky ReRoPE's far frequencies
    not divided by k; DCA's successive-chunk position uncapped; log n taken at p, not p + 1."""
    q, k, v = qkv(L, L)
    pos = torch.arange(L).expand(2, -1)

    def caught(method: str, options: dict[str, Any], fault: Any) -> bool:
        sets = fault(key_sets(method, options))
        got = explicit.keyset_attention(q, k, v, pos, sets=sets, inv_freq=INV_FREQ, scale=0.25)
        want = naive_attention(q, k, v, rot_at, method, options, 0.25)
        return float((got - want).abs().max()) > 100 * TOL

    def rules(sets: Any, *new: Any) -> Any:
        return dataclasses.replace(sets, sets=tuple(new))

    string = {"shifted_offset": 12, "local_window": 3}
    far, near = key_sets("string", string).sets
    assert caught("string", string, lambda s: rules(s, dataclasses.replace(far, lo=13),
                                                    dataclasses.replace(near, hi=13)))  # fmt: skip
    assert caught("string", string, lambda s: rules(s, dataclasses.replace(far, query=None), near))
    far, near = key_sets("rerope", {"window": 8}).sets
    assert caught(
        "rerope", {"window": 8}, lambda s: rules(s, dataclasses.replace(far, key=None), near)
    )
    far, near = key_sets("leaky_rerope", {"window": 8, "k": 4}).sets
    leaky = {"window": 8, "k": 4}
    assert caught(
        "leaky_rerope", leaky, lambda s: rules(s, dataclasses.replace(far, divide=1), near)
    )
    dca = {"chunk_size": 12, "local_size": 2}
    inter, intra, succ = key_sets("dual_chunk", dca).sets
    uncapped = dataclasses.replace(succ, query=lambda p: p % 10 + 10)
    assert caught("dual_chunk", dca, lambda s: rules(s, inter, intra, uncapped))
    assert not caught("logn", {"length": 16}, lambda s: s)
    monkeypatch.setattr(  # log n of p (the query's position), not of its p + 1 keys
        temperature, "_logn_scale", lambda p, n: (torch.log(p.float()) / math.log(n)).clamp(min=1)
    )
    assert caught("logn", {"length": 16}, lambda s: s)


# --- the fused and flex paths against the explicit one -------------------------------------------

FAST_CASES = [
    ("string", {"shifted_offset": 40, "local_window": 5}),  # S above the 16-row blocks: 3 calls
    ("string", {"shifted_offset": 9, "local_window": 2, "logn": 16}),  # S below: the band mask
    ("rerope", {"window": 8}),
    ("leaky_rerope", {"window": 20, "k": 3}),
    ("logn", {"length": 16}),
]
SHAPES = [(45, 45), (30, 120), (1, 120)]  # prefill, a prefill after a cache, decode


@pytest.mark.parametrize("block", [512, 16])
@pytest.mark.parametrize(("method", "options"), FAST_CASES, ids=lambda x: str(x))
def test_fused_equals_explicit(
    monkeypatch: pytest.MonkeyPatch, block: int, method: str, options: dict[str, Any]
) -> None:
    monkeypatch.setattr(fused, "PATH", "fused")  # an error rather than a fallback
    monkeypatch.setattr(fused, "BLOCK", block)
    sinks = torch.tensor([0.3, -0.5, 1.0, 2.0])
    for s, t in SHAPES:
        q, k, v = qkv(s, t)
        pos = torch.arange(t - s, t).expand(2, -1) + torch.tensor([[0], [7]])  # rows apart
        for extra in ({}, {"sinks": sinks}):
            got = run(fused.keyset, method, options, q, k, v, pos, **extra)
            want = run(explicit.keyset_attention, method, options, q, k, v, pos, **extra)
            assert float((got - want).abs().max()) <= TOL, (s, t, extra)


@pytest.mark.parametrize(("method", "options"), FAST_CASES, ids=lambda x: str(x))
def test_fused_output_keeps_the_values_dtype(
    monkeypatch: pytest.MonkeyPatch, method: str, options: dict[str, Any]
) -> None:
    """bfloat16 in, bfloat16 out on every shape (a cached prompt's suffix merges in float32),
    as the explicit path gives; within bf16's rounding of it."""
    monkeypatch.setattr(fused, "PATH", "fused")
    for s, t in SHAPES:
        q, k, v = (x.bfloat16() for x in qkv(s, t))
        pos = torch.arange(t - s, t).expand(2, -1)
        got = run(fused.keyset, method, options, q, k, v, pos)
        want = run(explicit.keyset_attention, method, options, q, k, v, pos)
        assert got.dtype == want.dtype == torch.bfloat16, (s, t, got.dtype)
        assert float((got.float() - want.float()).abs().max()) <= 0.05, (s, t)


def test_flex_equals_explicit() -> None:
    """One FlexAttention call per set (eager on the CPU), with sinks and a left-padded batch."""
    q, k, v = qkv(30, 40)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, :6] = False
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    keep = torch.ones(30, 40, dtype=torch.bool).tril(10)[None, None] & mask[:, None, None]
    sinks = torch.tensor([0.3, -0.5, 1.0, 2.0])
    for method, options in FAST_CASES[1:]:
        extra = {"keep": keep, "sinks": sinks}
        got = run(flex.keyset_flex, method, options, q, k, v, positions[:, 10:], **extra)
        want = run(explicit.keyset_attention, method, options, q, k, v, positions[:, 10:], **extra)
        assert float((got - want).abs().max()) <= TOL, method


# --- inside transformers models ----------------------------------------------------------------------

MODEL_CASES = [CASES[0], CASES[2], CASES[5], CASES[6]]  # every method; log n also composed


def tiny(model_type: str) -> Any:
    common = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, pad_token_id=0,
                  initializer_range=0.1)  # fmt: skip
    if (
        model_type == "gemma3_text"
    ):  # sliding window 16 > every window below: a method put there shows
        common.update(num_hidden_layers=3, sliding_window=16,
                      layer_types=["sliding_attention", "full_attention", "sliding_attention"])  # fmt: skip
    else:
        common.update(num_hidden_layers=2)
    cfg = transformers.CONFIG_MAPPING[model_type](**common)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
@pytest.mark.parametrize(("method", "options"), MODEL_CASES, ids=lambda x: str(x))
def test_patched_model_prefill_and_decode_equal_the_naive_reference(
    model_type: str, method: str, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny(model_type)
    ids = torch.randint(1, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    want = reference_logits(model, ids, method, options, monkeypatch)
    with torch.no_grad():
        assert float((model(ids).logits - want).abs().max()) > 1e-3  # the method changes it
    patched = apply_posenc(copy.deepcopy(model), extension={"method": method, **options})
    got = prefill_and_decode(patched, ids, 25)
    assert float((got[:, :40] - want).abs().max()) <= TOL
    assert float((got[:, 40:] - want[:, 25:]).abs().max()) <= TOL


@pytest.mark.parametrize(("method", "options"), [CASES[0], CASES[5]], ids=lambda x: str(x))
def test_left_padding_gives_each_row_its_own_logits(method: str, options: dict[str, Any]) -> None:
    """A left-padded row (transformers' mask and positions) has the logits it has alone: the
    padded keys unseen, log n at the row's own positions."""
    model = apply_posenc(tiny("llama"), extension={"method": method, **options})
    ids, mask, positions, short = left_padded(97)
    with torch.no_grad():
        both = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = model(short).logits
    assert float((both[1, 7:] - alone[0]).abs().max()) <= TOL


# --- options, defaults, refusals ---------------------------------------------------------------------


def test_cli_names_and_defaults() -> None:
    """``--methods`` names with options; defaults for a model trained at 4096 run at 16384: STRING
    ``int(0.33 L)`` and 128, ReRoPE ``L / 4``, Leaky ReRoPE ``L / 4`` and Su's smallest k with
    ``w + (N - 1 - w) / k <= L / 2`` (here 15), log n ``L``."""
    methods = "string,rerope:window=512,leaky_rerope:window=512:k=16,logn,string:logn=4096"
    got = {m.label: resolve(m, 4096, 16384, 64).extension for m in _parse(methods)}
    assert got == {
        "string": {"method": "string", "shifted_offset": 1351, "local_window": 128},
        "rerope:window=512": {"method": "rerope", "window": 512},
        "leaky_rerope:window=512:k=16": {"method": "leaky_rerope", "window": 512, "k": 16},
        "logn": {"method": "logn", "length": 4096},
        "string:logn=4096": {
            "method": "string", "shifted_offset": 1351, "local_window": 128, "logn": 4096,
        },
    }  # fmt: skip
    leaky = resolve(parse_method("leaky_rerope"), 4096, 16384, 64).extension
    assert leaky == {"method": "leaky_rerope", "window": 1024, "k": 15}
    assert 1024 + (16384 - 1 - 1024) / 15 <= 2048 < 1024 + (16384 - 1 - 1024) / 14
    small = resolve(parse_method("string"), 64, 64, 8).extension  # S = 21 < 128: W = S - 1
    assert small == {"method": "string", "shifted_offset": 21, "local_window": 20}


def _parse(text: str) -> list[Any]:
    from posenc.extend.methods.names import parse_methods

    return parse_methods(text)


def test_refusals_are_one_line() -> None:
    cases = [
        ({"method": "string", "shifted_offset": 8, "local_window": 8}, "local_window .8. must be below shifted_offset"),
        ({"method": "string", "shifted_offset": 0, "local_window": 0}, "shifted_offset must be an integer in \\[1, 2147483647\\]"),
        ({"method": "string", "shifted_offset": 8, "local_window": 2, "attention_factor": 0}, "attention_factor must be a number > 0"),
        ({"method": "string", "shifted_offset": 8, "local_window": 2, "attention_factor": math.inf}, "attention_factor must be a number > 0"),
        ({"method": "rerope", "window": 0}, "rerope window must be an integer in \\[1, 2147483647\\]"),
        ({"method": "rerope", "window": 4.0}, "rerope window must be an integer in \\[1, 2147483647\\]"),
        ({"method": "leaky_rerope", "window": 4}, "missing: k"),
        ({"method": "leaky_rerope", "window": 4, "k": True}, "k must be an integer in \\[1, 2147483647\\]"),
        ({"method": "rerope", "window": 4, "logn": 1}, "logn must be an integer in \\[2, 2147483647\\]"),
        ({"method": "logn", "length": 8, "window": 2}, "takes length; unknown: window"),
    ]  # fmt: skip
    for extension, message in cases:
        with pytest.raises(ValueError, match=message):
            normalize_extension(extension)
    with pytest.raises(ValueError, match="method 'rerope' takes window, logn; unknown: k"):
        parse_method("rerope:window=4:k=2")
    windowed = transformers.AutoModelForCausalLM.from_config(
        transformers.MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, sliding_window=8)
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"string acts on full-attention layers with RoPE.*window 8"
    ):
        apply_posenc(
            windowed, extension={"method": "string", "shifted_offset": 4, "local_window": 1}
        )
