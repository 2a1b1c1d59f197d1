"""A study through lm-evaluation-harness: posenc's tasks written as an lm-eval task folder
(``posenc extend lm-eval-tasks``), and lm-eval's output folder read back as study rows, so
``report``, ``summary`` and ``compare`` read a run made anywhere, with any back-end.

The task folder (:func:`write_task_folder`) holds one YAML per task (``posenc_<task>``, tagged
``posenc_ruler``) and ``posenc_tasks.py``, whose ``custom_dataset`` functions build the samples
with posenc's generators at evaluation time (:mod:`posenc.lmeval.taskdir`): the same prompts as
``posenc extend --tasks`` with the same seed, scored as it scores them, one metric per length.

An lm-eval output folder (``--output_path`` with ``--log_samples``: ``results_<date>.json`` and
``samples_<task>_<date>.jsonl`` per run, in a folder named after the model) is read by
:func:`lmeval_rows`: each run's posenc tasks, one ``task`` row per (task, length, depth) as
``posenc extend --tasks`` writes it: the method from the run's ``--model_args`` (``method=``,
the posenc model's; ``none`` for any other model), the model as the task folder recorded it
(:func:`model_record`) with lm-eval's parameter count and dtype, per sample the output, the score
(posenc's rule again, checked against lm-eval's), the references and the digest of the ids the
back-end read. What lm-eval does not record is marked so: ``target_logprobs`` null,
``new_tokens`` -1, ``seconds`` the run's wall time shared by sample. A line or a file that is not
what lm-eval writes is one warning naming it (skipped) or one error line.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from ...runs.identity import stable_hash
from ...runs.rows import Keys, ListOf, read_shaped_json, shape_problem

TAG, MODULE = "posenc_ruler", "posenc_tasks"
_RESULTS = re.compile(r"^results_(.+)\.json$")


def lmeval_name(task: str) -> str:
    """The lm-eval task name of posenc's ``task``: ``posenc_niah_single_1``."""
    return f"posenc_{task}"


def model_reference(model: str, gguf: str | None) -> tuple[str, str | None]:
    """``--model`` as the task folder records it: a packaged name or cached model id as given
    (it resolves on any machine that has it), a folder or file as its absolute path."""
    from ..model.packaged import PACKAGED

    path = Path(model).expanduser()
    if model.lower() in PACKAGED and not path.exists():
        return model.lower(), None
    return (str(path.resolve()) if path.exists() else model), gguf


def model_record(model: str, gguf: str | None) -> dict[str, Any]:
    """What names the model in the rows read back (:func:`~posenc.extend.model.load.
    model_identity`'s fields from the configuration alone; lm-eval's run adds the parameters
    and dtype)."""
    import hashlib

    from transformers.models.auto.configuration_auto import AutoConfig

    from ..model.load import config_fields, trained_length
    from ..model.locate import model_source

    source = model_source(model, gguf)
    kw: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    config = AutoConfig.from_pretrained(source.path, **kw, **(
        {"gguf_file": source.gguf} if source.gguf else {}))  # fmt: skip
    blob = json.dumps(config_fields(config), sort_keys=True, default=str)
    file = Path(source.path) / source.gguf if source.gguf else None
    return {"source": source.describe(), "gguf": source.gguf,
            "file_bytes": file.stat().st_size if file is not None else None,
            "model_type": config.model_type, "trained_length": trained_length(config),
            "config_hash": hashlib.sha256(blob.encode()).hexdigest()[:12]}  # fmt: skip


def _yaml(task: str, max_new: int, lengths: tuple[int, ...], meta: dict[str, Any]) -> str:
    """One task's YAML (JSON values are YAML; ``!function`` names the folder's module)."""
    from ...lmeval.taskdir import metric_name

    metrics = "".join(f"  - metric: {metric_name(n)}\n    aggregation: mean\n"
                      "    higher_is_better: true\n" for n in lengths)  # fmt: skip
    meta_text = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in meta.items())
    return (
        f"# posenc's {task}, written by `posenc extend lm-eval-tasks`: offline, RULER's scoring\n"
        f'tag:\n  - {TAG}\ntask: {lmeval_name(task)}\ndataset_path: ""\ndataset_name: ""\n'
        f"output_type: generate_until\ntest_split: test\n"
        f"custom_dataset: !function {MODULE}.{task}\n"
        'doc_to_text: prompt\ndoc_to_target: target\ntarget_delimiter: ""\n'
        f"process_results: !function {MODULE}.process_results\nmetric_list:\n{metrics}"
        # greedy as posenc answers; the back-end stops at its end-of-sequence token, as posenc
        f"generation_kwargs:\n  until: []\n  do_sample: false\n  temperature: 0.0\n"
        f"  max_gen_toks: {max_new}\nrepeats: 1\nnum_fewshot: 0\n"
        f"metadata:\n  version: 1.0\n{meta_text}"
    )


def _module(tasks: tuple[str, ...]) -> str:
    fns = "".join(f"\n\ndef {t}(**metadata):\n    return dataset({t!r}, **metadata)\n"
                  for t in tasks)  # fmt: skip
    return (
        '"""posenc\'s offline tasks for lm-eval (`posenc extend lm-eval-tasks`): each '
        "custom_dataset builds its samples\nwith posenc's generators; process_results "
        'scores as posenc does."""\n\n'
        "from posenc.lmeval.taskdir import dataset, process_results  # noqa: F401\n" + fns
    )


def write_task_folder(out: str, *, model: str, gguf: str | None, tasks: str, lengths: str,
                      samples: int, seed: int, depths: str) -> dict[str, Any]:  # fmt: skip
    """Write the lm-eval task folder ``out`` (new or empty) for ``model``'s tokenizer; every
    sample is built once first (a length too short for a task is one line, nothing written).
    Returns ``{"prompts": ..., "exact": ..., "other": ...}``: how many prompts, how many of them
    encode back to posenc's ids from their text, and per task where some do not, ``(how many,
    of how many, fewest tokens, most tokens)`` of those."""
    from ...cli_errors import check_can_write
    from ...lmeval.taskdir import docs, tokenizer_of
    from ...runs.atomic import folder_written_aside
    from ..measures.tasks import get_task
    from .config import parse_lengths
    from .options import _depths, parse_tasks

    names, lens = parse_tasks(tasks), parse_lengths(lengths, "--lengths")
    where = _depths(depths, "--depths")
    if not names or not lens or not where:
        raise ValueError("give --tasks, --lengths and --depths (each at least one)")
    target = Path(out)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ValueError(f"{out!r} exists and is not an empty folder; nothing was written")
    check_can_write(target, "DIR")
    ref, ref_gguf = model_reference(model, gguf)
    tok = tokenizer_of(ref, ref_gguf)
    meta = {"posenc_tasks": list(names), "posenc_model": ref, "posenc_gguf": ref_gguf, "posenc_lengths": list(lens),
            "posenc_depths": list(where), "posenc_samples": samples, "posenc_seed": seed,
            "posenc_identity": model_record(ref, ref_gguf)}  # fmt: skip
    built = {t: docs(tok, t, list(lens), list(where), samples, seed) for t in names}
    with folder_written_aside(target) as tmp:
        (tmp / f"{MODULE}.py").write_text(_module(names))
        for t in names:
            text = _yaml(t, get_task(t).max_new_tokens, lens, meta)
            (tmp / f"{lmeval_name(t)}.yaml").write_text(text)
    every = [d for ds in built.values() for d in ds]
    other = {t: [d for d in ds if d["digest"] != d["text_digest"]] for t, ds in built.items()}
    return {"prompts": len(every), "exact": sum(d["digest"] == d["text_digest"] for d in every),
            "other": {t: (len(o), len(built[t]), min(d["text_tokens"] for d in o),
                          max(d["text_tokens"] for d in o)) for t, o in other.items() if o}}  # fmt: skip


# --- an lm-eval output folder read back ----------------------------------------------------------

#: What is read of a ``results_<date>.json`` (the rest is not looked at).
RESULTS_SHAPE = Keys({"configs": Keys({}, rest=Any), "config": Keys({}, rest=Any)},
                     {"lm_eval_version": Any, "transformers_version": Any,
                      "total_evaluation_time_seconds": Any})  # fmt: skip
#: What is read of one logged sample of a posenc task.
SAMPLE_SHAPE = Keys({"doc": Keys({
    "task": str, "length": int, "depth": float, "seed": int, "index": int,
    "references": ListOf(str), "digest": str, "text_digest": str, "text_tokens": int}),
    "filtered_resps": ListOf(str)}, rest=Any)  # fmt: skip
META_SHAPE = Keys({"posenc_lengths": ListOf(int), "posenc_samples": int, "posenc_seed": int,
                   "posenc_identity": Keys({"source": str, "model_type": str,
                                            "trained_length": int, "config_hash": str})},
                  {"posenc_tasks": ListOf(str)}, rest=Any)  # fmt: skip


def is_lmeval_folder(folder: Path) -> bool:
    """``folder`` holds lm-eval output (a ``results_<date>.json`` in it or one level down)."""
    return any(_RESULTS.match(p.name) for p in (*folder.glob("*.json"), *folder.glob("*/*.json")))


def method_of(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The method label of an lm-eval run (its ``config``): the posenc model's ``method=``, else
    ``none`` (any other model: the model as trained); and what the row's settings record."""
    from ..methods.names import parse_method

    args = config.get("model_args") or {}
    if isinstance(args, str):
        args = dict(p.split("=", 1) for p in args.split(",") if "=" in p)
    text = args.get("method") if isinstance(args, dict) else None
    label = parse_method(str(text)).label if text else "none"
    return label, {"lm_eval_model": str(config.get("model")), "model_args": args}


def _dtype(config: dict[str, Any]) -> str:
    text = str(config.get("model_dtype") or "").removeprefix("torch.")
    return text or "unknown"


def _answers(path: Path, task: str) -> dict[tuple[int, Any], list[tuple[int, dict[str, Any]]]]:
    """The logged samples of ``path`` (lm-eval's ``samples_<task>_<date>.jsonl``) by (length,
    depth): ``(line, doc with its "output" and "score")``; a line that is not a sample of
    posenc's ``task`` skipped with one warning naming the file and the line."""
    from ...lmeval.taskdir import NO_DEPTH, metric_name, score
    from ..measures.tasks import TASKS, postprocess

    cells: dict[tuple[int, Any], list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
        except (ValueError, RecursionError) as e:
            warnings.warn(f"{path}:{i}: skipping a line that is not JSON ({e})", stacklevel=3)
            continue
        problem = shape_problem(sample, SAMPLE_SHAPE, "sample")
        if problem is None and (sample["doc"]["task"] != task or task not in TASKS):
            problem = f"sample.doc.task is {sample['doc']['task']!r}, no posenc task {task!r}"
        if problem is None and not sample["filtered_resps"]:
            problem = "sample.filtered_resps is empty: no answer"
        if problem is not None:
            warnings.warn(f"{path}:{i}: skipping a sample lm-eval did not write: {problem}",
                          stacklevel=3)  # fmt: skip
            continue
        doc = sample["doc"]
        own = score(doc, sample["filtered_resps"][0])
        logged = sample.get(metric_name(doc["length"]))
        if isinstance(logged, int | float) and abs(float(logged) - own) > 1e-9:
            warnings.warn(f"{path}:{i}: lm-eval logged the score {logged}, posenc's rule gives "
                          f"{own}: posenc's is read", stacklevel=3)  # fmt: skip
        depth = None if doc["depth"] == NO_DEPTH else doc["depth"]
        output = postprocess(sample["filtered_resps"][0])  # as posenc's rows hold it
        cells[(doc["length"], depth)].append((i, {**doc, "output": output, "score": own}))
    return cells


def _cell_rows(path: Path, task: str, meta: dict[str, Any],
               run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """One run's samples of one posenc task (the file ``path``) as task rows by cell."""
    from ..measures.tasks import get_task, summarize

    cells = _answers(path, task)
    label, settings = method_of(run["config"])
    model = {
        **meta["posenc_identity"],
        "dtype": _dtype(run["config"]),
        "parameters": int(run["config"].get("model_num_parameters") or 0),
    }
    versions = {k: str(run.get(f"{k}_version")) for k in ("lm_eval", "transformers")}
    out = []
    for (length, depth), got in sorted(cells.items(), key=lambda c: (c[0][0], c[0][1] or 0)):
        got.sort(key=lambda x: x[1]["index"])
        docs = [d for _, d in got]
        if any(d["text_digest"] != d["digest"] for d in docs):
            warnings.warn(f"{path}:{got[0][0]}: {task} at {length}: the back-end read other ids "
                          "than posenc built (the text encodes to other tokens): these samples "
                          "pair with no `posenc extend` row", stacklevel=2)  # fmt: skip
        s = summarize([d["score"] for d in docs])
        ident = {"lm_eval": str(path.name), "task": task, "length": length, "depth": depth,
                 "method": label, "settings": settings}  # fmt: skip
        out.append((f"{path}:{got[0][0]}", {
            "encoding": label, "seed": 0, "config_hash": stable_hash(ident), "kind": "task",
            "method": label, "settings": settings, "model": model, "task": task,
            "length": length, "depth": depth, "task_seed": docs[0]["seed"], "n": len(docs),
            "metric": get_task(task).metric_name, "score": s.mean, "low": s.low,
            "high": s.high, "scores": [d["score"] for d in docs],
            "outputs": [d["output"] for d in docs], "references": [d["references"] for d in docs],
            "target_logprobs": [None] * len(docs), "new_tokens": [-1] * len(docs),
            # the ids the back-end read from the text: posenc's where the text encodes back to them
            "digests": [d["text_digest"] for d in docs],
            "posenc_digests": [d["digest"] for d in docs],
            "seconds": 0.0, "versions": versions, "threads": 0,
        }))  # fmt: skip
    return out


def _read_json(path: Path, shape: Keys) -> dict[str, Any]:
    return dict(read_shaped_json(path, shape, "results", "lm-eval 0.4 results file"))


def lmeval_rows(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(where, row)`` of every posenc task cell in the lm-eval output ``folder`` (see the
    module), each run's in turn; a run without ``--log_samples`` is one line saying so."""
    from ..measures.tasks import task_names

    found = sorted(p for p in (*folder.glob("*.json"), *folder.glob("*/*.json"))
                   if _RESULTS.match(p.name))  # fmt: skip
    out: list[tuple[str, dict[str, Any]]] = []
    configs: list[tuple[str, dict[str, Any]]] = []
    for path in found:
        run = _read_json(path, RESULTS_SHAPE)
        date = _RESULTS.match(path.name).group(1)  # type: ignore[union-attr]
        posenc = {name: cfg for name, cfg in run["configs"].items() if isinstance(cfg, dict)
                  and "posenc_identity" in (cfg.get("metadata") or {})}  # fmt: skip
        mine: list[tuple[str, dict[str, Any]]] = []
        configs += posenc.items()
        for name, cfg in posenc.items():
            meta = cfg["metadata"]
            problem = shape_problem(meta, META_SHAPE, f"configs.{name}.metadata")
            if problem is not None:
                raise ValueError(f"{path}: {problem}; write the task folder again")
            samples = path.parent / f"samples_{name}_{date}.jsonl"
            if not samples.is_file():
                raise ValueError(f"{path} has no {samples.name} beside it: run lm_eval with "
                                 "--log_samples (posenc reads every answer, not the means)")  # fmt: skip
            mine += _cell_rows(samples, name.removeprefix("posenc_"), meta, run)
        # lm-eval times the run, not a task: its wall time shared out by sample
        seconds = float(str(run.get("total_evaluation_time_seconds") or 0) or 0)
        every = max(1, sum(r["n"] for _, r in mine))
        out += [(w, {**r, "seconds": round(seconds * r["n"] / every, 3)}) for w, r in mine]
    # the order a study writes its rows (length, then task as asked, then depth; each run's
    # method in turn), whatever order lm-eval listed its tasks in (by name); a stable sort
    asked = [t for _, c in configs for t in c["metadata"].get("posenc_tasks") or []]
    order = {t: i for i, t in enumerate(dict.fromkeys(asked + list(task_names())))}
    return sorted(out, key=lambda x: (x[1]["length"], order.get(x[1]["task"], len(order)),
                                      -1.0 if x[1]["depth"] is None else x[1]["depth"]))  # fmt: skip


def read_lmeval_rows(folder: Path) -> list[dict[str, Any]]:
    """The study rows of the lm-eval output ``folder`` (:func:`lmeval_rows`), read by the one
    reader's checks (:func:`~posenc.extend.study.rows.checked_rows`)."""
    from .rows import checked_rows

    return checked_rows(lmeval_rows(folder))


def lm_eval_tasks(out: str, **options: Any) -> None:
    """``posenc extend lm-eval-tasks DIR``: the folder written, and what to type next."""
    import typer

    got = write_task_folder(out, **options)
    typer.echo(f"wrote {out}: {got['prompts']} prompts, {got['exact']} of them encode back to "
               "posenc's ids from their text")  # fmt: skip
    for task, (n, total, low, high) in got["other"].items():
        # where decoding and encoding again disagree (pieces posenc encoded apart merge)
        typer.echo(f"note: {n} of {total} {task} prompts encode to other ids from their text "
                   f"({low}-{high} tokens): a back-end that reads text reads other prompts "
                   "than posenc's, which pair with no `posenc extend` row (docs/lm-eval.md)",
                   err=True)  # fmt: skip
    typer.echo(f"run them: lm_eval --include_path {out} --tasks {TAG} --log_samples "
               "--output_path OUT --model ...; read them: posenc extend report OUT")  # fmt: skip
