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
    the store's :data:`~posenc.runs.store.RowCheck`."""
    kind = row.get("kind")
    if kind not in KINDS:
        return f"its kind {kind!r} is not a study row's ({', '.join(KINDS)})", None
    problem = shape_problem(row, STUDY_ROWS[kind], "row") or _contexts_problem(row)
    if problem is not None:
        return f"{problem} (a {kind} row); a rerun of the study computes its cell again", None
    return None, None


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
    written; every other line skipped with one warning naming the file and the line."""
    rows = ResultStore(path).numbered_rows(study_row_problem)
    return [_nan_at_floats(row, STUDY_ROWS[row["kind"]]) for _, row in rows]
