"""Result rows as data: the one place the keys of a stored row are written.

A row is one JSON line of ``<out>/results.jsonl`` (:mod:`posenc.runs.store`): a :class:`GridRow`
per finished grid cell, an :class:`ExtendRow` per evaluation of ``posenc lab extend``. Writers
build the dataclass and store :meth:`to_dict`; the reader (:mod:`posenc.lab.reports.results`) gives
rows back as those dicts, with the fields older rows lack filled in (:func:`upgrade_row`).
The field order is the key order of the stored JSON (the reports list variants as stored).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

from ...runs.rows import NUMBER_OR_NULL, Each, Keys, ListOf, OneOf

EXTEND, REFERENCE = "extend", "extend-reference"


_Row = TypeVar("_Row", bound="_StoredRow")


class _StoredRow:
    """What both row kinds do: :meth:`to_dict` (the stored JSON, keys in field order) and
    :meth:`from_dict` (a stored row back, with the fields older rows lack filled in by
    :func:`upgrade_row`: :data:`GRID_ROW_DEFAULTS` or :data:`EXTEND_ROW_DEFAULTS`)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[_Row], row: dict[str, Any]) -> _Row:
        """A stored row as this dataclass; KeyError naming a field the row lacks."""
        row = upgrade_row(row)
        return cls(**{f.name: row[f.name] for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class GridRow(_StoredRow):
    """One finished grid cell.

    ``encoding`` is the label (``rope:positions=pose``), ``encoding_kwargs`` the encoding's own
    options; ``lab_options`` the lab options that are set, resolved (``{}`` for a plain label),
    and ``length_method`` the training positions (``"arange"``, ``"randomized"``, ``"pose"``),
    so a report can group by them. ``identity`` is the cell's (its hash is ``config_hash``),
    ``train`` the training statistics, ``eval`` :func:`posenc.lab.evaluation.evaluate.evaluate_model`'s
    result, ``runtime`` how it ran (in no hash)."""

    schema: int
    encoding: str
    encoding_name: str
    encoding_kwargs: dict[str, Any]
    lab_options: dict[str, Any]
    length_method: str
    family: str
    seed: int
    config_hash: str
    train_hash: str
    group: str
    preset: str | None
    train_len: int
    data: dict[str, Any]
    identity: dict[str, Any]
    params: int
    train: dict[str, Any]
    eval: dict[str, Any]
    runtime: dict[str, Any]
    versions: dict[str, str]
    finished_at: str


@dataclass(frozen=True)
class ExtendRow(_StoredRow):
    """One evaluation of a fine-tune (``kind`` :data:`EXTEND`) or of a model trained at the
    target length from scratch (:data:`REFERENCE`), after ``step`` of its ``steps``.

    ``config_hash`` keys what it measures and the table it belongs to (``group``); the base
    cell is ``base_group`` / ``base_config_hash``; ``identity`` is the job's."""

    schema: int
    kind: str
    encoding: str
    encoding_name: str
    family: str
    method: str
    label: str
    seed: int
    config_hash: str
    job_hash: str
    group: str
    base_group: str
    base_config_hash: str
    preset: str | None
    train_len: int
    target_len: int
    step: int
    steps: int
    tokens_per_step: int
    identity: dict[str, Any]
    data: dict[str, Any]
    eval: dict[str, Any]
    runtime: dict[str, Any]
    versions: dict[str, str]
    finished_at: str


@dataclass(frozen=True)
class GridRuntime:
    """How a grid cell ran (``GridRow.runtime``)."""

    world_size: int
    device: str
    threads: int
    compiled: bool
    resumed_from: int | None
    reused_weights: bool
    eval_seconds: float
    cell_seconds: float
    # glibc's allocator in the cell's process: "retain" (the lab's own processes keep freed
    # memory, posenc._malloc) or "system: <why>"; rows written before it lack the key
    malloc: str


@dataclass(frozen=True)
class ExtendRuntime:
    """How an extend evaluation ran (``ExtendRow.runtime``)."""

    eval_seconds: float
    elapsed_seconds: float
    device: str
    threads: int


#: Fields of a grid row that rows written before them lack, and the value they stand for there.
GRID_ROW_DEFAULTS: dict[str, Any] = {"lab_options": {}, "length_method": "arange", "preset": None}

#: Fields older extend rows lack.
EXTEND_ROW_DEFAULTS: dict[str, Any] = {"preset": None}


def upgrade_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the fields rows written before them lack set to the value they stand for
    (:data:`GRID_ROW_DEFAULTS`, :data:`EXTEND_ROW_DEFAULTS`); other keys untouched."""
    defaults = EXTEND_ROW_DEFAULTS if row.get("kind") else GRID_ROW_DEFAULTS
    missing = {k: v for k, v in defaults.items() if k not in row}
    if not missing:
        return row
    out = dict(row)
    for key, value in missing.items():
        out[key] = dict(value) if isinstance(value, dict) else value
    return out


def runtime_dict(runtime: GridRuntime | ExtendRuntime) -> dict[str, Any]:
    return asdict(runtime)


# --- The shapes of a row's nested fields --------------------------------------------------------
#
# What the readers (the reports, the figures, ``posenc lab extend``) index inside a row's objects,
# so that a row whose ``eval`` (or ``train``, ``runtime``, ``identity``) is an object of the wrong
# shape is skipped when it is read (:func:`posenc.lab.reports.results.row_problem`) instead of failing
# the report. Keys not named are allowed (and not looked at).


# A curve's bits are always floats (a non-finite bin reads back as NaN, a gap in its line).
_CURVE = Keys({"pos": ListOf(int), "end": ListOf(int), "bits": ListOf(float)})
_RESULT = Keys(
    {"bits": NUMBER_OR_NULL},
    {"acc": NUMBER_OR_NULL, "tokens": int, "curve": OneOf((None, _CURVE)),
     "note": OneOf((None, str))},
)  # fmt: skip
_BY_DEPTH = ListOf(OneOf((None, ListOf(NUMBER_OR_NULL))))  # [length][depth]
_PASSKEY = Keys({"depths": ListOf(float), "lengths": ListOf(int), "acc": _BY_DEPTH,
                 "exact": _BY_DEPTH})  # fmt: skip
_VARIANT = Keys(
    {"label": str, "results": Each(_RESULT, int_keys=True)},
    {"seconds": float, "passkey": OneOf((None, _PASSKEY))},
)

#: ``eval``: :func:`posenc.lab.evaluation.evaluate.evaluate_model`'s result, with its ``base`` variant.
EVAL_SHAPE = Keys(
    {"mode": str, "unit": str, "lengths": ListOf(int),
     "variants": Keys({"base": _VARIANT}, rest=_VARIANT)},
    {"train_len": int, "skipped": Each(Any)},
)  # fmt: skip

#: A grid row's nested fields: the ones its table and caption read.
GRID_SHAPES: dict[str, Any] = {
    "eval": EVAL_SHAPE,
    "train": Keys(
        {"tokens_per_s": float, "train_seconds": float, "final_loss_bits": float},
        {"tokens_per_s_fast": float, "tokens_per_cpu_s": float},
    ),
    "runtime": Keys({"world_size": int, "device": str, "threads": int, "cell_seconds": float}),
    "identity": Keys({"train": Keys(
        {"model": Keys({"dim": int, "num_layers": int, "num_heads": int}),
         "train": Keys({"steps": int, "batch_size": int})},
        {"data": Each(Any)},
    )}, {"eval": Each(Any)}),
    "data": Keys({"name": str, "fingerprint": str}),
    "versions": Keys({"torch": str}),
}  # fmt: skip

#: An extend row's nested fields.
EXTEND_SHAPES: dict[str, Any] = {
    "eval": EVAL_SHAPE,
    "identity": Keys({"model": Each(Any), "train": Keys({"batch_size": int, "lr": float})}),
}
