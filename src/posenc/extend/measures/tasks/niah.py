"""Needle in a haystack, RULER's eight variants (``scripts/synthetic.yaml``, task ``niah``,
generator ``scripts/data/synthetic/niah.py``, template ``scripts/data/synthetic/constants.py``).

Followed: the needle ``"One of the special magic {type_needle_v} for {key} is: {value}."``; the
template and answer prefix, made singular as RULER makes them when one value is asked for
(``Some`` -> ``A``, ``are all`` / ``are`` -> ``is``, the value type without its ``s``); keys
drawn distinct, ``num_needle_k = max(num_needle_k, num_needle_q)``, the needles shuffled, the
queried keys drawn from the keys and joined ``"a, b, and c"``; the references are the queried
keys' values; 7-digit numbers and version-4 UUIDs; haystacks ``noise`` (one noise sentence per
line), ``essay`` (sentences joined by spaces) and ``needle`` (distractor needles of random keys
and values, one per line); 128 new tokens; scored by ``string_match_all`` (every variant,
multi-value included, in RULER's ``scripts/eval/synthetic/constants.py``).

Different: the essay is local real text (:mod:`.haystacks`), word keys are pronounceable words
(:mod:`.words`); the depth is given, not drawn: the first reference's needle goes at exactly
``depth`` of the haystack, on a sentence boundary, the other needles at haystack boundaries drawn
without replacement (RULER draws every needle's depth from 40 levels); values are distinct
across all needles and the needle haystack's distractors (RULER's could repeat, by chance).

Several questions of one context (:func:`build_niah_group`, ``Task.samples(questions=k)``): one
haystack holds the needles of ``k`` questions (``max(num_k, k num_q)`` keys: every key of a
multi-key haystack asked in turn, by a question of its own), question ``j``'s first reference
at the ``j``-th haystack boundary nearest ``depth`` (question 0's exactly at it), the other
needles at boundaries drawn as above; each question is the template's tail for its own keys. A
single-needle task asked ``k`` times so has ``k - 1`` other keys' needles in its haystack.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import partial

from .base import (
    Encoder,
    Group,
    Parts,
    Question,
    Span,
    Stream,
    Task,
    insert,
    register,
    spread,
    window,
)
from .haystacks import essay_stream, noise_stream
from .scoring import string_match_all
from .words import KINDS, distinct

TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all "
    "the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."


@dataclass(frozen=True)
class NiahConfig:
    """One RULER ``niah`` configuration (``synthetic.yaml``'s ``args``)."""

    haystack: str  # noise | essay | needle
    type_k: str = "words"
    type_v: str = "numbers"
    num_k: int = 1
    num_v: int = 1
    num_q: int = 1


def _singular(text: str, cfg: NiahConfig) -> str:
    """RULER's rewrite when one value is asked for (``niah.py``, ``generate_input_output``)."""
    if cfg.num_q * cfg.num_v != 1:
        return text
    for old, new in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
        text = text.replace(old, new)
    return text


def _needle_stream(rng: random.Random, enc: Encoder, cfg: NiahConfig, used: set[str]) -> Stream:
    """RULER's ``needle`` haystack: distractor needles of fresh keys and values, one per line."""

    def unit() -> list[int]:
        key, value = distinct(rng, KINDS[cfg.type_k], 1, used) + distinct(
            rng, KINDS[cfg.type_v], 1, used
        )
        return enc.ids(NEEDLE.format(type_needle_v=cfg.type_v, key=key, value=value) + "\n")

    return Stream(unit)


def _draw(rng: random.Random, cfg: NiahConfig) -> tuple[list[tuple[str, str]], list[int],
                                                          list[str], set[str]]:  # fmt: skip
    """Keys, values, which keys are asked: ``(needles as (key, value), queried key indices,
    keys, every string drawn)``."""
    used: set[str] = set()
    num_k = max(cfg.num_k, cfg.num_q)
    keys = distinct(rng, KINDS[cfg.type_k], num_k, used)
    pairs = [(k, v) for k in keys for v in distinct(rng, KINDS[cfg.type_v], cfg.num_v, used)]
    return pairs, rng.sample(range(num_k), cfg.num_q), keys, used


def build_niah(cfg: NiahConfig, rng: random.Random, enc: Encoder, length: int,
               depth: float | None) -> Parts:  # fmt: skip
    """A RULER ``niah`` prompt of ``length`` tokens, its first reference's needle at ``depth``."""
    assert depth is not None  # the task checks it
    pairs, queried, keys, used = _draw(rng, cfg)
    asked = [keys[i] for i in queried]
    answers = [v for k in asked for kk, v in pairs if kk == k]
    query = asked[0] if len(asked) == 1 else ", ".join(asked[:-1]) + ", and " + asked[-1]
    type_v = cfg.type_v[:-1] if cfg.num_q * cfg.num_v == 1 else cfg.type_v
    head_t, tail_t = _singular(TEMPLATE + ANSWER_PREFIX, cfg).split("{context}")
    head = enc.ids(head_t.format(type_needle_v=type_v))
    tail = enc.ids(tail_t.format(type_needle_v=type_v, query=query))
    sep = (" ", "") if cfg.haystack == "essay" else ("", "\n")
    first = (asked[0], answers[0])
    others = [p for p in pairs if p != first]
    rng.shuffle(others)  # RULER shuffles its needles
    needle_ids = [enc.ids(sep[0] + NEEDLE.format(type_needle_v=cfg.type_v, key=k, value=v)
                          + sep[1]) for k, v in [first, *others]]  # fmt: skip
    n = enc.room(length, head, tail, *needle_ids)
    at = round(depth * n)
    stream = {"noise": lambda: noise_stream(enc), "essay": lambda: essay_stream(enc),
              "needle": lambda: _needle_stream(rng, enc, cfg, used)}[cfg.haystack]()  # fmt: skip
    hay, bounds = window(stream, n, at)
    spots = [at, *spread(rng, bounds, len(others), exclude=at)]
    context, spans = insert(hay, [(s, ids, p[0] in asked) for s, ids, p in
                                  zip(spots, needle_ids, [first, *others], strict=True)])  # fmt: skip
    prefix = _singular(ANSWER_PREFIX, cfg).format(type_needle_v=type_v, query=query)
    return Parts(head, context, tail, tuple(answers), " " + ", ".join(answers), prefix, spans)


def build_niah_group(cfg: NiahConfig, rng: random.Random, enc: Encoder, length: int,
                     depth: float | None, k: int) -> Group:  # fmt: skip
    """``k`` questions of one haystack of ``length`` tokens (its longest question's prompt);
    question ``j`` asks its own ``num_q`` keys, its first reference's needle at the ``j``-th
    boundary nearest ``depth`` (the module docstring)."""
    assert depth is not None  # the task checks it
    used: set[str] = set()
    keys = distinct(rng, KINDS[cfg.type_k], max(cfg.num_k, cfg.num_q * k), used)
    pairs = [(key, v) for key in keys for v in distinct(rng, KINDS[cfg.type_v], cfg.num_v, used)]
    order = rng.sample(range(len(keys)), cfg.num_q * k)
    asked = [[keys[i] for i in order[j * cfg.num_q : (j + 1) * cfg.num_q]] for j in range(k)]
    type_v = cfg.type_v[:-1] if cfg.num_q * cfg.num_v == 1 else cfg.type_v
    head_t, tail_t = _singular(TEMPLATE + ANSWER_PREFIX, cfg).split("{context}")
    head = enc.ids(head_t.format(type_needle_v=type_v))
    queries = [a[0] if len(a) == 1 else ", ".join(a[:-1]) + ", and " + a[-1] for a in asked]
    tails = [enc.ids(tail_t.format(type_needle_v=type_v, query=q)) for q in queries]
    answers = [[v for key in a for kk, v in pairs if kk == key] for a in asked]
    firsts = [(a[0], ans[0]) for a, ans in zip(asked, answers, strict=True)]
    others = [p for p in pairs if p not in firsts]
    rng.shuffle(others)
    placed = [*firsts, *others]
    sep = (" ", "") if cfg.haystack == "essay" else ("", "\n")
    needle_ids = [enc.ids(sep[0] + NEEDLE.format(type_needle_v=cfg.type_v, key=key, value=v)
                          + sep[1]) for key, v in placed]  # fmt: skip
    n = enc.room(length, head, max(tails, key=len), *needle_ids)
    at = round(depth * n)
    stream = {"noise": lambda: noise_stream(enc), "essay": lambda: essay_stream(enc),
              "needle": lambda: _needle_stream(rng, enc, cfg, used)}[cfg.haystack]()  # fmt: skip
    hay, bounds = window(stream, n, at)
    near = sorted(bounds, key=lambda b: (abs(b - at), b))  # `at` first: a boundary of the window
    spots = [near[j % len(near)] for j in range(k)]
    rest = [b for b in bounds if b not in spots] or [at]
    spots += spread(rng, rest, len(others), exclude=-1)
    context, spans = insert(hay, [(s, ids, False) for s, ids in zip(spots, needle_ids,
                                                                    strict=True)])  # fmt: skip
    questions = []
    for j in range(k):  # its own needle first, every span flagged for its own keys
        mine = [Span(s.start, s.end, p[0] in asked[j]) for s, p in zip(spans, placed, strict=True)]
        prefix = _singular(ANSWER_PREFIX, cfg).format(type_needle_v=type_v, query=queries[j])
        questions.append(Question(tails[j], tuple(answers[j]), " " + ", ".join(answers[j]),
                                  prefix, (mine[j], *mine[:j], *mine[j + 1 :])))  # fmt: skip
    return Group(head, context, tuple(questions))


#: RULER's ``synthetic.yaml`` NIAH configurations, by its names.
CONFIGS: dict[str, NiahConfig] = {
    "niah_single_1": NiahConfig("noise"),
    "niah_single_2": NiahConfig("essay"),
    "niah_single_3": NiahConfig("essay", type_v="uuids"),
    "niah_multikey_1": NiahConfig("essay", num_k=4),
    "niah_multikey_2": NiahConfig("needle"),
    "niah_multikey_3": NiahConfig("needle", type_k="uuids", type_v="uuids"),
    "niah_multivalue": NiahConfig("essay", num_v=4),
    "niah_multiquery": NiahConfig("essay", num_q=4),
}

for _name, _cfg in CONFIGS.items():
    register(Task(
        name=_name, family="niah", build=partial(build_niah, _cfg), metric=string_match_all,
        metric_name="string_match_all", max_new_tokens=128, uses_depth=True,
        follows=f"RULER synthetic.yaml {_name} (scripts/data/synthetic/niah.py)",
        group=partial(build_niah_group, _cfg),
    ))  # fmt: skip
