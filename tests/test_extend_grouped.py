"""Several questions of one prefilled context (``Task.samples(questions=k)``,
:func:`posenc.extend.measures.tasks.answer_group`): each question's answer through the forked
cache is its whole prompt's answered alone (:func:`~posenc.extend.measures.tasks.answer`): the
same output tokens and target log-probabilities, the model as loaded and with a key-set method
in place, on a Llama and on the hybrid Gemma-3 (whose sliding layers forget: the fork refilled);
the grouped prompts' layout (shared ids, each question's needle, every key asked in turn); the
cluster-aware interval against a naive computation of its formula; a cell's row fields."""

from __future__ import annotations

import copy
import math
import re
import statistics
from typing import Any

import pytest

from _tiny import bpe_tokenizer, tiny_lm
from posenc._stats import cluster_wilson_interval, wilson_interval
from posenc.extend.measures.tasks import (
    answer,
    answer_group,
    context_digest,
    get_task,
    run_cell,
    sample_digest,
    summarize,
)
from posenc.extend.measures.tasks.haystacks import NOISE, essay_sentences


@pytest.fixture(scope="module")
def bpe() -> Any:
    text = " ".join(essay_sentences()[:400]) + (NOISE + "\n") * 50
    return bpe_tokenizer(1000, text)


def _model(bpe: Any, model_type: str = "llama", **extra: Any) -> Any:
    ids = {"bos_token_id": bpe.bos_token_id, "eos_token_id": bpe.eos_token_id}
    return tiny_lm(model_type, vocab_size=len(bpe), max_position_embeddings=256,
                   attn="eager", **ids, **extra)  # fmt: skip


METHODS = [
    None,
    {"method": "self_extend", "group_size": 4, "neighbor_window": 64},
    {"method": "string", "shifted_offset": 192, "local_window": 32},
]


@pytest.mark.parametrize("extension", METHODS, ids=["none", "self_extend", "string"])
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_each_question_through_the_fork_answers_as_its_prompt_alone(
    bpe: Any, extension: dict[str, Any] | None, model_type: str
) -> None:
    from posenc.hf import apply_posenc

    extra = ({"sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]}
             if model_type == "gemma3_text" else {})  # fmt: skip
    model = _model(bpe, model_type, **extra)
    if extension is not None:
        model = apply_posenc(copy.deepcopy(model), extension=extension)
    samples = get_task("niah_multikey_1").samples(bpe, 400, 0.5, 4, seed=1, questions=4)
    grouped = answer_group(model, bpe, samples, max_new_tokens=12)
    for s, got in zip(samples, grouped, strict=True):
        alone = answer(model, bpe, s, max_new_tokens=12)
        assert got.output == alone.output and got.new_tokens == alone.new_tokens
        assert got.new_tokens > 0 and got.target_tokens == alone.target_tokens
        assert got.target_logprob == pytest.approx(alone.target_logprob, abs=1e-4)
    assert len({g.output for g in grouped}) > 1 or len({g.target_logprob for g in grouped}) > 1


def test_a_fork_that_leaked_into_the_context_is_caught(
    bpe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above fails where every question grows the one cache (no fork)."""
    from posenc.extend.measures.tasks import generation

    model = _model(bpe)
    samples = get_task("niah_single_2").samples(bpe, 300, 0.5, 3, seed=2, questions=3)
    monkeypatch.setattr(generation, "_fork", lambda cache: cache)
    grouped = answer_group(model, bpe, samples, max_new_tokens=4)
    alone = [answer(model, bpe, s, max_new_tokens=4) for s in samples]
    assert any(abs(float(g.target_logprob) - float(a.target_logprob)) > 1e-2
               for g, a in zip(grouped[1:], alone[1:], strict=True))  # fmt: skip


def test_the_questions_decode_in_shared_steps_and_a_mixed_batch_is_caught(
    bpe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Questions of 394-400 ids decode in batches that the shorter ones join as they reach a
    longer one's position: fewer decoder steps than tokens written, the same answers (the test
    above); and rows stacked in another order than their tokens are caught by that comparison."""
    from posenc.extend.measures.tasks import generation

    model = _model(bpe)
    samples = get_task("niah_multikey_1").samples(bpe, 400, 0.5, 4, seed=1, questions=4)
    assert len({len(s.ids) for s in samples}) > 1  # prompts of several lengths
    steps = []
    handle = model.model.register_forward_hook(lambda m, a, kw, o: steps.append(1),
                                               with_kwargs=True)  # fmt: skip
    grouped = answer_group(model, bpe, samples, max_new_tokens=12, logprob=False)
    handle.remove()
    written = sum(g.new_tokens for g in grouped)
    # 1 prefill + 4 questions + the decoding steps: fewer than one a token and question
    assert written == 48 and len(steps) - 5 < written - 4
    alone = [answer(model, bpe, s, max_new_tokens=12, logprob=False).output for s in samples]
    assert [g.output for g in grouped] == alone
    rows = generation._rows

    def swapped(caches: Any, keep: Any = None, room: int = 0) -> Any:
        return rows(list(reversed(caches)), keep, room)

    monkeypatch.setattr(generation, "_rows", swapped)
    mixed = answer_group(model, bpe, samples, max_new_tokens=12, logprob=False)
    assert [g.output for g in mixed] != alone


def test_a_batch_cache_appends_in_place_and_grows_past_its_room(bpe: Any) -> None:
    """The batch's plain layers write each step into spare room (no copy of the cache a step) and
    grow when it runs out: the same logits and keys as transformers' own layer, step by step;
    the fork it was copied from untouched."""
    import torch

    from posenc.extend.measures.tasks import generation

    model = _model(bpe)
    ids = torch.randint(3, len(bpe), (1, 30), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        _, context = generation._prefill(model, ids)
        before = context.layers[0].keys.clone()
        plain, batch = generation._fork(context), generation._rows([context], room=2)
        assert type(batch.layers[0]).__name__ == "AppendingLayer"
        first = batch.layers[0].room
        for step in range(5):  # two steps in the room, then it grows
            token = torch.tensor([[7 + step]])
            want = generation._step(model, token, plain)
            assert torch.equal(generation._step(model, token, batch), want)
            for a, b in zip(batch.layers, plain.layers, strict=True):
                assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert batch.layers[0].room is not first and batch.layers[0].keys.shape[-2] == 35
        assert torch.equal(context.layers[0].keys, before) and before.shape[-2] == 30


def test_caches_that_cannot_stack_decode_each_question_in_turn(
    bpe: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache with a layer other than a plain or sliding one (a recurrent state) never shares a
    batch: each question decodes alone, to the same answers."""
    from posenc.extend.measures.tasks import generation

    model = _model(bpe)
    samples = get_task("niah_multikey_1").samples(bpe, 400, 0.5, 4, seed=1, questions=4)
    alone = [answer(model, bpe, s, max_new_tokens=6, logprob=False).output for s in samples]
    monkeypatch.setattr(generation, "_stackable", lambda cache: False)
    monkeypatch.setattr(generation, "_rows", lambda *a: pytest.fail("stacked a cache"))
    grouped = answer_group(model, bpe, samples, max_new_tokens=6, logprob=False)
    assert [g.output for g in grouped] == alone


@pytest.mark.parametrize("name", ["niah_single_1", "niah_multikey_1", "niah_multikey_2",
                                  "niah_multivalue", "niah_multiquery"])  # fmt: skip
def test_a_group_is_one_context_and_each_question_asks_its_own_needle(bpe: Any, name: str) -> None:
    k = 4
    samples = get_task(name).samples(bpe, 1024, 0.4, 8, seed=3, questions=k)
    assert [s.index for s in samples] == list(range(8))
    assert max(len(s.ids) for s in samples[:k]) == 1024 >= min(len(s.ids) for s in samples)
    for group in (samples[:k], samples[k:]):
        first = group[0]
        assert {s.ids[: first.prefix] for s in group} == {first.ids[: first.prefix]}
        assert len({context_digest(s) for s in group}) == 1
        assert len({sample_digest(s) for s in group}) == k  # each digest its own prompt
        asked = [re.search(r"What (?:is|are all) the special magic \w+ for (.+?) mentioned",
                           s.text[len(bpe.decode(list(s.ids[: s.prefix]))) - 1 :]).group(1)
                 for s in group]  # fmt: skip
        assert len(set(asked)) == k  # every question asks its own key(s)
        for s in group:
            needle = bpe.decode(list(s.ids[s.needles[0].start : s.needles[0].end]))
            assert s.needles[0].answer and s.references[0] in needle
            assert asked[group.index(s)].split(",")[0] in needle
            assert s.needles[0].end <= s.prefix and s.text.endswith(s.answer_prefix)
    if name == "niah_multikey_1":  # its four keys, every one asked in turn
        keys = re.findall(r"magic numbers for (\S+) is:", bpe.decode(list(samples[0].ids)))
        assert len(keys) == 4
    depth_of_first = samples[0].needles[0]
    haystack = (
        samples[0].context[1]
        - samples[0].context[0]
        - sum(n.end - n.start for n in samples[0].needles)
    )
    before = (
        depth_of_first.start
        - samples[0].context[0]
        - sum(n.end - n.start for n in samples[0].needles if n.end <= depth_of_first.start)
    )
    assert before == round(0.4 * haystack)  # question 0's needle exactly at the depth


def test_tasks_without_questions_and_counts_that_do_not_divide_are_refused(bpe: Any) -> None:
    with pytest.raises(ValueError, match=r"task vt asks one question of a context.*niah_single_1"):
        get_task("vt").samples(bpe, 1024, 0.5, 4, 0, questions=2)
    with pytest.raises(ValueError, match="6 samples are not a whole number of contexts of 4"):
        get_task("niah_single_1").samples(bpe, 1024, 0.5, 6, 0, questions=4)


def _naive_deff_wilson(scores: list[float], clusters: list[int], z: float = 1.959963984540054):
    """Kish's design effect from the between-cluster variance of the ratio mean, written out;
    fewer than five clusters: the clusters' own Kish size ``n**2 / sum m_c**2`` (every question
    of a context alike)."""
    n = len(scores)
    ids = sorted(set(clusters))
    k = len(ids)
    p = sum(scores) / n
    totals = [sum(s for s, c in zip(scores, clusters, strict=True) if c == i) for i in ids]
    sizes = [clusters.count(i) for i in ids]
    fewest = n * n / sum(m * m for m in sizes)
    if k < 5 or not 0 < p < 1:
        m = fewest
    else:
        var = k / (k - 1) * sum((t - p * m) ** 2 for t, m in zip(totals, sizes, strict=True)) / n**2
        m = n if var == 0 else min(n, max(fewest, p * (1 - p) / var))
    centre = (p + z * z / (2 * m)) / (1 + z * z / m)
    half = z / (1 + z * z / m) * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m))
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize(("scores", "clusters"), [
    ([1, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]),  # perfectly correlated: n_eff = 2
    ([1, 0] * 5, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]),  # no correlation: deff held at 1
    ([1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 0, 1], [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]),
    ([1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]),  # all right: the 2 contexts' interval
    ([0.5, 1, 0, 0.25, 1, 1, 0, 0, 0.5, 0.75, 1, 0], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]),
    ([1, 0, 1, 0, 1, 0, 1, 0], [0, 0, 1, 1, 2, 2, 3, 3]),  # 4 contexts: too few, n_eff = 4
    ([1, 1, 1, 0, 0, 1, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1, 2, 3, 4, 5]),  # unequal sizes
])  # fmt: skip
def test_cluster_interval_against_a_naive_computation(scores, clusters) -> None:
    assert cluster_wilson_interval(scores, clusters) == pytest.approx(
        _naive_deff_wilson(scores, clusters), abs=1e-12
    )
    low, high = cluster_wilson_interval(scores, clusters)
    plain = wilson_interval(sum(scores), len(scores))
    assert low <= plain[0] + 1e-12 and high >= plain[1] - 1e-12  # never narrower than Wilson


def test_cluster_interval_of_singletons_is_wilson_and_of_identical_clusters_the_clusters() -> None:
    scores = [1, 0, 1, 1, 0, 1, 0]
    assert cluster_wilson_interval(scores, range(7)) == wilson_interval(4, 7)
    # four contexts whose questions all agree: the interval of the four contexts alone
    assert cluster_wilson_interval([1] * 6 + [0] * 2, [0, 0, 1, 1, 2, 2, 3, 3]) == pytest.approx(
        wilson_interval(3, 4)
    )
    got = summarize([1, 1, 0, 0], contexts=["a", "a", "b", "b"])
    assert (got.low, got.high) == pytest.approx(wilson_interval(1, 2))
    assert statistics.fmean([1, 1, 0, 0]) == got.mean


def test_a_grouped_cell_records_its_contexts(bpe: Any) -> None:
    model = _model(bpe)
    cell = run_cell(model, bpe, "niah_single_2", 300, 0.5, 4, 0, questions=2, max_new_tokens=3)
    assert cell["questions"] == 2 and len(set(cell["contexts"])) == 2
    assert cell["contexts"][0] == cell["contexts"][1] != cell["contexts"][2]
    want = summarize(cell["scores"], contexts=cell["contexts"])
    assert (cell["low"], cell["high"]) == (want.low, want.high)
    alone = run_cell(model, bpe, "niah_single_2", 300, 0.5, 2, 0, max_new_tokens=3)
    assert "contexts" not in alone and "questions" not in alone


def test_a_study_asks_several_questions_of_each_context(tmp_path: Any) -> None:
    """``posenc extend --questions-per-context``: the dry run counts one prefill per context,
    the rows record their contexts, a rerun recomputes nothing; the task that cannot take it
    and a count that is no multiple refused in one line, before anything is written."""
    from typer.testing import CliRunner

    from _tiny import tiny_folder
    from posenc.cli import app
    from posenc.extend.study.run import study_rows

    folder = tiny_folder(tmp_path / "llama", 128)
    out = tmp_path / "out"
    args = ["extend", str(folder), "--methods", "none,string", "--lengths", "64,128",
            "--documents", "0", "--tasks", "niah_single_1", "--task-lengths", "384",
            "--samples", "4", "--questions-per-context", "2", "--out", str(out)]  # fmt: skip
    dry = CliRunner().invoke(app, [*args, "--dry-run"])
    assert dry.exit_code == 0 and "(2 prefilled contexts of 2 questions)" in dry.output, dry.output
    assert CliRunner().invoke(app, args).exit_code == 0
    rows = study_rows(out)
    assert len(rows) == 2 and all(r["questions"] == 2 for r in rows)
    assert rows[0]["contexts"] == rows[1]["contexts"] and len(set(rows[0]["contexts"])) == 2
    assert rows[0]["digests"] == rows[1]["digests"] and len(set(rows[0]["digests"])) == 4
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and len(study_rows(out)) == 2
    # A task that asks one question beside the needles: it asks one a context, they share theirs
    mixed = [*args[:-1], str(tmp_path / "mixed")]
    mixed[mixed.index("niah_single_1")] = "niah_single_1,vt"
    mixed[mixed.index("384")] = "640"  # vt's chains need more room
    dry = CliRunner().invoke(app, [*mixed, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "of 2 questions for niah_single_1; one question a context for the others" in " ".join(
        dry.output.split()
    )
    assert CliRunner().invoke(app, mixed).exit_code == 0
    rows = {r["task"]: r for r in study_rows(tmp_path / "mixed") if r["method"] == "none"}
    assert (
        rows["niah_single_1"]["questions"] == 2 and len(set(rows["niah_single_1"]["contexts"])) == 2
    )
    assert "questions" not in rows["vt"] and "contexts" not in rows["vt"]
    for bad, says in (
        (["--tasks", "vt"], "task vt asks one question of a context"),
        (["--samples", "3"], "3 samples are not a whole number of contexts of 2"),
    ):
        other = [*args[:-1], str(tmp_path / "bad"), *bad]
        result = CliRunner().invoke(app, other)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and says in lines[0], result.output
        assert not (tmp_path / "bad").exists()


def test_the_estimate_counts_one_prefill_per_context() -> None:
    from posenc.extend.study.estimate import QUESTION_TOKENS, Shape, forward_flops, task_cell_flops

    shape = Shape(layers=2, heads=4, kv_heads=2, head_dim=16, hidden=64, intermediate=96,
                  vocab=100, body_params=10_000, bytes_per_value=4)  # fmt: skip
    prefill = forward_flops(shape, 2048)
    step = forward_flops(shape, 2049) - prefill
    assert task_cell_flops(shape, 2048, "none", 8, 40) == pytest.approx(8 * (prefill + 40 * step))
    grouped = task_cell_flops(shape, 2048, "none", 8, 40, questions=4)
    assert grouped == pytest.approx(2 * prefill + 8 * (40 + QUESTION_TOKENS) * step)


def test_a_row_whose_contexts_do_not_fit_is_no_readable_row() -> None:
    """A committed study's task row reads; with contexts that are not one string per sample
    it is skipped (the ranking would otherwise zip lists of other lengths)."""
    import json
    from pathlib import Path

    from posenc.extend.study.rows import study_row_problem

    path = Path(__file__).parent.parent / "benchmarks/studies/smollm2-135m-bf16/results.jsonl"
    row = next(r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "task")
    n = len(row["digests"])
    assert study_row_problem(row) == (None, None)
    assert study_row_problem({**row, "contexts": ["x"] * n}) == (None, None)
    assert f"1 contexts for {n} samples" in study_row_problem({**row, "contexts": ["x"]})[0]
    assert "not a list of strings" in study_row_problem({**row, "contexts": [1] * n})[0]
