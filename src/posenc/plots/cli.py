"""``posenc plot <kind>`` and ``posenc report``.

matplotlib and torch-heavy work are imported inside the commands, so ``posenc --help`` stays fast
and works without the ``plots`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from matplotlib.figure import Figure

plot_app = typer.Typer(
    help=(
        "Draw a figure to PNG or SVG (chosen by the --out suffix). Each figure has a title, "
        "axis labels, a colour bar where colour carries a value, and a caption saying what to "
        "look at."
    ),
    no_args_is_help=True,
)


def _out(default: str) -> Any:
    return typer.Option(Path(default), "--out", "-o", help="output file: .png or .svg")


def _check_out(out: Path) -> Path:
    from .common import check_figure_path

    try:
        return check_figure_path(out)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--out") from None


def _floats(text: str, name: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise typer.BadParameter(
            f"must be comma-separated numbers, got {text!r}", param_hint=name
        ) from None
    if not values:
        raise typer.BadParameter("needs at least one number", param_hint=name)
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def _make(kind: str, **options: Any) -> Figure:
    """Build a figure, turning bad options into a usage error instead of a traceback, and a bad
    checkpoint into a one-line error (exit code 2)."""
    from ..lab.training.train import CheckpointError
    from .figures import make_figure

    try:
        return make_figure(kind, **options)
    except CheckpointError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e)) from None


def _save(save_figure: Any, fig: Figure, out: Path) -> Path:
    """``save_figure(fig, out)``, a folder or file that cannot be written being a one-line error."""
    from ..cli_errors import fail

    try:
        return Path(save_figure(fig, out))
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e}")


def _write(fig: Figure, out: Path) -> None:
    from .common import caption, save_figure

    path = _save(save_figure, fig, out)
    typer.echo(f"wrote {path}")
    typer.echo(caption(fig))


def _draw(kind: str, out: Path, **options: Any) -> None:
    """``posenc plot <kind>``: check ``--out``, build the figure, write it and its caption."""
    out = _check_out(out)
    _write(_make(kind, **options), out)


def _list_option(default: str, help_text: str) -> Any:
    """An option holding comma-separated names (read with :func:`_names`)."""
    return typer.Option(default, help=f"comma-separated {help_text}")


@plot_app.command("table")
def table(
    out: Path = _out("table.png"),
    encodings: str = _list_option(
        "sinusoidal,rope", "encodings: sinusoidal, rope (one panel each)"
    ),
    positions: int = typer.Option(128, min=1, help="number of positions (rows)"),
    dim: int = typer.Option(64, min=2, help="encoding / head dimension (columns), even"),
    base: float = typer.Option(10000.0, help="frequency base"),
) -> None:
    """The encoding matrix (positions x dimensions): sinusoidal table and RoPE's cos table."""
    names = _names(encodings)
    _draw("table", out, encodings=names, num_positions=positions, dim=dim, base=base)


@plot_app.command("similarity")
def similarity(
    out: Path = _out("similarity.png"),
    dim: int = typer.Option(128, min=2, help="encoding / head dimension, even"),
    max_offset: int = typer.Option(256, min=1, help="largest offset k / distance r"),
    bases: str = typer.Option("100,10000,500000", help="comma-separated frequency bases"),
    start: int = typer.Option(100, min=0, help="the position p compared with p + k"),
) -> None:
    """PE(p)·PE(p+k) against k (sinusoidal) and RoPE's long-term decay bound (RoFormer §3.4.3)."""
    out = _check_out(out)  # --out is checked first, then --bases
    floats = _floats(bases, "--bases")
    _draw("similarity", out, dim=dim, max_offset=max_offset, bases=floats, start=start)


@plot_app.command("wavelengths")
def wavelengths(
    out: Path = _out("wavelengths.png"),
    head_dim: int = typer.Option(128, min=4, help="head dimension (rotary dim), even"),
    base: float = typer.Option(10000.0, help="RoPE base (rope_theta)"),
    train_len: int = typer.Option(4096, min=1, help="training length L"),
    factor: float = typer.Option(4.0, help="context-extension factor (> 1)"),
    methods: str = _list_option("none,linear,ntk,dynamic,yarn,llama3,longrope", "scaling methods"),
) -> None:
    """Per-pair RoPE wavelengths and how each scaling method changes them."""
    _draw(
        "wavelengths", out, head_dim=head_dim, base=base, train_len=train_len, factor=factor,
        methods=_names(methods),
    )  # fmt: skip


@plot_app.command("bias")
def bias(
    out: Path = _out("bias.png"),
    kinds: str = _list_option("", "bias encodings (default: every registered bias)"),
    heads: int = typer.Option(4, min=1, help="number of heads (columns)"),
    length: int = typer.Option(64, min=1, help="number of positions"),
    bidirectional: bool = typer.Option(False, help="encoder form: no causal mask"),
    seed: int = typer.Option(0, help="seed of the learned tables' initialization"),
) -> None:
    """Per-head bias maps B(h, i, j) of ALiBi, T5 buckets, KERPLE, FIRE and Sandwich."""
    _draw(
        "bias", out, kinds=_names(kinds) or None, num_heads=heads, length=length,
        causal=not bidirectional, seed=seed,
    )  # fmt: skip


@plot_app.command("attention")
def attention(
    out: Path = _out("attention.png"),
    checkpoint: Path | None = typer.Option(
        None,
        help="a lab checkpoint (final.pt/last.pt, or its cell folder); default: train a tiny "
        "model here for a few seconds",
    ),
    encoding: str = typer.Option("rope", help="encoding of the tiny model (no checkpoint)"),
    train_len: int = typer.Option(32, min=8, help="training length of the tiny model"),
    factor: int = typer.Option(4, min=1, help="the long map is factor x the training length"),
    steps: int = typer.Option(300, min=1, help="training steps of the tiny model"),
    layer: int | None = typer.Option(
        None,
        help="layer to show (negative counts from the last); default: the checkpoint's last "
        "layer, or the tiny model's layer that looks back 5 tokens",
    ),
    seed: int = typer.Option(0, help="seed of the tiny model"),
) -> None:
    """Attention maps at the training length and at 4x it (checkpoint or tiny model)."""
    _draw(
        "attention", out, checkpoint=None if checkpoint is None else str(checkpoint),
        encoding=encoding, train_len=train_len, factor=factor, steps=steps, layer=layer, seed=seed,
        progress=checkpoint is None,
    )  # fmt: skip


@plot_app.command("lab")
def lab(
    out: Path = _out("lab.png"),
    results: Path = typer.Option(
        Path("runs/lab"), help="the lab's output folder (--out of `posenc lab`)"
    ),
    group: str | None = typer.Option(None, help="result group (default: that of the newest row)"),
) -> None:
    """The lab's extrapolation plots: loss vs eval length, loss by position."""
    _draw("lab", out, results=str(results), group=group)


def _lab_results_option() -> Any:
    return typer.Option(Path("runs/lab"), help="the lab's output folder (--out of `posenc lab`)")


def _group_option() -> Any:
    return typer.Option(None, help="result group (default: the newest that applies)")


def _lab_question_command(kind: str, help_text: str) -> None:
    """``posenc plot <kind>``: a lab figure drawn from the newest results that answer its
    question (or ``--group``), one command per kind from one definition."""

    def command(
        out: Path = _out(f"{kind}.png"),
        results: Path = _lab_results_option(),
        group: str | None = _group_option(),
    ) -> None:
        _draw(kind, out, results=str(results), group=group)

    command.__doc__ = help_text
    plot_app.command(kind)(command)


_lab_question_command(
    "length", "Training for length: randomized positions, PoSE, CoPE, NoPE layers "
    "(`posenc lab --encodings length`)."
)  # fmt: skip
_lab_question_command(
    "extend", "Extension by fine-tuning: loss vs fine-tune steps per method (`posenc lab extend`)."
)


@plot_app.command("passkey")
def passkey(
    out: Path = _out("passkey.png"),
    results: Path = _lab_results_option(),
    group: str | None = _group_option(),
    variants: bool = typer.Option(
        False,
        "--variants",
        help="one heatmap per inference-time variant (every RoPE rescaling, the learned table "
        "interpolated) beside its model as trained, instead of one per encoding",
    ),
) -> None:
    """Passkey retrieval: accuracy over length x depth per encoding (`posenc lab --task
    passkey`); `--variants`: per RoPE rescaling."""
    _draw("passkey", out, results=str(results), group=group, variants=variants)


@plot_app.command("all")
def plot_all(
    out_dir: Path = typer.Option(Path("figures"), "--out-dir", help="folder for the figures"),
    fmt: str = typer.Option("png", "--format", help="png or svg"),
    results: Path = typer.Option(Path("runs/lab"), help="the lab's output folder"),
    attention_steps: int = typer.Option(300, min=1, help="training steps of the tiny model"),
) -> None:
    """Every figure into one folder (<kind>.<format>); the lab's only where results exist."""
    from .common import save_figure
    from .figures import FIGURES, lab_results

    if fmt not in ("png", "svg"):
        raise typer.BadParameter(f"must be png or svg, got {fmt!r}", param_hint="--format")
    _writable_folder(out_dir)
    for kind, spec in FIGURES.items():
        options: dict[str, Any] = {}
        if kind == "attention":
            options.update(steps=attention_steps, progress=True)
        if spec.question is not None:
            if not lab_results(spec.question, results):
                typer.echo(f"skip {kind}: no {spec.question} results in {results} "
                           f"(run `{spec.command}` first)")  # fmt: skip
                continue
            options["results"] = str(results)
        path = _save(save_figure, _make(kind, **options), out_dir / f"{kind}.{fmt}")
        typer.echo(f"wrote {path}")


def _writable_folder(folder: Path) -> None:
    """Create ``folder`` before any drawing, or fail in one line saying why it cannot be."""
    import os

    from ..cli_errors import fail

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot create the folder {folder}: {e.strerror or e}")
    if not os.access(folder, os.W_OK):
        fail(f"cannot write into the folder {folder}: permission denied")


def report_command(
    out: Path = typer.Option(Path("report.html"), "--out", "-o", help="the HTML file to write"),
    results: Path = typer.Option(Path("runs/lab"), help="the lab's output folder"),
    checkpoint: Path | None = typer.Option(
        None, help="a lab checkpoint for the attention maps (default: a tiny model trained here)"
    ),
    attention_steps: int = typer.Option(300, min=1, help="training steps of the tiny model"),
) -> None:
    """One self-contained HTML page: every figure embedded, and the lab's latest table."""
    from ..runs.atomic import write_file_atomically
    from .report import build_report

    if out.suffix.lower() not in (".html", ".htm"):
        raise typer.BadParameter(f"must end in .html, got {str(out)!r}", param_hint="--out")
    _writable_folder(out.parent)
    page = build_report(results, checkpoint, attention_steps, log=typer.echo)
    write_file_atomically(out, page)  # an interrupted write leaves the previous page whole
    typer.echo(f"wrote {out}")
