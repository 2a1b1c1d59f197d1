"""``posenc lab``: run the train-short-test-long grid (bare ``posenc lab`` runs the default one),
and ``posenc lab report``: print the table and write the plots and CSV.

Thin on purpose: options become a :class:`~posenc.lab.presets.LabConfig` and
:class:`~posenc.lab.experiment.RunOptions`; the work is in the library functions. Heavy imports
happen inside the commands so ``posenc --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

import typer

from . import DEFAULT_RUN_TIME

lab_app = typer.Typer(
    help=(
        "Train short, test long: every encoding trained at length L on real text (the Python "
        "standard library's source, as bytes) and measured at L, 2L, 4L, 8L, with "
        "inference-time RoPE rescaling. Bare `posenc lab` runs the default grid "
        f"({DEFAULT_RUN_TIME})."
    ),
    invoke_without_command=True,
    no_args_is_help=False,
)


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _fail(msg: str, code: int = 2) -> None:
    from ..cli_errors import fail

    fail(msg, code)


@dataclass(frozen=True)
class Overrides:
    """What ``posenc lab``'s options change in a preset, by name; None keeps the preset's value.

    ``encodings``, ``eval_lens`` and ``rope_scalings`` are comma-separated (``rope_scalings``
    ``"none"``: no rescaling); ``text``, ``dataset`` and ``task`` pick the data (at most one);
    ``seeds`` seeds from ``seed`` on (None: the preset's number of seeds).
    """

    encodings: str | None = None
    train_len: int | None = None
    eval_lens: str | None = None
    seeds: int | None = None
    seed: int = 0
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    dim: int | None = None
    layers: int | None = None
    heads: int | None = None
    eval_tokens: int | None = None
    sliding: int | None = None
    rope_scalings: str | None = None
    text: str | None = None
    dataset: str | None = None
    task: str | None = None
    include_tests: bool | None = None
    ckpt_every: int | None = None
    compile_model: bool | None = None


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def build_config(preset: str, over: Overrides | None = None) -> Any:
    """The preset named ``preset`` (a :class:`~posenc.lab.presets.LabConfig`) with ``over``'s
    fields replaced."""
    from .presets import preset as get_preset

    over = over or Overrides()
    cfg = get_preset(preset)
    seeds = over.seeds if over.seeds is not None else len(cfg.seeds)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    train = replace(cfg.train, **_given(steps=over.steps, batch_size=over.batch_size, lr=over.lr))
    if train.warmup_steps >= train.steps:
        train = replace(train, warmup_steps=max(1, train.steps // 10))
    return replace(
        cfg,
        encodings=tuple(map(_label, _csv(over.encodings) or cfg.encodings)),
        seeds=tuple(range(over.seed, over.seed + seeds)),
        model=_model_shape(cfg.model, over),
        train=train,
        data=_data_config(cfg.data, over),
        eval=_eval_config(cfg.eval, over),
        **_given(train_len=over.train_len, ckpt_every=over.ckpt_every, compile=over.compile_model),
    )


def _label(label: str) -> str:
    """``"ALiBi:eps=1"`` -> ``"alibi:eps=1"``: registry names are case-insensitive, while a label
    keys the preset's options, the results and the checkpoints, so one spelling is kept."""
    name, sep, rest = label.partition(":")
    return name.strip().lower() + sep + rest


def _model_shape(model: Any, over: Overrides) -> Any:
    sizes = {"dim": over.dim, "num_layers": over.layers, "num_heads": over.heads}
    return replace(model, **_given(**sizes))


def _data_config(data: Any, over: Overrides) -> Any:
    sources = [s for s, v in (("text", over.text), ("hf", over.dataset), ("task", over.task)) if v]
    if len(sources) > 1:
        raise ValueError("pass at most one of --text, --dataset, --task")
    if sources:
        data = replace(
            data, source=sources[0], path=over.text, dataset=over.dataset, task=over.task
        )
    return replace(data, **_given(include_tests=over.include_tests))


def _eval_config(ev: Any, over: Overrides) -> Any:
    lens = _csv(over.eval_lens)
    if lens is not None:
        ev = replace(ev, lengths=tuple(int(v) if v.isdigit() else v for v in lens))
    ev = replace(ev, **_given(tokens=over.eval_tokens, stride=over.sliding))
    scal = _csv(over.rope_scalings)
    if scal is not None:
        ev = replace(ev, rope_scalings=() if scal == ["none"] else tuple(scal))
    return ev


def _preset_default(get: Callable[[Any], Any], none: str = "none") -> str:
    """Each preset's value of an option, for ``--help``: ``"cpu-small 500, cpu 2000, ..."``, or
    the one value when every preset has it; ``none`` says what None means."""
    from .presets import PRESETS

    def show(v: Any) -> str:
        if v is None:
            return none
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, tuple):
            return ",".join(map(str, v)) or "none"
        return str(v)

    values = {name: show(get(cfg)) for name, cfg in PRESETS.items()}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return ", ".join(f"{name} {v}" for name, v in values.items())


def _opt(
    default: Any,
    *names: str,
    get: Callable[[Any], Any] | None = None,
    none: str = "none",
    **kw: Any,
) -> Any:
    """A typer option; ``get`` reads its preset's value, shown as the default in ``--help``."""
    if get is not None:
        kw["show_default"] = _preset_default(get, none)
    return typer.Option(default, *names, **kw)


_ENCODINGS = _opt(
    "default",
    "--encodings",
    "-e",
    help="Comma-separated names from `posenc list` (name:key=value sets an option), "
    "'default' (the standard set that is registered), 'length' (training-time length "
    "methods, CoPE, Llama-4 NoPE layers and temperature) or 'all'.",
)
_PRESET = _opt("cpu-small", "--preset", "-p", help="cpu-small, cpu, gpu or gpu-small.")
_TRAIN_LEN = _opt(
    None, "--train-len", "-L", min=2, help="Train length L.", get=lambda c: c.train_len
)
_EVAL_LENS = _opt(
    None,
    "--eval-lens",
    help="Comma-separated eval lengths: tokens (256) or multiples (4x).",
    get=lambda c: c.eval.lengths,
)
_SEEDS = _opt(
    None,
    "--seeds",
    min=1,
    help="Number of seeds per encoding (the report gives mean and 95% interval).",
    get=lambda c: len(c.seeds),
)
_SEED = _opt(0, "--seed", help="First seed.")
_STEPS = _opt(None, "--steps", min=1, help="Training steps.", get=lambda c: c.train.steps)
_BATCH = _opt(
    None,
    "--batch-size",
    min=1,
    help="Global batch (sequences).",
    get=lambda c: c.train.batch_size,
)
_LR = _opt(None, "--lr", help="Peak learning rate (> 0).", get=lambda c: c.train.lr)
_DIM = _opt(None, "--dim", min=1, help="Model width.", get=lambda c: c.model.dim)
_LAYERS = _opt(None, "--layers", min=1, help="Number of blocks.", get=lambda c: c.model.num_layers)
_HEADS = _opt(None, "--heads", min=1, help="Attention heads.", get=lambda c: c.model.num_heads)
_EVAL_TOKENS = _opt(
    None, "--eval-tokens", min=1, help="Test tokens per length.", get=lambda c: c.eval.tokens
)
_SLIDING = _opt(
    None,
    "--sliding",
    min=1,
    help="Sliding-window evaluation with this stride (none: non-overlapping windows).",
    get=lambda c: c.eval.stride,
)
_ROPE_SCALINGS = _opt(
    None,
    "--rope-scalings",
    help="RoPE rescalings to sweep (linear,ntk,dynamic,yarn or none).",
    get=lambda c: c.eval.rope_scalings,
)
_TEXT = _opt(None, "--text", help="Your corpus: a file, folder or glob.")
_DATASET = _opt(None, "--dataset", help="A Hugging Face dataset NAME[:CONFIG] in the local cache.")
_TASK = _opt(
    None,
    "--task",
    help="A synthetic task: copy, reverse, associative-recall, passkey (retrieval heatmaps).",
)
_INCLUDE_TESTS = _opt(
    None,
    "--include-tests/--no-include-tests",
    help="Read the stdlib's test suites too.",
    get=lambda c: c.data.include_tests,
)
_OUT = _opt(Path("runs/lab"), "--out", "-o", help="Output folder.")
_RESUME = _opt(False, "--resume", help="Continue interrupted cells.")
_RESTART = _opt(False, "--restart", help="Discard interrupted cells' progress.")
_THREADS = _opt(
    None,
    "--threads",
    min=1,
    help="torch CPU threads.",
    get=lambda c: c.threads,
    none="every core",
)
_DEVICE = _opt("auto", "--device", help="auto, cpu or cuda.")
_CKPT_EVERY = _opt(
    None, "--ckpt-every", min=1, help="Checkpoint interval.", get=lambda c: c.ckpt_every
)
_COMPILE = _opt(
    None,
    "--compile/--no-compile",
    help="Train through torch.compile, on CUDA only. Not part of any hash.",
    get=lambda c: c.compile,
)
_QUIET = _opt(False, "--quiet", "-q", help="No progress bar or log.")
_PLOTS = _opt(True, "--plots/--no-plots", help="Write PNG plots.")


@lab_app.callback(invoke_without_command=True)
def lab(
    ctx: typer.Context,
    encodings: str = _ENCODINGS,
    preset: str = _PRESET,
    train_len: int | None = _TRAIN_LEN,
    eval_lens: str | None = _EVAL_LENS,
    seeds: int | None = _SEEDS,
    seed: int = _SEED,
    steps: int | None = _STEPS,
    batch_size: int | None = _BATCH,
    lr: float | None = _LR,
    dim: int | None = _DIM,
    layers: int | None = _LAYERS,
    heads: int | None = _HEADS,
    eval_tokens: int | None = _EVAL_TOKENS,
    sliding: int | None = _SLIDING,
    rope_scalings: str | None = _ROPE_SCALINGS,
    text: str | None = _TEXT,
    dataset: str | None = _DATASET,
    task: str | None = _TASK,
    include_tests: bool | None = _INCLUDE_TESTS,
    out: Path = _OUT,
    resume: bool = _RESUME,
    restart: bool = _RESTART,
    threads: int | None = _THREADS,
    device: str = _DEVICE,
    ckpt_every: int | None = _CKPT_EVERY,
    compile_model: bool | None = _COMPILE,
    quiet: bool = _QUIET,
    plots: bool = _PLOTS,
) -> None:
    """Run the grid: every encoding x seed, skipping finished cells, then print the table.

    An option left out takes the preset's value (shown as its default). Bad values, unknown
    encodings or options and a device that is not there are refused before anything trains.
    """
    if ctx.invoked_subcommand is None:  # every option above, passed on by name
        _run_lab(**{k: v for k, v in locals().items() if k != "ctx"})


def _run_lab(
    *,
    preset: str,
    out: Path,
    resume: bool,
    restart: bool,
    threads: int | None,
    device: str,
    quiet: bool,
    plots: bool,
    **options: Any,
) -> None:
    """Bare ``posenc lab``: run the grid (``options``: :class:`Overrides`' fields), then print
    and write its report."""
    from .experiment import RunOptions, run_grid

    if resume and restart:
        _fail("pass --resume or --restart, not both")
    with _refusals():
        cfg = build_config(preset, Overrides(**options))
        preflight(cfg, device)
        opts = RunOptions(
            out=out, resume=resume, restart=restart, threads=threads, device=device, quiet=quiet
        )
        summary = run_grid(cfg, opts)
    torchrun = _in_process_group()
    try:
        if _leave_process_group():  # a torchrun rank other than 0 skips this: rank 0 reports
            _report_run(out, summary, quiet=quiet, plots=plots)
    except typer.Exit as e:
        if torchrun:
            _exit_process(e.exit_code)
        raise
    if torchrun:
        _exit_process(0)


def _report_run(out: Path, summary: Any, *, quiet: bool, plots: bool) -> None:
    """Print and write the report of the grid ``run_grid`` returned ``summary`` for; exit 1
    when a cell failed."""
    from .report import load_rows, print_table, write_report

    rows = load_rows(out, summary.group)
    if rows and not quiet:
        print_table(rows)
    if rows:
        written = write_report(out, rows, plots=plots)
        if not quiet:
            print("wrote " + ", ".join(str(p) for p in written.values()))
    if summary.failed:
        _fail("failed cells: " + "; ".join(f"{k}: {v}" for k, v in summary.failed.items()), code=1)


def preflight(cfg: Any, device: str = "auto") -> None:
    """Refuse a grid before any data is read or cell trained: ValueError naming what is wrong
    (a number out of range, a model shape, an encoding or option that does not build at this
    shape, a device that is not there)."""
    from .. import registry
    from .._checks import check_positive_int
    from .experiment import check_config, resolve_encodings
    from .presets import model_config
    from .train import resolve_device

    check_config(cfg)
    shape = cfg.model
    for name, value in (
        ("dim", shape.dim),
        ("layers", shape.num_layers),
        ("heads", shape.num_heads),
    ):
        check_positive_int(f"--{name}", value)
    if shape.dim % shape.num_heads:
        raise ValueError(f"--dim ({shape.dim}) must be divisible by --heads ({shape.num_heads})")
    try:
        resolve_device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device}: {e}") from None
    for label in resolve_encodings(cfg.encodings):
        m = model_config(cfg, label, vocab_size=256)
        try:
            registry.build(
                m.encoding,
                dim=m.dim,
                num_heads=m.num_heads,
                max_len=m.max_len,
                causal=m.causal,
                **m.encoding_kwargs,
            )
        except (TypeError, ValueError) as e:
            raise ValueError(f"encoding {label!r} cannot be built at this shape: {e}") from None


def _in_process_group() -> bool:
    import torch.distributed as tdist

    return tdist.is_available() and tdist.is_initialized()


def _exit_process(code: int) -> NoReturn:
    """End a torchrun rank now, with ``code``, without the interpreter's shutdown.

    DDP keeps the gloo process group alive past ``destroy_process_group`` (a reference held in
    C++), so its worker threads outlive ``main``. A worker that frees a finished collective's
    tensors a moment late then needs the GIL while the interpreter is shutting down, and
    libstdc++ aborts the rank ("terminate called without an active exception", SIGABRT): one
    run in five on a loaded 2-core machine. Everything this process wrote is closed by now;
    what is left to do is flush the streams.
    """
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _leave_process_group() -> bool:
    """Under torchrun: wait for every rank, leave the group, and say whether this is rank 0.
    True in a single process."""
    import torch.distributed as tdist

    if not (tdist.is_available() and tdist.is_initialized()):
        return True
    main = tdist.get_rank() == 0
    tdist.barrier()
    tdist.destroy_process_group()
    return main


@lab_app.command("report")
def report(
    out: Path = typer.Option(Path("runs/lab"), "--out", "-o", help="Output folder of a run."),
    group: str | None = typer.Option(
        None, "--group", "-g", help="Group hash (prefix) to show; default: the newest."
    ),
    all_groups: bool = typer.Option(False, "--all", help="One table per group."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots."),
    question: str | None = typer.Option(
        None,
        "--question",
        help="extrapolation, length, passkey or extend: the newest results that answer it "
        "(default: the newest grid).",
    ),
    readme: Path | None = typer.Option(
        None,
        "--readme",
        help="Also write the table into this Markdown file (e.g. README.md), between the lines "
        "of its question's block: <!-- lab:table --> and <!-- /lab:table --> (lab:length, "
        "lab:passkey, lab:extend for the others).",
    ),
) -> None:
    """Print the results table and write table.md, results.csv and the figures (and, with
    --readme, the table into its block of a Markdown file: lab:table, lab:length, lab:passkey
    or lab:extend by the results' question)."""
    from .report import QUESTIONS

    if all_groups and readme is not None:
        _fail("--readme writes one table: pass --group (or nothing, for the newest), not --all")
    if question is not None and question not in (*QUESTIONS, "extend"):
        _fail(f"--question must be one of {', '.join((*QUESTIONS, 'extend'))}, got {question!r}")
    if question == "extend":
        if all_groups:
            _fail("--all shows the grid's groups; the extend table is one: pass --group instead")
        _report_extend(out, group, plots, readme)
    else:
        _report_grid(out, group, question, all_groups, plots, readme)


def _report_grid(
    out: Path,
    group: str | None,
    question: str | None,
    all_groups: bool,
    plots: bool,
    readme: Path | None,
) -> None:
    """``posenc lab report`` for grid results: the group's (or every group's) table, and its
    report files and README block for one group."""
    from .report import (
        groups,
        load_rows,
        newest_group,
        print_table,
        question_rows,
        write_readme_table,
        write_report,
    )

    try:
        if question is not None and group is None:
            group = newest_group(out, question)
            if group is None:
                _fail(f"no {question} results under {out}")
        names = list(groups(out)) if all_groups else [group]
        if not names:
            _fail(f"no results under {out}; run `posenc lab` first")
        for name in names:
            rows = load_rows(out, name)
            if question is not None:  # a group may hold two grids (default and length)
                rows = question_rows(rows, question)
            if not rows:
                _fail(f"no results under {out}; run `posenc lab` first")
            print_table(rows)
            if not all_groups:
                written = write_report(out, rows, plots=plots)
                if readme is not None:
                    written["readme"] = write_readme_table(readme, rows, question)
                print("wrote " + ", ".join(str(p) for p in written.values()))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))


def _report_extend(out: Path, group: str | None, plots: bool, readme: Path | None) -> None:
    from .extend_report import (
        extend_rows,
        print_extend_table,
        write_extend_readme,
        write_extend_report,
    )

    try:
        rows = extend_rows(out, group)
        if not rows:
            _fail(f"no extend results under {out}; run `posenc lab extend` first")
        print_extend_table(rows)
        written = write_extend_report(out, rows, plots=plots)
        if readme is not None:
            written["readme"] = write_extend_readme(readme, rows)
        print("wrote " + ", ".join(str(p) for p in written.values()))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))


_X_METHODS = _opt(
    None,
    "--methods",
    help="RoPE methods: none (unscaled), linear (PI), ntk, yarn, longrope, dynamic.",
    show_default="all six",
)
_X_ENCODINGS = _opt(
    None,
    "--encodings",
    "-e",
    help="Grid encodings to extend (rotary ones with every method, the others unchanged).",
    show_default="rope,alibi,t5,kerple,fire,sandwich",
)
_X_REFERENCE = _opt(
    None,
    "--reference",
    help="Encodings trained from scratch at the target length (the bar); 'none' for none.",
    show_default="rope",
)


@lab_app.command("extend")
def extend(
    out: Path = _OUT,
    group: str | None = _opt(None, "--group", "-g", help="The grid (hash prefix).",
                             show_default="the newest"),
    target: float = _opt(4.0, "--target", help="Fine-tune length as a multiple of L."),
    steps: int | None = _opt(None, "--steps", min=1, help="Fine-tune steps.",
                             show_default="2% of the grid's steps"),
    lr: float | None = _opt(None, "--lr", help="Constant fine-tune learning rate.",
                            show_default="the grid's final"),
    methods: str | None = _X_METHODS,
    encodings: str | None = _X_ENCODINGS,
    reference: str | None = _X_REFERENCE,
    curve: str | None = _opt(None, "--curve", help="Fine-tune steps evaluated at the target "
                             "length (e.g. 1,2,5).", show_default="1,2,5,10,... below --steps"),
    resume: bool = _RESUME,
    restart: bool = _RESTART,
    threads: int | None = _opt(None, "--threads", min=1, help="torch CPU threads.",
                               show_default="the grid's"),
    device: str = _DEVICE,
    quiet: bool = _QUIET,
    plots: bool = _PLOTS,
) -> None:  # fmt: skip
    """Fine-tune the grid's finished cells at a longer length with each RoPE method (and the
    bias encodings unchanged): zero-shot vs fine-tuned, and the steps to come within 0.02 bits
    of a model trained at that length from scratch. Resumable; rows go to the grid's store."""
    from .experiment import RunOptions
    from .extend import ExtendConfig, run_extend
    from .extend_report import extend_rows, print_extend_table, write_extend_report

    if resume and restart:
        _fail("pass --resume or --restart, not both")
    with _refusals():
        given: dict[str, Any] = {}
        for name, value in (("methods", methods), ("encodings", encodings)):
            if value is not None:
                given[name] = tuple(_csv(value) or ())
        if reference is not None:
            none = reference.strip().lower() == "none"
            given["reference"] = () if none else tuple(_csv(reference) or ())
        if curve is not None:
            given["curve"] = tuple(_int_list("--curve", curve))
        cfg = ExtendConfig(target=target, steps=steps, lr=lr, **given)
        opts = RunOptions(
            out=out, resume=resume, restart=restart, threads=threads, device=device, quiet=quiet
        )
        summary = run_extend(cfg, opts, group=group)
        rows = extend_rows(out, summary.group)
        if not quiet:
            print_extend_table(rows)
        written = write_extend_report(out, rows, plots=plots)
        if not quiet:
            print("wrote " + ", ".join(str(p) for p in written.values()))


@contextmanager
def _refusals() -> Iterator[None]:
    """What a run refuses or is stopped by, as a one-line error: a signal (exit 128 + signum,
    with the --resume hint), an interrupted run to resume or restart, a folder in use, a bad
    value, a file."""
    from .lock import FolderLocked
    from .train import CheckpointError, Interrupted, ResumeRequired

    try:
        yield
    except Interrupted as e:
        _fail(f"{e}; rerun the same command with --resume to continue", 128 + e.signum)
    except (ResumeRequired, CheckpointError, FolderLocked, ValueError, OSError) as e:
        _fail(str(e))


def _int_list(option: str, value: str) -> list[int]:
    try:
        return [int(v) for v in _csv(value) or ()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {value!r}") from None


def main() -> None:  # pragma: no cover - `python -m posenc.lab.cli`
    lab_app()
    sys.exit(0)
