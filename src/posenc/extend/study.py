"""The real-model study: every method at every length on long documents and passkey prompts.

A study is a grid of cells, each one forward of the model with one method applied:

* ``ppl`` cells, one per (method, document): a forward of the longest length gives the loss
  at every position; the row holds it in bins and as perplexity at each ``--lengths`` entry;
* ``passkey`` cells, one per (method, length, depth): the key's log-probability, ranks and
  greedy exact match;
* with ``longppl``, a ``keytokens`` cell per document (the evaluator method's whole-context and
  truncated-context losses pick the key tokens) and a ``longppl`` cell per (method, document):
  key-token perplexity at each length (:mod:`posenc.extend.longppl`).

Rows go to ``<out>/results.jsonl`` through the lab's append-only store (one fsynced line per
finished cell), keyed by the cell's identity, so a run killed at any point resumes without
recomputing a finished cell; ``<out>/run.json`` records what was asked (``posenc extend export``
reads the model from it). The methods' factors are set for the longest length (one forward per
cell serves every shorter length).
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..runs.identity import stable_hash
from ..runs.store import ResultStore, row_key
from .evaluate import (
    bin_means,
    document_ids,
    passkey_prompt,
    perplexity_at,
    score_passkey,
    token_nll,
)
from .folder import RUN_FILE as RUN_FILE  # where `posenc extend export` reads the model
from .folder import check_one_model, check_study, document_id, study_lock, write_run_file
from .methods import Method, Resolved, as_transformers, resolve
from .model import ModelSource, model_identity, rotated_pairs, trained_length
from .rows import read_study_rows

log = logging.getLogger("posenc.extend")

STUDY_SCHEMA = 1


@dataclass(frozen=True)
class StudyConfig:
    """What a study runs (all lengths in tokens)."""

    methods: tuple[Method, ...]
    lengths: tuple[int, ...]
    documents: tuple[str, ...]
    bin_size: int = 1024
    passkey_lengths: tuple[int, ...] = ()
    passkey_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    passkey_seed: int = 0
    passkey_methods: tuple[str, ...] | None = None  # labels; None: every method
    tasks: tuple[str, ...] = ()  # registered task names (posenc.extend.tasks)
    task_lengths: tuple[int, ...] = ()
    task_depths: tuple[float, ...] = (0.5,)  # for the tasks that take a depth
    task_samples: int = 4
    task_seed: int = 0
    longppl: bool = False  # key-token perplexity cells (posenc.extend.longppl)
    longppl_evaluator: str | None = None  # a method's label; None: yarn if there, else the first
    longppl_trunc: int = 4096  # the truncated context that finds key tokens (tokens)
    longppl_window: int = 1024  # tokens scored per truncated forward

    def __post_init__(self) -> None:
        if not self.methods:
            raise ValueError("a study needs at least one method")
        parse_lengths(self.lengths, "lengths")  # integers (a bool or 256.5 refused)
        parse_lengths(self.passkey_lengths, "passkey lengths")
        if isinstance(self.bin_size, bool) or not isinstance(self.bin_size, int):
            raise ValueError(f"bin size must be an integer, got {self.bin_size!r}")
        if (
            not self.lengths
            or min(self.lengths) < 2
            or list(self.lengths) != sorted(set(self.lengths))
        ):
            raise ValueError(f"lengths must be increasing integers >= 2, got {list(self.lengths)}")
        if self.bin_size < 1 or self.bin_size >= self.lengths[0]:
            raise ValueError(
                f"bin size must be in [1, {self.lengths[0] - 1}] (below the shortest length), "
                f"got {self.bin_size}"
            )
        labels = {m.label for m in self.methods}
        if self.passkey_methods is not None and not set(self.passkey_methods) <= labels:
            unknown = sorted(set(self.passkey_methods) - labels)
            raise ValueError(
                f"passkey methods {unknown} are not among the methods {sorted(labels)}"
            )
        if any(not 0.0 <= d <= 1.0 for d in self.passkey_depths):
            raise ValueError(f"passkey depths must be in [0, 1], got {list(self.passkey_depths)}")
        self._check_tasks()
        self._check_longppl()
        passkeys = self.passkey_lengths and self.passkey_methods != ()  # () asks none
        if not (self.documents or passkeys or self.tasks):
            raise ValueError("no document, passkey or task: nothing to measure (--documents 0 "
                             "is for a study of --tasks or --passkey-lengths alone)")  # fmt: skip

    def _check_tasks(self) -> None:
        from .tasks import get_task

        for name in self.tasks:
            get_task(name)  # one line naming the tasks there are
        parse_lengths(self.task_lengths, "task lengths")
        if self.tasks and not self.task_lengths:
            raise ValueError("tasks need at least one task length")
        if list(self.task_lengths) != sorted(set(self.task_lengths)):
            raise ValueError(f"task lengths (--task-lengths) must increase, each given once, "
                             f"got {list(self.task_lengths)}")  # fmt: skip
        if not self.task_depths:
            raise ValueError("task depths (--task-depths) name no depth: give fractions in "
                             "[0, 1], e.g. 0.1,0.5,0.9")  # fmt: skip
        if any(not 0.0 <= d <= 1.0 for d in self.task_depths):
            raise ValueError(f"task depths must be in [0, 1], got {list(self.task_depths)}")
        if len(set(self.task_depths)) != len(self.task_depths):  # the same cells twice
            raise ValueError(f"task depths (--task-depths) are given more than once: "
                             f"{list(self.task_depths)}")  # fmt: skip
        for name, value in (("task samples", self.task_samples), ("task seed", self.task_seed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
        if self.task_samples < 1:
            raise ValueError(f"task samples must be at least 1, got {self.task_samples}")

    def _check_longppl(self) -> None:
        for name, value in (("LongPPL trunc", self.longppl_trunc),
                            ("LongPPL window", self.longppl_window)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of tokens >= 1, got {value!r}")
        if not self.longppl:
            return
        if not self.documents:
            raise ValueError("--longppl measures documents: give --documents 1 or more, or --text")
        labels = [m.label for m in self.methods]
        if self.longppl_evaluator is not None and self.longppl_evaluator not in labels:
            raise ValueError(
                f"the LongPPL evaluator {self.longppl_evaluator!r} is not among the methods "
                f"{labels}: name one of them with --longppl-evaluator"
            )
        if self.lengths[-1] <= self.longppl_trunc:
            raise ValueError(
                f"LongPPL needs a length longer than its truncated context: the longest length "
                f"{self.lengths[-1]} is not above --longppl-trunc {self.longppl_trunc}; lower "
                "--longppl-trunc or add a longer length"
            )

    @property
    def evaluator(self) -> str:
        """The label of the method whose losses pick the key tokens: ``longppl_evaluator``, else
        ``yarn`` (as named, else the first yarn with options), else the first method."""
        labels = [m.label for m in self.methods]
        if self.longppl_evaluator is not None:
            return self.longppl_evaluator
        yarns = [m.label for m in self.methods if m.name == "yarn"]
        return "yarn" if "yarn" in labels else (yarns or labels)[0]

    @property
    def target(self) -> int:
        """The length the methods' factors are set for: the longest of every kind of cell."""
        return max((self.lengths[-1], *self.passkey_lengths, *self.task_lengths))


@dataclass(frozen=True)
class Cell:
    kind: str  # "ppl" | "passkey" | "task" | "keytokens" | "longppl"
    method: Method
    document: str | None = None
    length: int = 0
    depth: float | None = None
    task: str | None = None

    def name(self) -> str:
        where = Path(self.document).name if self.document else f"L={self.length} depth={self.depth}"
        return f"{self.task or self.kind} {self.method.label} {where}"


def cells(cfg: StudyConfig) -> list[Cell]:
    """Every cell in the order they run: perplexity method by method, then the key tokens and
    LongPPL, then passkey (so a run stopped early has every method's perplexity first)."""
    out = [
        Cell("ppl", m, document=d, length=cfg.lengths[-1])
        for m in cfg.methods
        for d in cfg.documents
    ]
    out += longppl_cells(cfg)
    keys = [m for m in cfg.methods if cfg.passkey_methods is None or m.label in cfg.passkey_methods]
    out += [
        Cell("passkey", m, length=n, depth=d)
        for m in keys
        for n in cfg.passkey_lengths
        for d in cfg.passkey_depths
    ]
    return out + task_cells(cfg)


def longppl_cells(cfg: StudyConfig) -> list[Cell]:
    """With ``cfg.longppl``: each document's ``keytokens`` cell (the evaluator's forwards),
    then a ``longppl`` cell per (method, document), every one at the longest length."""
    if not cfg.longppl:
        return []
    evaluator = next(m for m in cfg.methods if m.label == cfg.evaluator)
    n = cfg.lengths[-1]
    out = [Cell("keytokens", evaluator, document=d, length=n) for d in cfg.documents]
    return out + [Cell("longppl", m, document=d, length=n) for m in cfg.methods
                  for d in cfg.documents]  # fmt: skip


def task_cells(cfg: StudyConfig) -> list[Cell]:
    """The task cells, shortest length first and every method of a (task, length, depth) in a
    row: a run stopped early has whole columns of the task table, every method on the same
    prompts (read once from the prompt cache)."""
    from .tasks import get_task

    out = []
    for n in cfg.task_lengths:
        for name in cfg.tasks:
            depths = cfg.task_depths if get_task(name).uses_depth else (None,)
            out += [Cell("task", m, length=n, depth=d, task=name)
                    for d in depths for m in cfg.methods]  # fmt: skip
    return out


def cell_identity(
    cell: Cell, cfg: StudyConfig, model_id: dict[str, Any], resolved: Resolved
) -> dict[str, Any]:
    ident: dict[str, Any] = {
        "schema": STUDY_SCHEMA,
        "kind": cell.kind,
        "model": model_id,
        "method": cell.method.label,
        "settings": resolved.settings(),
        "length": cell.length,
    }
    if cell.kind == "ppl":
        ident.update(
            document=document_id(cell.document or ""),
            bin_size=cfg.bin_size,
            lengths=list(cfg.lengths),
        )
    elif cell.kind == "task":
        ident.update(task=cell.task, depth=cell.depth, seed=cfg.task_seed, n=cfg.task_samples)
    elif cell.kind in ("keytokens", "longppl"):
        from .longppl_cells import longppl_settings

        ident.update(document=document_id(cell.document or ""), longppl=longppl_settings(cfg))
        if cell.kind == "longppl":
            ident["lengths"] = list(cfg.lengths)
    else:
        ident.update(depth=cell.depth, seed=cfg.passkey_seed)
    return ident


def versions() -> dict[str, str]:
    import transformers

    from .. import __version__

    return {"posenc": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}  # fmt: skip


def with_method(model: Any, resolved: Resolved) -> Callable[[], None]:
    """Apply ``resolved`` to ``model`` (``none``: the model as loaded); returns the undo."""
    if resolved.scaling is None and resolved.extension is None:
        return lambda: None
    from ..hf import apply_posenc, remove_posenc

    scaling = as_transformers(resolved.scaling, model.config, resolved.layers)
    apply_posenc(model, scaling=scaling, extension=resolved.extension)

    def undo() -> None:
        remove_posenc(model)

    return undo


def check_methods(model: Any, cfg: StudyConfig) -> list[Resolved]:
    """Every method of ``cfg`` resolved and put on ``model`` once, then taken off: what a cell
    would refuse (an extension on a model whose full-attention layers have no RoPE, a
    ``layers=full`` on a model with one set of rope parameters) is refused here, in one line
    naming the method, before any cell runs and in ``--dry-run``."""
    train, pairs = trained_length(model.config), rotated_pairs(model.config)
    resolved = []
    for method in cfg.methods:
        try:
            r = resolve(method, train, cfg.target, pairs)
            with_method(model, r)()
        except (ValueError, TypeError) as err:
            raise ValueError(f"method {method.label}: {err}") from err
        resolved.append(r)
    return resolved


def check_texts(tokenizer: Any, cfg: StudyConfig) -> None:
    """Every document holds the longest length and the shortest passkey length holds the prompt,
    in ``tokenizer``'s tokens: refused in one line before any cell runs or anything is written."""
    for doc in cfg.documents:
        document_ids(tokenizer, Path(doc), cfg.lengths[-1])
    if cfg.passkey_lengths and cfg.passkey_methods != ():
        passkey_prompt(tokenizer, min(cfg.passkey_lengths), 0.0, cfg.passkey_seed)
    from .tasks import get_task

    for name in cfg.tasks:  # one sample at the shortest length: a task too long for it refused
        task, shortest = get_task(name), cfg.task_lengths[0]
        try:
            task.sample(tokenizer, shortest, cfg.task_depths[0] if task.uses_depth else None,
                        cfg.task_seed)  # fmt: skip
        except ValueError as err:  # which task and which option, beside the tokens it needs
            raise ValueError(f"task {name} at {shortest} tokens, the shortest task length "
                             f"(--task-lengths, default --lengths): {err}") from err  # fmt: skip


def run_cell(model: Any, tokenizer: Any, cell: Cell, cfg: StudyConfig, *,
             folder: Path | None = None, tokenizer_id: Any = None) -> dict[str, Any]:  # fmt: skip
    """The measured numbers of one cell (the method already applied), with attention in memory
    linear in the length (:func:`~posenc.hf.linear_memory.linear_memory`: no ``[s, t]`` mask
    for a sliding-window or soft-capped layer). A task cell's prompts are cached in
    ``folder`` (:func:`~posenc.extend.tasks.prompts.cached_samples`, keyed by ``tokenizer_id``);
    a ``longppl`` cell reads its document's key tokens from ``folder``'s ``keytokens`` row."""
    from ..hf.linear_memory import linear_memory

    with linear_memory(model):
        if cell.kind == "task":
            return _answer_task(model, tokenizer, cell, cfg, folder, tokenizer_id)
        if cell.kind in ("keytokens", "longppl"):
            from .longppl_cells import measure_longppl_cell as measure

            return measure(model, tokenizer, cell.kind, str(cell.document), cfg, folder)
        return _measure(model, tokenizer, cell, cfg)


def _answer_task(model: Any, tokenizer: Any, cell: Cell, cfg: StudyConfig, folder: Path | None,
                 tokenizer_id: Any) -> dict[str, Any]:  # fmt: skip
    """A task cell's row fields (:func:`posenc.extend.tasks.run_cell`): its seed as
    ``task_seed`` (a row's ``seed`` is the store's key), its time the row's own."""
    from .tasks import run_cell as answer_cell
    from .tasks.prompts import cached_samples

    task = str(cell.task)
    samples = cached_samples(folder, tokenizer, task, cell.length, cell.depth, cfg.task_samples,
                             cfg.task_seed, tokenizer_id)  # fmt: skip
    numbers = answer_cell(model, tokenizer, task, cell.length, cell.depth, cfg.task_samples,
                          cfg.task_seed, samples=samples)  # fmt: skip
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
    model_id = model_identity(source, model, dtype)
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
    model_id = model_identity(source, model, dtype)
    train = trained_length(model.config)
    pairs = rotated_pairs(model.config)
    todo = cells(cfg)
    result = StudyRun()
    check_methods(model, cfg)  # every refusal before the first cell
    check_texts(tokenizer, cfg)
    out.mkdir(parents=True, exist_ok=True)
    with study_lock(out):
        settings = check_study(out, cfg, model_id)  # one study per folder, before any write
        write_run_file(out, {  # lm-eval's habit: the model, every setting and the versions
            "source": asdict(source), "dtype": dtype, "study": _config_dict(cfg), "model": model_id,
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


def _config_dict(cfg: StudyConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["methods"] = [m.label for m in cfg.methods]
    return d


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
    """The rows of a study folder, read by one schema (:mod:`posenc.extend.rows`): a torn line,
    or a row with a field missing or of the wrong type, skipped with a warning. Rows of more
    than one model are refused (:func:`~posenc.extend.folder.check_one_model`)."""
    check_run_folder(out)
    path = Path(out) / "results.jsonl"
    if not path.exists():
        raise ValueError(f"{str(out)!r} holds no study results (no results.jsonl)")
    rows = read_study_rows(path)
    check_one_model(rows, out)
    return rows


def default_bin_size(lengths: Sequence[int]) -> int:
    """The bin size when none is given: 1024 tokens, or the largest power of two at most half
    the shortest length where that is less (``--lengths 32,64``: 16), so a default never refuses
    the user's own lengths."""
    half = max(1, min(lengths) // 2)
    return min(1024, 1 << (half.bit_length() - 1))


def parse_lengths(text: str | Sequence[int], option: str = "--lengths") -> tuple[int, ...]:
    """``"2k,4k,8192"`` -> ``(2048, 4096, 8192)``; one line naming ``option`` for a bad entry
    (inf, NaN, a fraction of a token, a bool, a list)."""
    if not isinstance(text, str):
        for x in text:
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"{option} must be integers (tokens), got {x!r}")
        return tuple(text)
    out = []
    for part in (p.strip().lower() for p in text.split(",") if p.strip()):
        mult = 1024 if part.endswith("k") else 1
        try:
            number = float(part[:-1] if mult > 1 else part) * mult
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number != int(number):  # inf, nan, 256.5, [64
            raise ValueError(
                f"{option}: {part!r} is not a whole number of tokens (e.g. 2048 or 2k)"
            )
        value = int(number)
        if value < 2:
            raise ValueError(f"{option}: {part!r} must be at least 2 tokens")
        out.append(value)
    return tuple(out)
