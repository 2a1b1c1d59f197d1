"""A study's rows read by one schema: what the table, the report and the figure read in a ``ppl``,
``passkey``, ``task``, ``keytokens`` or ``longppl`` row, checked when the row is read.

A row of a known kind with a field missing or of the wrong type (a hand edit, a row of another
posenc) is skipped with one warning naming the file and the line, like a torn line, never a
``KeyError`` in a report; its cell counts as not done, so a rerun of the study computes it again.
The shapes and their checker are the run machinery's (:mod:`posenc.runs.rows`,
:func:`posenc.runs.rows.shape_problem`); a null where a float goes (the store writes a
non-finite float as null) reads back as NaN, a perplexity's null as None (no number).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...runs.rows import NUMBER_OR_NULL, Each, Keys, ListOf, shape_problem
from ...runs.rows import nan_at_floats as _nan_at_floats
from ...runs.store import ResultStore

PPL, PASSKEY, TASK = "ppl", "passkey", "task"
KEYTOKENS, LONGPPL = "keytokens", "longppl"  # key-token perplexity (posenc.extend.measures.longppl)
KINDS = (PPL, PASSKEY, TASK, KEYTOKENS, LONGPPL)

#: What names the model in a row (:func:`posenc.extend.model.load.model_identity`), as read.
MODEL_SHAPE = Keys({"source": str, "model_type": str, "parameters": int, "trained_length": int,
                    "dtype": str, "config_hash": str})  # fmt: skip

_COMMON: dict[str, Any] = {
    "kind": str, "method": str, "settings": Each(Any), "model": MODEL_SHAPE, "seconds": float,
    "versions": Each(str), "threads": int,
}  # fmt: skip

#: How a document's key tokens were found (:mod:`posenc.extend.measures.longppl`): both LongPPL kinds.
_KEY_SETTINGS: dict[str, Any] = {
    "document": str, "tokens": int, "evaluator": str, "trunc_len": int, "window": int,
    "alpha": float, "beta": float,
}  # fmt: skip

#: Every field a study row of each kind is read with (others are allowed and not looked at).
STUDY_ROWS: dict[str, Keys] = {
    PPL: Keys({**_COMMON, "document": str, "tokens": int, "bin_size": int, "bins": ListOf(float),
               "ppl": Each(NUMBER_OR_NULL, int_keys=True)}),
    PASSKEY: Keys({**_COMMON, "length": int, "depth": float, "key": str, "key_logprob": float,
                   "ranks": ListOf(int), "exact": bool}),
    # a (task, length, depth) cell's samples (posenc.extend.measures.tasks.run_cell); depth null for a
    # task without one; target log-probabilities null where not measured
    TASK: Keys({**_COMMON, "task": str, "length": int, "depth": NUMBER_OR_NULL, "task_seed": int,
                "n": int, "metric": str, "score": float, "low": float, "high": float,
                "scores": ListOf(float), "outputs": ListOf(str), "references": ListOf(ListOf(str)),
                "target_logprobs": ListOf(NUMBER_OR_NULL), "new_tokens": ListOf(int),
                "digests": ListOf(str)}),
    # a document's key tokens by the evaluator (the row's method): their positions in the ids
    KEYTOKENS: Keys({**_COMMON, **_KEY_SETTINGS, "positions": ListOf(int), "count": int}),
    # a method's LongPPL (null: no key token below that length), plain perplexity over every
    # token below each length, key tokens below each length; keytokens: that row's config_hash
    LONGPPL: Keys({**_COMMON, **_KEY_SETTINGS, "keytokens": str,
                   "longppl": Each(NUMBER_OR_NULL, int_keys=True),
                   "plain_ppl": Each(NUMBER_OR_NULL, int_keys=True),
                   "key_count": Each(int, int_keys=True)}),
}  # fmt: skip


def study_row_problem(row: dict[str, Any]) -> tuple[str | None, str | None]:
    """Why a stored row (an object with a well-typed key) is no readable study row, or None;
    the store's :data:`~posenc.runs.store.RowCheck`. A field of the right type but a value no
    study writes (:func:`value_problem`) is refused as a wrong type is."""
    kind = row.get("kind")
    if kind not in KINDS:
        return f"its kind {kind!r} is not a study row's ({', '.join(KINDS)})", None
    problem = (
        shape_problem(row, STUDY_ROWS[kind], "row") or value_problem(row) or _contexts_problem(row)
    )
    if problem is not None:
        return f"{problem} (a {kind} row); a rerun of the study computes its cell again", None
    return None, None


def _unit(x: float) -> bool:
    return 0.0 <= x <= 1.0  # False for NaN too


def value_problem(row: dict[str, Any]) -> str | None:
    """Why a well-typed row holds values no study writes, or None: a length or token count
    below 1, a depth outside ``[0, 1]``; a task row of an unknown task or another metric than
    its task's, no sample (``scores: []``), per-sample lists of another length than ``n``, or a
    score outside ``[0, 1]``."""
    kind = row["kind"]
    for key in ("length", "tokens", "bin_size"):
        if key in STUDY_ROWS[kind].required and row[key] < 1:
            return f"row.{key} is {row[key]}; a study's {key} is >= 1"
    depth = row.get("depth")
    if "depth" in STUDY_ROWS[kind].required and depth is not None and not _unit(depth):
        return f"row.depth is {depth}; a depth is in [0, 1]"
    if kind != TASK:
        return None
    from ..measures.tasks import TASKS

    task = TASKS.get(row["task"])
    if task is None:
        return f"row.task is {row['task']!r}, no task of this posenc ({', '.join(TASKS)})"
    if row["metric"] != task.metric_name:
        return f"row.metric is {row['metric']!r}; {row['task']} is scored by {task.metric_name}"
    if (depth is None) == task.uses_depth:
        return (
            f"row.depth is {depth}; {row['task']} {'needs' if task.uses_depth else 'has no'} depth"
        )
    if row["n"] < 1:
        return f"row.n is {row['n']}; a cell holds at least one sample"
    for key in ("scores", "outputs", "references", "target_logprobs", "new_tokens", "digests"):
        if len(row[key]) != row["n"]:
            return f"row.{key} holds {len(row[key])} entries, not n = {row['n']}"
    if not all(_unit(x) for x in (row["score"], row["low"], row["high"], *row["scores"])):
        return "row.score, low, high or scores hold a value outside [0, 1]"
    return None


def cell_of(row: dict[str, Any]) -> tuple[Any, ...]:
    """What one row answers: a task row's (method, task, length, depth); another's key."""
    if row["kind"] == TASK:
        return (row["method"], row["task"], row["length"], row["depth"])
    return (row["encoding"], row["seed"], row["config_hash"])


def _cell_text(cell: tuple[Any, ...]) -> str:
    if len(cell) == 4:
        return f"{cell[1]} at {cell[2]} (depth {cell[3]}) with {cell[0]}"
    return f"{cell[0]} ({cell[2]})"


def one_row_per_cell(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """``rows`` (``(where, row)``, ``where`` a file and line) in order, refusing (ValueError, one
    line naming both places) two readable rows of one cell: which one holds the answer is not
    for a reader to guess (a later row silently read in place of an earlier one turned 0 %
    into 100 %)."""
    seen: dict[tuple[Any, ...], str] = {}
    for where, row in rows:
        cell = cell_of(row)
        if cell in seen:
            raise ValueError(
                f"{seen[cell]} and {where} both hold {_cell_text(cell)}: one cell, two answers; "
                "remove the row that is not the study's (or move it to its own folder)"
            )
        seen[cell] = where
    return [row for _, row in rows]


def checked_rows(rows: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows read from elsewhere than a store (``(where, row)``: an lm-eval output folder's,
    :mod:`posenc.extend.study.harness`) through the same checks as a store's: a row no study
    writes skipped with one warning naming ``where``, two rows of one cell refused."""
    from ...runs.store import warn_line

    kept = []
    for where, row in rows:
        problem, _ = study_row_problem(row)
        if problem is not None:
            file, _, line = where.rpartition(":")
            warn_line(
                Path(file), int(line), f"skipping a result row that cannot be read: {problem}"
            )
            continue
        kept.append((where, _nan_at_floats(row, STUDY_ROWS[row["kind"]])))
    return one_row_per_cell(kept)


def _contexts_problem(row: dict[str, Any]) -> str | None:
    """A task row's optional ``contexts`` (one shared-context id per sample, where questions
    shared a prefill): a list of strings as long as its ``digests``, else why not."""
    if row.get("kind") != TASK or "contexts" not in row:
        return None
    got = row["contexts"]
    if not isinstance(got, list) or not all(isinstance(c, str) for c in got):
        return "its contexts are not a list of strings"
    if len(got) != len(row["digests"]):
        return f"it has {len(got)} contexts for {len(row['digests'])} samples"
    return None


def read_study_rows(path: str | Path) -> list[dict[str, Any]]:
    """The readable study rows of the store at ``path`` (a ``results.jsonl``), in the order
    written; every other line skipped with one warning naming the file and the line; two
    readable rows of one cell refused (:func:`one_row_per_cell`)."""
    rows = ResultStore(path).every_row(study_row_problem)
    return one_row_per_cell([(f"{path}:{i}", _nan_at_floats(row, STUDY_ROWS[row["kind"]]))
                             for i, row in rows])  # fmt: skip
