"""What a single planted line in ``posenc.extend`` or ``posenc.hf.extension`` would change, each
guarded by a test that names it: DCA's inter-chunk position cap, the float32 logits of the merge,
the key positions when no ``position_ids`` are passed, YaRN's attention scaling in an extended
model, the refusal of length-dependent RoPE types, the perplexity bin bounds, the needle depth,
the greedy-rank tie rule, the cell identity, the target length behind the default factor, the
export's ``max_position_embeddings``, NTK's base exponent, the fine-tune's RNG state on resume,
the default neighbour window, and a resumed run that must not skip a passkey depth.

References are independent of the code under test: the papers' formulas written out, transformers'
own models and rotary modules, hand-made numbers."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers
from torch import nn

import posenc.extend.methods.finetune as ft
from _tiny import bpe_tokenizer, tiny_lm
from posenc.extend.measures.perplexity import (
    PASSKEY_INTRO,
    PASSKEY_NEEDLE,
    PASSKEY_QUESTION,
    PasskeyPrompt,
    bin_means,
    default_documents,
    passkey_prompt,
    perplexity_at,
    score_passkey,
)
from posenc.extend.methods.explicit import keyset_attention
from posenc.extend.methods.export import export_model
from posenc.extend.methods.keysets import by_method
from posenc.extend.methods.names import (
    Method,
    Resolved,
    as_transformers,
    parse_method,
    resolve,
)
from posenc.extend.study.config import StudyConfig, cell_identity, cells
from posenc.hf import apply_posenc
from posenc.hf.extension import ExtensionState, extension_attention
from posenc.runs.identity import stable_hash
from test_extend_attention import hf_rot, hf_rotary, naive_dual_chunk, qkv, repeat

self_extend_attention = by_method(keyset_attention, "self_extend")
dual_chunk_attention = by_method(keyset_attention, "dual_chunk")
TOL = 1e-5


def _llama(**rope: Any) -> Any:
    """A tiny Llama (head_dim 16, trained at 32 tokens), with ``rope_parameters`` if given."""
    if rope:
        params = {"rope_theta": 10000.0, **rope}
        return tiny_lm(pad_token_id=0, max_position_embeddings=128, rope_parameters=params)
    return tiny_lm(pad_token_id=0)


# --- attention ---------------------------------------------------------------------------------


def test_dca_inter_chunk_position_is_capped_at_chunk_size() -> None:
    """A query attends to earlier chunks at ``min(2c - 1, chunk_size)`` (ChunkLlama's cap): with
    chunk_size 12 and local_size 2, c = 10 and 2c - 1 = 19 > 12, so the cap decides."""
    q, k, v = qkv(L=45)
    rotary = hf_rotary()
    pos = torch.arange(45).expand(2, -1)
    got = dual_chunk_attention(q, k, v, pos, inv_freq=rotary.inv_freq.float(), chunk_size=12,
                               local_size=2, scale=0.25)  # fmt: skip
    assert (got - naive_dual_chunk(q, k, v, rotary, 12, 2)).abs().max() <= TOL


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_merge_takes_float32_logits_for_half_inputs(dtype: torch.dtype) -> None:
    """Half-precision inputs: the logits, mask and softmax in float32 (float16's range cannot hold
    the mask value; its softmax would round), the output in the input's dtype, within the
    dtype's rounding of a float32 reference on the same values."""
    q, k, v = (x.to(dtype) for x in qkv(L=40))
    rotary = hf_rotary()
    pos = torch.arange(40)
    got = self_extend_attention(q, k, v, pos.expand(2, -1), inv_freq=rotary.inv_freq.float(),
                                group_size=4, neighbor_window=40, scale=0.25)  # fmt: skip
    assert got.dtype == dtype
    qf, kf, vf = q.float(), k.float(), v.float()
    want = torch.nn.functional.scaled_dot_product_attention(
        hf_rot(qf, pos, rotary), repeat(hf_rot(kf, pos, rotary), 4), repeat(vf, 4), is_causal=True
    )
    tol = 4 * torch.finfo(dtype).eps
    assert (got.float() - want).abs().max() <= tol * max(1.0, float(want.abs().max()))


def test_without_position_ids_the_queries_are_the_caches_last_slots() -> None:
    """A model that passes no ``position_ids`` to attention: the ``s`` queries take positions
    ``t - s .. t - 1`` (the last slots of the cache), as in a decode step. (Grouped positions
    are not shift-invariant: 27 cached tokens, groups of 4.)"""
    q, k, v = qkv(L=30)
    rotary = hf_rotary()
    module = nn.Module().eval()
    module.posenc_extension = ExtensionState(  # type: ignore[assignment]
        "self_extend", {"group_size": 4, "neighbor_window": 4}, rotary.inv_freq.float(), 1.0
    )
    query = q[:, :, -3:]  # a 3-token step after 27 cached tokens
    out, _ = extension_attention(module, query, k, v, None, scaling=0.25)
    want = self_extend_attention(query, k, v, torch.arange(27, 30).expand(2, -1),
                                 inv_freq=rotary.inv_freq.float(), group_size=4,
                                 neighbor_window=4, scale=0.25)  # fmt: skip
    assert (out.transpose(1, 2) - want).abs().max() <= TOL
    given, _ = extension_attention(
        module, query, k, v, None, scaling=0.25, position_ids=torch.arange(27, 30)[None]
    )
    assert (given - out).abs().max() <= TOL


@pytest.mark.parametrize(
    "extension",
    [
        {"method": "self_extend", "group_size": 2, "neighbor_window": 64},
        {"method": "dual_chunk", "chunk_size": 72, "local_size": 4},
    ],
    ids=lambda e: e["method"],
)
def test_an_extended_yarn_model_keeps_yarns_attention_scaling(extension: dict[str, Any]) -> None:
    """YaRN multiplies cos and sin by 0.1 ln(factor) + 1 (1.139 at factor 4): a window or chunk
    wider than the sequence is plain attention, so the extended model equals stock transformers'
    YaRN model only if the methods rotate with that scaling too."""
    model = _llama(rope_type="yarn", factor=4.0, original_max_position_embeddings=32)
    assert abs(model.model.rotary_emb.attention_scaling - (0.1 * math.log(4.0) + 1)) < 1e-9
    ids = torch.randint(1, 64, (1, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stock = model(ids).logits
        patched = apply_posenc(copy.deepcopy(model), extension=extension)(ids).logits
    assert (patched - stock).abs().max() <= TOL


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "dynamic", "factor": 4.0},
        {"rope_type": "longrope", "factor": 4.0, "short_factor": [1.0] * 8,
         "long_factor": [2.0] * 8, "original_max_position_embeddings": 32},
    ],
    ids=lambda r: r["rope_type"],
)  # fmt: skip
def test_length_dependent_rope_types_are_refused(rope: dict[str, Any]) -> None:
    """Dynamic NTK and LongRoPE change their frequencies with the sequence length; the methods
    rotate by frequencies read once, so they refuse such a model rather than run it wrongly."""
    model = _llama(**rope)
    for extension in (
        {"method": "self_extend", "group_size": 2, "neighbor_window": 8},
        {"method": "dual_chunk", "chunk_size": 24, "local_size": 2},
    ):
        with pytest.raises(ValueError, match="changes them with the length"):
            apply_posenc(model, extension=extension)
    assert getattr(model, "posenc_patch", None) is None


# --- measuring ---------------------------------------------------------------------------------


def test_perplexity_at_a_length_reads_the_bin_just_before_it() -> None:
    """``nll[i]`` is the loss of token ``i + 1``: perplexity at 8 tokens with a window of 3 is
    over tokens 5, 6, 7, i.e. ``nll[4:7]`` (mean 5 here), and bins cover ``nll`` in order."""
    nll = torch.arange(10, dtype=torch.float64)
    assert math.log(perplexity_at(nll, 8, 3)) == pytest.approx(5.0)
    assert math.log(perplexity_at(nll, 11, 10)) == pytest.approx(4.5)  # every token
    assert bin_means(nll, 4) == [1.5, 5.5, 8.5]
    with pytest.raises(ValueError):
        perplexity_at(nll, 12, 3)  # one token past the end


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return bpe_tokenizer()


def _find(ids: list[int], part: list[int]) -> int:
    return next(i for i in range(len(ids)) if ids[i : i + len(part)] == part)


def test_the_needle_sits_at_its_depth(tokenizer: Any) -> None:
    """Depth 0: the needle right after the intro; 1: right before the question; 0.5: halfway
    through the filler (to a token)."""

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    length, head = 300, 1 + len(enc(PASSKEY_INTRO))  # BOS, intro
    starts = {}
    for depth in (0.0, 0.5, 1.0):
        prompt = passkey_prompt(tokenizer, length, depth, seed=7)
        ids = prompt.ids[0].tolist()
        assert len(ids) == length
        needle = enc(PASSKEY_NEEDLE.format(key=prompt.key))
        starts[depth] = _find(ids, needle)
    tail = len(enc(PASSKEY_QUESTION)) + len(enc(" " + prompt.key))
    assert starts[0.0] == head
    assert starts[1.0] + len(needle) == length - tail
    assert abs(starts[0.5] - (starts[0.0] + starts[1.0]) / 2) <= 1


class _TableModel(nn.Module):
    """A stand-in causal LM whose logits after token ``i`` are row ``i`` of ``table``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        n = table.shape[0]
        self.embed = nn.Embedding(n, n, _weight=torch.eye(n))
        self.head = nn.Linear(n, n, bias=False)
        self.head.weight.data = table.T.clone()
        self.config = SimpleNamespace(get_text_config=lambda decoder=True: SimpleNamespace())

    def get_decoder(self) -> Any:
        return lambda input_ids, **kw: SimpleNamespace(last_hidden_state=self.embed(input_ids))

    def get_output_embeddings(self) -> nn.Module:
        return self.head


def test_a_key_token_tied_with_the_best_is_greedy_rank_1() -> None:
    """Rank = 1 + the number of tokens strictly more likely: a tie with the best token is rank 1
    (greedy decoding may write it), one token strictly above is rank 2."""
    table = torch.tensor(
        [[0.0, 5.0, 5.0, 0.0], [0.0, 0.0, 3.0, 4.0], [0.0, 0.0, 4.0, 4.0], [0.0] * 4]
    )
    model = _TableModel(table)
    # ids 0 1 2: the key is (1, 2); token 1 is predicted after 0 (tied), token 2 after 1 (below 3)
    tied_then_below = score_passkey(model, PasskeyPrompt(torch.tensor([[0, 1, 2]]), "k", 2, 0.5))
    assert tied_then_below["ranks"] == [1, 2] and tied_then_below["exact"] is False
    # ids 0 2 2: after 2, token 2 ties with 3: every key token rank 1, an exact match
    tied = score_passkey(model, PasskeyPrompt(torch.tensor([[0, 2, 2]]), "k", 2, 0.5))
    assert tied["ranks"] == [1, 1] and tied["exact"] is True
    want = (5.0 - math.log(2 * math.exp(5) + 2)) + (4.0 - math.log(2 * math.exp(4) + 2))
    assert tied["key_logprob"] == pytest.approx(want, abs=1e-5)


# --- the study's bookkeeping -------------------------------------------------------------------


def _cfg(**kw: Any) -> StudyConfig:
    base: dict[str, Any] = dict(
        methods=(Method("none"),), lengths=(64, 256), documents=(str(default_documents(1)[0]),),
        bin_size=32, passkey_lengths=(256, 512), passkey_depths=(0.1, 0.5, 0.9),
    )  # fmt: skip
    return StudyConfig(**{**base, **kw})


def _idents(cfg: StudyConfig, kind: str) -> list[str]:
    return [
        stable_hash(cell_identity(c, cfg, {"model": "m"}, Resolved("none")))
        for c in cells(cfg)
        if c.kind == kind
    ]


def test_every_passkey_cell_has_its_own_identity() -> None:
    """A resumed run skips a cell whose identity is stored: each (length, depth) is its own, so
    no depth or length is taken as done because another one is."""
    idents = _idents(_cfg(), "passkey")
    assert len(idents) == 6 and len(set(idents)) == 6
    more = _idents(_cfg(passkey_depths=(0.1, 0.5, 0.9, 0.3)), "passkey")
    assert set(idents) < set(more) and len(set(more)) == 8  # an added depth is new work


def test_a_perplexity_cell_is_named_by_its_bin_size_and_lengths() -> None:
    assert _idents(_cfg(), "ppl") != _idents(_cfg(bin_size=16), "ppl")
    assert _idents(_cfg(), "ppl") != _idents(_cfg(lengths=(128, 256)), "ppl")


def test_the_default_factor_is_the_longest_length_over_the_trained_length() -> None:
    """The methods' factor is set for the study's target, the longest of the perplexity and
    passkey lengths, as target / trained (not rounded down)."""
    cfg = _cfg()
    assert cfg.target == 512  # a passkey length above the longest perplexity length
    assert resolve(parse_method("yarn"), 128, cfg.target, 8).scaling["factor"] == 4.0
    assert resolve(parse_method("linear"), 128, 320, 8).scaling["factor"] == 2.5
    assert resolve(parse_method("yarn"), 128, 100, 8).identity  # within training: factor 1


def test_the_default_neighbour_window_is_a_quarter_of_training() -> None:
    """Self-Extend's default window is trained / 4 and its group the smallest that keeps the
    largest grouped query position, (L - 1) // G + W - W // G, at a position the model was
    trained on (<= trained - 1; at 128 -> 512 a ceil-based group of 5 reached 128, one past)."""
    cases = [(128, 512), (128, 300), (2048, 16384), (100, 1000), (8192, 12288), (32768, 65536)]
    for trained, target in cases:
        ext = resolve(parse_method("self_extend"), trained, target, 8).extension
        w, g = ext["neighbor_window"], ext["group_size"]
        assert w == trained // 4
        assert (target - 1) // g + w - w // g <= trained - 1
        if g > 2:  # the smallest such group
            assert (target - 1) // (g - 1) + w - w // (g - 1) > trained - 1


def test_ntk_is_written_as_the_base_times_factor_to_d_over_d_minus_2() -> None:
    """Static NTK-aware scaling (bloc97): base' = base * factor ** (d / (d - 2)), d the rotary
    dimension (16 here), written as transformers' default RoPE with that theta."""
    model = _llama()
    scaling = resolve(parse_method("ntk"), 32, 128, 8).scaling
    params = as_transformers(scaling, model.config)
    assert params["rope_type"] == "default"
    assert params["rope_theta"] == pytest.approx(10000.0 * 4.0 ** (16 / 14), rel=1e-12)


def test_export_raises_max_position_embeddings_to_the_target(tmp_path: Path) -> None:
    model = _llama()
    for method, want in [("yarn", 256), ("linear", 256), ("dynamic", 32)]:
        out = export_model(model, None, parse_method(method), 256, tmp_path / method)
        config = json.loads((out / "config.json").read_text())
        assert config["max_position_embeddings"] == want, method  # dynamic grows by itself


def test_a_resumed_fine_tune_continues_the_rng_stream(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its checkpoint at step 2, a PoSE fine-tune resumed draws the examples an
    uninterrupted run draws at steps 3 and 4 (the RNG state is in the checkpoint): same losses."""
    doc = tmp_path / "doc.txt"
    doc.write_text(default_documents(1)[0].read_text()[:6000])
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=32)  # fmt: skip
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(cfg)
    settings = ft.FinetuneConfig(steps=4, train_len=16, target_len=128, save_every=2, lr=1e-3)
    whole = ft.finetune(copy.deepcopy(base), tokenizer, [doc], settings, tmp_path / "whole")

    real, calls = ft.pose_example, []

    def killed_at_step_3(*a: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(ft, "pose_example", killed_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        ft.finetune(copy.deepcopy(base), tokenizer, [doc], settings, tmp_path / "resumed")
    monkeypatch.setattr(ft, "pose_example", real)
    resumed = ft.finetune(copy.deepcopy(base), tokenizer, [doc], settings, tmp_path / "resumed")
    assert resumed["losses"] == pytest.approx(whole["losses"], rel=1e-6)
