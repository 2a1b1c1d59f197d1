"""What an lm-eval task folder written by ``posenc extend lm-eval-tasks`` runs: its samples built
offline by posenc's own generators, its answers scored as posenc scores them.

The folder's module (``posenc_tasks.py``) holds one ``custom_dataset`` function per task, each
calling :func:`dataset` here, and names :func:`process_results` for scoring; lm-eval (0.4.13:
``ConfigurableTask.download`` calls ``custom_dataset(**metadata)``, the task YAML's ``metadata``
joined with ``--model_args`` and ``--metadata``) imports it from the folder, so the same task
folder runs with every back-end (``hf``, ``vllm``, an API model): nothing is downloaded.

A doc (one sample) holds the prompt as text and what pairs it with posenc's own rows:

* ``prompt``: the sample's ids decoded (``Sample.text``), BOS text first where the tokenizer has
  one: lm-eval's ``hf`` back-end then encodes it without adding special tokens
  (``has_bos_prefix``), so a tokenizer that reads its own BOS text as the BOS id reads the ids
  posenc built wherever decoding and encoding agree;
* ``digest``: :func:`~posenc.extend.measures.tasks.sample_digest` of posenc's ids (what ``posenc
  extend --tasks`` rows hold), ``text_digest`` and ``text_tokens``: the same of the prompt text
  encoded again by the model's tokenizer (``add_special_tokens=False``), the ids a back-end
  reads from the text; the two digests differ where re-encoding merges pieces posenc encoded
  apart, and the prompt is then ``text_tokens`` long, not ``length``;
* ``task``, ``length``, ``depth`` (-1: a task without one), ``seed``, ``index``, ``references``,
  ``target``.

Scoring is RULER's per sample (:mod:`posenc.extend.measures.tasks.scoring`: the output
post-processed, then ``string_match_all`` or ``string_match_part``, "any one reference"), one
metric per length, ``score_<length>``, averaged by lm-eval's ``mean``.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

#: The metadata keys a task folder records (the YAML's ``metadata``), prefixed so that no
#: ``--model_args`` key of any back-end meets them.
KEYS = ("posenc_model", "posenc_gguf", "posenc_lengths", "posenc_depths", "posenc_samples",
        "posenc_seed")  # fmt: skip

#: A task without a depth: its docs' ``depth`` (one type for the column; read back as None).
NO_DEPTH = -1.0


def metric_name(length: int) -> str:
    """The lm-eval metric of one length: ``score_4096``."""
    return f"score_{int(length)}"


@functools.cache
def tokenizer_of(model: str, gguf: str | None) -> Any:
    """The tokenizer of posenc's model reference ``model`` (a folder, a ``.gguf`` file, a cached
    model id, a packaged name; ``gguf``: the file in a folder), read from this machine only and
    never with the folder's own code, as ``posenc extend`` reads it."""
    from transformers.models.auto.tokenization_auto import AutoTokenizer

    from ..extend.model.load import _check_gguf_reader, gguf_read_once
    from ..extend.model.locate import model_source
    from ..extend.model.remote_code import refuse_folder_code

    source = model_source(model, gguf)
    refuse_folder_code(source.path)
    kw: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if source.gguf:
        _check_gguf_reader()
        kw["gguf_file"] = source.gguf
        with gguf_read_once():
            return AutoTokenizer.from_pretrained(source.path, **kw)
    return AutoTokenizer.from_pretrained(source.path, **kw)


def docs(tokenizer: Any, task: str, lengths: list[int], depths: list[float], samples: int,
         seed: int) -> list[dict[str, Any]]:  # fmt: skip
    """Every doc of ``task``: ``samples`` samples of seed ``seed`` at each length and (a task
    with depth) each depth, in that order, as :mod:`posenc.extend.measures.tasks` builds them."""
    from ..extend.measures.tasks import get_task, sample_digest

    t = get_task(task)
    out = []
    for length in lengths:
        for depth in depths if t.uses_depth else [None]:
            for s in t.samples(tokenizer, int(length), depth, int(samples), int(seed)):
                again = tokenizer(s.text, add_special_tokens=False)["input_ids"]
                out.append({
                    "task": task, "length": s.length,
                    "depth": NO_DEPTH if s.depth is None else float(s.depth),
                    "seed": s.seed, "index": s.index, "prompt": s.text,
                    "references": list(s.references), "target": s.target,
                    "digest": sample_digest(s), "text_tokens": len(again),
                    "text_digest": sample_digest(replace(s, ids=tuple(again))),
                })  # fmt: skip
    return out


def dataset(task: str, **metadata: Any) -> dict[str, Any]:
    """lm-eval's ``custom_dataset`` for ``task``: ``{"test": Dataset}`` of :func:`docs`, its
    settings read from the task folder's ``metadata`` (:data:`KEYS`); the rest (the back-end's
    ``--model_args``, lm-eval's ``version``) is not looked at."""
    import datasets

    missing = [k for k in KEYS if k not in metadata]
    if missing:
        raise ValueError(f"the posenc task {task} has no {', '.join(missing)} in its metadata: "
                         "write the task folder again with `posenc extend lm-eval-tasks`")  # fmt: skip
    tok = tokenizer_of(str(metadata["posenc_model"]), metadata["posenc_gguf"] or None)
    rows = docs(tok, task, list(metadata["posenc_lengths"]), list(metadata["posenc_depths"]),
                int(metadata["posenc_samples"]), int(metadata["posenc_seed"]))  # fmt: skip
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


def score(doc: dict[str, Any], output: str) -> float:
    """``output`` (the back-end's text after the prompt) scored as posenc scores the task: RULER's
    post-processing, then the task's metric against the doc's references."""
    from ..extend.measures.tasks import get_task, postprocess

    return float(get_task(doc["task"]).metric(postprocess(output), doc["references"]))


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    """lm-eval's ``process_results``: the sample's score under its length's metric only (the
    other lengths' metrics are not this sample's: lm-eval averages each over its own samples)."""
    return {metric_name(doc["length"]): score(doc, results[0])}
