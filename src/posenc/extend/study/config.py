"""What a study asks and the cells it makes: :class:`StudyConfig`, :class:`Cell`, the cells in
the order they run and each cell's identity (what its row is keyed by), the lengths parsed.

A study is a grid of cells, each one forward of the model with one method applied:

* ``ppl`` cells, one per (method, document): a forward of the longest length gives the loss
  at every position; the row holds it in bins and as perplexity at each ``--lengths`` entry;
* ``passkey`` cells, one per (method, length, depth): the key's log-probability, ranks and
  greedy exact match;
* ``task`` cells, one per (task, length, depth, method): RULER-style prompts answered greedily;
* with ``longppl``, a ``keytokens`` cell per document and a ``longppl`` cell per
  (method, document) (:mod:`posenc.extend.study.longppl_cells`).

The methods' factors are set for the longest length (one forward per cell serves every shorter
length).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ..methods.names import Method, Resolved
from .folder import document_id

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
    tasks: tuple[str, ...] = ()  # registered task names (posenc.extend.measures.tasks)
    task_lengths: tuple[int, ...] = ()
    task_depths: tuple[float, ...] = (0.5,)  # for the tasks that take a depth
    task_samples: int = 4
    task_seed: int = 0
    task_questions: int = 1  # needle tasks: questions asked of one prefilled context
    longppl: bool = False  # key-token perplexity cells (posenc.extend.measures.longppl)
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
        from ..measures.tasks import get_task

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
        from ..measures.tasks.base import check_questions

        # Several questions a context go to the tasks that take them (the needles); the others
        # ask one each. Refused where no task of the study takes them, or they do not divide.
        takes = [name for name in self.tasks if get_task(name).group is not None]
        for name in takes or self.tasks[:1]:  # one line naming the tasks that take it
            check_questions(get_task(name), self.task_samples, self.task_questions)

    def questions_for(self, task: str) -> int:
        """Questions asked of one prefilled context of ``task``: ``task_questions`` for a task
        that groups its questions (the needles), one for the others (vt, cwe, qa, ...)."""
        from ..measures.tasks import get_task

        return self.task_questions if get_task(task).group is not None else 1

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
    from ..measures.tasks import get_task

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
        if cfg.questions_for(str(cell.task)) > 1:  # rows of one question keep their identity
            ident["questions"] = cfg.questions_for(str(cell.task))
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

    from ... import __version__

    return {"posenc": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}  # fmt: skip


def _config_dict(cfg: StudyConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["methods"] = [m.label for m in cfg.methods]
    return d


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
