"""``posenc extend MODEL``, the whole run: the options checked, the model loaded, every method
resolved and applied once, the memory of the longest forward checked, an optional fine-tune,
then the dry run's plan or the study and its tables."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from ..methods.finetune import FinetuneConfig
    from ..model.load import ModelSource

from .options import check_finetune, check_options, length_options, study_config


def model_source(model: str, gguf: str | None) -> Any:
    from ..model.locate import model_source as source

    return source(model, gguf)


def _say_identities(resolved: list[Any], cfg: Any) -> None:
    """A scaling set for a target within the trained length has factor 1: its cells repeat the
    model as trained's, which a user asking for it should hear before paying for them."""
    same = [r.label for r in resolved if r.identity]
    if same:
        typer.echo(f"note: {', '.join(same)} at {cfg.target} tokens, within the model's trained "
                   f"length, {'has' if len(same) == 1 else 'have'} factor 1: the model as trained "
                   f"(none); set a longer target with --lengths, --task-lengths or --passkey-lengths to measure "
                   f"{'it' if len(same) == 1 else 'them'}", err=True)  # fmt: skip


def _config(model: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """The study's configuration and the model's source, every option checked before the model
    loads (the default ``--lengths`` read from the model's configuration alone)."""
    from ..model.load import peek_trained_length

    if options["lengths"] is not None:  # the options' own mistakes first, then the model's
        cfg, trained = study_config(options), None
        source = model_source(model, options["gguf"])
    else:
        source = model_source(model, options["gguf"])
        trained = peek_trained_length(source)
        cfg = study_config(options, trained)
    check_options(options)
    check_finetune(options, cfg)
    if trained is not None:
        typer.echo(f"--lengths {','.join(map(str, cfg.lengths))} (the default: 1/4, 1/2, 1 and "
                   f"1.5 times the trained length {trained})", err=True)  # fmt: skip
    return cfg, source


def _memory(loaded: Any, cfg: Any, todo: list[Any]) -> tuple[Any, int, int]:
    """The model's shape, and the memory the longest forward needs and the device has; refused
    in one line naming the option that asked for that length where it does not fit."""
    from .estimate import available_bytes, forward_bytes, loaded_bytes, model_shape

    shape = model_shape(loaded)
    big = max(todo, key=lambda c: forward_bytes(shape, c.length, c.method.name))
    need = loaded_bytes(loaded) + forward_bytes(shape, big.length, big.method.name)
    have = available_bytes(next(loaded.parameters()).device)
    if need > have:
        raise ValueError(
            f"one forward of {big.length} tokens needs about {need / 2**30:.1f} GiB and "
            f"{have / 2**30:.1f} GiB is available: lower {length_options(cfg, big.length)} "
            f"or use a larger device"
        )
    return shape, need, have


def run(model: str, options: dict[str, Any]) -> None:
    """``posenc extend MODEL``: the checks, the model, then the dry run's plan or the study."""
    import torch

    from ..model.load import load_model, model_identity
    from .config import cells
    from .dry_run import plan_text
    from .folder import check_study, folder_identity
    from .run import check_methods, check_no_links, check_texts, pending_cells

    cfg, source = _config(model, options)
    if options["threads"]:
        torch.set_num_threads(options["threads"])
    out = Path(options["out"])
    if out.is_dir():
        check_no_links(out)  # rows appended to a file outside the folder: refused first
    check_study(out, cfg)  # a folder of another study: refused before the load
    loaded, tokenizer = load_model(
        source, dtype=options["dtype"], device=options["device"], device_map=options["device_map"]
    )
    from ..methods.layer_plan import describe_method

    plans: list[str] = []

    def plan_of(r: Any) -> None:  # what the method does per layer type, read while applied
        plans.append(describe_method(loaded, r, getattr(loaded.posenc_patch, "layers", ())
                                     if hasattr(loaded, "posenc_patch") else ()))  # fmt: skip

    _say_identities(check_methods(loaded, cfg, plan_of), cfg)  # every method resolves, applies
    todo = cells(cfg)
    if not todo:  # e.g. --documents 0 with --passkey-methods naming none
        raise ValueError("the study has no cell to run: ask --tasks, --passkey-lengths (with a "
                         "method in --passkey-methods) or --documents 1 or more")  # fmt: skip
    shape, need, have = _memory(loaded, cfg, todo)
    check_texts(tokenizer, cfg, loaded)  # the texts fit, in its tokens, positions and vocabulary
    if options["finetune"]:
        loaded, tokenizer, source = _finetune(loaded, tokenizer, source, cfg, options, out)
    if not (options["finetune"] and options["dry_run"]):  # (no fine-tuned model to name yet)
        # the dry run refuses what the run would: a folder that holds another model's study
        model_id = folder_identity(out, model_identity(source, loaded, options["dtype"]))
        check_study(out, cfg, model_id)
    left = pending_cells(loaded, source, cfg, out, options["dtype"])
    plan = plan_text(loaded, shape, cfg, left, need, have, done=len(todo) - len(left))
    if options["dry_run"]:
        for line in plans:  # per layer type, what each method does
            typer.echo(f"  {line}")
        typer.echo(f"{plan}. Nothing was run.")
        return
    typer.echo(f"plan: {plan}; Ctrl-C stops it, and the same command resumes it.")
    _study(loaded, tokenizer, source, cfg, out, options["dtype"], len(left))


def _study(loaded: Any, tokenizer: Any, source: Any, cfg: Any, out: Path, dtype: str,
           left: int) -> None:  # fmt: skip
    """The study's cells, then its tables; Ctrl-C says where it stopped and how to resume."""
    from ..reports.commands import print_tables
    from .run import run_study, study_rows

    start, written = time.perf_counter(), [0]
    try:
        run_study(loaded, tokenizer, source, cfg, out, dtype=dtype,
                  on_row=lambda row: written.__setitem__(0, written[0] + 1))  # fmt: skip
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {written[0]} of the {left} cells left were written to "
                   f"{out / 'results.jsonl'}; run the same command again to resume it "
                   "(finished cells are kept, the rest run)", err=True)  # fmt: skip
        raise typer.Exit(130) from None
    print_tables(study_rows(out), f"posenc extend: {source.describe()}")
    typer.echo(f"rows in {out / 'results.jsonl'}; {time.perf_counter() - start:.0f} s")


def _finetune(
    model: Any, tokenizer: Any, source: Any, cfg: Any, options: dict[str, Any], out: Path
) -> Any:
    """``--finetune pose``: train (resumable), write the folder, and return it loaded with its
    source, so the study then measures the fine-tuned model (``none``: with its scaling)."""
    from ..measures.perplexity import default_documents
    from ..methods.finetune import FinetuneConfig, training_bytes
    from ..model.load import load_model, resolve_source
    from .estimate import available_bytes

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


def pose_model(
    model: Any,
    tokenizer: Any,
    source: ModelSource,
    documents: list[Path],
    cfg: FinetuneConfig,
    out: Path,
    *,
    dtype: str,
) -> tuple[Path, dict[str, Any]]:
    """``posenc extend --finetune pose`` into the study folder ``out``: under its lock, refused
    where ``out`` holds a study of another model, :func:`finetune` (resumed from
    ``out/pose/checkpoint.pt``), then ``out/pose-model`` written aside and renamed into place
    unless a whole one is there. Returns the model folder and :func:`finetune`'s result."""
    from ...hf import remove_posenc
    from ...runs.atomic import remove_partials
    from ..methods.export import export_model
    from ..methods.finetune import finetune
    from ..methods.names import parse_method
    from ..model.load import model_identity
    from .folder import check_finetune_folder, study_lock

    folder = out / "pose-model"
    with study_lock(out):
        check_finetune_folder(out, folder)
        model_id = model_identity(source, model, dtype)
        result = finetune(model, tokenizer, documents, cfg, out / "pose", model_id=model_id)
        remove_posenc(model)
        remove_partials(folder)  # what a killed save left (no other run writes: the lock is held)
        if not folder.exists():
            export_model(model, tokenizer, parse_method(cfg.method), cfg.target_len, folder)
    return folder, result
