"""The Markdown blocks of ``benchmarks/RESULTS.md``, rendered from rows (:mod:`.rows`) alone.

Every ``posenc bench`` subcommand given ``--results FILE`` writes its rows to
``rows/<block>.json`` beside ``FILE`` and then this module's rendering of them into ``FILE``'s
block (:func:`publish`); ``posenc bench render`` re-renders every block that has a rows file
(:func:`rerender`), so a change of format reaches every recorded run without re-measuring.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import cos_sin, decode_calls, decode_positions, extend_attention, hf_model, rope, targets
from .bias import report as bias_report
from .harness import markdown_table, write_section
from .rows import BenchRows, load_all, rows_path


def _env_lines(doc: BenchRows) -> list[str]:
    return [*(f"- {k}: {v}" for k, v in doc.env.items()), f"- command: `{doc.command}`"]


def _case_tables(
    cases: list, header: list[str], rows_of: Callable, label_of: Callable
) -> list[str]:
    """``### label``, the case's table and its notes, for each case."""
    parts: list[str] = []
    for case in cases:
        parts += ["", f"### {label_of(case)}", "", markdown_table(header, rows_of(case))]
        if case.notes:
            parts += ["", *(f"- {k}: {v}" for k, v in case.notes.items())]
    return parts


def rope_target_lines(doc: BenchRows) -> list[str]:
    """``SHAPE DTYPE: target met; target MISSED``, one line per case a target applies to."""
    by_case: dict[str, list[str]] = {}
    for t in targets.rope(doc):
        by_case.setdefault(t.case, []).append(t.text)
    return [f"{case}: {'; '.join(texts)}" for case, texts in by_case.items()]


def rope_block(doc: BenchRows) -> str:
    """The ``rope-<device>[-tag]`` / ``rope-backward-...`` block."""
    backward = bool(doc.settings.get("backward"))
    cases = rope.cases_from_rows(doc.rows, backward)
    header, rows = rope.drop_empty_columns(
        rope.SUMMARY_HEADER, [rope.summary_row(c) for c in cases]
    )
    tag = doc.settings.get("tag", "")
    where = f"{doc.device}{', ' + tag if tag else ''}"
    calls = doc.settings.get("decode_calls", rope.DECODE_CALLS)
    parts = [
        f"## rope ({'forward+backward' if backward else 'forward'}, {where})",
        "",
        *_env_lines(doc),
        "",
        "Median of round-robin timed calls (decode shapes, one token: each sample the mean of "
        f"{calls} back-to-back calls). GB/s: q and k read and written once"
        + (" per pass (forward and backward)" if backward else "")
        + "; x copy: copy time / candidate time; speedup: candidate ms / posenc ms.",
        "",
        "### Summary",
        "",
        markdown_table(header, rows),
        "",
        rope.SUMMARY_LEGEND,
        "",
        *(f"- target {line}" for line in rope_target_lines(doc)),
    ]
    label = lambda c: f"{c.shape.label} {c.dtype}"  # noqa: E731
    parts += _case_tables(cases, rope.CASE_HEADER, rope.case_rows, label)
    return "\n".join(parts)


def rope_decode_block(doc: BenchRows) -> str:
    """The ``rope-decode-<device>[-tag]`` block: the decode per-call table."""
    parts = [
        f"## rope decode, per call ({doc.device})",
        "",
        *_env_lines(doc),
        "",
        markdown_table(decode_calls.HEADER, decode_calls.table_rows(doc.rows)),
        "",
        decode_calls.LEGEND,
    ]
    return "\n".join(parts)


def cos_sin_block(doc: BenchRows) -> str:
    """The ``cos-sin-<device>`` block."""
    cases = cos_sin.CosSinCase.from_rows(doc.rows)
    parts = [f"## cos-sin ({doc.device})", "", *_env_lines(doc)]
    parts += _case_tables(cases, cos_sin.CASE_HEADER, cos_sin.case_rows, cos_sin.label)
    return "\n".join(parts)


RENDERERS: dict[str, Callable[[BenchRows], str]] = {
    "rope": rope_block,
    "rope-decode": rope_decode_block,
    "decode-positions": decode_positions.block,
    "cos-sin": cos_sin_block,
    "bias": bias_report.block,
    "hf-model": hf_model.block,
    "extend-attention": extend_attention.block,
}


def render(doc: BenchRows) -> str:
    """The Markdown block of a rows file."""
    if doc.bench not in RENDERERS:
        raise ValueError(f"no renderer for bench {doc.bench!r}; known: {', '.join(RENDERERS)}")
    return RENDERERS[doc.bench](doc)


def publish(doc: BenchRows, results: Path | None, json_path: Path | None = None) -> list[Path]:
    """Save the rows (to ``json_path``, else beside ``results``) and render them into
    ``results``' block; returns the files written."""
    written = []
    if json_path is None and results is not None:
        json_path = rows_path(results, doc.block)
    if json_path is not None:
        written.append(doc.save(json_path))
    if results is not None:
        write_section(results, doc.block, render(doc))
        written.append(results)
    return written


def rerender(results: Path, folder: Path | None = None) -> list[str]:
    """Re-render every block of ``results`` that has a rows file in ``folder`` (default
    ``rows/`` beside it); other blocks and the text between them stay. Returns the blocks."""
    docs = load_all(folder or results.parent / "rows")
    for name, doc in docs.items():
        write_section(results, name, render(doc))
    return list(docs)
