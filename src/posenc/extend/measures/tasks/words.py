"""Random keys, values and words, drawn from a task's seeded ``random.Random``.

RULER draws needle keys from wonderwords' adjective and noun lists (``adj-noun``) and the
common words of ``cwe`` from wonderwords plus a downloaded English list; neither is in Python's
standard library, and posenc downloads nothing. Words here are pronounceable instead: three
consonant-vowel syllables (``bakoti``), 70 syllables so 343,000 words, every one six letters.
Equal length matters for scoring by substring (RULER's rule): no word of a sample can be found
inside another, which English lists allow ("cat" in "catalog"). Numbers (7 digits) and UUIDs
are RULER's own generators (``niah.py``), on the task's generator instead of the global one.
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Callable

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def word(rng: random.Random) -> str:
    """A pronounceable six-letter word, three consonant-vowel syllables: ``bakoti``."""
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(3))


def distinct(
    rng: random.Random, make: Callable[[random.Random], str], n: int, avoid: set[str] | None = None
) -> list[str]:
    """``n`` distinct draws of ``make(rng)``, none in ``avoid`` (which gains them)."""
    seen = avoid if avoid is not None else set()
    out: list[str] = []
    while len(out) < n:
        w = make(rng)
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def key_word(rng: random.Random) -> str:
    """A needle key as RULER's ``adj-noun`` shape: two words joined by a hyphen."""
    return f"{word(rng)}-{word(rng)}"


def number(rng: random.Random, digits: int = 7) -> str:
    """RULER's ``generate_random_number``: a ``digits``-digit number, no leading zero."""
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def uuid4(rng: random.Random) -> str:
    """RULER's ``generate_random_uuid``: a version-4 UUID from 128 random bits."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def variable(rng: random.Random, letters: int = 5) -> str:
    """A variable name of ``variable_tracking.py``: ``letters`` uppercase letters."""
    return "".join(rng.choices(string.ascii_uppercase, k=letters))


def coded(rng: random.Random, letters: int = 6) -> str:
    """A coded word of ``freq_words_extraction.py``: ``letters`` random lowercase letters."""
    return "".join(rng.choices(string.ascii_lowercase, k=letters))


#: Needle key and value kinds (RULER's ``type_needle_k`` / ``type_needle_v``).
KINDS = {"words": key_word, "numbers": number, "uuids": uuid4}
