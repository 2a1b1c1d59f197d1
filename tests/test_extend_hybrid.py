"""Self-Extend and Dual Chunk Attention on hybrid models: the method acts on the full-attention
layers with RoPE; sliding-window layers keep their window and positions, NoPE layers are
untouched, Gemma-2's soft-capping applies to every key set's logits before the one softmax.

The reference is transformers' own model with an attention function of the test's (registered
through transformers' ``AttentionInterface``): on a sliding layer it is transformers' eager
attention as it is; on a full-attention layer it undoes the rotation transformers applied (the
same cos with ``-sin``) and runs the papers' full-matrix method (LongLM's merged logits,
ChunkLlama's chunk loop with its log-sum-exp merge, from ``tests/test_extend_attention.py``),
with the layer's own softmax scale and soft cap. So a method wrongly put on a sliding layer (the
tiny Gemma-3's window of 16 is wider than the neighbour window of 4) or on a NoPE layer, a cap
left out, or the wrong layer type's frequencies all show in the logits.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import AttentionInterface  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

from _decode import hf_prefill_then_decode  # noqa: E402
from _tiny import PARITY_SIZES, tiny_lm  # noqa: E402
from posenc.hf import apply_posenc  # noqa: E402

TOL = 1e-5
EXTENSIONS = [
    {"method": "self_extend", "group_size": 3, "neighbor_window": 4},
    {"method": "dual_chunk", "chunk_size": 12, "local_size": 3},
]
MODELS: dict[str, dict[str, Any]] = {
    # sliding window 16 > the neighbour window 4: a method put on a sliding layer shows
    "gemma3_text": {
        "num_hidden_layers": 3,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    # soft-capped logits on every layer (a small cap so that it bites), sliding and full
    "gemma2": {"num_hidden_layers": 2, "sliding_window": 16, "attn_logit_softcapping": 2.0},
    # NoPE on the last layer (no_rope_layers: 1 = uses RoPE)
    # (smaller weights: its logits grow to ~10^2 at 0.3, where float32 sums differ by 1e-5)
    "smollm3": {"num_hidden_layers": 3, "no_rope_layers": [1, 1, 0], "initializer_range": 0.1},
}


def tiny(model_type: str) -> Any:
    return tiny_lm(model_type, attn="eager", **{**PARITY_SIZES, **MODELS[model_type]})


def repeat(x: torch.Tensor, h: int) -> torch.Tensor:
    return x.repeat_interleave(h // x.shape[1], dim=1)


def rot(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotation of ``x [b, h, n, d]`` by tables ``[b, n, d]``."""
    out, _ = modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)
    return out


def logits_of(w: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    w = w * scale
    return torch.tanh(w / softcap) * softcap if softcap else w


def naive_self_extend(q, k, v, table, group, window, scale, softcap):
    """LongLM's merged neighbour/group logits over the full matrix (positions 0..L-1)."""
    L = q.shape[2]
    pos = torch.arange(L)
    nq, nk = rot(q, *table(pos)), rot(k, *table(pos))
    gq, gk = rot(q, *table(pos // group + window - window // group)), rot(k, *table(pos // group))
    near = logits_of(nq @ nk.transpose(-1, -2), scale, softcap)
    far = logits_of(gq @ gk.transpose(-1, -2), scale, softcap)
    neighbour = torch.tril(torch.ones(L, L))
    if L - window > 0:
        neighbour[window:, :-window] -= torch.tril(torch.ones(L - window, L - window))
    merged = torch.where(neighbour.bool(), near, far)
    merged = merged.masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool)), float("-inf"))
    return torch.softmax(merged, dim=-1) @ v


def naive_dual_chunk(q, k, v, table, chunk_size, local_size, scale, softcap):
    """ChunkLlama's chunk loop and its log-sum-exp merge of partial attentions."""
    L = q.shape[2]
    c = chunk_size - local_size
    pos = torch.arange(L)
    keys = rot(k, *table(pos % c))

    def partial(qr, kr, vr, causal):
        w = logits_of(qr @ kr.transpose(-1, -2), scale, softcap)
        if causal:
            keep = torch.tril(torch.ones(w.shape[-2:], dtype=torch.bool))
            w = w.masked_fill(~keep, float("-inf"))
        return torch.softmax(w, dim=-1) @ vr, torch.logsumexp(w, dim=-1)

    outs = [partial(rot(q[:, :, :c], *table(pos[:c] % c)), keys[:, :, :c], v[:, :, :c], True)[0]]
    for begin in range(c, L, c):
        end = min(begin + c, L)
        qi, p = q[:, :, begin:end], pos[begin:end]
        parts = [partial(rot(qi, *table(p % c)), keys[:, :, begin:end], v[:, :, begin:end], True)]
        prev = slice(begin - c, begin)
        succ = (p % c + c).clamp(max=chunk_size)
        parts.append(partial(rot(qi, *table(succ)), keys[:, :, prev], v[:, :, prev], False))
        if begin - c > 0:
            inter = torch.full_like(p, min(2 * c - 1, chunk_size))
            early = slice(0, begin - c)
            parts.append(partial(rot(qi, *table(inter)), keys[:, :, early], v[:, :, early], False))
        weights = torch.softmax(torch.stack([lse for _, lse in parts]), dim=0)[..., None]
        outs.append((torch.stack([o for o, _ in parts]) * weights).sum(0))
    return torch.cat(outs, dim=2)


def reference(
    model: Any, ids: torch.Tensor, extension: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> torch.Tensor:
    """transformers' forward of ``model`` whose full-attention RoPE layers attend by the papers'
    method (see the module docstring); positions 0..L-1, no padding."""
    rotary = model.model.rotary_emb
    text = model.config
    modeling = sys.modules[type(model.model.layers[0].self_attn).__module__]
    eager, stock_rotation = modeling.eager_attention_forward, modeling.apply_rotary_pos_emb

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        types = getattr(text, "layer_types", None)
        layer_type = types[module.layer_idx] if types else None
        uses_rope = getattr(module, "use_rope", True)

        def table(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            args = (query, p[None]) + ((layer_type,) if isinstance(rotary.rope_type, dict) else ())
            return rotary(*args)

        if kw.get("sliding_window") or not uses_rope:  # the layer as transformers has it
            # with its causal (and windowed) mask written here: a custom implementation's name
            # may get no mask from transformers (SDPA's is_causal stands in for it)
            L = query.shape[2]
            dist = torch.arange(L)[:, None] - torch.arange(L)[None]  # [L, L]: i - j
            visible = (dist >= 0) & (dist < (kw.get("sliding_window") or L + 1))
            mask = torch.zeros(L, L).masked_fill(~visible, torch.finfo(torch.float32).min)
            if uses_rope:  # transformers' rotation, which the reference model skipped
                cos, sin = table(torch.arange(L))
                query, key = stock_rotation(query, key, cos, sin)
            return eager(module, query, key, value, mask[None, None], scaling=scaling, **kw)

        q, k = query, key  # unrotated: the reference model's rotation is the identity
        h = q.shape[1]
        k, v = repeat(k, h), repeat(value, h)
        scale = scaling if scaling is not None else q.shape[-1] ** -0.5
        cap = kw.get("softcap")
        if extension["method"] == "self_extend":
            o = naive_self_extend(
                q, k, v, table, extension["group_size"], extension["neighbor_window"], scale, cap
            )
        else:
            o = naive_dual_chunk(
                q, k, v, table, extension["chunk_size"], extension["local_size"], scale, cap
            )
        return o.transpose(1, 2).contiguous(), None

    AttentionInterface.register("posenc_test_naive", attention)
    # The layers call the rotation by its module-level name: the identity while the reference
    # runs, so each attention above receives the unrotated queries and keys.
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", lambda q, k, *a, **kw: (q, k))
    ref = copy.deepcopy(model)
    ref.config._attn_implementation = "posenc_test_naive"
    for m in ref.modules():
        if hasattr(m, "config") and m.config is not ref.config:
            m.config._attn_implementation = "posenc_test_naive"
    try:
        with torch.no_grad():
            return ref(ids, use_cache=False).logits
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("model_type", list(MODELS))
@pytest.mark.parametrize("extension", EXTENSIONS, ids=lambda e: e["method"])
def test_hybrid_prefill_and_decode_equal_the_papers(
    model_type: str, extension: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny(model_type)
    ids = torch.randint(1, 97, (2, 40), generator=torch.Generator().manual_seed(3))
    want = reference(model, ids, extension, monkeypatch)
    with torch.no_grad():
        stock = model(ids).logits
        assert (stock - want).abs().max() > 1e-3  # the method changes this model
        patched = apply_posenc(copy.deepcopy(model), extension=extension)
        assert (patched(ids).logits - want).abs().max() <= TOL
        steps = hf_prefill_then_decode(patched, ids, 25)[:, 25:]  # prefill 25, then one a call
        assert (steps - want[:, 25:]).abs().max() <= TOL


def test_only_the_full_rope_layers_are_patched() -> None:
    gemma3 = apply_posenc(tiny("gemma3_text"), extension=EXTENSIONS[0])
    assert [a.layer_idx for a in gemma3.posenc_patch.attention] == [1]
    # the full layer rotates by the global theta (1e6), not the sliding layers' 1e4
    state = gemma3.model.layers[1].self_attn.posenc_extension
    assert torch.equal(state.inv_freq, gemma3.model.rotary_emb.full_attention_inv_freq)
    smollm3 = apply_posenc(tiny("smollm3"), extension=EXTENSIONS[1])
    assert [a.layer_idx for a in smollm3.posenc_patch.attention] == [0, 1]


def test_left_padding_on_a_hybrid_gives_each_row_its_own_logits() -> None:
    model = apply_posenc(tiny("gemma3_text"), extension=EXTENSIONS[0])
    g = torch.Generator().manual_seed(4)
    long, short = (
        torch.randint(1, 97, (1, 36), generator=g),
        torch.randint(1, 97, (1, 29), generator=g),
    )
    ids = torch.cat((long, torch.cat((torch.zeros(1, 7, dtype=torch.long), short), 1)))
    mask = (ids != 0).long()
    mask[0] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each row from 0, as generate() gives them
    with torch.no_grad():
        both = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = model(short).logits
    assert (both[1, 7:] - alone[0]).abs().max() <= TOL


def test_models_with_nothing_to_extend_are_refused_by_name() -> None:
    mistral = tiny_lm("mistral", **{**PARITY_SIZES, "num_hidden_layers": 2, "sliding_window": 8})
    with pytest.raises(ValueError, match=r"this mistral has none \(sliding window 8\)"):
        apply_posenc(mistral, extension=EXTENSIONS[0])
    cohere2 = tiny_lm("cohere2", **{**PARITY_SIZES, "num_hidden_layers": 4, "sliding_window": 8})
    with pytest.raises(ValueError, match="supports half-split RoPE models"):
        apply_posenc(cohere2, extension=EXTENSIONS[0])
    assert getattr(mistral, "posenc_patch", None) is None
