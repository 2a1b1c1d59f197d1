"""Properties a planted fault showed unpinned, each pinned here by a test that fails when it
breaks: the needle's slot (the needle's exact ids at exactly ``round(depth * haystack)``), the
variable chain's order, 7-digit values, distinct draws, end-of-sequence honoured by greedy
decoding, fused Dual Chunk Attention with ``local_size >= chunk_size / 2`` exact (ChunkLlama's
``chunkllama_attn_replace.py`` takes any local window: its successive and inter-chunk query
positions ``min(chunk_len + i, chunk_size)`` then never reach the cap), ``layers="full"`` on a
Llama (every layer: all of them are full attention); and the prompt cache read as data from a
stranger: every field checked against what the generator builds, one line naming the file."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import posenc.extend.methods.fused as fused
from _keyset_naive import naive_attention
from _tiny import bpe_tokenizer, tiny_lm
from posenc.extend.measures.tasks import generation, get_task
from posenc.extend.measures.tasks.base import encoder_for
from posenc.extend.measures.tasks.haystacks import NOISE, essay_sentences
from posenc.extend.measures.tasks.niah import NEEDLE
from posenc.extend.measures.tasks.prompts import cached_samples
from posenc.extend.measures.tasks.words import KINDS, distinct
from posenc.extend.methods.keysets import key_sets


@pytest.fixture(scope="module")
def bpe() -> Any:
    text = " ".join(essay_sentences()[:400]) + (NOISE + "\n") * 50
    return bpe_tokenizer(1000, text)


# --- the generators -----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "sep"), [("niah_single_1", ("", "\n")),
                                           ("niah_single_2", (" ", ""))])  # fmt: skip
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.77, 1.0])
def test_the_needle_sits_in_its_slot(
    bpe: Any, name: str, sep: tuple[str, str], depth: float
) -> None:
    """The first needle's span holds exactly its sentence's ids, after exactly ``round(depth *
    haystack)`` haystack ids (RULER's depth), the haystack itself untouched around it."""
    s = get_task(name).sample(bpe, 1500, depth, seed=7)
    first = s.needles[0]
    key = re.search(r"for (\S+) mentioned", s.text[s.context[1] - 1 :]).group(1)
    sentence = NEEDLE.format(type_needle_v="numbers", key=key, value=s.references[0])
    assert s.ids[first.start : first.end] == tuple(encoder_for(bpe).ids(sep[0] + sentence + sep[1]))
    haystack = s.context[1] - s.context[0] - sum(n.end - n.start for n in s.needles)
    before = (
        first.start - s.context[0] - sum(n.end - n.start for n in s.needles if n.end <= first.start)
    )
    assert before == round(depth * haystack)


def test_the_variable_chain_reads_down_in_order(bpe: Any) -> None:
    """Link ``j`` (``VAR V_j = VAR V_{j-1}``, the first ``VAR V_0 = value``) sits after link
    ``j - 1``: the chain can be followed reading forward."""
    for seed in range(4):
        s = get_task("vt").sample(bpe, 2048, 0.3, seed=seed)
        names = s.references
        value = re.search(r"assigned the value (\d+)", s.text[s.context[1] - 1 :]).group(1)
        links = [f"VAR {names[0]} = {value}"] + [
            f"VAR {names[j]} = VAR {names[j - 1]}" for j in range(1, len(names))
        ]
        starts = [n.start for n in s.needles]
        assert starts == sorted(starts) and len(set(starts)) == len(starts)
        for span, link in zip(s.needles, links, strict=True):
            assert bpe.decode(list(s.ids[span.start : span.end])) == link + "\n"


def test_values_are_seven_digit_numbers_and_vt_five(bpe: Any) -> None:
    for name in ("niah_single_1", "niah_multikey_2", "niah_multivalue", "niah_multiquery"):
        for s in get_task(name).samples(bpe, 1024, 0.5, 3, seed=1):
            assert all(re.fullmatch(r"[1-9]\d{6}", r) for r in s.references), s.references
            values = re.findall(r"is: (\d+)\.", s.text)
            assert values and all(len(v) == 7 for v in values)
    s = get_task("vt").sample(bpe, 1024, 0.5, seed=1)
    assert re.search(r"assigned the value [1-9]\d{4} ", s.text)


def test_draws_are_distinct(bpe: Any) -> None:
    """``distinct`` never repeats a draw, nor one in ``avoid``, even from three letters; every
    key and value of a haystack full of distractor needles is its own, and so are vt's names."""
    for seed in range(20):
        got = distinct(random.Random(seed), lambda r: r.choice("abc"), 3)
        assert sorted(got) == ["a", "b", "c"]
    avoid = {"a"}
    assert sorted(distinct(random.Random(0), lambda r: r.choice("abc"), 2, avoid)) == ["b", "c"]
    assert avoid == {"a", "b", "c"}
    s = get_task("niah_multikey_2").sample(bpe, 4096, 0.5, seed=3)
    pairs = re.findall(r"for (\S+) is: (\d+)\.", s.text)
    keys, values = [k for k, _ in pairs], [v for _, v in pairs]
    assert len(pairs) > 20 and len(set(keys)) == len(keys) and len(set(values)) == len(values)
    assert len(set(get_task("vt").sample(bpe, 1024, 0.5, seed=2).references)) == 5
    assert len(set(distinct(random.Random(1), KINDS["numbers"], 50))) == 50


# --- greedy decoding ------------------------------------------------------------------------------


def test_greedy_decoding_stops_at_end_of_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first stop id ends the answer (not kept); without one it runs to its budget."""
    script = iter([6, 2, 7, 8, 9, 10])

    def step(model: Any, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.tensor([next(script)]), 16).float()

    monkeypatch.setattr(generation, "_step", step)
    first = torch.nn.functional.one_hot(torch.tensor(5), 16).float()
    assert generation._greedy(None, first, None, 50, {2}) == [5, 6]
    script = iter([6, 2, 7, 8, 9, 10])
    assert generation._greedy(None, first, None, 4, {3}) == [5, 6, 2, 7]

    class Tok:
        eos_token_id = 2

    class Model:
        generation_config = type("G", (), {"eos_token_id": [2, 11]})()

    assert generation._stop_ids(Tok(), Model()) == {2, 11}


# --- Dual Chunk Attention with a wide local window --------------------------------------------------

WIDE_LOCAL = [(8, 4), (9, 5), (10, 6), (12, 9)]  # local_size >= chunk_size / 2


def _rot_at() -> Any:
    import transformers
    from transformers.models.llama import modeling_llama

    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4)
    rotary = modeling_llama.LlamaRotaryEmbedding(cfg)

    def rot_at(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        cos, sin = rotary(x, p[None])
        return modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)[0]

    return rot_at, rotary.inv_freq.float()


@pytest.mark.parametrize(("chunk", "local"), WIDE_LOCAL)
def test_fused_dual_chunk_with_a_wide_local_window_is_exact(
    monkeypatch: pytest.MonkeyPatch, chunk: int, local: int
) -> None:
    """Prefill and a decode step of the fused path against the naive full-matrix DCA
    (ChunkLlama's formulas); and the comparison fails where the inter-chunk query sits at
    ``chunk_size`` (the cap) instead of ``2 c - 1`` below it."""
    monkeypatch.setattr(fused, "PATH", "fused")  # an error rather than a fallback
    rot_at, inv_freq = _rot_at()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 45, 16, generator=g) for h in (4, 2, 2))
    options = {"chunk_size": chunk, "local_size": local}
    want = naive_attention(q, k, v, rot_at, "dual_chunk", options, 0.25)
    sets = key_sets("dual_chunk", options)

    def ours(sets: Any, rows: slice = slice(None)) -> torch.Tensor:
        pos = torch.arange(45)[rows][None]
        return fused.keyset(q[:, :, rows], k, v, pos, sets=sets, inv_freq=inv_freq, scale=0.25)

    assert float((ours(sets) - want).abs().max()) <= 1e-5
    assert float((ours(sets, slice(44, 45)) - want[:, :, 44:]).abs().max()) <= 1e-5
    inter, intra, succ = sets.sets
    capped = dataclasses.replace(inter, query=lambda p: torch.full_like(p, chunk))
    planted = dataclasses.replace(sets, sets=(capped, intra, succ))
    assert float((ours(planted) - want).abs().max()) > 1e-3


# --- layers="full" on a Llama ----------------------------------------------------------------------


def test_layers_full_on_a_llama_scales_every_layer() -> None:
    """A Llama's layers are all full attention: ``yarn:layers=full`` is ``yarn`` (every layer
    scaled), neither refused nor scaling none."""
    from posenc.extend.methods.apply import with_method
    from posenc.extend.methods.names import parse_method, resolve

    model = tiny_lm("llama", max_position_embeddings=32)
    ids = torch.randint(0, 64, (1, 96), generator=torch.Generator().manual_seed(1))

    def logits(label: str | None) -> torch.Tensor:
        undo = (with_method(model, resolve(parse_method(label), 32, 128, 8)) if label
                else (lambda: None))  # fmt: skip
        try:
            with torch.no_grad():
                return model(ids).logits
        finally:
            undo()

    plain, auto, full = logits(None), logits("yarn"), logits("yarn:layers=full")
    assert float((auto - plain).abs().max()) > 1e-4
    assert float((full - auto).abs().max()) == 0.0


# --- the prompt cache -------------------------------------------------------------------------------


def _planted(tmp_path: Path, bpe: Any, fault: Any, questions: int = 1) -> str:
    args = (tmp_path, bpe, "niah_single_1", 384, 0.5, 2, 0, {"m": 1}, questions)
    cached_samples(*args)
    (path,) = (tmp_path / "prompts").glob("*.json")
    data = json.loads(path.read_text())
    fault(data[1])
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        cached_samples(*args)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "sample 1" in message
    return message


@pytest.mark.parametrize(("fault", "says"), [
    (lambda d: d["ids"].__setitem__(5, 10**6), "holds id 1000000, outside the vocabulary of"),
    (lambda d: d.__setitem__("max_new_tokens", 10**7), "max_new_tokens=10000000; task"),
    (lambda d: d.__setitem__("max_new_tokens", 0), "max_new_tokens=0; task niah_single_1 writes"),
    (lambda d: d.__setitem__("references", []), "an empty reference"),
    (lambda d: d.__setitem__("references", [""]), "an empty reference"),
    (lambda d: d["ids"].__setitem__(5, d["ids"][6]), "ids (digest"),
    (lambda d: d.__setitem__("target", " 1234567"), "target ' 1234567' is not the generator"),
    (lambda d: d["needles"][0].__setitem__("start", 3), "needles"),
    (lambda d: d.__setitem__("prefix", 7), "prefix 7 is not the generator's 0"),
])  # fmt: skip
def test_a_planted_prompt_file_is_refused_in_one_line(tmp_path: Path, bpe: Any, fault: Any,
                                                      says: str) -> None:  # fmt: skip
    assert says in _planted(tmp_path, bpe, fault)


def test_grouped_prompts_are_cached_and_checked(tmp_path: Path, bpe: Any) -> None:
    first = cached_samples(tmp_path, bpe, "niah_single_1", 384, 0.5, 2, 0, {"m": 1}, 2)
    again = cached_samples(tmp_path, bpe, "niah_single_1", 384, 0.5, 2, 0, {"m": 1}, 2)
    assert first == again and first[0].prefix > 0
    alone = cached_samples(tmp_path, bpe, "niah_single_1", 384, 0.5, 2, 0, {"m": 1})
    assert len(list((tmp_path / "prompts").glob("*.json"))) == 2 and alone[0].prefix == 0
    assert "prefix" in _planted(tmp_path / "g", bpe, lambda d: d.__setitem__("prefix", 3), 2)
