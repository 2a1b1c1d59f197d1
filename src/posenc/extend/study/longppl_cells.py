"""The study's LongPPL cells (``posenc extend --longppl``): what a ``keytokens`` and a ``longppl``
cell measure, and what they cost.

* ``keytokens``, one per document, with the evaluator method applied: its whole-context losses
  (one forward of the longest length) and its truncated-context losses (the authors' windows,
  :func:`~posenc.extend.measures.longppl.short_context_nll`) pick the key tokens; the row holds their
  positions in the document's ids.
* ``longppl``, one per (method, document): the method's whole-context losses (one forward of
  the longest length), LongPPL over the key tokens below each length, the plain perplexity of
  every token below it from the same losses, and the key tokens' count. It reads the key tokens
  from the document's ``keytokens`` row in the study folder, which runs before it.

Evaluator and evaluated model share the tokenizer and the ids (the same model under two
methods), so a key token's position is the same in both; the authors' evaluator is another,
larger model, its key tokens carried over through character offsets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..measures.longppl import (
    ALPHA,
    BETA,
    key_positions,
    key_token_mask,
    key_token_perplexity,
    plain_perplexity,
    positions_mask,
    short_context_nll,
    short_windows,
)
from ..measures.perplexity import document_ids, token_nll
from .rows import KEYTOKENS, LONGPPL, read_study_rows


def longppl_settings(cfg: Any) -> dict[str, Any]:
    """How a study of ``cfg`` (a :class:`~posenc.extend.study.config.StudyConfig`) finds key tokens:
    in both LongPPL cells' identity and rows."""
    return {"evaluator": cfg.evaluator, "trunc_len": cfg.longppl_trunc,
            "window": cfg.longppl_window, "alpha": ALPHA, "beta": BETA}  # fmt: skip


def cell_forwards(kind: str, length: int, cfg: Any) -> list[int]:
    """The lengths of the forwards a cell of ``kind`` at ``length`` runs (the dry run's cost):
    a ``keytokens`` cell one whole and one per truncated window, any other one."""
    if kind != KEYTOKENS:
        return [length]
    windows = short_windows(length, cfg.longppl_trunc, cfg.longppl_window)
    return [length, *(cfg.longppl_trunc + w for _, w in windows)]


def measure_longppl_cell(
    model: Any, tokenizer: Any, kind: str, document: str, cfg: Any, folder: Path | None
) -> dict[str, Any]:
    """The row fields of a ``keytokens`` or ``longppl`` cell on ``document`` at the longest
    length (the cell's method already applied, attention already linear in memory)."""
    settings = longppl_settings(cfg)
    length = cfg.lengths[-1]
    name = Path(document).name
    ids = document_ids(tokenizer, Path(document), length).to(next(model.parameters()).device)
    head = {"document": name, "tokens": length, **settings}
    if kind == KEYTOKENS:
        full = token_nll(model, ids).cpu()  # [L - 1]
        short = short_context_nll(model, ids, cfg.longppl_trunc, cfg.longppl_window).cpu()
        positions = key_positions(key_token_mask(full, short, ALPHA, BETA))
        return {**head, "positions": positions, "count": len(positions)}
    key = stored_keytokens(folder, name, length, settings)
    nll = token_nll(model, ids).cpu()  # [L - 1]
    values, counts = key_token_perplexity(nll, positions_mask(key["positions"], length - 1),
                                          cfg.lengths)  # fmt: skip
    plain = plain_perplexity(nll, cfg.lengths)
    return {
        **head,
        "keytokens": key["config_hash"],
        "longppl": {str(n): v for n, v in values.items()},
        "plain_ppl": {str(n): v for n, v in plain.items()},
        "key_count": {str(n): c for n, c in counts.items()},
    }


def stored_keytokens(
    folder: Path | None, document: str, length: int, settings: dict[str, Any]
) -> dict[str, Any]:
    """The last readable ``keytokens`` row of ``folder`` for ``document`` (its name) at
    ``length`` found with ``settings``; a ValueError (one line) where there is none."""
    path = Path(folder or ".") / "results.jsonl"
    rows = read_study_rows(path) if path.is_file() else []
    found = [r for r in rows if r["kind"] == KEYTOKENS and r["document"] == document
             and r["tokens"] == length and all(r[k] == v for k, v in settings.items())]  # fmt: skip
    if not found:
        raise ValueError(
            f"a {LONGPPL} cell needs the key tokens of {document} by {settings['evaluator']} "
            f"and there are none in {path}: its keytokens cell runs first; run the study again"
        )
    return found[-1]
