"""A study's task prompts cached by identity: built once, read back by every method and rerun.

Every method of a study answers the same samples of a (task, length, depth) cell, and a study
resumed after a kill answers the rest of them: both read the samples from
``<out>/prompts/<key>.json``, written once (aside, then renamed into place) the first time the
cell is prepared. The key is a hash of what fixes the ids: the task, length, depth, number of
samples, seed, the tokenizer's identity (the model's, which the study already checks) and
:data:`PROMPTS_VERSION`. The file is plain JSON (never a pickle: a folder from elsewhere runs no
code); one that cannot be read, or whose samples are not what its key promises (another length,
task or count), is built again, with a warning.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
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
                tokenizer_id: Any) -> str:  # fmt: skip
    """The cache key of a cell's samples: 16 hex digits over everything that fixes their ids."""
    return stable_hash({"task": task, "length": length, "depth": depth, "n": n, "seed": seed,
                        "tokenizer": tokenizer_id, "version": PROMPTS_VERSION}, 16)  # fmt: skip


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
    )  # fmt: skip


def _read(path: Path, task: str, length: int, n: int) -> list[Sample] | None:
    """The samples in ``path`` if it holds ``n`` of ``task`` at ``length`` tokens; else None
    (missing, unreadable or another cell's: a warning for the last two)."""
    if not path.is_file():
        return None
    try:
        samples = [_from_json(d) for d in json.loads(path.read_text(encoding="utf-8"))]
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, IndexError) as e:
        log.warning("%s is unreadable (%s): its prompts are built again", path, e)
        return None
    if len(samples) != n or any(
        s.task != task or s.length != length or len(s.ids) != length or s.index != i
        for i, s in enumerate(samples)
    ):
        log.warning("%s holds other prompts than its name says: they are built again", path)
        return None
    return samples


def cached_samples(folder: str | Path | None, tokenizer: Any, task: str, length: int,
                   depth: float | None, n: int, seed: int,
                   tokenizer_id: Any) -> list[Sample]:  # fmt: skip
    """``n`` samples of ``task`` at ``length`` and ``depth`` (seed ``seed``), read from
    ``folder/prompts/`` when prepared before, else built with ``tokenizer`` and written there
    (``folder`` None: built, not cached). ``tokenizer_id``: what names the tokenizer (the
    model's identity), part of the key."""
    if folder is None:
        return get_task(task).samples(tokenizer, length, depth, n, seed)
    path = Path(folder) / FOLDER / f"{prompts_key(task, length, depth, n, seed, tokenizer_id)}.json"
    samples = _read(path, task, length, n)
    if samples is None:
        samples = get_task(task).samples(tokenizer, length, depth, n, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(path, dumps([_to_json(s) for s in samples]))
    return samples
