"""A ``posenc extend`` results folder: one study per folder, written under its lock, with folders
and files that appear whole or not at all.

One study per folder: a study is its model (:func:`~posenc.extend.model.load.model_identity`: source,
type, sizes, dtype, config hash) and the settings every row is measured with (:data:`FIXED`:
lengths, bin size, the target length the methods' factors are set for, the passkey seed; and a
document's contents under its name). A run into a folder that holds another study, by its
``run.json`` or by its rows, is refused in one line naming what differs (:func:`check_study`),
before the model loads where the settings already differ, and before anything is written. A run
may add methods, documents and passkey lengths and depths to a study: each new row is measured
like the others. ``export`` checks that ``run.json`` names the model its rows were measured on,
and that the model it loads is still that model (:func:`check_export`).

Writes: ``run.json`` is written aside and renamed into place (:func:`write_run_file`); a model
folder is written into a uniquely named temporary folder beside it and renamed into place
(:func:`~posenc.runs.atomic.folder_written_aside`), so an interrupted export or PoSE save leaves no half folder that
blocks a rerun. :func:`study_lock` is the lab's folder lock with its refusal as one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ...runs.atomic import write_file_atomically
from ...runs.identity import config_diff, stable_hash
from ...runs.lock import FolderLocked, folder_lock
from ..model.locate import same_model
from .rows import KEYTOKENS, LONGPPL, PASSKEY, PPL, TASK, read_study_rows

RUN_FILE, RESULTS = "run.json", "results.jsonl"


@contextmanager
def study_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s folder lock (:func:`posenc.runs.lock.folder_lock`); a folder in use by
    another run is a ValueError (one line naming that run)."""
    try:
        with folder_lock(out, command="posenc extend"):
            yield
    except FolderLocked as e:
        raise ValueError(str(e)) from None


#: The settings every row of a study is measured with: a run into a folder that recorded other
#: values is another study. (Methods, documents, passkey lengths and depths are what a study has
#: rows of: a run may add to them, each new row measured like the others.)
FIXED = ("lengths", "bin_size", "target", "passkey_seed")
#: Fixed like :data:`FIXED` once a study has recorded them (a folder from before task cells
#: existed takes whatever a first task run sets): every task row's seed and sample count, and
#: how the LongPPL rows find their key tokens (evaluator, truncated context, window).
FIXED_ONCE_SET = ("task_seed", "task_samples", "task_questions", "longppl_evaluator",
                  "longppl_trunc", "longppl_window")  # fmt: skip
#: What a study has rows of: a run may add to these (each new row measured like the others).
GROWING = ("passkey_lengths", "passkey_depths", "tasks", "task_lengths", "task_depths")


def document_id(path: str) -> dict[str, Any]:
    """What names a document in a cell's identity: its name, size and a hash of its start."""
    p = Path(path)
    return {
        "name": p.name,
        "bytes": p.stat().st_size,
        "sha": stable_hash(p.read_bytes().hex()[:20000]),
    }


def study_settings(cfg: Any) -> dict[str, Any]:
    """What a :class:`~posenc.extend.study.config.StudyConfig` records of how its rows are measured:
    the :data:`FIXED` settings (``target``: the length the methods' factors are set for) and the
    documents (name, size, content hash) and passkey lengths and depths it has rows of."""
    return {
        "lengths": list(cfg.lengths),
        "bin_size": cfg.bin_size,
        "target": cfg.target,
        "passkey_seed": cfg.passkey_seed,
        "documents": [document_id(d) for d in cfg.documents],
        "passkey_lengths": list(cfg.passkey_lengths),
        "passkey_depths": list(cfg.passkey_depths),
        "tasks": list(cfg.tasks),
        "task_lengths": list(cfg.task_lengths),
        "task_depths": list(cfg.task_depths) if cfg.tasks else [],
        "task_seed": cfg.task_seed if cfg.tasks else None,
        "task_samples": cfg.task_samples if cfg.tasks else None,
        "task_questions": cfg.task_questions if cfg.tasks else None,
        "longppl_evaluator": cfg.evaluator if cfg.longppl else None,
        "longppl_trunc": cfg.longppl_trunc if cfg.longppl else None,
        "longppl_window": cfg.longppl_window if cfg.longppl else None,
    }


def _read_run(out: Path) -> dict[str, Any] | None:
    path = out / RUN_FILE
    if not path.is_file():
        return None
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is unreadable ({e}); use another --out") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path} is no posenc extend run file; use another --out")
    return spec


def _recorded_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The settings a ``run.json`` records; what one written before a setting was recorded lacks
    is derived from its ``study`` (documents by name only)."""
    study: dict[str, Any] = spec["study"] if isinstance(spec.get("study"), dict) else {}
    lengths, keys = list(study.get("lengths") or []), list(study.get("passkey_lengths") or [])
    every = lengths + keys + list(study.get("task_lengths") or [])
    derived = {
        "lengths": lengths,
        "bin_size": study.get("bin_size"),
        "target": max(every) if every else None,
        "passkey_seed": study.get("passkey_seed"),
        "documents": [{"name": Path(str(d)).name} for d in study.get("documents") or []],
        "passkey_lengths": keys,
        "passkey_depths": list(study.get("passkey_depths") or []),
    }
    recorded = spec.get("settings")
    return {**derived, **recorded} if isinstance(recorded, dict) else derived


def _merged(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``new`` with the documents and passkey lengths and depths of ``old`` it lacks (what the
    folder then has rows of), and how the two differ where they may not: a :data:`FIXED`
    setting, or a document of one name with other contents."""
    if old.get("task_questions") is None and old.get("task_samples") is not None:
        old = {**old, "task_questions": 1}  # recorded before it existed: one question each
    diff = config_diff({k: old.get(k) for k in FIXED}, {k: new[k] for k in FIXED})
    once = [k for k in FIXED_ONCE_SET if old.get(k) is not None and new[k] is not None]
    diff += config_diff({k: old[k] for k in once}, {k: new[k] for k in once})
    docs = {d.get("name"): d for d in old.get("documents") or [] if isinstance(d, dict)}
    for d in new["documents"]:
        was = docs.get(d["name"])
        if was is not None and "sha" in was and was != d:
            diff.append(
                f"document {d['name']}: other contents ({was.get('bytes')} -> {d['bytes']} bytes)"
            )
        docs[d["name"]] = d
    merged = dict(new)
    merged["documents"] = list(docs.values())
    for key in GROWING:
        merged[key] = (list(dict.fromkeys([*(old.get(key) or []), *new[key]])) if key == "tasks"
                       else sorted({*(old.get(key) or []), *new[key]}))  # fmt: skip
    for key in FIXED_ONCE_SET:
        merged[key] = new[key] if new[key] is not None else old.get(key)
    return merged, diff


def _row_differences(rows: list[dict[str, Any]], settings: dict[str, Any],
                     model: dict[str, Any] | None) -> list[str]:  # fmt: skip
    """How the rows differ from a study of ``settings`` (and ``model``, when known)."""
    lengths = {str(n) for n in settings["lengths"]}
    for r in rows:
        if model is not None and r["model"] != model:
            return [f"a row's {d}" for d in config_diff(r["model"], model, "model.")[:3]]
        if r["kind"] == PPL and (r["bin_size"] != settings["bin_size"] or set(r["ppl"]) != lengths):
            return [f"a row's bin size {r['bin_size']} and lengths {sorted(map(int, r['ppl']))}"]
        if r["kind"] in (PASSKEY, TASK) and r["length"] > settings["target"]:
            return [
                f"a row's {r['kind']} length {r['length']} (beyond the target {settings['target']})"
            ]
        if r["kind"] == TASK and (r["task_seed"], r["n"]) != (
            settings.get("task_seed", r["task_seed"]),
            settings.get("task_samples", r["n"]),
        ):
            return [f"a row's task seed {r['task_seed']} and samples {r['n']}"]
        if r["kind"] in (KEYTOKENS, LONGPPL) and _longppl_differs(r, settings, lengths):
            return [f"a {r['kind']} row's evaluator {r['evaluator']}, trunc_len {r['trunc_len']}, "
                    f"window {r['window']} or lengths"]  # fmt: skip
    return []


def _longppl_differs(row: dict[str, Any], settings: dict[str, Any], lengths: set[str]) -> bool:
    """A LongPPL row found its key tokens otherwise than the study's recorded settings, or (a
    ``longppl`` row) holds other lengths."""
    recorded = (settings.get("longppl_evaluator"), settings.get("longppl_trunc"),
                settings.get("longppl_window"))  # fmt: skip
    own = (row["evaluator"], row["trunc_len"], row["window"])
    return (None not in recorded and own != recorded) or (
        row["kind"] == LONGPPL and set(row["longppl"]) != lengths
    )


def check_study(out: Path, cfg: Any, model_id: dict[str, Any] | None = None) -> dict[str, Any]:
    """Refuse (ValueError, one line naming what differs) a study of ``cfg`` (and ``model_id``,
    when known) in a folder whose ``run.json`` or rows belong to another study: another model,
    or another :data:`FIXED` setting, or a document of the same name with other contents.
    Returns the settings to record (the folder's documents and passkey lengths and depths
    joined with ``cfg``'s). Reads only: a folder without a study passes."""
    settings = study_settings(cfg)
    diff: list[str] = []
    spec = _read_run(out)
    if spec is not None:
        settings, diff = _merged(_recorded_settings(spec), settings)
        if model_id is not None and not same_model(spec.get("model"), model_id):
            diff += config_diff(spec.get("model"), model_id, "model.")
    if not diff and (out / RESULTS).is_file():
        diff = _row_differences(read_study_rows(out / RESULTS), settings, model_id)
    if diff:
        raise ValueError(
            f"{out} holds another study (differs in: {'; '.join(diff[:4])}); one folder holds "
            "one study: use another --out, or the same model and settings to resume it"
        )
    return settings


def folder_identity(out: Path, model_id: dict[str, Any]) -> dict[str, Any]:
    """The identity ``out``'s study recorded for the model ``model_id`` names, where it names the
    same model from another path (:func:`~posenc.extend.model.locate.same_model`: the model
    moved, or the study is resumed on another machine), so its rows keep their keys; else
    ``model_id``."""
    spec = _read_run(out) if out.is_dir() else None
    recorded = spec.get("model") if spec is not None else None
    return recorded if isinstance(recorded, dict) and same_model(recorded, model_id) else model_id


def check_one_model(rows: list[dict[str, Any]], out: str | os.PathLike[str]) -> None:
    """Refuse (ValueError, one line) to read ``rows`` of more than one model as one study (a
    folder into which an older posenc wrote a second study): their table would mix them."""
    models: list[dict[str, Any]] = []
    for r in rows:
        if r["model"] not in models:
            models.append(r["model"])
    if len(models) > 1:
        diff = "; ".join(config_diff(models[0], models[1], "model.")[:3])
        raise ValueError(
            f"{out} holds the rows of {len(models)} models (differs in: {diff}), as an older "
            "posenc wrote a second study into one folder; one table is one model's: run each "
            "study into its own --out"
        )


def check_finetune_folder(out: Path, model_folder: Path) -> None:
    """Refuse a PoSE fine-tune into a folder that holds a study of another model than the
    fine-tune's own (``model_folder``), before any step is trained."""
    spec = _read_run(out)
    source = (spec or {}).get("source")
    path = source.get("path") if isinstance(source, dict) else None
    if spec is not None and path != str(model_folder.resolve()):
        raise ValueError(
            f"{out} holds a study of another model ({path}), not of the PoSE fine-tune "
            f"{model_folder}; one folder holds one study: use another --out"
        )


def write_run_file(out: Path, record: dict[str, Any]) -> None:
    """``out/run.json`` written aside and renamed into place."""
    write_file_atomically(out / RUN_FILE, json.dumps(record, indent=1) + "\n")


def check_export(run: Path, spec: dict[str, Any], model_id: dict[str, Any] | None = None) -> None:
    """Refuse (ValueError, one line) an export from ``run`` whose ``run.json`` (``spec``) names
    another model than its rows were measured on, or (``model_id``: the model as loaded now) a
    model changed since the study."""
    model = spec.get("model")
    rows = read_study_rows(run / RESULTS) if (run / RESULTS).is_file() else []
    for r in rows:
        if r["model"] != model:
            diff = "; ".join(config_diff(model, r["model"], "model.")[:3])
            raise ValueError(
                f"{run / RUN_FILE} names another model than its rows were measured on ({diff}); "
                "export from the folder of that study, or run the study again into a new --out"
            )
    if model_id is not None and not same_model(model_id, model):
        diff = "; ".join(config_diff(model, model_id, "model.")[:3])
        raise ValueError(
            f"the model of {run} has changed since the study ({diff}); nothing was written: "
            "export the model the study measured, or run the study again into a new --out"
        )
