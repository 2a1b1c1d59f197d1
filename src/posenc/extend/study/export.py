"""``posenc extend export``: a study's chosen method written as a model folder that stock
transformers loads, for the model the study's rows were measured on (its ``run.json``).

The model is found on this machine by what the study recorded (:func:`~posenc.extend.model.
locate.locate`: its path where it still is, else the packaged model or cached model id it is), or
given with ``--model``; either way the model loaded must be the one the rows were measured on.
Before it writes, the export says what the rows measured of the method *inside* the trained
length, where a scaling stretches every position and can cost what the model as trained did well
(:func:`short_length_cost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from ...runs.rows import Keys, ListOf, OneOf, read_shaped_json


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _ppl_at(rows: Sequence[dict[str, Any]], label: str, n: int) -> float | None:
    got = [r["ppl"][str(n)] for r in rows
           if r["kind"] == "ppl" and r["method"] == label and str(n) in r["ppl"]]  # fmt: skip
    return _mean(got) if got else None


def short_length_cost(rows: Sequence[dict[str, Any]], label: str, trained: int) -> str:
    """One line: what ``rows`` measured of method ``label`` against the model as trained
    (``none``) at the shortest length the study has of both at or below ``trained``: the mean
    perplexity over documents and the task score (RULER's mean over tasks), or that nothing was
    measured there."""
    from ..measures.tasks import scores_by_length

    tasks = {m: scores_by_length([r for r in rows if r["kind"] == "task" and r["method"] == m])
             for m in (label, "none")}  # fmt: skip
    ppl_lengths = {int(n) for r in rows if r["kind"] == "ppl" for n in r["ppl"]}
    lengths = sorted(n for n in ppl_lengths | set(tasks[label]) if n <= trained)
    said = []
    for n in lengths:
        mine, base = _ppl_at(rows, label, n), _ppl_at(rows, "none", n)
        if mine is not None and base is not None:
            said.append(f"perplexity {mine:.2f} against {base:.2f} as trained "
                        f"({100 * (mine / base - 1):+.1f} %)")  # fmt: skip
        if n in tasks[label] and n in tasks["none"]:
            said.append(f"task score {100 * tasks[label][n]:.1f} % against "
                        f"{100 * tasks['none'][n]:.1f} % as trained")  # fmt: skip
        if said:
            return f"inside the trained length ({trained}), at {n} tokens {label} measured " + (
                "; ".join(said)
            )
    return (f"the study measured no length at or below the trained {trained} with both {label} "
            "and none: what it costs inside the trained length is unmeasured (a --lengths or "
            f"--task-lengths entry at or below {trained} measures it)")  # fmt: skip


def _study_rows(run: Path) -> list[dict[str, Any]]:
    from .run import study_rows

    return study_rows(run) if (run / "results.jsonl").is_file() else []


#: What ``export`` reads of a ``run.json`` (others are not looked at): checked, a stranger's file.
RUN_SPEC = Keys({
    "dtype": str, "model": Keys({}, rest=Any), "source": Keys({"path": str}, {"gguf": OneOf((str, None))}),
    "study": Keys({"lengths": ListOf(int), "passkey_lengths": ListOf(int)},
                  {"task_lengths": ListOf(int)}),
})  # fmt: skip
DTYPES = ("float32", "bfloat16", "float16")


def read_run_spec(path: Path) -> dict[str, Any]:
    """``path`` (a study's ``run.json``) read and checked: not JSON, a field missing or of the
    wrong type, a dtype or length that cannot be, each one line naming the file and the field."""
    spec = read_shaped_json(path, RUN_SPEC, "run.json", "`posenc extend` run file of this posenc")
    if spec["dtype"] not in DTYPES:
        raise ValueError(f"{path}: run.json.dtype is {spec['dtype']!r}, not one of "
                         f"{', '.join(DTYPES)}")  # fmt: skip
    study = spec["study"]
    for key in ("lengths", "passkey_lengths", "task_lengths"):
        bad = [n for n in study.get(key, []) if n < 1]
        if bad:
            raise ValueError(f"{path}: run.json.study.{key} holds {bad[0]}; a length is >= 1")
    return spec


def export_run(run: str, *, method: str, out: str, length: int, model: str | None = None) -> None:
    """Write ``method`` for ``length`` tokens (0: the study's longest) into the folder ``out``;
    every refusal (no study, another model, a folder in the way) before the model loads.
    ``model``: the study's model on this machine where its recorded path is not (checked)."""
    from ...cli_errors import check_can_write
    from ...hf.extension import EXTENSION_METHODS
    from ..methods.export import export_model
    from ..methods.names import parse_method
    from ..model.load import load_model, model_identity, resolve_source, trained_length
    from ..model.locate import locate
    from .folder import check_export

    path = Path(run) / "run.json"
    if not path.is_file():
        raise ValueError(f"{run!r} is no `posenc extend` folder (no run.json)")
    spec = read_run_spec(path)
    check_export(Path(run), spec)  # run.json names the model its rows were measured on
    chosen = parse_method(method)
    study = spec["study"]  # the target the rows were measured with: every kind of length
    every = study["lengths"] + study["passkey_lengths"] + study.get("task_lengths", [])
    if not length and not every:
        raise ValueError(f"{path} records no length its study measured; give --length")
    target = length or max(every)
    if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise ValueError(f"{out!r} exists and is not an empty folder; nothing was written")
    check_can_write(Path(out), "--out")  # under a file, a read-only disk: before the load
    if chosen.name in EXTENSION_METHODS:
        export_model(None, None, chosen, target, out)  # raises its refusal
    source = resolve_source(model) if model else locate(spec, Path(run))
    loaded, tokenizer = load_model(source, dtype=spec["dtype"])
    check_export(Path(run), spec, model_identity(source, loaded, spec["dtype"]))  # the same one
    if chosen.name != "none":
        typer.echo(short_length_cost(_study_rows(Path(run)), chosen.label,
                                     trained_length(loaded.config)))  # fmt: skip
    written = export_model(loaded, tokenizer, chosen, target, out)
    typer.echo(f"wrote {written} ({chosen.label} for {target} tokens); load it with "
               f"AutoModelForCausalLM.from_pretrained({str(written)!r})")  # fmt: skip
