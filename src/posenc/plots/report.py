"""``posenc report``: one self-contained HTML page with every figure and the lab's latest table.

Self-contained means it opens from a file, offline, anywhere: figures are PNG ``data:`` URIs,
the CSS is inline, and there is no script and no external URL.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import __version__

REPORT_DPI = 100

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", "Noto Sans", sans-serif;
       max-width: 1280px; margin: 2rem auto; padding: 0 1rem; color: #1d1d1f; line-height: 1.5; }
h1 { margin-bottom: 0.2rem; }
.meta { color: #666; margin-top: 0; }
nav ul { display: flex; flex-wrap: wrap; gap: 0.4rem 1.2rem; padding: 0; list-style: none; }
section { margin: 2.5rem 0; }
figure { margin: 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-style: italic; color: #333; margin-top: 0.4rem; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 0.6rem 1rem; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead { background: #f3f3f3; }
code { background: #f3f3f3; padding: 0 0.25rem; }
"""


def text_html(text: str) -> str:
    """Plain text as HTML: escaped, with ``code`` spans (Markdown backticks, as in error
    messages and notes) as ``<code>`` elements, so no literal backtick reaches the page."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text)).replace("`", "'")


def _figure_html(kind: str, title: str, png: bytes, caption: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<section id="{kind}"><h2>{html.escape(title)}</h2><figure>'
        f'<img src="data:image/png;base64,{data}" alt="{html.escape(title)}">'
        f"<figcaption>{text_html(caption)}</figcaption></figure></section>"
    )


def _note_html(kind: str, title: str, text: str) -> str:
    return (
        f'<section id="{kind}"><h2>{html.escape(title)}</h2>'
        f'<p class="note">{text_html(text)}</p></section>'
    )


def lab_table_html(rows: list[dict[str, Any]]) -> str:
    """The lab's results table (:func:`posenc.lab.reports.report.table_cells`) as an HTML table, its
    units in a header row above the column names (test loss in bits per byte or token at each
    eval length; training throughput in tokens per second)."""
    from ..lab.reports.report import describe, table_cells

    # The best cell is bold: marked with control characters that survive html.escape, then
    # turned into <b> (Markdown's ** would show as literal asterisks).
    header, body = table_cells(rows, bold=lambda text: f"\x02{text}\x03")
    unit = rows[0]["eval"]["unit"] if rows else "byte"
    n = len(header) - 5  # encoding, the eval lengths, then 4 columns about the training
    groups = (
        f'<tr><th rowspan="2">encoding</th><th colspan="{n}">test loss, bits per {unit} at '
        "each eval length (lower is better)</th>"
        "<th>tokens per second</th><th>throughput ratio</th><th>parameters</th>"
        "<th>runs averaged</th></tr>"
    )
    names = "".join(f"<th>{html.escape(h)}</th>" for h in header[1:])
    lines = "".join(
        "<tr>" + "".join(f"<td>{_bold_html(html.escape(c))}</td>" for c in cells) + "</tr>"
        for cells in body
    )
    return (
        f"<table><thead>{groups}<tr>{names}</tr></thead><tbody>{lines}</tbody></table>"
        f'<p class="meta">{text_html(describe(rows))}</p>'
    )


def _bold_html(escaped: str) -> str:
    return escaped.replace("\x02", "<b>").replace("\x03", "</b>")


def _figure_section(
    kind: str,
    options: dict[str, Any],
    say: Callable[[str], Any],
    missing: str | None = None,
    section: tuple[str, str] | None = None,
) -> str:
    """One figure as a report section, its caption under the image (drawn once: taken out of
    the PNG); a figure that cannot be drawn here becomes a note saying why. ``missing``: why no
    figure can be drawn at all (matplotlib absent), said instead of trying; ``section``: the
    section's id and heading (default: the kind's)."""
    from .common import figure_png_bytes, take_caption
    from .figures import FIGURES, make_figure

    spec = FIGURES[kind]
    anchor, title = section or (kind, spec.title)
    if missing is not None:
        return _note_html(anchor, title, f"Not drawn: {missing}")
    say(f"drawing {anchor} ...")
    try:
        fig = make_figure(kind, **options)
    except Exception as e:
        say(f"  {anchor} unavailable: {type(e).__name__}: {e}")
        detail = traceback.format_exception_only(type(e), e)[-1].strip()
        return _note_html(anchor, title, f"Not drawn (needs {spec.needs}): {detail}")
    text = take_caption(fig)
    return _figure_html(anchor, title, figure_png_bytes(fig, REPORT_DPI), text)


def _matplotlib_missing() -> str | None:
    """Why no figure can be drawn here (matplotlib, the plots extra, not installed), or None."""
    from .common import require_matplotlib

    try:
        require_matplotlib()
    except ImportError as e:
        return str(e)
    return None


#: The passkey section's second figure: a heatmap per inference-time variant (RoPE rescaling).
PASSKEY_VARIANTS = ("passkey-variants", "Lab: passkey retrieval, inference-time variants")


def _has_variants(rows: list[dict[str, Any]]) -> bool:
    return any(name != "base" for r in rows for name in r["eval"]["variants"])


def _options(
    kind: str, results: str | Path, checkpoint: str | Path | None, attention_steps: int
) -> dict[str, Any]:
    if kind == "attention":
        if checkpoint is not None:
            return {"steps": attention_steps, "checkpoint": str(checkpoint)}
        return {"steps": attention_steps, "progress": True}
    from .figures import FIGURES

    if FIGURES[kind].question is not None:
        return {"results": str(results)}
    return {}


def _lab_table_section(rows: list[dict[str, Any]]) -> str:
    if rows:
        table = lab_table_html(rows)
    else:
        table = (
            '<p class="note">No lab results yet. <code>posenc lab</code> trains and evaluates '
            "every encoding and writes them to <code>runs/lab/results.jsonl</code>; this section "
            "then shows its latest table.</p>"
        )
    return f'<section id="lab-table"><h2>Lab: latest results</h2>{table}</section>'


def _html_table(header: list[str], body: list[list[str]], note: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    lines = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>" for cells in body
    )
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{lines}</tbody></table>"
        f'<p class="meta">{text_html(note)}</p>'
    )


def _question_table(kind: str, rows: list[dict[str, Any]]) -> str:
    """The table under a lab figure other than the main one (its rows are there)."""
    if kind == "length":
        table = lab_table_html(rows)
    elif kind == "extend":
        from ..lab.reports.extend_report import describe_extend, extend_table

        table = _html_table(*extend_table(rows), describe_extend(rows))
    elif kind == "passkey":
        from .passkey import passkey_table

        table = _html_table(*passkey_table(rows))  # header, body, note
    else:
        return ""
    return f'<section id="{kind}-table"><h3>Table</h3>{table}</section>'


def build_report(
    results: str | Path = "runs/lab",
    checkpoint: str | Path | None = None,
    attention_steps: int = 300,
    kinds: list[str] | None = None,
    log: Callable[[str], Any] | None = None,
) -> str:
    """The report as an HTML string. ``kinds``: the figures to include (default: all).

    The lab's questions (extrapolation, training for length, extension by fine-tuning, passkey
    retrieval) each get their figure and table, from the newest results that answer them. A
    figure that cannot be drawn here (its encodings absent, no lab results) becomes a note
    saying why, so one missing piece never costs the whole page.
    """
    from .. import lab
    from .figures import FIGURES, lab_results

    say = log or (lambda _msg: None)
    rows = lab_results("extrapolation", results)
    missing = _matplotlib_missing()
    if missing is not None:
        say(f"no figures drawn: {missing}")
    sections: list[str] = []
    for kind in kinds or list(FIGURES):
        spec = FIGURES[kind]
        found = lab_results(spec.question, results) if spec.question else []
        if spec.question is not None and not found:
            when = f" ({lab.DEFAULT_RUN_TIME})" if kind == "lab" else ""
            note = (
                f"No {spec.question} results in {Path(results) / 'results.jsonl'}. Run "
                f"`{spec.command}`{when}, then `posenc report` again."
            )
            sections.append(_note_html(kind, spec.title, note))
            continue
        options = _options(kind, results, checkpoint, attention_steps)
        sections.append(_figure_section(kind, options, say, missing))
        if kind == "passkey" and _has_variants(found):
            options = {**options, "variants": True}
            sections.append(_figure_section(kind, options, say, missing, PASSKEY_VARIANTS))
        if spec.question is not None and kind != "lab":
            sections.append(_question_table(kind, found))
    sections.append(_lab_table_section(rows))
    toc = "".join(
        f'<li><a href="#{k}">{html.escape(FIGURES[k].title)}</a></li>' for k in kinds or FIGURES
    )
    toc += '<li><a href="#lab-table">Lab: latest results</a></li>'
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>posenc report</title><style>{_CSS}</style></head><body>"
        "<header><h1>posenc report</h1>"
        f'<p class="meta">posenc {html.escape(__version__)}, generated {stamp}. Positional '
        "encodings, shown: each figure's caption says what to look at.</p></header>"
        f"<nav><ul>{toc}</ul></nav>{''.join(sections)}</body></html>\n"
    )
