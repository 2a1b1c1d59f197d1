"""Aggregation: common-words and frequent-words extraction, RULER's ``cwe`` and ``fwe``
(``scripts/synthetic.yaml``; generators ``scripts/data/synthetic/common_words_extraction.py``
and ``freq_words_extraction.py``; templates ``constants.py``).

``cwe`` follows: a numbered list ``"1. w 2. w ..."`` of 10 common words repeated 30 times and
uncommon words 3 times each, shuffled (6 and 1 below 4,096 tokens), as many uncommon words as
fit; one solved example first (40 words at 10 and 3 repeats, 20 at 3 and 1 below 4,096 tokens);
the references are the 10 common words; 120 new tokens; ``string_match_all``.

``fwe`` follows: a vocabulary of ``max(8, (length - 50) // 50)`` coded words of six random
lowercase letters (RULER: ``(max_seq_length - tokens_to_generate) // 50``), the word of rank
``k`` appearing ``int(N k**-alpha / zeta(alpha))`` times with ``alpha = 2``, the top-ranked
word replaced by ``...`` (noise), the references are the words ranked 2-4; shuffled and joined
by spaces; as many words ``N`` as fit; 50 new tokens; ``string_match_all``.

Different (both): the words (:mod:`.words`: pronounceable six-letter words for ``cwe``; RULER
reads wonderwords and an English list); the list fills the prompt to the token and the few ids
too few for one more word are newlines before the question (RULER stops at the last word that
fits under ``max_seq_length``); ``fwe``'s vocabulary has at least 8 words so that short prompts
still have a ranking (RULER's formula gives 19 at 1,024 tokens and 0 below 50 + 50).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from .base import Encoder, Parts, Task, register
from .scoring import string_match_all
from .words import coded, distinct, word

CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common "
    "words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. "
    "Please ignore the dots '....'. What are the three most frequently appeared words in the "
    "above coded text?"
)
FWE_PREFIX = (
    " Answer: According to the coded text above, the three most frequently appeared words are:"
)
NUM_CW = 10


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest ``x`` in ``[lo, hi]`` with ``fits(x)`` (``fits`` true up to some point, then
    false), or ``lo - 1`` when none fits."""
    best = lo - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _number(i: int) -> str:
    """The ``i``-th item's number as encoded apart: ``"1."``, then ``" 2."``, ``" 3."``, ..."""
    return ("" if i == 0 else " ") + f"{i + 1}."


def _numbered(enc: Encoder, words: Sequence[str]) -> list[int]:
    """``"1. w 2. w ..."`` as ids, number and word encoded apart (``" 12."``, ``" w"``)."""
    nums = enc.many([_number(i) for i in range(len(words))])
    toks = enc.many([" " + w for w in words])
    return [t for pair in zip(nums, toks, strict=True) for piece in pair for t in piece]


def _pad(enc: Encoder, ids: list[int], n: int) -> list[int]:
    """``ids`` followed by newlines up to ``n`` ids."""
    return ids + enc.ids("\n")[-1:] * (n - len(ids))


def _cwe_list(rng: random.Random, enc: Encoder, pool: list[str], reps: tuple[int, int],
              uncommon: int) -> list[int]:  # fmt: skip
    """The numbered list: ``pool``'s first 10 words ``reps[0]`` times, the next ``uncommon``
    ``reps[1]`` times, shuffled."""
    words = pool[:NUM_CW] * reps[0] + pool[NUM_CW : NUM_CW + uncommon] * reps[1]
    rng.shuffle(words)
    return _numbered(enc, words)


def _cwe_uncommon(enc: Encoder, pool: list[str], reps: tuple[int, int], n: int) -> int:
    """How many uncommon words of ``pool`` fit a list of at most ``n`` ids (-1: not even the
    common words), counted without building each list: a list's ids are its numbers' (which
    depend on its length only) plus its words' (which do not depend on the order)."""
    size = [len(t) for t in enc.many([" " + w for w in pool])]
    items = NUM_CW * reps[0] + (len(pool) - NUM_CW) * reps[1]
    num_sum = [0]
    for ids in enc.many([_number(i) for i in range(items)]):
        num_sum.append(num_sum[-1] + len(ids))
    word_sum = [0]
    for x in size[NUM_CW:]:
        word_sum.append(word_sum[-1] + x)
    common = sum(size[:NUM_CW]) * reps[0]

    def tokens(m: int) -> int:
        return num_sum[NUM_CW * reps[0] + m * reps[1]] + common + reps[1] * word_sum[m]

    return largest_fitting(lambda m: tokens(m) <= n, 0, len(pool) - NUM_CW)


def build_cwe(rng: random.Random, enc: Encoder, length: int, depth: float | None) -> Parts:
    """RULER's ``cwe`` at ``length`` tokens (``depth`` unused: the words fill the context)."""
    short = length < 4096
    shot_reps, reps = ((3, 1), (6, 1)) if short else ((10, 3), (30, 3))
    head_t, tail_t = (CWE_TEMPLATE + CWE_PREFIX).split("{context}")
    used: set[str] = set()
    shot_pool = distinct(rng, word, 20 if short else 40, used)
    example = _cwe_list(rng, enc, shot_pool, shot_reps, len(shot_pool) - NUM_CW)
    answer = " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_pool[:NUM_CW]))
    head = enc.ids(head_t) + example + enc.ids(tail_t + answer + "\n" + head_t)
    tail = enc.ids(tail_t)
    n = enc.room(length, head, tail)
    # every item is at least 2 ids (number, word): no more uncommon words than this can fit
    pool = distinct(rng, word, NUM_CW + n // (2 * reps[1]) + 1, used)
    m = _cwe_uncommon(enc, pool, reps, n)
    if m < 0:
        raise ValueError(f"a prompt of {length} tokens is too short for cwe's {NUM_CW} common "
                         f"words repeated {reps[0]} times")  # fmt: skip
    refs = pool[:NUM_CW]
    target = " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(refs))
    ids = _pad(enc, _cwe_list(rng, enc, pool, reps, m), n)
    return Parts(head, ids, tail, tuple(refs), target, CWE_PREFIX)


def _zeta(alpha: float) -> float:
    """Riemann zeta of ``alpha > 1`` (RULER imports scipy's): a partial sum to 10,000 and the
    Euler-Maclaurin tail, exact to 1e-12 for ``alpha >= 1.5``; ``pi**2 / 6`` at 2."""
    if alpha == 2.0:
        return math.pi**2 / 6
    n = 10_000
    head = sum(k**-alpha for k in range(1, n))
    return head + n ** (1 - alpha) / (alpha - 1) + 0.5 * n**-alpha + alpha / 12 * n ** (-alpha - 1)


def build_fwe(rng: random.Random, enc: Encoder, length: int, depth: float | None,
              alpha: float = 2.0) -> Parts:  # fmt: skip
    """RULER's ``fwe`` at ``length`` tokens (``depth`` unused)."""
    head_t, tail_t = (FWE_TEMPLATE + FWE_PREFIX).split("{context}")
    head, tail = enc.ids(head_t), enc.ids(tail_t)
    n = enc.room(length, head, tail)
    vocab = distinct(rng, coded, max(8, (length - 50) // 50))
    vocab[0] = "..."  # RULER: the top-ranked word is noise
    size = [len(t) for t in enc.many([" " + w for w in vocab])]
    z = _zeta(alpha)

    def counts(total: int) -> list[int]:
        return [int(total * k**-alpha / z) for k in range(1, len(vocab) + 1)]

    def tokens(total: int) -> int:
        return sum(c * s for c, s in zip(counts(total), size, strict=True))

    total = largest_fitting(lambda t: tokens(t) <= n, 1, 4 * n + 8)
    words = [w for w, c in zip(vocab, counts(max(total, 1)), strict=True) for _ in range(c)]
    rng.shuffle(words)
    ids = [t for piece in enc.many([" " + w for w in words]) for t in piece]
    refs = tuple(vocab[1:4])
    return Parts(head, _pad(enc, ids, n), tail, refs, " " + " ".join(refs), FWE_PREFIX)


register(Task(
    name="cwe", family="common_words_extraction", build=build_cwe, metric=string_match_all,
    metric_name="string_match_all", max_new_tokens=120, uses_depth=False,
    follows="RULER synthetic.yaml cwe (scripts/data/synthetic/common_words_extraction.py)",
))  # fmt: skip
register(Task(
    name="fwe", family="freq_words_extraction", build=build_fwe, metric=string_match_all,
    metric_name="string_match_all", max_new_tokens=50, uses_depth=False,
    follows="RULER synthetic.yaml fwe (scripts/data/synthetic/freq_words_extraction.py)",
))  # fmt: skip
