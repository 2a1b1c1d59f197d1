"""Self-Extend and Dual Chunk Attention against naive references written from the papers and the
authors' code, at the attention level and inside transformers models (prefill, decode with a KV
cache, left padding), with planted faults the comparison catches.

The references are written independently of :mod:`posenc.extend.methods.explicit`: full ``L x L``
matrices, transformers' own ``apply_rotary_pos_emb`` and rotary module for every rotation,
and the authors' control flow (LongLM's merged neighbour/group logits; ChunkLlama's chunk loop
with its log-sum-exp merge of partial attentions).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import transformers
from transformers.models.llama import modeling_llama

import posenc.extend.methods.explicit as ext_attention
from _decode import hf_prefill_then_decode
from _tiny import tiny_lm
from posenc.extend.methods.explicit import keyset_attention
from posenc.extend.methods.keysets import by_method
from posenc.hf import apply_posenc, extension_from_config, normalize_extension, remove_posenc

self_extend_attention = by_method(keyset_attention, "self_extend")
dual_chunk_attention = by_method(keyset_attention, "dual_chunk")

TOL = 1e-5


def hf_rotary(head_dim: int = 16, theta: float = 10000.0) -> Any:
    cfg = transformers.LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        rope_theta=theta,
        max_position_embeddings=64,
    )
    return modeling_llama.LlamaRotaryEmbedding(cfg)


def hf_rot(x: torch.Tensor, positions: torch.Tensor, rotary: Any) -> torch.Tensor:
    """transformers' rotation of ``x [b, h, n, d]`` by integer ``positions [n]``."""
    cos, sin = rotary(x, positions[None])  # [1, n, d]
    rotated, _ = modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)
    return rotated


def repeat(x: torch.Tensor, h: int) -> torch.Tensor:
    return x.repeat_interleave(h // x.shape[1], dim=1)


# --- the naive references ------------------------------------------------------------------------


def naive_self_extend(q, k, v, rotary, group: int, window: int, shift_fault: int = 0):
    """LongLM's ``self_extend_forward`` (q_len == kv_seq_len branch), positions 0..L-1."""
    h, L = q.shape[1], q.shape[2]
    k, v = repeat(k, h), repeat(v, h)
    pos = torch.arange(L)
    scale = q.shape[-1] ** -0.5
    neighbor_q, neighbor_k = hf_rot(q, pos, rotary), hf_rot(k, pos, rotary)
    group_q_pos = pos // group + window - window // group + shift_fault
    group_q, group_k = hf_rot(q, group_q_pos, rotary), hf_rot(k, pos // group, rotary)
    neighbor_w = neighbor_q @ neighbor_k.transpose(-1, -2) * scale
    group_w = group_q @ group_k.transpose(-1, -2) * scale
    neighbor_mask = torch.tril(torch.ones(L, L))
    if L - window > 0:
        neighbor_mask[window:, :-window] -= torch.tril(torch.ones(L - window, L - window))
    merged = torch.where(neighbor_mask.bool(), neighbor_w, group_w)
    merged = merged.masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool)), float("-inf"))
    return torch.softmax(merged, dim=-1) @ v


def _partial(q, k, v, causal: bool):
    """One flash-attention call of ChunkLlama: output and log-sum-exp of the scaled logits."""
    w = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        w = w.masked_fill(~torch.tril(torch.ones(w.shape[-2:], dtype=torch.bool)), float("-inf"))
    return torch.softmax(w, dim=-1) @ v, torch.logsumexp(w, dim=-1)


def naive_dual_chunk(q, k, v, rotary, chunk_size: int, local_size: int, swap_fault: bool = False):
    """ChunkLlama's ``forward`` (no cache): its chunk loop and ``merge_attn_outputs``."""
    h, L = q.shape[1], q.shape[2]
    k, v = repeat(k, h), repeat(v, h)
    c = chunk_size - local_size
    pos = torch.arange(L)
    keys = hf_rot(k, pos % c, rotary)
    q_succ_pos = lambda p: (p % c + c).clamp(max=chunk_size)  # noqa: E731
    q_inter_pos = lambda p: torch.full_like(p, min(2 * c - 1, chunk_size))  # noqa: E731
    if swap_fault:
        q_succ_pos, q_inter_pos = q_inter_pos, q_succ_pos
    outs = [
        _partial(hf_rot(q[:, :, :c], pos[:c] % c, rotary), keys[:, :, :c], v[:, :, :c], True)[0]
    ]
    begin = c
    while begin < L:
        end = min(begin + c, L)
        qi, p = q[:, :, begin:end], pos[begin:end]
        parts = [
            _partial(hf_rot(qi, p % c, rotary), keys[:, :, begin:end], v[:, :, begin:end], True)
        ]
        prev = slice(begin - c, begin)
        parts.append(
            _partial(hf_rot(qi, q_succ_pos(p), rotary), keys[:, :, prev], v[:, :, prev], False)
        )
        if begin - c > 0:
            early = slice(0, begin - c)
            parts.append(
                _partial(
                    hf_rot(qi, q_inter_pos(p), rotary), keys[:, :, early], v[:, :, early], False
                )
            )
        lse = torch.stack([lse for _, lse in parts])  # [n, b, h, r]
        weights = torch.softmax(lse, dim=0)[..., None]  # each partial's share of the union
        outs.append((torch.stack([o for o, _ in parts]) * weights).sum(0))
        begin = end
    return torch.cat(outs, dim=2)


def qkv(L: int = 45, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 4, L, 16, generator=g),
        torch.randn(2, 2, L, 16, generator=g),
        torch.randn(2, 2, L, 16, generator=g),
    )


def ours(method: str, q, k, v, rotary, **options):
    pos = torch.arange(q.shape[2]).expand(q.shape[0], -1)
    run = self_extend_attention if method == "self_extend" else dual_chunk_attention
    return run(q, k, v, pos, inv_freq=rotary.inv_freq.float(), scale=q.shape[-1] ** -0.5, **options)


# --- attention level -----------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1 << 24, 1])  # one block; the smallest blocks (16 rows)
@pytest.mark.parametrize(("group", "window"), [(4, 8), (3, 7), (2, 1), (8, 64)])
def test_self_extend_equals_longlm(monkeypatch, rows: int, group: int, window: int) -> None:
    monkeypatch.setattr(ext_attention, "BLOCK_ELEMENTS", rows)
    q, k, v = qkv()
    rotary = hf_rotary()
    got = ours("self_extend", q, k, v, rotary, group_size=group, neighbor_window=window)
    want = naive_self_extend(q, k, v, rotary, group, window)
    assert (got - want).abs().max() <= TOL


@pytest.mark.parametrize("rows", [1 << 24, 1])
@pytest.mark.parametrize(("chunk", "local"), [(12, 4), (9, 2), (20, 3), (64, 8)])
def test_dual_chunk_equals_chunkllama(monkeypatch, rows: int, chunk: int, local: int) -> None:
    monkeypatch.setattr(ext_attention, "BLOCK_ELEMENTS", rows)
    q, k, v = qkv()
    rotary = hf_rotary()
    got = ours("dual_chunk", q, k, v, rotary, chunk_size=chunk, local_size=local)
    want = naive_dual_chunk(q, k, v, rotary, chunk, local)
    assert (got - want).abs().max() <= TOL


def test_planted_faults_are_caught() -> None:
    """The comparisons above fail on a group shift off by one and on swapped chunk rules."""
    q, k, v = qkv()
    rotary = hf_rotary()
    se = ours("self_extend", q, k, v, rotary, group_size=4, neighbor_window=8)
    assert (se - naive_self_extend(q, k, v, rotary, 4, 8, shift_fault=1)).abs().max() > 100 * TOL
    dca = ours("dual_chunk", q, k, v, rotary, chunk_size=12, local_size=4)
    faulty = naive_dual_chunk(q, k, v, rotary, 12, 4, swap_fault=True)
    assert (dca - faulty).abs().max() > 100 * TOL


def test_wide_settings_are_plain_attention() -> None:
    """A window and chunk wider than the sequence leave RoPE attention as it is."""
    q, k, v = qkv()
    rotary = hf_rotary()
    L = q.shape[2]
    plain = torch.nn.functional.scaled_dot_product_attention(
        hf_rot(q, torch.arange(L), rotary),
        repeat(hf_rot(k, torch.arange(L), rotary), 4),
        repeat(v, 4),
        is_causal=True,
    )
    se = ours("self_extend", q, k, v, rotary, group_size=4, neighbor_window=L)
    dca = ours("dual_chunk", q, k, v, rotary, chunk_size=L + 8, local_size=4)
    assert (se - plain).abs().max() <= TOL
    assert (dca - plain).abs().max() <= TOL


# --- inside transformers models ------------------------------------------------------------------

EXTENSIONS = [
    {"method": "self_extend", "group_size": 4, "neighbor_window": 8},
    {"method": "dual_chunk", "chunk_size": 12, "local_size": 4},
]


def tiny(model_type: str = "llama") -> Any:
    """The tiny model these tests patch (:func:`_tiny.tiny_lm`, token 0 the padding)."""
    return tiny_lm(model_type, pad_token_id=0)


def naive_logits(model: Any, ids: torch.Tensor, extension: dict[str, Any]) -> torch.Tensor:
    """The model's forward written out by hand (its own norms, projections and MLPs) with the
    naive attention of ``extension``; positions 0..L-1, no padding."""
    rotary = model.model.rotary_emb
    x = model.model.embed_tokens(ids)
    b, L = ids.shape
    for layer in model.model.layers:
        a = layer.self_attn
        hs = layer.input_layernorm(x)
        q = a.q_proj(hs).view(b, L, -1, a.head_dim).transpose(1, 2)
        k = a.k_proj(hs).view(b, L, -1, a.head_dim).transpose(1, 2)
        v = a.v_proj(hs).view(b, L, -1, a.head_dim).transpose(1, 2)
        if extension["method"] == "self_extend":
            o = naive_self_extend(
                q, k, v, rotary, extension["group_size"], extension["neighbor_window"]
            )
        else:
            o = naive_dual_chunk(q, k, v, rotary, extension["chunk_size"], extension["local_size"])
        x = x + a.o_proj(o.transpose(1, 2).reshape(b, L, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x))


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("extension", EXTENSIONS, ids=lambda e: e["method"])
def test_patched_model_prefill_and_decode_equal_naive(model_type: str, extension: dict) -> None:
    model = tiny(model_type)
    ids = torch.randint(1, 64, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = naive_logits(model, ids, extension)
        patched = apply_posenc(copy.deepcopy(model), extension=extension)
        assert (patched(ids).logits - want).abs().max() <= TOL
        steps = hf_prefill_then_decode(patched, ids, 25)[:, 25:]  # prefill 25, then one a call
        assert (steps - want[:, 25:]).abs().max() <= TOL


@pytest.mark.parametrize("extension", EXTENSIONS, ids=lambda e: e["method"])
def test_left_padding_gives_each_row_its_own_logits(extension: dict) -> None:
    model = apply_posenc(tiny(), extension=extension)
    g = torch.Generator().manual_seed(4)
    long, short = (
        torch.randint(1, 64, (1, 36), generator=g),
        torch.randint(1, 64, (1, 29), generator=g),
    )
    ids = torch.cat((long, torch.cat((torch.zeros(1, 7, dtype=torch.long), short), 1)))
    mask = (ids != 0).long()
    mask[0] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        both = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = model(short).logits
        first = model(long).logits
        generated = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        alone_gen = model.generate(short, max_new_tokens=4, do_sample=False)
    assert (both[1, 7:] - alone[0]).abs().max() <= TOL
    assert (both[0] - first[0]).abs().max() <= TOL
    assert torch.equal(generated[1, 36:], alone_gen[0, 29:])


def test_remove_restores_the_model() -> None:
    model = tiny()
    ids = torch.randint(1, 64, (1, 40))
    with torch.no_grad():
        want = model(ids).logits
        remove_posenc(apply_posenc(model, extension=EXTENSIONS[0]))
        assert torch.equal(model(ids).logits, want)
    assert not any("posenc_extension" in m.__dict__ for m in model.modules())


def test_refusals_are_one_line() -> None:
    model = tiny()
    cases = [
        ({"method": "self_extended"}, "extension method must be one of"),
        ({"method": "self_extend", "group_size": 4}, "missing: neighbor_window"),
        ({"method": "self_extend", "group_size": 0, "neighbor_window": 4}, "group_size must be an integer in \\[1, 2147483647\\]"),
        ({"method": "dual_chunk", "chunk_size": 8, "local_size": 7}, "local_size .* must be below"),
        ({"method": "dual_chunk", "chunk_size": 8, "local_size": 2, "x": 1}, "unknown: x"),
    ]  # fmt: skip
    for extension, message in cases:
        with pytest.raises(ValueError, match=message):
            apply_posenc(model, extension=extension)
    with pytest.raises(ValueError, match="not both"):
        apply_posenc(model, extension=EXTENSIONS[0], scaling={"rope_type": "linear", "factor": 2.0})
    gemma3 = transformers.AutoModelForCausalLM.from_config(
        transformers.Gemma3TextConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
        )
    )
    with pytest.raises(
        ValueError, match=r"acts on full-attention layers with RoPE.*sliding window"
    ):
        apply_posenc(gemma3, extension=EXTENSIONS[0])  # two sliding layers: nothing to extend
    cohere = transformers.AutoModelForCausalLM.from_config(
        transformers.CohereConfig(
            vocab_size=32,
            hidden_size=32,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    )
    with pytest.raises(ValueError, match="supports half-split RoPE models"):
        apply_posenc(cohere, extension=EXTENSIONS[0])
    assert getattr(model, "posenc_patch", None) is None  # nothing changed by the failed calls


def test_qwen_1m_config_reads_as_dual_chunk() -> None:
    # The dual_chunk_attention_config block Qwen2.5-14B-Instruct-1M's config.json ships (as quoted
    # verbatim in a public deployment note; the 7B-1M release has the same keys).
    config = {
        "dual_chunk_attention_config": {
            "chunk_size": 262144,
            "local_size": 8192,
            "original_max_position_embeddings": 262144,
        }
    }
    assert extension_from_config(config) == {
        "method": "dual_chunk",
        "chunk_size": 262144,
        "local_size": 8192,
    }
    assert extension_from_config({}) is None
    assert normalize_extension(EXTENSIONS[1]) == EXTENSIONS[1]
