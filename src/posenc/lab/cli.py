"""``posenc lab``: run the train-short-test-long grid (bare ``posenc lab`` runs the default one),
and ``posenc lab report``: print the table and write the plots and CSV.

Thin on purpose: options become a :class:`~posenc.lab.presets.LabConfig` and
:class:`~posenc.lab.experiment.RunOptions`; the work is in the library functions. Heavy imports
happen inside the commands so ``posenc --help`` stays fast.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
    from rich.console import Console

    # soft_wrap: one line whatever the width (a log file, a terminal, a test reading it)
    Console(stderr=True).print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@dataclass(frozen=True)
class Overrides:
    """What ``posenc lab``'s options change in a preset, by name; None keeps the preset's value.

    ``encodings``, ``eval_lens`` and ``rope_scalings`` are comma-separated (``rope_scalings``
    ``"none"``: no rescaling); ``text``, ``dataset`` and ``task`` pick the data (at most one);
    ``seeds`` seeds from ``seed`` on.
    """

    encodings: str | None = None
    train_len: int | None = None
    eval_lens: str | None = None
    seeds: int = 1
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
    if over.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {over.seeds}")
    train = replace(cfg.train, **_given(steps=over.steps, batch_size=over.batch_size, lr=over.lr))
    if train.warmup_steps >= train.steps:
        train = replace(train, warmup_steps=max(1, train.steps // 10))
    return replace(
        cfg,
        encodings=tuple(_csv(over.encodings) or cfg.encodings),
        seeds=tuple(range(over.seed, over.seed + over.seeds)),
        model=_model_shape(cfg.model, over),
        train=train,
        data=_data_config(cfg.data, over),
        eval=_eval_config(cfg.eval, over),
        **_given(train_len=over.train_len, ckpt_every=over.ckpt_every, compile=over.compile_model),
    )


def _model_shape(model: Any, over: Overrides) -> Any:
    sizes = {"dim": over.dim, "num_layers": over.layers, "num_heads": over.heads}
    return replace(model, **{k: v for k, v in sizes.items() if v})


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


@lab_app.callback(invoke_without_command=True)
def lab(
    ctx: typer.Context,
    encodings: str = typer.Option(
        "default",
        "--encodings",
        "-e",
        help="Comma-separated names from `posenc list` (name:key=value sets an option), "
        "'default' (the standard set that is registered) or 'all'.",
    ),
    preset: str = typer.Option(
        "cpu-small", "--preset", "-p", help="cpu-small, cpu, gpu or gpu-small."
    ),
    train_len: int | None = typer.Option(None, "--train-len", "-L", help="Train length L."),
    eval_lens: str | None = typer.Option(
        None, "--eval-lens", help="Comma-separated eval lengths: tokens (256) or multiples (4x)."
    ),
    seeds: int = typer.Option(1, "--seeds", help="Number of seeds per encoding."),
    seed: int = typer.Option(0, "--seed", help="First seed."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps."),
    batch_size: int | None = typer.Option(None, "--batch-size", help="Global batch (sequences)."),
    lr: float | None = typer.Option(None, "--lr", help="Peak learning rate."),
    dim: int | None = typer.Option(None, "--dim", help="Model width."),
    layers: int | None = typer.Option(None, "--layers", help="Number of blocks."),
    heads: int | None = typer.Option(None, "--heads", help="Attention heads."),
    eval_tokens: int | None = typer.Option(None, "--eval-tokens", help="Test tokens per length."),
    sliding: int | None = typer.Option(
        None, "--sliding", help="Sliding-window evaluation with this stride (default: none)."
    ),
    rope_scalings: str | None = typer.Option(
        None, "--rope-scalings", help="RoPE rescalings to sweep (linear,ntk,dynamic,yarn or none)."
    ),
    text: str | None = typer.Option(None, "--text", help="Your corpus: a file, folder or glob."),
    dataset: str | None = typer.Option(
        None, "--dataset", help="A Hugging Face dataset NAME[:CONFIG] in the local cache."
    ),
    task: str | None = typer.Option(
        None, "--task", help="A synthetic task: copy, reverse, associative-recall."
    ),
    include_tests: bool | None = typer.Option(
        None, "--include-tests/--no-include-tests", help="Read the stdlib's test suites too."
    ),
    out: Path = typer.Option(Path("runs/lab"), "--out", "-o", help="Output folder."),
    resume: bool = typer.Option(False, "--resume", help="Continue interrupted cells."),
    restart: bool = typer.Option(False, "--restart", help="Discard interrupted cells' progress."),
    threads: int | None = typer.Option(None, "--threads", help="torch CPU threads."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    ckpt_every: int | None = typer.Option(None, "--ckpt-every", help="Checkpoint interval."),
    compile_model: bool | None = typer.Option(
        None,
        "--compile/--no-compile",
        help="Train through torch.compile, on CUDA only (default: the preset's; gpu-small "
        "compiles). Not part of any hash.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or log."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write PNG plots."),
) -> None:
    """Run the grid: every encoding x seed, skipping finished cells, then print the table."""
    if ctx.invoked_subcommand is None:  # every option below, passed on by name
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
    from .lock import FolderLocked
    from .train import CheckpointError, Interrupted, ResumeRequired

    if resume and restart:
        _fail("pass --resume or --restart, not both")
    try:
        cfg = build_config(preset, Overrides(**options))
        opts = RunOptions(
            out=out, resume=resume, restart=restart, threads=threads, device=device, quiet=quiet
        )
        summary = run_grid(cfg, opts)
    except Interrupted as e:
        _fail(f"{e}; rerun the same command with --resume to continue", 128 + e.signum)
        return
    except (ResumeRequired, CheckpointError, FolderLocked, ValueError, FileNotFoundError) as e:
        _fail(str(e))
        return
    if not _leave_process_group():
        return  # a torchrun rank other than 0: rank 0 reports
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
    readme: Path | None = typer.Option(
        None,
        "--readme",
        help="Also write the table into this Markdown file (e.g. README.md), between its "
        "<!-- lab:table --> and <!-- /lab:table --> lines.",
    ),
) -> None:
    """Print the results table and write table.md, results.csv and the figure."""
    from .report import groups, load_rows, print_table, write_readme_table, write_report

    if all_groups and readme is not None:
        _fail("--readme writes one table: pass --group (or nothing, for the newest), not --all")
    try:
        names = list(groups(out)) if all_groups else [group]
        if not names:
            _fail(f"no results under {out}; run `posenc lab` first")
        for name in names:
            rows = load_rows(out, name)
            if not rows:
                _fail(f"no results under {out}; run `posenc lab` first")
            print_table(rows)
            if not all_groups:
                written = write_report(out, rows, plots=plots)
                if readme is not None:
                    written["readme"] = write_readme_table(readme, rows)
                print("wrote " + ", ".join(str(p) for p in written.values()))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))


def main() -> None:  # pragma: no cover - `python -m posenc.lab.cli`
    lab_app()
    sys.exit(0)
