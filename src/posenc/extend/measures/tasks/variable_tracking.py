"""Variable tracking, RULER's ``vt`` (``scripts/synthetic.yaml``: noise haystack, one chain, four
hops; generator ``scripts/data/synthetic/variable_tracking.py``, template ``constants.py``).

Followed: a chain ``VAR A = 12345``, ``VAR B = VAR A``, ... of ``hops + 1`` distinct
five-letter uppercase variables and a 5-digit value, its links inserted in order, one per line,
into the noise haystack; the references are every variable of the chain; the template and
answer prefix; one in-context example first (RULER builds it at 500 tokens with three-letter
variables and appends its answer, the variables joined by spaces); 30 new tokens;
``string_match_all``.

Different: the depth is given: the chain's first link goes at exactly ``depth`` of the haystack,
the other links at line boundaries drawn after it (RULER draws all of them); the example is
``min(500, length // 4)`` tokens, or its chain alone where that is too few (RULER's 500 would
not fit in a short prompt); the answer
prefix ends without RULER's trailing space (``"they are:"``: a lone space is a token that byte-
level BPE tokenizers almost never put before a word), and the links without RULER's trailing
space (``"VAR B = VAR A "``).
"""

from __future__ import annotations

import random

from .base import Encoder, Parts, Task, insert, register, window
from .haystacks import noise_stream
from .scoring import string_match_all
from .words import distinct, number, variable

TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text "
    "above."
)
ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assigned the value {query}, they are:"
)
HOPS = 4
EXAMPLE_TOKENS = 500


def _chain(rng: random.Random, hops: int, letters: int) -> tuple[list[str], list[str], str]:
    """``(variables, links, value)``: ``VAR V0 = value``, ``VAR V1 = VAR V0``, ..."""
    names = distinct(rng, lambda r: variable(r, letters), hops + 1)
    value = number(rng, 5)
    links = [f"VAR {names[0]} = {value}"] + [
        f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(hops)
    ]
    return names, links, value


def _prompt(rng: random.Random, enc: Encoder, length: int, depth: float, letters: int,
            head_extra: list[int], shrink: bool = False) -> tuple[Parts, list[str]]:  # fmt: skip
    """One chain in noise, ``length`` tokens all told (BOS and ``head_extra`` included);
    ``shrink``: no noise at all where ``length`` is too short for the chain (the example)."""
    names, links, value = _chain(rng, HOPS, letters)
    head_t, tail_t = (TEMPLATE + ANSWER_PREFIX).split("{context}")
    head = head_extra + enc.ids(head_t)
    tail = enc.ids(tail_t.format(query=value, num_v=HOPS + 1))
    link_ids = [enc.ids(link + "\n") for link in links]
    fixed = len(enc.bos) + len(head) + len(tail) + sum(map(len, link_ids))
    n = max(0, length - fixed) if shrink else enc.room(length, head, tail, *link_ids)
    at = round(depth * n)
    hay, bounds = window(noise_stream(enc), n, at)
    later = [b for b in bounds if b >= at]
    spots = [at, *sorted(rng.choice(later) for _ in links[1:])]  # in order: a chain reads down
    context, spans = insert(hay, [(s, ids, True) for s, ids in zip(spots, link_ids, strict=True)])
    prefix = ANSWER_PREFIX.format(query=value, num_v=HOPS + 1)
    return Parts(head, context, tail, tuple(names), " " + " ".join(names), prefix, spans), names


def build_vt(rng: random.Random, enc: Encoder, length: int, depth: float | None) -> Parts:
    """RULER's ``vt`` at ``length`` tokens, the chain starting at ``depth`` of the haystack,
    after one solved example (three-letter variables, at a depth drawn from the seed)."""
    assert depth is not None  # the task checks it
    size = min(EXAMPLE_TOKENS, length // 4) + len(enc.bos)
    example, answer = _prompt(rng, enc, size, rng.random(), 3, [], shrink=True)
    shot = example.head + example.context + example.tail + enc.ids(" " + " ".join(answer) + "\n")
    return _prompt(rng, enc, length, depth, 5, shot)[0]


register(Task(
    name="vt", family="variable_tracking", build=build_vt, metric=string_match_all,
    metric_name="string_match_all", max_new_tokens=30, uses_depth=True,
    follows="RULER synthetic.yaml vt (scripts/data/synthetic/variable_tracking.py)",
))  # fmt: skip
