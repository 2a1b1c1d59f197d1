"""The real-model study run: every cell of a :class:`~.config.StudyConfig` measured with its
method in place (:mod:`.config` says which cells there are and in which order).

Rows go to ``<out>/results.jsonl`` through the lab's append-only store (one fsynced line per
finished cell), keyed by the cell's identity, so a run killed at any point resumes without
recomputing a finished cell; ``<out>/run.json`` records what was asked (``posenc extend export``
reads the model from it). The methods' factors are set for the longest length (one forward per
cell serves every shorter length).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...runs.identity import stable_hash
from ...runs.store import ResultStore, row_key
from ..measures.perplexity import (
    bin_means,
    document_ids,
    passkey_prompt,
    perplexity_at,
    score_passkey,
    token_nll,
)
from ..methods.apply import with_method
from ..methods.names import Resolved, resolve
from ..model.load import ModelSource, model_identity, rotated_pairs, trained_length
from ..model.locate import reference
from .config import Cell, StudyConfig, _config_dict, cell_identity, cells, versions
from .folder import RUN_FILE as RUN_FILE  # where `posenc extend export` reads the model
from .folder import check_one_model, check_study, folder_identity, study_lock, write_run_file
from .rows import read_study_rows

log = logging.getLogger("posenc.extend")


def check_methods(
    model: Any, cfg: StudyConfig, on_applied: Callable[[Resolved], None] | None = None
) -> list[Resolved]:
    """Every method of ``cfg`` resolved and put on ``model`` once, then taken off: what a cell
    would refuse (an extension on a model whose full-attention layers have no RoPE, a
    ``layers=full`` on a model with one set of rope parameters) is refused here, in one line
    naming the method, before any cell runs and in ``--dry-run``."""
    train, pairs = trained_length(model.config), rotated_pairs(model.config)
    resolved = []
    for method in cfg.methods:
        try:
            r = resolve(method, train, cfg.target, pairs)
            undo = with_method(model, r)
            if on_applied is not None:  # e.g. what it does per layer type, while applied
                on_applied(r)
            undo()
        except (ValueError, TypeError) as err:
            raise ValueError(f"method {method.label}: {err}") from err
        resolved.append(r)
    return resolved


def check_texts(tokenizer: Any, cfg: StudyConfig, model: Any = None) -> None:
    """Every document holds the longest length and the shortest passkey length holds the prompt,
    in ``tokenizer``'s tokens: refused in one line before any cell runs or anything is written.
    With ``model``: the longest length fits its learned position table (GPT-2's ``n_positions``)
    and every id of those texts is in its vocabulary."""
    from ..model.limits import check_positions, check_token_ids, input_rows
    from .options import length_options

    if model is not None:
        check_positions(model, cfg.target, length_options(cfg, cfg.target))
    rows = input_rows(model) if model is not None else None

    def fits(ids: Any, what: str) -> None:
        if rows is not None:  # host ids of the tokenizer's output, before any forward
            check_token_ids(torch.as_tensor(ids).flatten().tolist(), rows, what)

    for doc in cfg.documents:
        fits(document_ids(tokenizer, Path(doc), cfg.lengths[-1]), f"the document {doc}")
    if cfg.passkey_lengths and cfg.passkey_methods != ():
        prompt = passkey_prompt(tokenizer, min(cfg.passkey_lengths), 0.0, cfg.passkey_seed)
        fits(prompt.ids, "the passkey prompt")
    from ..measures.tasks import get_task

    for name in cfg.tasks:  # one sample at the shortest length: a task too long for it refused
        task, shortest = get_task(name), cfg.task_lengths[0]
        depth = cfg.task_depths[0] if task.uses_depth else None
        try:  # with every question's needle where several share a context
            if cfg.questions_for(name) > 1:
                samples = task.context(tokenizer, shortest, depth, cfg.task_seed, 0,
                                       cfg.questions_for(name))  # fmt: skip
            else:
                samples = [task.sample(tokenizer, shortest, depth, cfg.task_seed)]
        except ValueError as err:  # which task and which option, beside the tokens it needs
            raise ValueError(f"task {name} at {shortest} tokens, the shortest task length "
                             f"(--task-lengths, default --lengths): {err}") from err  # fmt: skip
        for sample in samples:
            fits(sample.ids, f"task {name}'s prompt")


def run_cell(model: Any, tokenizer: Any, cell: Cell, cfg: StudyConfig, *,
             folder: Path | None = None, tokenizer_id: Any = None) -> dict[str, Any]:  # fmt: skip
    """The measured numbers of one cell (the method already applied), with attention in memory
    linear in the length (:func:`~posenc.hf.linear_memory.linear_memory`: no ``[s, t]`` mask
    for a sliding-window or soft-capped layer). A task cell's prompts are cached in
    ``folder`` (:func:`~posenc.extend.measures.tasks.prompts.cached_samples`, keyed by ``tokenizer_id``);
    a ``longppl`` cell reads its document's key tokens from ``folder``'s ``keytokens`` row."""
    from ...hf.linear_memory import linear_memory

    with linear_memory(model):
        if cell.kind == "task":
            return _answer_task(model, tokenizer, cell, cfg, folder, tokenizer_id)
        if cell.kind in ("keytokens", "longppl"):
            from .longppl_cells import measure_longppl_cell as measure

            return measure(model, tokenizer, cell.kind, str(cell.document), cfg, folder)
        return _measure(model, tokenizer, cell, cfg)


def _answer_task(model: Any, tokenizer: Any, cell: Cell, cfg: StudyConfig, folder: Path | None,
                 tokenizer_id: Any) -> dict[str, Any]:  # fmt: skip
    """A task cell's row fields (:func:`posenc.extend.measures.tasks.run_cell`): its seed as
    ``task_seed`` (a row's ``seed`` is the store's key), its time the row's own."""
    from ..measures.tasks import run_cell as answer_cell
    from ..measures.tasks.prompts import cached_samples

    task = str(cell.task)
    questions = cfg.questions_for(task)
    samples = cached_samples(folder, tokenizer, task, cell.length, cell.depth, cfg.task_samples,
                             cfg.task_seed, tokenizer_id, questions)  # fmt: skip
    numbers = answer_cell(model, tokenizer, task, cell.length, cell.depth, cfg.task_samples,
                          cfg.task_seed, samples=samples, questions=questions)  # fmt: skip
    numbers["task_seed"] = numbers.pop("seed")
    del numbers["seconds"]
    return numbers


def _measure(model: Any, tokenizer: Any, cell: Cell, cfg: StudyConfig) -> dict[str, Any]:
    device = next(model.parameters()).device
    if cell.kind == "ppl":
        ids = document_ids(tokenizer, Path(cell.document or ""), cell.length).to(device)
        nll = token_nll(model, ids).cpu()
        return {
            "document": Path(cell.document or "").name,
            "tokens": cell.length,
            "bin_size": cfg.bin_size,
            "bins": bin_means(nll, cfg.bin_size),
            "ppl": {str(n): perplexity_at(nll, n, cfg.bin_size) for n in cfg.lengths},
        }
    prompt = passkey_prompt(tokenizer, cell.length, float(cell.depth or 0.0), cfg.passkey_seed)
    return {
        "length": cell.length,
        "depth": cell.depth,
        "key": prompt.key,
        **score_passkey(model, prompt),
    }


@dataclass
class StudyRun:
    """What :func:`run_study` did: rows written and cells found done already."""

    written: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0


def pending_cells(
    model: Any,
    source: ModelSource,
    cfg: StudyConfig,
    out: str | os.PathLike[str],
    dtype: str = "float32",
) -> list[Cell]:
    """The cells of ``cfg`` that :func:`run_study` would run: those whose row is not yet in
    ``<out>/results.jsonl`` (what a ``--dry-run`` of a resumed study costs)."""
    model_id = folder_identity(Path(out), model_identity(source, model, dtype))
    train, pairs = trained_length(model.config), rotated_pairs(model.config)
    path = Path(out) / "results.jsonl"
    done = {row_key(r) for r in read_study_rows(path)} if path.is_file() else set()
    return [c for c in cells(cfg) if _cell_key(c, cfg, model_id, train, pairs) not in done]


def _cell_key(
    cell: Cell, cfg: StudyConfig, model_id: dict[str, Any], train: int, pairs: int
) -> tuple[str, int, str]:
    """The row key of a cell: (method label, seed 0, hash of everything that makes its row)."""
    resolved = resolve(cell.method, train, cfg.target, pairs)
    return (cell.method.label, 0, stable_hash(cell_identity(cell, cfg, model_id, resolved)))


def run_study(
    model: Any,
    tokenizer: Any,
    source: ModelSource,
    cfg: StudyConfig,
    out: str | os.PathLike[str],
    *,
    dtype: str = "float32",
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> StudyRun:
    """Run every cell of ``cfg`` not yet in ``<out>/results.jsonl``; returns what it wrote."""
    out = Path(out)
    train, pairs = trained_length(model.config), rotated_pairs(model.config)
    todo = cells(cfg)
    result = StudyRun()
    check_methods(model, cfg)  # every refusal before the first cell
    check_texts(tokenizer, cfg, model)
    check_no_links(out, make=True)
    with study_lock(out):
        # a study resumed from another path keeps the identity (and so the row keys) it recorded
        model_id = folder_identity(out, model_identity(source, model, dtype))
        settings = check_study(out, cfg, model_id)  # one study per folder, before any write
        write_run_file(out, {  # lm-eval's habit: the model, every setting and the versions
            "source": asdict(source), "locate": reference(source), "dtype": dtype,
            "study": _config_dict(cfg), "model": model_id,
            "settings": settings, "versions": versions(), "threads": torch.get_num_threads(),
        })  # fmt: skip
        store = ResultStore(out / "results.jsonl")
        stored = store.keys()  # a key whose row cannot be read is not done: its row is replaced
        done = {row_key(r) for r in read_study_rows(store.path)}
        for i, cell in enumerate(todo, 1):
            key = _cell_key(cell, cfg, model_id, train, pairs)
            if key in done:
                result.skipped += 1
                continue
            resolved = resolve(cell.method, train, cfg.target, pairs)
            undo = with_method(model, resolved)
            start, cpu = time.perf_counter(), time.process_time()
            try:
                numbers = run_cell(model, tokenizer, cell, cfg, folder=out, tokenizer_id=model_id)
            finally:
                undo()
            seconds = time.perf_counter() - start
            # the process's CPU time beside the wall clock: on a shared machine (other work, a
            # paused run) the wall clock measures the load, the CPU time the cell's own cost
            cpu_seconds = time.process_time() - cpu
            row = {
                "encoding": cell.method.label, "seed": 0, "config_hash": key[2], "kind": cell.kind,
                "method": cell.method.label, "settings": resolved.settings(), "model": model_id,
                **({"identical_to_none": True} if resolved.identity else {}),
                **numbers, "seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2),
                "versions": versions(),
                "threads": torch.get_num_threads(),
            }  # fmt: skip
            store.append(row, replace=key in stored)
            result.written.append(row)
            log.info("[%d/%d] %s: %.1f s", i, len(todo), cell.name(), seconds)
            if on_row is not None:
                on_row(row)
    return result


def check_no_links(out: Path, make: bool = False) -> None:
    """Refuse (one line) a study folder whose ``results.jsonl`` or ``run.json`` is a symbolic
    link: the rows would be appended to a file outside the folder, another study's perhaps.
    ``make``: the folder is made first where it is missing."""
    if make:
        out.mkdir(parents=True, exist_ok=True)
    for name in ("results.jsonl", "run.json"):
        if (out / name).is_symlink():
            raise ValueError(
                f"{out / name} is a symbolic link (to {os.readlink(out / name)}); a study writes "
                "only into its own folder: copy the file there, or use another --out"
            )


def check_run_folder(out: str | os.PathLike[str]) -> None:
    """``out`` is a folder: a path that is missing or a file (its ``results.jsonl`` given for
    the folder) is one line saying which, and what to give instead."""
    path = Path(out)
    if path.is_file():
        raise ValueError(f"{str(out)!r} is a file; give the `posenc extend` results folder "
                         f"that holds it ({str(path.parent)!r})")  # fmt: skip
    if not path.is_dir():
        raise ValueError(f"{str(out)!r}: no such folder; give a `posenc extend` results folder")


def study_rows(out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The rows of a study folder (or of an lm-eval output folder of posenc's task folder:
    :mod:`posenc.extend.study.harness`), read by one schema (:mod:`posenc.extend.study.rows`): a torn line,
    or a row with a field missing or of the wrong type, skipped with a warning. Rows of more
    than one model are refused (:func:`~posenc.extend.study.folder.check_one_model`)."""
    from .harness import is_lmeval_folder, read_lmeval_rows

    check_run_folder(out)
    path = Path(out) / "results.jsonl"
    if path.exists():
        rows = read_study_rows(path)
    elif is_lmeval_folder(Path(out)):  # lm-eval's output of posenc's task folder
        rows = read_lmeval_rows(Path(out))
    else:
        raise ValueError(f"{str(out)!r} holds no study results (no results.jsonl, and no "
                         "lm-eval results_*.json)")  # fmt: skip
    check_one_model(rows, out)
    return rows
