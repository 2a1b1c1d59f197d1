"""The ``posenc`` command line. Each command group lives beside what it runs; heavy imports
(matplotlib, the lab) happen inside the commands so ``posenc --help`` stays fast."""

from __future__ import annotations

import typer

from .bench.cli import bench_app
from .demo import demo_app
from .lab.cli import lab_app
from .plots.cli import plot_app, report_command

app = typer.Typer(
    name="posenc",
    help="Transformer positional encodings: demos, the lab, plots and benchmarks.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(demo_app, name="demo")
app.add_typer(bench_app, name="bench")
app.add_typer(lab_app, name="lab")
app.add_typer(plot_app, name="plot")
app.command("report")(report_command)


@app.command("list")
def list_encodings() -> None:
    """List the registered encodings with their family and options."""
    from rich.console import Console
    from rich.table import Table

    from . import registry

    table = Table("name", "family", "shared", "options", "description")
    for name in registry.names():
        e = registry.entry(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in registry.options(name).items())
        table.add_row(name, e.family, "yes" if e.shared else "per layer", opts, e.description)
    Console().print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
