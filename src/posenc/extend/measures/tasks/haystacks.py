"""The haystacks needles hide in: RULER's noise sentence, and real text from local documents.

* ``noise``: RULER's repeated ``"The grass is green. The sky is blue. The sun is yellow. Here we
  go. There and back again."``, one per line (``niah.py`` and ``variable_tracking.py`` join
  them with ``"\\n"``).
* ``essay``: RULER reads Paul Graham's essays, downloaded. Here the real text is the first of
  the local documents ``posenc extend`` measures perplexity on
  (:func:`posenc.extend.measures.perplexity.default_documents`: ``pydoc_data/topics.py``, the Python
  reference manual's topics, on every machine that runs Python): the module's long string
  constants (its prose, not its quoting), whitespace collapsed to single spaces as RULER collapses
  the essays, cut into sentences after ``.``, ``!`` or ``?`` (RULER cuts with nltk's
  ``sent_tokenize``) and joined by spaces. Repeated from the start when a length needs more, as
  RULER repeats the essays.
"""

from __future__ import annotations

import ast
import itertools
import re
from functools import lru_cache
from pathlib import Path

from .base import Encoder, Stream

#: RULER's noise haystack (``niah.py``, ``variable_tracking.py``).
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def noise_stream(enc: Encoder) -> Stream:
    """RULER's noise sentence, one per line, forever."""
    unit = enc.ids(NOISE + "\n")
    return Stream(lambda: list(unit))


@lru_cache(maxsize=4)
def _document_sentences(path: str) -> tuple[str, ...]:
    source = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        tree = ast.parse(source)
        strings = [n.value for n in ast.walk(tree)
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and len(n.value) >= 200]  # fmt: skip
    except SyntaxError:  # not Python: the file's text as it is
        strings = [source]
    text = re.sub(r"\s+", " ", " ".join(strings or [source])).strip()
    return tuple(s for s in _SENTENCE_END.split(text) if s)


def essay_sentences(document: Path | None = None) -> tuple[str, ...]:
    """The real-text haystack's sentences, in order (``document``: the first of
    :func:`~posenc.extend.measures.perplexity.default_documents` unless given)."""
    if document is None:
        from ..perplexity import default_documents

        document = default_documents(1)[0]
    return _document_sentences(str(document))


def essay_stream(enc: Encoder, document: Path | None = None) -> Stream:
    """The real text, sentence by sentence (each ``" " + sentence``), repeated forever."""
    sentences = itertools.cycle(essay_sentences(document))
    return Stream(lambda: enc.ids(" " + next(sentences)))
