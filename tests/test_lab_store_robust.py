"""The results store on a damaged ``results.jsonl`` and ``posenc lab report --readme`` on a
hand-edited file: a bad line is skipped (or, for an unknown field, read) with one warning naming
the file and the line, no good row is lost; every append is fsynced; a file whose markers are
not one well-formed pair is refused, left as it was, before anything is computed.

The rows are real grid rows (three cells of a ``cpu-small`` run, ``tests/data/lab_store_rows.jsonl``),
written by hand: nothing here trains."""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from posenc.cli import app
from posenc.lab.reports import readme as RD
from posenc.lab.reports import report as R
from posenc.lab.reports.results import extend_rows, load_rows, store_rows
from posenc.runs.store import RESULTS_FILE, ResultStore

DATA = Path(__file__).resolve().parent / "data" / "lab_store_rows.jsonl"
GOOD: list[dict[str, Any]] = [json.loads(line) for line in DATA.read_text().splitlines()]
ENCODINGS = [r["encoding"] for r in GOOD]  # none, sinusoidal, alibi


def _line(row: Any) -> bytes:
    return (json.dumps(row) + "\n").encode()


def _bad_lines() -> dict[str, tuple[bytes, str]]:
    """Case -> (the bad line, what its warning says)."""
    row = GOOD[0]
    no_encoding = {k: v for k, v in row.items() if k != "encoding"}
    deep = "[" * 3000 + "]" * 3000
    return {
        "invalid bytes": (b'{"encoding": "r\xffpe", "seed": 0}\n', "not UTF-8"),
        "invalid JSON": (b'{"encoding": "rope", "seed": 0, "conf\n', "not JSON"),
        "missing encoding": (_line(no_encoding), "no 'encoding'"),
        "seed a string": (_line({**row, "seed": "zero"}), "'seed' is 'zero', not an integer"),
        "seed a bool": (_line({**row, "seed": True}), "'seed' is True, not an integer"),
        "field of the wrong type": (
            _line({**row, "config_hash": "bad1", "params": "many"}),
            "'params' is 'many', not int",
        ),
        "group missing": (
            _line({k: v for k, v in {**row, "config_hash": "bad2"}.items() if k != "group"}),
            "no 'group'",
        ),
        "object of the wrong type": (
            _line({**row, "config_hash": "bad4", "eval": [1]}),
            "'eval' is [1], not dict[str, Any]",
        ),
        "not an object": (b"[1, 2, 3]\n", "a JSON list, not an object"),
        **_nested_bad_lines(),
        "deep nesting": ((deep + "\n").encode(), "nested too deep"),
        "deep nesting in a row": (
            (json.dumps({**row, "config_hash": "bad3"})[:-1] + ', "x": ' + deep + "}\n").encode(),
            "nested too deep",
        ),
    }


def _nested(tag: str, path: str, value: Any) -> bytes:
    """The first good row (key ``tag``) with the nested field at ``path`` (dotted; ``-`` drops
    it) set to ``value``."""
    row = copy.deepcopy({**GOOD[0], "config_hash": tag})
    *parents, last = path.split(".")
    at = row
    for key in parents:
        at = at[key]
    if value is _DROP:
        del at[last]
    else:
        at[last] = value
    return _line(row)


_DROP = object()


def _deep_in_eval(tag: str) -> bytes:
    """The first good row with a 3000-deep list beside the fields of its ``eval``."""
    text = json.dumps({**GOOD[0], "config_hash": tag})
    deep = "[" * 3000 + "]" * 3000
    return (text.replace('"eval": {', '"eval": {"x": ' + deep + ", ", 1) + "\n").encode()


def _nested_bad_lines() -> dict[str, tuple[bytes, str]]:
    """Valid JSON rows whose nested fields (``eval`` and the others the reports read) have the
    wrong shape or type: each would fail the report (TypeError, KeyError, AttributeError)."""
    base = "eval.variants.base"
    result = GOOD[0]["eval"]["variants"]["base"]["results"]["64"]
    deep_list: Any = []
    for _ in range(500):  # parses (under the recursion limit) and is no object
        deep_list = [deep_list]
    return {
        "nested bits a string": (
            _nested("n1", f"{base}.results.64.bits", "x"),
            f"{base}.results.64.bits is 'x', not a number or null",
        ),
        "eval of another shape": (_nested("n2", "eval", {"bits": {"64": "x"}}), "no eval.mode"),
        "results a list": (
            _nested("n3", f"{base}.results", [1, 2]),
            f"{base}.results is [1, 2], not an object",
        ),
        "a result a list": (
            _nested("n4", f"{base}.results.64", [1]),
            f"{base}.results.64 is [1], not an object",
        ),
        "a result keyed by no length": (
            _nested("n5", f"{base}.results.x", result),
            f"{base}.results has the key 'x', not a length",
        ),
        "lengths of strings": (
            _nested("n6", "eval.lengths", ["64"]),
            "eval.lengths[0] is '64', not an integer",
        ),
        "a variant a string": (
            _nested("n7", "eval.variants.linear", "x"),
            "eval.variants.linear is 'x', not an object",
        ),
        "no base variant": (_nested("n8", base, _DROP), "no eval.variants.base"),
        "a number past float's range": (
            _nested("n9", f"{base}.results.64.bits", 10**400),
            "not a number or null",
        ),
        "a deep list where an object belongs": (
            _nested("n10", f"{base}.results", deep_list),
            f"{base}.results is [[[...]]], not an object",
        ),
        "a 3000-deep value in eval": (_deep_in_eval("n11"), "nested too deep"),
        "train statistics missing": (
            _nested("n12", "train.tokens_per_s", _DROP),
            "no train.tokens_per_s",
        ),
        "runtime of the wrong type": (
            _nested("n13", "runtime.threads", "one"),
            "runtime.threads is 'one', not an integer",
        ),
    }


def _store_with(tmp_path: Path, bad: bytes) -> Path:
    """A folder whose results.jsonl is the good rows with ``bad`` as its line 2."""
    out = tmp_path / "out"
    out.mkdir()
    lines = [_line(GOOD[0]), bad, *(_line(r) for r in GOOD[1:])]
    (out / RESULTS_FILE).write_bytes(b"".join(lines))
    return out


def _warnings_of(read: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = read()
    return got, [str(w.message) for w in caught]


@pytest.mark.parametrize("case", list(_bad_lines()))
def test_a_bad_line_is_skipped_with_one_warning_naming_file_and_line(tmp_path, case):
    bad, why = _bad_lines()[case]
    out = _store_with(tmp_path, bad)
    path = out / RESULTS_FILE
    rows, messages = _warnings_of(lambda: store_rows(out))
    assert [r["encoding"] for r in rows] == ENCODINGS  # every good row, in order
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{path}:2: ") and why in messages[0], messages[0]
    assert "\n" not in messages[0]
    # The store's own reads (a run's skip test) pass the line too, and its key still appends.
    store = ResultStore(path)
    keys, _ = _warnings_of(store.keys)
    assert {k[0] for k in keys} >= set(ENCODINGS)
    assert _warnings_of(lambda: store.append({**GOOD[1], "config_hash": "new"}))[0]


def test_a_bad_line_is_warned_once_per_process_however_often_it_is_read(tmp_path):
    """A run reads the store to skip finished cells, then again for its report: under Python's
    default warning filter each bad line is shown once."""
    out = _store_with(tmp_path, b"[1]\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        ResultStore(out / RESULTS_FILE).keys()
        store_rows(out)
        load_rows(out)
    assert [str(w.message) for w in caught] == [
        f"{out / RESULTS_FILE}:2: skipping a line that is no result row: a JSON list, not an object"
    ]


def test_an_unknown_field_is_ignored_with_a_warning_and_its_row_kept(tmp_path):
    extra = {**GOOD[0], "config_hash": "extra1", "colour": "red"}
    out = _store_with(tmp_path, _line(extra))
    rows, messages = _warnings_of(lambda: store_rows(out))
    assert [r["config_hash"] for r in rows] == [
        GOOD[0]["config_hash"],
        "extra1",
        *(r["config_hash"] for r in GOOD[1:]),
    ]
    assert messages == [f"{out / RESULTS_FILE}:2: ignoring field(s) no result row has: 'colour'"]


def test_every_bad_line_in_one_file_is_named_and_the_report_still_runs(tmp_path):
    """All the cases at once: one warning each, with its own line number; ``posenc lab report``
    prints the table of the good rows and exits 0."""
    out = tmp_path / "out"
    out.mkdir()
    cases = list(_bad_lines().values())
    lines = [_line(r) for r in GOOD] + [bad for bad, _ in cases] + [b"\n"]
    (out / RESULTS_FILE).write_bytes(b"".join(lines))
    rows, messages = _warnings_of(lambda: load_rows(out))
    assert [r["encoding"] for r in rows] == ENCODINGS
    assert len(messages) == len(cases)
    for n, ((_, why), message) in enumerate(zip(cases, messages, strict=True), len(GOOD) + 1):
        assert message.startswith(f"{out / RESULTS_FILE}:{n}: ") and why in message
    args = ["lab", "report", "--out", str(out), "--no-plots"]
    res, messages = _warnings_of(lambda: CliRunner().invoke(app, args))
    assert res.exit_code == 0, res.output
    assert f"{out / RESULTS_FILE}:{len(GOOD) + 1}: " in messages[0]
    assert all(name in res.output for name in ENCODINGS)
    assert "Traceback" not in res.output


def test_every_append_is_fsynced_after_its_write(tmp_path, monkeypatch):
    """``os.fsync`` is called once per written row, on the results file, after the row is in it
    (the file's size at the fsync is the size with the row); a skipped duplicate writes and
    syncs nothing."""
    path = tmp_path / RESULTS_FILE
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        assert os.path.samestat(st, os.stat(path))
        synced.append(st.st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = ResultStore(path)
    sizes = []
    for row in GOOD:
        assert store.append(row)
        sizes.append(path.stat().st_size)
    assert synced == sizes
    assert not store.append(GOOD[0]) and synced == sizes  # a stored key: nothing written


def test_an_append_after_a_torn_line_starts_a_fresh_line_and_is_fsynced(tmp_path, monkeypatch):
    path = tmp_path / RESULTS_FILE
    path.write_bytes(_line(GOOD[0]) + b'{"encoding": "ro')
    calls = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    (written, messages) = _warnings_of(lambda: ResultStore(path).append(GOOD[1]))
    assert written and len(calls) == 1
    assert messages and messages[0].startswith(f"{path}:2: ")
    rows, _ = _warnings_of(ResultStore(path).rows)
    assert [r["encoding"] for r in rows] == ENCODINGS[:2]


# --- --readme markers ------------------------------------------------------------------------

START, END = RD.README_START, RD.README_END

#: Case -> (the file's text, what the error says).
MARKER_CASES = {
    "duplicated opening marker": (
        f"# intro\n{START}\nmy own text\n{START}\nold table\n{END}\noutro\n",
        f"has {START} on 2 lines (2, 4)",
    ),
    "duplicated closing marker": (
        f"# intro\n{START}\nold\n{END}\nmine\n{END}\n",
        f"has {END} on 2 lines (4, 6)",
    ),
    "closing before opening": (
        f"# intro\n{END}\nmine\n{START}\nold\n",
        f"has {END} on line 2, before {START} on line 4",
    ),
    "missing closing": (f"# intro\n{START}\nmine\n", f"has {START} on line 2 and no {END}"),
    "missing opening": (f"# intro\nmine\n{END}\n", f"has {END} on line 3 and no {START}"),
    "marker inside a line": (
        f"# intro\nsee {START} here\nold\n{END}\n",
        f"has {START} on line 2 with other text",
    ),
    "no markers": ("# intro\nmine\n", f"has no {START} ... {END} block"),
}


@pytest.mark.parametrize("case", list(MARKER_CASES))
def test_a_readme_without_one_well_formed_block_is_refused_and_left_as_it_was(tmp_path, case):
    text, why = MARKER_CASES[case]
    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        RD.write_readme_table(readme, GOOD, "extrapolation")
    message = str(err.value)
    assert message.startswith(f"{readme} {why}") and "\n" not in message, message
    assert readme.read_text(encoding="utf-8") == text


@pytest.fixture
def lab_out(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(DATA, out / RESULTS_FILE)
    return out


def _report(out: Path, readme: Path, *extra: str) -> Any:
    args = ["lab", "report", "--out", str(out), "--no-plots", "--readme", str(readme), *extra]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("case", ["duplicated opening marker", "closing before opening"])
def test_lab_report_refuses_a_bad_readme_before_computing(lab_out, tmp_path, case):
    """One line naming the file and the problem, exit 2, the file unchanged, and no report
    written (the check comes before the rows are read)."""
    text, why = MARKER_CASES[case]
    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    res = _report(lab_out, readme)
    assert res.exit_code == 2, res.output
    assert why in res.output and "README.md" in res.output and "Traceback" not in res.output
    assert readme.read_text(encoding="utf-8") == text
    assert not (lab_out / R.REPORT_DIR).exists()


@pytest.mark.parametrize("question", [None, "extend"])
def test_lab_report_refuses_a_missing_readme_before_computing(lab_out, tmp_path, question):
    missing = tmp_path / "nothere.md"
    extra = () if question is None else ("--question", question)
    res = _report(lab_out, missing, *extra)
    assert res.exit_code == 2, res.output
    assert "nothere.md" in res.output and "does not exist" in res.output
    assert not (lab_out / R.REPORT_DIR).exists() and not missing.exists()


def test_lab_report_refuses_a_read_only_readme_before_computing(lab_out, tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\n{END}\n", encoding="utf-8")
    readme.chmod(0o444)
    access = os.access  # root may write a read-only file: answer as for anyone else

    def read_only(path: Any, mode: int, **kw: Any) -> bool:
        return False if Path(path) == readme and mode & os.W_OK else access(path, mode, **kw)

    monkeypatch.setattr(os, "access", read_only)
    res = _report(lab_out, readme)
    assert res.exit_code == 2 and "is not writable" in res.output, res.output
    assert not (lab_out / R.REPORT_DIR).exists()


def test_a_readme_check_names_a_bad_block_it_does_not_write(tmp_path):
    """With no question, every block the file holds must be well-formed (which one is written
    is known only once the rows are read)."""
    readme = tmp_path / "README.md"
    readme.write_text(f"{START}\n{END}\n<!-- lab:length -->\nmine\n", encoding="utf-8")
    problem = RD.readme_problem(readme)
    assert problem is not None and "<!-- lab:length --> on line 3 and no" in problem
    assert RD.readme_problem(readme, "extrapolation") is None


def test_a_well_formed_readme_block_is_replaced_and_the_rest_kept(lab_out, tmp_path):
    head, tail = "# intro\n\nmine, kept\n", "\n## after\n\nalso kept\n"
    readme = tmp_path / "README.md"
    readme.write_text(f"{head}{START}\nold table\n{END}{tail}", encoding="utf-8")
    res = _report(lab_out, readme)
    assert res.exit_code == 0, res.output
    new = readme.read_text(encoding="utf-8")
    block = new[len(head) + len(START) + 1 : new.index(END)]
    assert block == RD.readme_table(R.load_rows(lab_out))
    assert new == f"{head}{START}\n{block}{END}{tail}"
    assert re.match(r"\| encoding \|", block) and "old table" not in new


def test_an_extend_row_with_a_bad_nested_field_is_skipped_and_the_extend_report_runs(tmp_path):
    """``posenc lab extend``'s rows are checked the same way (their ``eval`` and the identity
    the table reads): one warning for the bad row, every good one in the table."""
    data = Path(__file__).resolve().parent / "data" / "lab_extend_rows.jsonl"
    extend = [json.loads(line) for line in data.read_text().splitlines()]
    bad = copy.deepcopy({**extend[1], "config_hash": "bad-extend"})
    bad["identity"]["train"]["lr"] = "fast"
    out = tmp_path / "out"
    out.mkdir()
    lines = [_line(r) for r in GOOD] + [_line(extend[0]), _line(bad)]
    lines += [_line(r) for r in extend[1:]]
    (out / RESULTS_FILE).write_bytes(b"".join(lines))
    rows, messages = _warnings_of(lambda: extend_rows(out))
    assert [r["config_hash"] for r in rows] == [r["config_hash"] for r in extend]
    assert messages == [
        f"{out / RESULTS_FILE}:{len(GOOD) + 2}: skipping a result row that cannot be read: "
        "identity.train.lr is 'fast', not a number"
    ]
    args = ["lab", "report", "--out", str(out), "--no-plots", "--question", "extend"]
    res, messages = _warnings_of(lambda: CliRunner().invoke(app, args))
    assert res.exit_code == 0 and "rope + YaRN" in res.output, res.output
    assert len(messages) == 1 and "Traceback" not in res.output


def test_a_grid_row_skipped_for_its_fields_says_how_to_run_its_cell_again(tmp_path):
    """Its key is stored, so a rerun counts the cell finished: the warning names --force."""
    bad, _ = _nested_bad_lines()["nested bits a string"]
    out = _store_with(tmp_path, bad)
    _, messages = _warnings_of(lambda: store_rows(out))
    assert messages[0].endswith("; its grid with --force none reruns it"), messages


# --- strict JSON: a non-finite float is stored null and read as NaN was -------------------------


def _no_constant(name: str) -> Any:
    raise AssertionError(f"a bare {name} in a results file (not JSON)")


def _non_finite_rows() -> list[dict[str, Any]]:
    """The good rows on two seeds (a paired table), with non-finite numbers where a diverged
    evaluation puts them: bits at one length (NaN, and +Infinity), a curve bin, a
    ``float`` leaf (``train.tokens_per_s_fast``)."""
    rows = []
    for seed in (0, 1):
        for r in GOOD:
            row = copy.deepcopy({**r, "seed": seed, "config_hash": f"{r['config_hash']}-{seed}"})
            results = row["eval"]["variants"]["base"]["results"]
            if row["encoding"] == "sinusoidal":
                results["128"]["bits"] = math.nan
                results["128"]["curve"]["bits"][3] = math.nan
            if row["encoding"] == "alibi" and seed == 1:
                results["128"]["bits"] = math.inf
                results["128"]["acc"] = math.nan
                row["train"]["tokens_per_s_fast"] = math.nan
            rows.append(row)
    return rows


def test_a_non_finite_float_is_stored_as_null_and_read_back_as_nan_was(tmp_path):
    rows = _non_finite_rows()
    new, old = tmp_path / "new", tmp_path / "old"
    store = ResultStore(new / RESULTS_FILE)
    for row in rows:
        assert store.append(row)
    # Before: the same rows as Python's json writes them by default (bare NaN, Infinity).
    old.mkdir()
    (old / RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "NaN" in (old / RESULTS_FILE).read_text()

    for line in (new / RESULTS_FILE).read_text().splitlines():
        json.loads(line, parse_constant=_no_constant)  # strict JSON: no NaN, no Infinity
    stored = [json.loads(line) for line in (new / RESULTS_FILE).read_text().splitlines()]
    results = stored[4]["eval"]["variants"]["base"]["results"]  # sinusoidal, seed 1
    assert results["128"]["bits"] is None and results["128"]["curve"]["bits"][3] is None

    got, want = load_rows(new), load_rows(old)
    # Read back, every NaN is NaN again (and +Infinity a non-finite NaN): the same rows.
    assert json.dumps(got) == json.dumps(want).replace("Infinity", "NaN")
    res = got[1]["eval"]["variants"]["base"]["results"]["128"]
    assert math.isnan(res["bits"]) and math.isnan(res["curve"]["bits"][3])
    assert math.isnan(got[5]["train"]["tokens_per_s_fast"])
    # A length that does not apply (no tokens) keeps its null bits as None.
    na = copy.deepcopy(GOOD[0])
    na["config_hash"] = "n/a"
    na["eval"]["variants"]["base"]["results"]["128"].update(
        bits=None, acc=None, tokens=0, curve=None, note="n/a: too long"
    )
    ResultStore(tmp_path / "na" / RESULTS_FILE).append(na)
    (read,) = load_rows(tmp_path / "na")
    assert read["eval"]["variants"]["base"]["results"]["128"]["bits"] is None

    # The same report: table, paired differences, CSV and the figure's data.
    assert "n/a" in R.results_markdown(got, "none")
    assert R.results_markdown(got, "none") == R.results_markdown(want, "none")
    assert R.paired_markdown(got, "none") == R.paired_markdown(want, "none")
    R.write_csv(got, tmp_path / "new.csv", "none")
    R.write_csv(want, tmp_path / "old.csv", "none")
    old_csv = (tmp_path / "old.csv").read_text()
    assert "inf" in old_csv
    assert (tmp_path / "new.csv").read_text() == old_csv.replace("inf", "nan")
    from posenc.plots.lab import lab_data

    np = pytest.importorskip("numpy")
    got_data, want_data = lab_data(got), lab_data(want)
    for a, b in zip(got_data["lines"], want_data["lines"], strict=True):
        np.testing.assert_equal(a, b)  # NaN where NaN was
    for a, b in zip(got_data["curves"]["lines"], want_data["curves"]["lines"], strict=True):
        np.testing.assert_equal(a, b)
