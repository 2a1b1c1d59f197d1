"""Every figure kind by name: ``make_figure(kind, **options) -> Figure``.

Used by ``posenc plot <kind>``, ``posenc plot all``, ``posenc report`` and the documentation
build, so each figure is defined once. Each kind is a pure data function (checked numerically in
the tests) followed by a drawing function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class FigureKind:
    name: str
    title: str  # a heading for the report and the docs
    needs: str  # what has to be importable/present, in words (for skip messages)
    make: Callable[..., Figure]
    #: For the lab's figures: the question its results answer (``lab_results``), and the
    #: command that writes them.
    question: str | None = None
    command: str | None = None


def _table(
    encodings: tuple[str, ...] = ("sinusoidal", "rope"),
    num_positions: int = 128,
    dim: int = 64,
    base: float = 10000.0,
) -> Figure:
    from .table import draw_table, table_data

    return draw_table([table_data(e, num_positions, dim, base) for e in encodings])


def _similarity(
    dim: int = 128,
    max_offset: int = 256,
    bases: tuple[float, ...] = (100.0, 10000.0, 500000.0),
    start: int = 100,
) -> Figure:
    from .similarity import draw_similarity, similarity_data

    return draw_similarity(similarity_data(dim, max_offset, bases, start))


def _wavelengths(
    head_dim: int = 128,
    base: float = 10000.0,
    train_len: int = 4096,
    factor: float = 4.0,
    methods: tuple[str, ...] | None = None,
) -> Figure:
    from .wavelengths import WAVELENGTH_METHODS, draw_wavelengths, wavelength_data

    chosen = tuple(methods) if methods else tuple(WAVELENGTH_METHODS)
    return draw_wavelengths(wavelength_data(head_dim, base, train_len, factor, chosen))


def _bias(
    kinds: tuple[str, ...] | None = None,
    num_heads: int = 4,
    length: int = 64,
    causal: bool = True,
    seed: int = 0,
) -> Figure:
    from .bias import available_bias_kinds, bias_data, draw_bias

    chosen = list(kinds) if kinds else available_bias_kinds()
    return draw_bias(bias_data(chosen, num_heads, length, causal, seed))


def _attention(**options: Any) -> Figure:
    """:func:`~posenc.plots.attention.draw_attention` of
    :func:`posenc.lab.evaluation.probe.attention_data`'s maps (``checkpoint``, ``encoding``, ``train_len``,
    ``factor``, ``steps``, ``layer``, ``seed``, ``progress``: its options)."""
    from ..lab.evaluation.probe import attention_data
    from .attention import draw_attention

    return draw_attention(attention_data(**options))


def lab_results(
    question: str, results: str | Path, group: str | None = None
) -> list[dict[str, Any]]:
    """The rows that answer ``question`` in the store at ``results`` (``group``: a hash prefix;
    default: the newest group that answers it): grid rows for ``extrapolation``, ``length`` and
    ``passkey`` (:func:`posenc.lab.reports.report.newest_group`), extend rows for ``extend``. Empty when
    there are none."""
    from ..lab.reports.report import load_rows, newest_group, question_rows
    from ..runs.store import RESULTS_FILE

    if not (Path(results) / RESULTS_FILE).exists():
        return []
    if question == "extend":
        from ..lab.reports.extend_report import extend_rows

        return extend_rows(results, group)
    group = group if group is not None else newest_group(results, question)
    return question_rows(load_rows(results, group), question) if group is not None else []


def _rows_or_raise(question: str, results: str, group: str | None) -> list[dict[str, Any]]:
    rows = lab_results(question, results, group)
    if not rows:
        kind = next(k for k in FIGURES.values() if k.question == question)
        raise ValueError(
            f"no {question} results in {Path(results) / 'results.jsonl'}"
            + (f" (group {group})" if group else "")
            + f"; `{kind.command}` writes them"
        )
    return rows


def _lab(results: str = "runs/lab", group: str | None = None) -> Figure:
    from .lab import draw_lab, lab_data

    return draw_lab(lab_data(rows=_rows_or_raise("extrapolation", results, group)))


def _length(results: str = "runs/lab", group: str | None = None) -> Figure:
    from .lab import draw_length, lab_data

    return draw_length(lab_data(rows=_rows_or_raise("length", results, group)))


def _extend(results: str = "runs/lab", group: str | None = None) -> Figure:
    from ..lab.reports.extend_report import extend_data
    from .extend import draw_extend

    return draw_extend(extend_data(_rows_or_raise("extend", results, group)))


def _passkey(results: str = "runs/lab", group: str | None = None, variants: bool = False) -> Figure:
    """The passkey heatmaps; ``variants``: one per inference-time variant (RoPE rescaling)
    beside its model as trained, instead of one per encoding."""
    from .passkey import draw_passkey, passkey_data

    data = passkey_data(_rows_or_raise("passkey", results, group))
    return draw_passkey(data, variants=variants)


FIGURES: dict[str, FigureKind] = {
    k.name: k
    for k in (
        FigureKind("table", "The encoding matrix", "posenc.functional.rotary", _table),
        FigureKind("similarity", "Similarity against offset", "posenc.functional.rotary", _similarity),
        FigureKind("wavelengths", "RoPE wavelengths and scaling", "posenc.functional.rotary", _wavelengths),
        FigureKind("bias", "Bias maps", "the bias encodings (posenc.bias)", _bias),
        FigureKind("attention", "Attention at 1x and 4x length", "a lab checkpoint or a few seconds of training", _attention),
        FigureKind("lab", "Lab: train short, test long", "a lab results store", _lab, "extrapolation", "posenc lab"),
        FigureKind("length", "Lab: training for length", "the length grid's results", _length, "length", "posenc lab --encodings length"),
        FigureKind("extend", "Lab: extension by fine-tuning", "posenc lab extend's results", _extend, "extend", "posenc lab extend"),
        FigureKind("passkey", "Lab: passkey retrieval", "the passkey grid's results", _passkey, "passkey", "posenc lab --task passkey"),
    )
}  # fmt: skip


def make_figure(kind: str, **options: Any) -> Figure:
    """Build figure ``kind`` (one of :data:`FIGURES`) with its options."""
    if kind not in FIGURES:
        raise ValueError(f"unknown plot kind {kind!r}; choose one of {', '.join(FIGURES)}")
    return FIGURES[kind].make(**options)
