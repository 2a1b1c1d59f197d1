"""A study's task prompts cached by identity: built once, read back by every method and rerun.

Every method of a study answers the same samples of a (task, length, depth) cell, and a study
resumed after a kill answers the rest of them: both read the samples from
``<out>/prompts/<key>.json``, written once (aside, then renamed into place) the first time the
cell is prepared. The key is a hash of what fixes the ids: the task, length, depth, number of
samples, seed, questions per context (where above 1), the tokenizer's identity (the model's,
which the study already checks) and :data:`PROMPTS_VERSION`. The file is plain JSON (never a
pickle: a folder from elsewhere runs no code); one that cannot be read as samples is built
again, with a warning.

A file that reads is data from a stranger all the same (a hand edit, another posenc, a planted
fault): every field of every sample is checked against what the generator builds for its key
(the prompts are rebuilt, seconds of tokenizing beside a cell's minutes of forwards, and
compared field by field, the ids by digest), and one that differs is refused in one line naming
the file, the sample and the field: an id past the vocabulary (it would crash mid-study),
``max_new_tokens`` other than the task's (``10**7`` would hang, ``0`` write rows scoring 0), an
empty reference (it would crash the scoring), other ids, references or spans.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ....runs.atomic import write_file_atomically
from ....runs.identity import stable_hash
from ....runs.strict_json import dumps
from .base import Sample, Span, get_task

log = logging.getLogger("posenc.extend")

#: Bump when a generator changes the ids it builds: cached prompts of another version are
#: rebuilt, never read as this version's.
PROMPTS_VERSION = 1
FOLDER = "prompts"


def prompts_key(task: str, length: int, depth: float | None, n: int, seed: int,
                tokenizer_id: Any, questions: int = 1) -> str:  # fmt: skip
    """The cache key of a cell's samples: 16 hex digits over everything that fixes their ids."""
    key = {"task": task, "length": length, "depth": depth, "n": n, "seed": seed,
           "tokenizer": tokenizer_id, "version": PROMPTS_VERSION}  # fmt: skip
    if questions > 1:  # the keys of one question a context as they were
        key["questions"] = questions
    return stable_hash(key, 16)


def _to_json(sample: Sample) -> dict[str, Any]:
    d = asdict(sample)
    d["ids"] = list(sample.ids)
    return d


def _from_json(d: dict[str, Any]) -> Sample:
    return Sample(
        task=str(d["task"]), seed=int(d["seed"]), index=int(d["index"]),
        length=int(d["length"]), depth=None if d["depth"] is None else float(d["depth"]),
        ids=tuple(int(i) for i in d["ids"]), text=str(d["text"]),
        references=tuple(str(r) for r in d["references"]), target=str(d["target"]),
        answer_prefix=str(d["answer_prefix"]), max_new_tokens=int(d["max_new_tokens"]),
        context=(int(d["context"][0]), int(d["context"][1])),
        needles=tuple(Span(int(s["start"]), int(s["end"]), bool(s["answer"]))
                      for s in d["needles"]),
        prefix=int(d.get("prefix", 0)),
    )  # fmt: skip


def _read(path: Path) -> list[Sample] | None:
    """The samples in ``path``; None where it is missing or cannot be read as samples (a
    warning for the last)."""
    if not path.is_file():
        return None
    try:
        return [_from_json(d) for d in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError) as e:
        log.warning("%s is unreadable (%s): its prompts are built again", path, e)
        return None


def _digest(ids: Any) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


def check_samples(path: Path, got: list[Sample], want: list[Sample], vocab: int) -> None:
    """ValueError, one line naming ``path``, where the samples ``got`` read from it are not
    ``want``, those the generator builds for its key (the module docstring)."""
    where = f"the cached prompts {path}"
    fix = "delete it to build them again"
    if len(got) != len(want):
        raise ValueError(f"{where} hold {len(got)} samples, not the {len(want)} of their cell; "
                         f"{fix}")  # fmt: skip
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        bad = next((x for x in g.ids if not 0 <= x < vocab), None)
        if bad is not None:
            raise ValueError(f"{where}: sample {i} holds id {bad}, outside the vocabulary of "
                             f"{vocab} ids; {fix}")  # fmt: skip
        if g.max_new_tokens != w.max_new_tokens:
            raise ValueError(f"{where}: sample {i} asks max_new_tokens={g.max_new_tokens}; task "
                             f"{w.task} writes {w.max_new_tokens}; {fix}")  # fmt: skip
        if not g.references or any(not r.strip() for r in g.references):
            raise ValueError(f"{where}: sample {i} has an empty reference {list(g.references)}; "
                             f"{fix}")  # fmt: skip
        if g.ids != w.ids:
            raise ValueError(f"{where}: sample {i}'s ids (digest {_digest(g.ids)}) are not the "
                             f"generator's ({_digest(w.ids)}); {fix}")  # fmt: skip
        for f in fields(Sample):
            if getattr(g, f.name) != getattr(w, f.name):
                raise ValueError(f"{where}: sample {i}'s {f.name} {getattr(g, f.name)!r} is not "
                                 f"the generator's {getattr(w, f.name)!r}; {fix}")  # fmt: skip


def cached_samples(folder: str | Path | None, tokenizer: Any, task: str, length: int,
                   depth: float | None, n: int, seed: int, tokenizer_id: Any,
                   questions: int = 1) -> list[Sample]:  # fmt: skip
    """``n`` samples of ``task`` at ``length`` and ``depth`` (seed ``seed``; ``questions`` per
    context), built with ``tokenizer``, checked against ``folder/prompts/``'s file when prepared
    before (:func:`check_samples`), else written there (``folder`` None: built, not cached).
    ``tokenizer_id``: what names the tokenizer (the model's identity), part of the key."""
    samples = get_task(task).samples(tokenizer, length, depth, n, seed, questions)
    if folder is None:
        return samples
    key = prompts_key(task, length, depth, n, seed, tokenizer_id, questions)
    path = Path(folder) / FOLDER / f"{key}.json"
    got = _read(path)
    if got is not None:
        check_samples(path, got, samples, len(tokenizer))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(path, dumps([_to_json(s) for s in samples]))
    return samples
