"""The ``posenc`` command line. Each command group lives beside what it runs; heavy imports
(matplotlib, the lab) happen inside the commands so ``posenc --help`` stays fast.

A user's mistake (a bad option value, an unknown encoding or command, a missing optional
package) ends in one line, ``error: ...``, and exit code 2 (:mod:`posenc.cli_errors`); the root
command (:class:`PosencGroup`) turns usage errors and missing packages into that line.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import typer
from typer.core import TyperGroup

from . import __version__
from .bench.cli import bench_app
from .cli_errors import fail, missing_package
from .demo import demo_app
from .extend.cli import extend_app
from .lab.cli import lab_app
from .plots.cli import plot_app, report_command

# Click's UsageError (typer vendors click in recent versions): the base of typer.BadParameter.
_UsageError: type[Exception] = next(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError"
)


def _usage_line(e: Exception) -> str:
    """One line for a usage error: click's message and where the help is."""
    message = e.format_message() if hasattr(e, "format_message") else str(e)
    ctx = getattr(e, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return f"{message}{where}"


def _plain_flags(command: Any) -> None:
    """Show boolean flags as flags in help: no ``<bool>`` type column (recent typers print one),
    for every option of ``command`` and its subcommands, ``--help`` included."""
    for param in getattr(command, "params", []):
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    get_help_option = command.get_help_option

    def plain_help_option(ctx: Any) -> Any:
        option = get_help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    setattr(command, "get_help_option", plain_help_option)  # noqa: B010 - an instance override
    for sub in getattr(command, "commands", {}).values():
        _plain_flags(sub)


class PosencGroup(TyperGroup):
    """The root command: flags shown as flags, and a user's mistake reported in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_flags(self)

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except _UsageError as e:
            fail(_usage_line(e))

    def invoke(self, ctx: Any) -> Any:
        from ._logging import command_logging

        try:
            with command_logging():  # posenc's INFO lines on stdout, for this command only
                return super().invoke(ctx)
        except _UsageError as e:
            fail(_usage_line(e))
        except ImportError as e:
            message = missing_package(e)
            if message is None:
                raise
            fail(message)


app = typer.Typer(
    name="posenc",
    cls=PosencGroup,
    help="Transformer positional encodings: demos, the lab, plots and benchmarks.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(demo_app, name="demo")
app.add_typer(bench_app, name="bench")
app.add_typer(lab_app, name="lab")
app.add_typer(extend_app, name="extend")
app.add_typer(plot_app, name="plot")
app.command("report")(report_command)


@app.command("kernels")
def kernels_command(
    build: bool = typer.Option(
        False, "--build", help="Build the CPU kernel now if it is not cached (and load it)."
    ),
) -> None:
    """The native CPU kernel: built or not, cache path, compiler, the instruction-set variant
    chosen for this CPU; which backend each call takes and why."""
    from .kernels.cli import kernels_command as report

    report(build)


@app.command(
    "lm-eval",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def lm_eval_command(ctx: typer.Context) -> None:
    """lm-eval's own command line with the posenc model registered (--model posenc
    --model_args pretrained=DIR,method=yarn:factor=4): every argument goes to lm-eval
    (docs/lm-eval.md)."""
    from .lmeval.launcher import main as launch

    launch(ctx.args)


def inspect_config_command(
    config: str = typer.Argument(
        ...,
        help="A config.json, a model folder holding one, or a model id ('org/name') already in "
        "the local Hugging Face cache (never downloaded).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead."),
    methods: str = typer.Option(
        None,
        "--methods",
        help="Also say what each method (as `posenc extend --methods`) does "
        "to each layer type (the model built without weights; needs transformers).",
    ),
    target: int = typer.Option(
        None, "--target", min=2, help="The length the methods are set for (default: 2x trained)."
    ),
) -> None:
    """Show what each decoder layer of a Hugging Face model does with positions."""
    from .hf.inspect import inspect_command

    inspect_command(config, as_json)
    if methods:
        from .cli_errors import fail
        from .extend.methods.layer_plan import config_method_plans

        try:
            lines = config_method_plans(config, methods, target)
        except (ValueError, TypeError, KeyError) as err:
            fail(str(err))
        for line in lines:
            typer.echo(line)


app.command("inspect")(inspect_config_command)


def explore_command(
    out: str = typer.Option(
        "posenc-explore.html", "--out", "-o", help="The page to write (.html)."
    ),
    open_page: bool = typer.Option(False, "--open", help="Open it in the default web browser."),
) -> None:
    """Write one self-contained HTML page (works offline) to explore the encodings: table,
    similarity, RoPE rotation and wavelengths against encoding, d_model, position and scaling."""
    from pathlib import Path

    from .explore.cli import explore_page

    explore_page(Path(out), open_page)


app.command("explore")(explore_command)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"posenc {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_show_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Transformer positional encodings: demos, the lab, plots and benchmarks."""


def matching_names(pattern: str | None, names: list[str] | None = None) -> list[str]:
    """Names (registered, or ``names``) matching ``pattern``, case-insensitively: a glob when it
    holds ``*?[``, else a substring. All names for None."""
    if names is None:
        from . import registry

        names = registry.names()
    if pattern is None:
        return names
    pat = pattern.strip().lower()
    if any(c in pat for c in "*?["):
        return [n for n in names if fnmatch.fnmatchcase(n, pat)]
    return [n for n in names if pat in n]


def _list_rows(imports: list[str]) -> list[Any]:
    """What ``posenc list`` shows: the catalog when only posenc's own encodings can exist (no
    torch import), else the live registry after the imports and entry points."""
    from . import catalog

    if not imports and catalog.only_builtins():
        return list(catalog.BUILTIN)
    import warnings

    from . import registry
    from .plugins import import_modules

    try:
        import_modules(imports)
    except ValueError as err:
        fail(str(err))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", registry.PluginWarning)
        registry.load_entry_points()
    for w in caught:
        typer.echo(f"warning: {w.message}", err=True)
    return catalog.live_rows()


@app.command("list")
def list_encodings(
    pattern: str | None = typer.Argument(
        None,
        help="Show only the names that match: a substring ('rope') or a glob ('t*'); any case.",
    ),
    imports: list[str] | None = typer.Option(
        None,
        "--import",
        metavar="MODULE",
        help="Import this module first (repeatable): its register() calls add encodings.",
    ),
) -> None:
    """List the registered encodings with their family, options and where they come from
    (posenc, a module given to --import, or an installed package's posenc.encodings entry
    point)."""
    from rich.console import Console
    from rich.table import Table

    from .registry import suggest

    rows = {r.name: r for r in _list_rows(list(imports or ()))}
    names = matching_names(pattern, list(rows))
    if not names:
        fail(
            f"no registered encoding matches {pattern!r}{suggest(str(pattern), list(rows))}; "
            f"registered: {', '.join(rows)}"
        )
    table = Table("name", "family", "shared", "options", "description", "from")
    for name in names:
        r = rows[name]
        shared = "yes" if r.shared else "per layer"
        table.add_row(name, r.family, shared, r.options, r.description, r.origin)
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
