"""``posenc lab``: run the train-short-test-long grid (bare ``posenc lab`` runs the default one),
and ``posenc lab report``: print the table and write the plots and CSV.

Thin on purpose: options become a :class:`~posenc.lab.cells.presets.LabConfig` and
:class:`~posenc.lab.grid.experiment.RunOptions`; the work is in the library functions. Heavy imports
happen inside the commands so ``posenc --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer

from .._malloc import retain_freed_memory
from . import DEFAULT_RUN_TIME
from .cells.flags import (
    LAB_FLAGS,
    Flag,
    check_caps,
    check_device,
    option_list,
    with_flags,
)
from .cells.flags import Overrides as Overrides
from .cells.flags import build_config as build_config
from .extension.flags import EXTEND_FLAGS, extend_config

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


def _fail(msg: str, code: int = 2) -> None:
    from ..cli_errors import fail

    fail(msg, code)


def _lab(ctx: typer.Context, **options: Any) -> None:
    """Run the grid: every encoding x seed, skipping finished cells, then print the table.

    An option left out takes the preset's value (shown as its default). Bad values, unknown
    encodings or options and a device that is not there are refused before anything trains.
    """
    if ctx.invoked_subcommand is None:
        config = options.pop("config")
        if config is not None:
            try:
                options = with_grid_file(ctx, config, options)
            except ValueError as e:
                _fail(str(e))
        _run_lab(**options)


def with_grid_file(
    ctx: typer.Context, path: Path, options: dict[str, Any], flags: tuple[Flag, ...] = LAB_FLAGS
) -> dict[str, Any]:
    """``options`` with the values of the TOML file at ``path`` (:mod:`posenc.lab.grid.grid_file`,
    keyed by ``flags``, the command's table) in place of the defaults: an option given on the
    command line keeps its value."""
    from .grid.grid_file import read_grid_file

    given = read_grid_file(path, flags)
    out = dict(options)
    for name, value in given.items():
        # by the enum's name: typer >= 0.2x carries its own copy of click's ParameterSource
        source = ctx.get_parameter_source(name)
        if source is None or source.name != "COMMANDLINE":
            out[name] = value
    return out


lab = lab_app.callback(invoke_without_command=True)(with_flags(_lab, LAB_FLAGS, context=True))


def _run_lab(
    *,
    preset: str,
    out: Path,
    resume: bool,
    restart: bool,
    threads: int | None,
    jobs: int | None,
    force: str | None,
    dry_run: bool,
    imports: list[str] | None,
    device: str,
    quiet: bool,
    plots: bool,
    report_to: str,
    **options: Any,
) -> None:
    """Bare ``posenc lab``: run the grid (``options``: :class:`Overrides`' fields), then print
    and write its report (``--dry-run``: print the plan instead)."""
    from .._logging import cli_logging
    from ..plugins import import_modules
    from ..runs.metrics import check_report_to
    from .grid.experiment import RunOptions, run_grid
    from .grid.preflight import plan_run

    if resume and restart:
        _fail("pass --resume or --restart, not both")
    cli_logging(quiet=quiet)
    with _refusals(out):
        retain_freed_memory()  # before the dry run times a step: as the cells will run
        import_modules(imports or ())
        cfg = build_config(preset, Overrides(**options))
        check_caps({"threads": threads, "jobs": jobs})
        check_report_to(report_to)
        opts = RunOptions(
            out=out, resume=resume, restart=restart, threads=threads, device=device,
            quiet=quiet, jobs=jobs, force=force_labels(force), report_to=report_to,
        )  # fmt: skip
        plan = plan_run(cfg, opts, timed=dry_run)
        if dry_run:
            print(plan.text())
            return
        _check_out(out)
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
    from .reports.report import load_rows, print_table, write_report

    rows = load_rows(out, summary.group)
    if rows and not quiet:
        print_table(rows)
    if rows:
        written = write_report(out, rows, plots=plots)
        if not quiet:
            print("wrote " + ", ".join(str(p) for p in written.values()))
    if summary.failed:
        _fail("failed cells: " + "; ".join(f"{k}: {v}" for k, v in summary.failed.items()), code=1)


def force_labels(value: str | None) -> tuple[str, ...]:
    """``--force``: the labels to rerun (``("all",)`` for every cell); () when not given."""
    if value is None:
        return ()
    return tuple(option_list("--force", value, "comma-separated labels of the grid, or all"))


def _check_out(out: Path, *, create: bool = True) -> None:
    """ValueError naming ``--out`` when the output folder cannot be written."""
    from ..cli_errors import check_writable

    check_writable(out, "--out", create=create)


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
        help="Also write the table into this Markdown file (e.g. docs/lab-results.md), between "
        "the lines of its question's block: <!-- lab:table --> and <!-- /lab:table --> "
        "(lab:length, lab:passkey, lab:extend for the others; lab:headline, the means alone, "
        "as README.md holds).",
    ),
    reference: str | None = typer.Option(
        None,
        "--reference",
        help="The line every other is compared with, seed by seed (a label of the table: rope, "
        "alibi, 'rope +YaRN', ...); needs 2 seeds or more.",
        show_default="rope",
    ),
) -> None:
    """Print the results table and write table.md, results.csv and the figures (and, with
    --readme, the table into its block of a Markdown file: lab:table, lab:length, lab:passkey
    or lab:extend by the results' question). Under the table: each line's bits minus the
    reference's (--reference, default rope) for the same seed, mean over seeds with its 95%
    interval, marked where a paired t test resolves it after Holm's correction across the
    table's comparisons."""
    from .reports.report import QUESTIONS

    if all_groups and readme is not None:
        _fail("--readme writes one table: pass --group (or nothing, for the newest), not --all")
    if question is not None and question not in (*QUESTIONS, "extend"):
        _fail(f"--question must be one of {', '.join((*QUESTIONS, 'extend'))}, got {question!r}")
    if not all_groups:
        try:
            _check_out(out, create=False)
        except ValueError as e:
            _fail(str(e))
    if question == "extend":
        if all_groups:
            _fail("--all shows the grid's groups; the extend table is one: pass --group instead")
        if reference is not None:
            _fail("--reference compares the grid's lines; posenc lab extend takes its own")
        _report_extend(out, group, plots, readme)
    else:
        _report_grid(out, group, question, all_groups, plots, readme, reference)


def _report_grid(
    out: Path,
    group: str | None,
    question: str | None,
    all_groups: bool,
    plots: bool,
    readme: Path | None,
    reference: str | None = None,
) -> None:
    """``posenc lab report`` for grid results: the group's (or every group's) table, and its
    report files and README block for one group; ``reference``: the paired differences' line
    (None: rope where the table has it), checked in every table before any is printed."""
    from .reports.readme import check_readme, write_readme_table
    from .reports.report import (
        check_reference,
        groups,
        load_rows,
        newest_group,
        print_table,
        question_rows,
        write_report,
    )

    try:
        if question is not None and group is None:
            group = newest_group(out, question)
            if group is None:
                _fail(f"no {question} results under {out}")
        check_readme(readme, question)
        names = list(groups(out)) if all_groups else [group]
        if not names:
            _fail(f"no results under {out}; run `posenc lab` first")
        tables = []
        for name in names:
            rows = load_rows(out, name)
            if question is not None:  # a group may hold two grids (default and length)
                rows = question_rows(rows, question)
            if not rows:
                _fail(f"no results under {out}; run `posenc lab` first")
            check_reference(rows, reference)
            tables.append(rows)
        for rows in tables:
            print_table(rows, reference=reference)
            if not all_groups:
                written = write_report(out, rows, plots=plots, reference=reference)
                if readme is not None:
                    written["readme"] = write_readme_table(readme, rows, question, reference)
                print("wrote " + ", ".join(str(p) for p in written.values()))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    except OSError as e:
        _fail_os(e, out)


def _fail_os(e: OSError, where: Path | None = None) -> None:
    from ..cli_errors import os_error_message

    _fail(os_error_message(e, f"under {where}" if where is not None else None))


def _report_extend(out: Path, group: str | None, plots: bool, readme: Path | None) -> None:
    from .reports.extend_report import (
        extend_rows,
        print_extend_table,
        write_extend_readme,
        write_extend_report,
    )
    from .reports.readme import check_readme

    try:
        check_readme(readme, "extend")
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
    except OSError as e:
        _fail_os(e, out)


def _extend(ctx: typer.Context, **options: Any) -> None:
    """Fine-tune the grid's finished cells at a longer length with each RoPE method (and the
    bias encodings unchanged): zero-shot vs fine-tuned, and the steps to come within 0.02 bits
    of a model trained at that length from scratch. Resumable; rows go to the grid's store."""
    config = options.pop("config")
    if config is not None:
        try:
            options = with_grid_file(ctx, config, options, EXTEND_FLAGS)
        except ValueError as e:
            _fail(str(e))
    _run_extend(**options)


def _run_extend(*, out: Path, group: str | None, resume: bool, restart: bool,
                threads: int | None, imports: list[str] | None, device: str, quiet: bool,
                plots: bool, report_to: str, **given: Any) -> None:  # fmt: skip
    """``posenc lab extend`` with its options resolved (``--config`` read): run the extend,
    then print and write its table."""
    from ..runs.metrics import check_report_to
    from .extension.extend import run_extend
    from .grid.run import RunOptions
    from .reports.extend_report import extend_rows, print_extend_table, write_extend_report

    if resume and restart:
        _fail("pass --resume or --restart, not both")
    from .._logging import cli_logging
    from ..plugins import import_modules

    cli_logging(quiet=quiet)
    with _refusals(out):
        retain_freed_memory()
        import_modules(imports or ())
        check_device(device)
        check_caps({"steps": given.get("steps"), "threads": threads})
        check_report_to(report_to)
        cfg = extend_config(given)
        opts = RunOptions(out=out, resume=resume, restart=restart, threads=threads,
                          device=device, quiet=quiet, report_to=report_to)  # fmt: skip
        summary = run_extend(cfg, opts, group=group)
        rows = extend_rows(out, summary.group)
        if not quiet:
            print_extend_table(rows)
        written = write_extend_report(out, rows, plots=plots)
        if not quiet:
            print("wrote " + ", ".join(str(p) for p in written.values()))


extend = lab_app.command("extend")(with_flags(_extend, EXTEND_FLAGS, context=True))


@contextmanager
def _refusals(out: Path | None = None) -> Iterator[None]:
    """What a run refuses or is stopped by, as a one-line error: a signal (exit 128 + signum,
    with the --resume hint), an interrupted run to resume or restart, a folder in use, a bad
    value, a file that cannot be written (``out``: the folder to name when the error names no
    file)."""
    from ..runs.lock import FolderLocked
    from .training.train import CheckpointError, Interrupted, ResumeRequired

    try:
        yield
    except Interrupted as e:
        _fail(f"{e}; rerun the same command with --resume to continue", 128 + e.signum)
    except (ResumeRequired, CheckpointError, FolderLocked, ValueError) as e:
        _fail(str(e))
    except OSError as e:
        _fail_os(e, out)


def main() -> None:  # pragma: no cover - `python -m posenc.lab.cli`
    lab_app()
    sys.exit(0)
