"""Key-token perplexity (LongPPL, Fang et al. ICLR 2025) in ``posenc extend --longppl``.

The numerics against references written here: the truncated losses against one separate forward
per token of exactly the context the authors' windows give it (and of exactly ``trunc_len``
tokens where that is the same), the key-token rule against hand-made losses at each comparison's
boundary, LongPPL against hand-made vectors. Then the study end to end on a tiny Llama folder:
rows, a rerun that recomputes nothing, the report's table, and one-line refusals.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from _cli_here import cli
from _tiny import tiny_folder, tiny_lm
from posenc.extend.measures.longppl import (
    key_positions,
    key_token_mask,
    key_token_perplexity,
    plain_perplexity,
    positions_mask,
    short_context_nll,
    short_windows,
)
from posenc.extend.measures.perplexity import default_documents, document_ids, token_nll
from posenc.extend.methods.names import parse_methods
from posenc.extend.model.load import load_model, resolve_source
from posenc.extend.study import longppl_cells
from posenc.extend.study.config import StudyConfig, cells
from posenc.extend.study.rows import read_study_rows
from posenc.extend.study.run import study_rows
from test_extend_task_study import assert_a_row_without_is_skipped

TRUNC, WINDOW = 32, 8


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    return tiny_lm(vocab_size=50, hidden_size=32, intermediate_size=48, max_position_embeddings=128)


def _loss_after(model: torch.nn.Module, context: torch.Tensor, target: torch.Tensor) -> float:
    """``-log p(target | context)`` from the model's full logits (float64 log-softmax)."""
    with torch.no_grad():
        logits = model(input_ids=context[None]).logits[0, -1].double()
    return float(-torch.log_softmax(logits, -1)[target])


def _ids(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 50, (1, length), generator=torch.Generator().manual_seed(seed))


def test_windows_are_the_authors() -> None:
    # range(0, L - trunc, window); the last window shortened to the end
    assert short_windows(61, 32, 8) == [(0, 8), (8, 8), (16, 8), (24, 5)]
    assert short_windows(64, 32, 8) == [(0, 8), (8, 8), (16, 8), (24, 8)]
    assert short_windows(33, 32, 8) == [(0, 1)]
    assert short_windows(32, 32, 8) == [] and short_windows(10, 32, 8) == []


@pytest.mark.parametrize("length", [64, 61])
def test_each_position_gets_its_windows_context(tiny: torch.nn.Module, length: int) -> None:
    """Position ``p >= trunc`` is predicted from ``ids[s : p]`` with ``s = p - trunc - j``,
    ``j = (p - trunc) % window``: ``trunc + j`` tokens; positions below ``trunc``: NaN."""
    ids = _ids(length)
    got = short_context_nll(tiny, ids, TRUNC, WINDOW)
    assert got.dtype == torch.float32 and got.shape == (length - 1,)
    assert torch.isnan(got[: TRUNC - 1]).all() and not torch.isnan(got[TRUNC - 1 :]).any()
    for p in range(TRUNC, length):
        j = (p - TRUNC) % WINDOW
        want = _loss_after(tiny, ids[0, p - TRUNC - j : p], ids[0, p])
        assert got[p - 1].item() == pytest.approx(want, abs=1e-4), p


def test_exactly_trunc_tokens_at_each_windows_first_position(tiny: torch.nn.Module) -> None:
    """Where the window gives exactly ``trunc`` tokens (``p = trunc + k window``) the loss is
    that of a forward of exactly the previous ``trunc`` tokens; elsewhere the context is longer
    and the loss differs from that reference."""
    ids = _ids(64)
    got = short_context_nll(tiny, ids, TRUNC, WINDOW)
    exact = {p: _loss_after(tiny, ids[0, p - TRUNC : p], ids[0, p]) for p in range(TRUNC, 64)}
    firsts = range(TRUNC, 64, WINDOW)
    for p in firsts:
        assert got[p - 1].item() == pytest.approx(exact[p], abs=1e-4), p
    others = [abs(got[p - 1].item() - exact[p]) for p in exact if p not in firsts]
    assert max(others) > 1e-3  # the longer context is seen: the two schemes are not the same


def test_full_and_short_agree_where_the_context_is_the_same(tiny: torch.nn.Module) -> None:
    ids = _ids(64)
    full, short = token_nll(tiny, ids), short_context_nll(tiny, ids, TRUNC, WINDOW)
    # the first window starts at 0: its positions see the whole prefix either way
    assert torch.allclose(full[TRUNC - 1 : TRUNC - 1 + WINDOW], short[TRUNC - 1 : TRUNC - 1 + WINDOW],
                          atol=1e-4)  # fmt: skip
    assert short_context_nll(tiny, ids, 64, WINDOW).isnan().all()  # no truncated context at all


def test_key_token_rule_at_each_boundary() -> None:
    t = torch.tensor
    # full < beta (2) and short - full > alpha (2), both strict; NaN never key
    full = t([1.0, 2.0, 1.999, 1.5, 1.5, 2.5, 0.5, 1.0])
    short = t([4.0, 9.0, 9.0, 3.5, 3.5001, 10.0, 2.4, math.nan])
    want = [True, False, True, False, True, False, False, False]
    assert key_token_mask(full, short).tolist() == want
    # another alpha and beta move both boundaries
    assert key_token_mask(t([1.0, 1.0]), t([2.0, 2.5]), alpha=1.0, beta=1.5).tolist() == [
        False,
        True,
    ]
    assert key_token_mask(t([1.5]), t([9.0]), beta=1.5).tolist() == [False]
    with pytest.raises(ValueError, match="one shape"):
        key_token_mask(t([1.0]), t([1.0, 2.0]))


def test_key_token_perplexity_by_length() -> None:
    nll = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])  # L = 8: tokens at positions 1..7
    mask = positions_mask([3, 6], 7)
    assert key_positions(mask) == [3, 6]
    values, counts = key_token_perplexity(nll, mask, [3, 4, 6, 7, 8])
    assert values[3] is None and counts[3] == 0  # positions 1, 2: none key
    assert values[4] == pytest.approx(math.exp(3.0)) and counts[4] == 1
    assert values[6] == pytest.approx(math.exp(3.0))  # position 6 is not < 6
    assert values[7] == pytest.approx(math.exp(4.5)) and counts[8] == 2
    assert plain_perplexity(nll, [3, 8]) == pytest.approx({3: math.exp(1.5), 8: math.exp(4.0)})
    with pytest.raises(ValueError, match="outside"):
        key_token_perplexity(nll, mask, [9])
    with pytest.raises(ValueError, match="outside"):
        positions_mask([0], 7)


# --- the study ------------------------------------------------------------------------------

METHODS = "none,yarn,self_extend"
LENGTHS = (32, 64, 128)  # 32: no key token can lie below it (it is the truncated context)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("llama"), 64)


def _args(folder: Path, out: Path, *extra: str) -> list[str]:
    return ["extend", str(folder), "--methods", METHODS, "--lengths", "32,64,128",
            "--bin-size", "16", "--longppl", "--longppl-trunc", str(TRUNC), "--out", str(out),
            *extra]  # fmt: skip


@pytest.fixture(scope="module")
def study(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("longppl")
    result = cli(*_args(folder, out))
    assert result.exit_code == 0, result.output
    return out


def test_longppl_rows_are_written(study: Path) -> None:
    rows = study_rows(study)
    (keys,) = [r for r in rows if r["kind"] == "keytokens"]
    assert (keys["method"], keys["evaluator"]) == ("yarn", "yarn")  # yarn is among the methods
    assert (keys["trunc_len"], keys["window"], keys["alpha"], keys["beta"]) == (32, 8, 2.0, 2.0)
    assert keys["count"] == len(keys["positions"]) and keys["tokens"] == 128
    assert all(TRUNC <= p < 128 for p in keys["positions"])
    got = [r for r in rows if r["kind"] == "longppl"]
    assert [r["method"] for r in got] == METHODS.split(",")
    for r in got:
        assert r["keytokens"] == keys["config_hash"] and r["evaluator"] == "yarn"
        assert (
            set(r["longppl"]) == set(r["plain_ppl"]) == set(r["key_count"]) == {"32", "64", "128"}
        )
        assert r["longppl"]["32"] is None and r["key_count"]["32"] == 0  # none below trunc_len
        assert r["key_count"]["128"] == keys["count"]
        assert all(math.isfinite(v) and v > 1 for v in r["plain_ppl"].values())
    # the order: perplexity first, then the key tokens, then LongPPL
    kinds = [r["kind"] for r in rows]
    assert kinds == ["ppl"] * 3 + ["keytokens"] + ["longppl"] * 3


def test_a_rerun_recomputes_nothing_and_shows_the_table(folder: Path, study: Path) -> None:
    lines = (study / "results.jsonl").read_text().splitlines()
    again = cli(*_args(folder, study))
    assert again.exit_code == 0, again.output
    assert (study / "results.jsonl").read_text().splitlines() == lines
    assert "LongPPL@128" in again.output and "evaluator yarn" in again.output
    # without --longppl the folder's LongPPL rows are still reported; nothing is recomputed
    plain = cli("extend", str(folder), "--methods", METHODS, "--lengths", "32,64,128",
                 "--bin-size", "16", "--out", str(study))  # fmt: skip
    assert plain.exit_code == 0 and "LongPPL@64" in plain.output, plain.output
    assert (study / "results.jsonl").read_text().splitlines() == lines


def test_report_shows_longppl_beside_plain_perplexity(study: Path) -> None:
    md = cli("extend", "report", str(study), "--markdown")
    assert md.exit_code == 0, md.output
    assert (
        "| method | LongPPL@32 | PPL@32 | LongPPL@64 | PPL@64 | LongPPL@128 | PPL@128 |"
        in md.output
    )
    assert "evaluator yarn" in md.output and "Fang et al., ICLR 2025" in md.output
    assert "| key tokens / tokens | 0 | 31 |" in md.output
    assert "| method | ppl@32 | ppl@64 | ppl@128 | s / forward |" in md.output  # unchanged
    term = cli("extend", "report", str(study))
    assert term.exit_code == 0 and "LongPPL@128" in term.output, term.output


def test_longppl_of_stored_key_tokens_by_hand(folder: Path, study: Path, tmp_path: Path) -> None:
    """A ``longppl`` cell's numbers from a keytokens row with chosen positions: exp of the mean
    loss of those tokens below each length, from a forward computed here."""
    lines = (study / "results.jsonl").read_text().splitlines()
    row = json.loads(next(x for x in lines if '"kind": "keytokens"' in x))
    row.update(positions=[40, 70, 100], count=3)
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    model, tok = load_model(resolve_source(str(folder)))
    cfg = StudyConfig(methods=tuple(parse_methods(METHODS)), lengths=LENGTHS,
                      documents=(str(default_documents(1)[0]),), bin_size=16, longppl=True,
                      longppl_trunc=TRUNC, longppl_window=WINDOW)  # fmt: skip
    got = longppl_cells.measure_longppl_cell(model, tok, "longppl", cfg.documents[0], cfg,
                                             tmp_path)  # fmt: skip
    nll = token_nll(model, document_ids(tok, Path(cfg.documents[0]), 128)).double()
    assert got["longppl"]["32"] is None
    assert got["longppl"]["64"] == pytest.approx(math.exp(float(nll[39])), rel=1e-5)
    assert got["longppl"]["128"] == pytest.approx(
        math.exp(float(nll[[39, 69, 99]].mean())), rel=1e-5
    )
    assert got["key_count"] == {"32": 0, "64": 1, "128": 3}
    assert got["plain_ppl"]["64"] == pytest.approx(math.exp(float(nll[:63].mean())), rel=1e-5)
    # without the keytokens row there is nothing to average over: one line, no guess
    (tmp_path / "results.jsonl").unlink()
    with pytest.raises(ValueError, match="keytokens cell runs first"):
        longppl_cells.measure_longppl_cell(model, tok, "longppl", cfg.documents[0], cfg, tmp_path)


def test_every_token_past_the_truncated_context_is_key_with_loose_thresholds(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With alpha and beta that every finite loss meets, the key tokens are exactly the positions
    with a truncated loss: ``trunc_len .. L - 1``; ``none``'s LongPPL is then the perplexity of
    those tokens, computed here from a forward of the model as trained."""
    monkeypatch.setattr(longppl_cells, "ALPHA", -1e9)
    monkeypatch.setattr(longppl_cells, "BETA", 1e9)
    out = tmp_path / "loose"
    result = cli(*_args(folder, out))
    assert result.exit_code == 0, result.output
    rows = read_study_rows(out / "results.jsonl")
    (keys,) = [r for r in rows if r["kind"] == "keytokens"]
    assert keys["positions"] == list(range(TRUNC, 128)) and keys["alpha"] == -1e9
    none = next(r for r in rows if r["kind"] == "longppl" and r["method"] == "none")
    assert none["key_count"] == {"32": 0, "64": 32, "128": 96}
    model, tok = load_model(resolve_source(str(folder)))
    nll = token_nll(model, document_ids(tok, default_documents(1)[0], 128)).double()
    assert none["longppl"]["64"] == pytest.approx(math.exp(float(nll[31:63].mean())), rel=1e-5)
    assert none["longppl"]["128"] == pytest.approx(math.exp(float(nll[31:].mean())), rel=1e-5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lengths", "64,128", "--longppl-trunc", "128"], "is not above --longppl-trunc 128"),
        (["--longppl-evaluator", "ntk"], "the LongPPL evaluator 'ntk' is not among the methods"),
        (["--longppl-trunc", "0"], "--longppl-trunc"),
    ],
)
def test_bad_longppl_options_are_one_line_and_write_nothing(
    folder: Path, tmp_path: Path, extra: list[str], message: str
) -> None:
    out = tmp_path / "out"
    base = ["extend", str(folder), "--methods", "none,yarn", "--lengths", "64,128",
            "--bin-size", "16", "--longppl", "--out", str(out)]  # fmt: skip
    result = cli(*base, *extra)
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output, result.output
    assert not out.exists()


def test_refused_before_the_model_loads(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = cli("extend", str(tmp_path / "no-such-model"), "--methods", "none", "--lengths",
                  "64,128", "--longppl", "--out", str(out))  # fmt: skip
    assert result.exit_code != 0 and "is not above --longppl-trunc 4096" in result.output
    assert not out.exists()


def test_another_truncated_context_in_the_folder_is_another_study(folder: Path,
                                                                  study: Path) -> None:  # fmt: skip
    result = cli(*_args(folder, study, "--longppl-window", "4"))
    assert result.exit_code != 0 and "another study" in result.output, result.output
    result = cli(*_args(folder, study, "--longppl-evaluator", "none"))
    assert result.exit_code != 0 and "longppl_evaluator" in result.output, result.output


def test_a_keytokens_row_with_a_field_missing_is_skipped_with_a_warning(study: Path,
                                                                        tmp_path: Path) -> None:  # fmt: skip
    assert_a_row_without_is_skipped(study, tmp_path, "keytokens", "positions")


def test_dry_run_counts_the_short_forwards(folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "dry"
    result = cli(*_args(folder, out, "--dry-run"))
    assert result.exit_code == 0, result.output
    # 128 tokens, trunc 32, window 8 (a quarter of trunc): range(0, 96, 8) is 12 windows
    assert "1 key-token cell (12 short forwards, evaluator yarn), 3 LongPPL cells" in result.output
    assert not out.exists()


def test_the_evaluator_is_yarn_if_there_else_the_first_method() -> None:
    def cfg(methods: str, **kw: Any) -> StudyConfig:
        return StudyConfig(methods=tuple(parse_methods(methods)), lengths=(64, 128),
                           documents=("d",), bin_size=16, longppl=True, longppl_trunc=32, **kw)  # fmt: skip

    assert cfg("none,yarn:factor=4,yarn").evaluator == "yarn"
    assert cfg("none,yarn:factor=4").evaluator == "yarn:factor=4"
    assert cfg("ntk,none").evaluator == "ntk"
    assert cfg("ntk,none", longppl_evaluator="none").evaluator == "none"
    got = [(c.kind, c.method.label) for c in cells(cfg("none,yarn"))]
    assert got == [("ppl", "none"), ("ppl", "yarn"), ("keytokens", "yarn"), ("longppl", "none"),
                   ("longppl", "yarn")]  # fmt: skip
