"""``posenc bench``: benchmarks of posenc's fast paths against the references installed here.

Subcommands: ``rope`` (RoPE on q and k), ``cos-sin`` (the cos/sin tables), ``bias`` (bias
attention: materialized vs FlexAttention vs plain causal SDPA). A new subcommand
goes in its own module of this package (timing and report helpers in :mod:`.harness`) and is
registered below with ``@bench_app.command("NAME")``; it may write its own block of
``benchmarks/RESULTS.md`` with :func:`.harness.write_section`.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from .bias import BiasRow, Case
    from .harness import Shape
    from .rope import RopeCase

bench_app = typer.Typer(
    help="Benchmarks: posenc against the reference implementations installed here.",
    no_args_is_help=True,
)

_SHAPES_HELP = (
    "Comma-separated q/k shapes BxHxSxD or BxH/HKxSxD (GQA: H query, HK key heads), or a "
    "preset: 'quick' (small, the default), 'prefill' ([1,32,2048,128], [4,32/8,4096,128], "
    "[4,8,4096,64]), 'decode' (one token: [1,32/8,1,128], [8,32/8,1,128]) or 'llama' "
    "(prefill + decode); 'quick' includes the decode shapes. Presets and shapes mix."
)
_PACKAGES = (
    "torch",
    "triton",
    "transformers",
    "rotary-embedding-torch",
    "flash-attn",
    "liger-kernel",
    "posenc",
)


def _device(name: str | None) -> torch.device:
    import torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _command_line() -> str:
    return "posenc " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _bad(message: str) -> typer.BadParameter:
    return typer.BadParameter(message)


def _parse_cases(
    shapes: str, dtypes: str, skip: str, known: tuple[str, ...]
) -> tuple[list[Shape], list[torch.dtype], tuple[str, ...]]:
    """``(shapes, dtypes, skipped candidates)`` from the options; BadParameter when wrong."""
    from . import harness

    try:
        shape_list = harness.parse_shapes(shapes)
        dtype_list = harness.parse_dtypes(dtypes)
    except ValueError as e:
        raise _bad(str(e)) from e
    skipped = tuple(s.strip() for s in skip.split(",") if s.strip())
    unknown = [s for s in skipped if s not in known]
    if unknown:
        raise _bad(f"unknown candidate(s) {unknown}; known: {', '.join(known)}")
    return shape_list, dtype_list, skipped


def _console(dev: torch.device, packages: tuple[str, ...]) -> tuple[Console, dict[str, str]]:
    """A console and the run's environment, printed on one line first."""
    from rich.console import Console

    from . import harness

    console = Console()
    env = harness.environment(dev, packages)
    console.print(", ".join(f"{k}: {v}" for k, v in env.items()))
    return console, env


def _note_load(env: dict[str, str]) -> None:
    """Record the load average at the end of the run (busy machines give slower figures)."""
    if hasattr(os, "getloadavg"):
        env["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- rope -----------------------------------------------------------------------------------


def _print_rope_case(console: Console, case: RopeCase) -> None:
    """One case's table, then its notes."""
    from rich.markup import escape
    from rich.table import Table

    from . import harness, rope

    title = escape(f"rope {case.shape.label} {harness.dtype_name(case.dtype)}")
    table = Table(*rope.CASE_HEADER, title=title)
    for row in rope.case_rows(case):
        table.add_row(*row)
    console.print(table)
    for name, note in case.notes.items():
        console.print(escape(f"  {name}: {note}"))


def _print_rope_summary(
    console: Console, cases: list[RopeCase], env: dict[str, str], cpu: bool
) -> tuple[list[str], list[list[str]], list[str]]:
    """Print the summary table, its legend and the target lines; ``(header, rows, targets)``."""
    from rich.markup import escape

    from . import rope

    header, rows = rope.drop_empty_columns(
        rope.SUMMARY_HEADER, [rope.summary_row(c) for c in cases]
    )
    targets = [line for c in cases if (line := rope.target_line(c, cpu))]
    summary = rope.summary_table(header, rows)
    _note_load(env)
    console.print(summary)
    console.print(escape(rope.SUMMARY_LEGEND))
    for line in targets:
        console.print(escape(f"target {line}"))
    return header, rows, targets


def _rope_block(
    cases: list[RopeCase],
    env: dict[str, str],
    summary: tuple[list[str], list[list[str]], list[str]],
    backward: bool,
    where: str,
) -> str:
    """The run's block of the results file; ``summary`` is ``(header, rows, targets)`` and
    ``where`` the device type and tag, as the heading shows them."""
    from . import harness, rope

    header, rows, targets = summary
    mode = "forward+backward" if backward else "forward"
    parts = [
        f"## rope ({mode}, {where})",
        "",
        "\n".join(f"- {k}: {v}" for k, v in env.items()),
        f"- command: `{_command_line()}`",
        "",
        "Median of round-robin timed calls (decode shapes, one token: each sample the mean of "
        f"{rope.DECODE_CALLS} back-to-back calls). GB/s: q and k read and written once"
        + (" per pass (forward and backward)" if backward else "")
        + "; x copy: copy time / candidate time; speedup: candidate ms / posenc ms.",
        "",
        "### Summary",
        "",
        harness.markdown_table(header, rows),
        "",
        rope.SUMMARY_LEGEND,
        "",
        *(f"- target {line}" for line in targets),
    ]
    for case in cases:
        parts += [
            "",
            f"### {case.shape.label} {harness.dtype_name(case.dtype)}",
            "",
            harness.markdown_table(rope.CASE_HEADER, rope.case_rows(case)),
        ]
        if case.notes:
            parts += ["", *(f"- {k}: {v}" for k, v in case.notes.items())]
    return "\n".join(parts)


@bench_app.command("rope")
def bench_rope(
    shapes: str = typer.Option("quick", "--shapes", help=_SHAPES_HELP),
    dtypes: str = typer.Option("float32,bfloat16", "--dtypes", help="Comma-separated dtypes."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed calls per candidate."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda if any)."),
    skip: str = typer.Option(
        "", "--skip", help="Comma-separated candidates to leave out, e.g. rotary-embedding-torch."
    ),
    backward: bool = typer.Option(
        False, "--backward", help="Time forward+backward (copy reference: two copies)."
    ),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch CPU threads."),
    budget: float = typer.Option(
        20.0, "--budget", help="Seconds of samples after which a slow candidate stops early."
    ),
    results: Path | None = typer.Option(
        None, "--results", help="Write the figures into this markdown file (its 'rope' block)."
    ),
    tag: str = typer.Option(
        "", "--tag", help="Name this run's block (e.g. 'thp' for a run under other settings)."
    ),
) -> None:
    """RoPE on q and k: posenc's kernels vs transformers (eager, compiled),
    rotary-embedding-torch, flash-attn and Liger (GPU), and the copy-bandwidth reference."""
    import torch
    from rich.markup import escape

    from . import harness, rope

    shape_list, dtype_list, skipped = _parse_cases(shapes, dtypes, skip, rope.IMPLEMENTATIONS)
    if threads is not None:
        torch.set_num_threads(threads)
    dev = _device(device)
    console, env = _console(dev, _PACKAGES)
    warning = harness.load_warning()
    if warning:
        console.print(f"[yellow]warning: {escape(warning)}[/yellow]")
        env["warning"] = warning

    cases = []
    for shape in shape_list:
        for dtype in dtype_list:
            console.print(escape(f"{shape.label} {harness.dtype_name(dtype)} ..."))
            cases.append(rope.rope_case(shape, dtype, dev, repeats, skipped, backward, budget))
            _print_rope_case(console, cases[-1])
    summary = _print_rope_summary(console, cases, env, dev.type == "cpu")

    if results is not None:
        where = f"{dev.type}{', ' + tag if tag else ''}"
        section = "rope-backward" if backward else "rope"
        name = f"{section}-{dev.type}" + (f"-{tag}" if tag else "")
        harness.write_section(results, name, _rope_block(cases, env, summary, backward, where))
        console.print(f"wrote {results}")


# --- cos-sin --------------------------------------------------------------------------------


def _cos_sin_cases(
    console: Console,
    shape_list: list[Shape],
    dtype_list: list[torch.dtype],
    dev: torch.device,
    repeats: int,
    skipped: tuple[str, ...],
) -> list[str]:
    """Time and print each distinct (b, s, d) in each dtype; the results file's lines for them."""
    from rich.markup import escape
    from rich.table import Table

    from . import cos_sin, harness

    parts: list[str] = []
    seen = set()
    for shape in shape_list:
        if (shape.b, shape.s, shape.d) in seen:
            continue  # heads do not matter to the tables
        seen.add((shape.b, shape.s, shape.d))
        for dtype in dtype_list:
            case = cos_sin.cos_sin_case(shape, dtype, dev, repeats, skipped)
            table = Table(*cos_sin.CASE_HEADER, title=escape(f"cos-sin {cos_sin.label(case)}"))
            rows = cos_sin.case_rows(case)
            for row in rows:
                table.add_row(*row)
            console.print(table)
            for name, note in case.notes.items():
                console.print(escape(f"  {name}: {note}"))
            parts += [
                "",
                f"### {cos_sin.label(case)}",
                "",
                harness.markdown_table(cos_sin.CASE_HEADER, rows),
            ]
            if case.notes:
                parts += ["", *(f"- {k}: {v}" for k, v in case.notes.items())]
    return parts


@bench_app.command("cos-sin")
def bench_cos_sin(
    shapes: str = typer.Option("quick", "--shapes", help=_SHAPES_HELP + " Heads are ignored."),
    dtypes: str = typer.Option("float32,bfloat16", "--dtypes", help="Comma-separated dtypes."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed calls per candidate."),
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda if any)."),
    skip: str = typer.Option("", "--skip", help="Comma-separated candidates to leave out."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch CPU threads."),
    results: Path | None = typer.Option(
        None, "--results", help="Write the figures into this markdown file (its 'cos-sin' block)."
    ),
) -> None:
    """cos/sin tables of positions (b, s): posenc vs transformers' LlamaRotaryEmbedding
    (eager, compiled) and rotary-embedding-torch."""
    import torch

    from . import cos_sin, harness

    shape_list, dtype_list, skipped = _parse_cases(shapes, dtypes, skip, cos_sin.IMPLEMENTATIONS)
    if threads is not None:
        torch.set_num_threads(threads)
    dev = _device(device)
    console, env = _console(dev, _PACKAGES)
    parts = [
        f"## cos-sin ({dev.type})",
        "",
        "\n".join(f"- {k}: {v}" for k, v in env.items()),
        f"- command: `{_command_line()}`",
    ]
    parts += _cos_sin_cases(console, shape_list, dtype_list, dev, repeats, skipped)
    if results is not None:
        harness.write_section(results, f"cos-sin-{dev.type}", "\n".join(parts))
        console.print(f"wrote {results}")


# --- bias -----------------------------------------------------------------------------------

# The options of `bench bias` whose help takes more than a line (keeps the signature short).
_BIAS_PRESET = typer.Option(
    "quick",
    "--preset",
    help="quick: s=1k,2k float32, every bias. full (the RESULTS.md run, ~10 min on 2 "
    "cores): float32 1k-8k every bias; bfloat16 2k,4k every bias, 8k,16k ALiBi and T5, 32k "
    "ALiBi (on CUDA also 32k T5 and 64k).",
)
_BIAS_LENGTHS = typer.Option(
    None,
    "--lengths",
    help="Comma-separated sequence lengths, e.g. 1024,2k,32k (default: the preset's).",
)
_BIAS_DTYPES = typer.Option(
    None,
    "--dtypes",
    help="Comma-separated dtypes, e.g. float32,bfloat16 (default: the preset's).",
)
_BIAS_BIASES = typer.Option(
    None,
    "--biases",
    help="Comma-separated: alibi,t5,kerple,fire,sandwich, or all (default: the preset's).",
)
_BIAS_REPEATS = typer.Option(
    None,
    "--repeats",
    min=3,
    help="Timed calls per candidate at most, 3 or more (default: quick 5, full 3).",
)
_BIAS_BUDGET = typer.Option(
    5.0,
    "--budget",
    help="Seconds of samples after which a candidate stops (at least 3 samples).",
)
_BIAS_MEMORY_FRACTION = typer.Option(
    None,
    "--memory-fraction",
    help="Largest estimated need of a materialized-bias call, as a fraction of RAM "
    "(default 0.4) or GPU memory (default 0.8); bigger ones are skipped, never tried.",
)
_BIAS_MAX_CALL_S = typer.Option(
    60.0, "--max-call-s", help="Skip a candidate predicted to take longer per call (seconds)."
)
_BIAS_SKIP = typer.Option(
    "", "--skip", help="Comma-separated candidates to leave out: materialized, flex, causal."
)
_BIAS_RESULTS = typer.Option(
    None, "--results", help="Write the figures into this markdown file (its 'bias' block)."
)


def _bias_plan(
    device: str | None,
    preset: str,
    lengths: str | None,
    dtypes: str | None,
    biases: str | None,
    skip: str,
) -> tuple[torch.device, list[Case], tuple[str, ...]]:
    """``(device, cases, skipped candidates)`` from the options; BadParameter when wrong."""
    from . import bias

    try:
        dev = _device(device)
        cases = bias.plan_cases(
            preset,
            bias.parse_lengths(lengths) if lengths is not None else None,
            bias.parse_dtype_names(dtypes) if dtypes is not None else None,
            bias.parse_biases(biases) if biases is not None else None,
            dev.type,
        )
        skipped = bias.parse_skip(skip)
    except (ValueError, RuntimeError) as e:
        raise _bad(str(e)) from e
    return dev, cases, skipped


def _print_bias_table(console: Console, rows: list[BiasRow], dev: torch.device) -> None:
    """The run's table, then the notes and target lines."""
    from rich.markup import escape
    from rich.table import Table

    from . import bias

    table = Table(
        *bias.SHORT_HEADER,
        title=f"posenc bias attention ({rows[0].mode if rows else ''}, {dev.type})",
    )
    for row in bias.table_rows(rows):
        table.add_row(*(escape(c) for c in row))
    console.print(table)
    for line in bias.row_notes(rows) + bias.target_summary(rows):
        console.print(escape(f"  {line}"))


@bench_app.command("bias")
def bench_bias(
    preset: str = _BIAS_PRESET,
    lengths: str | None = _BIAS_LENGTHS,
    dtypes: str | None = _BIAS_DTYPES,
    biases: str | None = _BIAS_BIASES,
    heads: int = typer.Option(8, "--heads", min=1, help="Attention heads h."),
    head_dim: int = typer.Option(64, "--head-dim", min=1, help="Head dim d."),
    batch: int = typer.Option(1, "--batch", min=1, help="Batch size b."),
    repeats: int | None = _BIAS_REPEATS,
    budget: float = _BIAS_BUDGET,
    memory_fraction: float | None = _BIAS_MEMORY_FRACTION,
    max_call_s: float = _BIAS_MAX_CALL_S,
    device: str | None = typer.Option(None, "--device", help="cpu or cuda (default: cuda if any)."),
    skip: str = _BIAS_SKIP,
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch CPU threads."),
    results: Path | None = _BIAS_RESULTS,
) -> None:
    """Bias attention (ALiBi, T5, KERPLE, FIRE, Sandwich): SDPA with a materialized [h, s, t]
    bias vs compiled FlexAttention vs plain causal SDPA; median ms and peak memory. Inference on
    CPU, forward+backward on CUDA."""
    import torch
    from rich.markup import escape

    from . import bias, harness

    dev, cases, skipped = _bias_plan(device, preset, lengths, dtypes, biases, skip)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise _bad("--device cuda: CUDA is not available here")
    try:
        limit = bias.memory_limit_for(dev, memory_fraction)
    except ValueError as e:
        raise _bad(f"--memory-fraction: {e}") from e
    if threads is not None:
        torch.set_num_threads(threads)
    console, env = _console(dev, ("torch", "posenc"))
    rows = bias.run_bias_bench(
        cases,
        heads=heads,
        head_dim=head_dim,
        batch=batch,
        device=dev,
        repeats=repeats if repeats is not None else bias.PRESET_REPEATS[preset],
        budget_s=budget,
        memory_limit=limit,
        max_call_s=max_call_s,
        skip=skipped,
        progress=lambda line: console.print(escape(line)),
    )
    _note_load(env)
    _print_bias_table(console, rows, dev)
    if results is not None:
        text = bias.markdown_section(rows, env, _command_line(), limit, max_call_s, dev)
        harness.write_section(results, f"bias-{dev.type}", text)
        console.print(f"wrote {results}")


# --- model ----------------------------------------------------------------------------------


@bench_app.command("model")
def bench_model(
    layers: int = typer.Option(4, "--layers", min=1, max=64, help="Decoder layers."),
    dtypes: str = typer.Option("float32,bfloat16", "--dtypes", help="Comma-separated dtypes."),
    repeats: int = typer.Option(10, "--repeats", min=1, help="Timed calls per candidate."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch CPU threads."),
    results: Path | None = typer.Option(
        None, "--results", help="Write the figures into this markdown file (its 'hf-model' block)."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the rows as JSON here."),
) -> None:
    """A transformers Llama with posenc applied (posenc.hf.apply_posenc) against the stock
    model: a prefill and decode steps (CPU), with the share of a step RoPE takes."""
    import json

    import torch

    from . import harness, hf_model

    try:
        dtype_list = harness.parse_dtypes(dtypes)
    except ValueError as e:
        raise _bad(str(e)) from e
    if threads is not None:
        torch.set_num_threads(threads)
    console, env = _console(torch.device("cpu"), ("torch", "transformers", "posenc"))
    cases = [("prefill", 1, 512), ("decode", 1, 512), ("decode", 8, 512)]
    rows = hf_model.run_cases(cases, dtype_list, layers, repeats)
    _note_load(env)
    block = hf_model.model_block(rows, env, _command_line())
    console.print(block)
    if results is not None:
        harness.write_section(results, "hf-model-cpu", block)
        console.print(f"wrote {results}")
    if json_out is not None:
        json_out.write_text(json.dumps([r.as_dict() for r in rows], indent=1) + "\n")
        console.print(f"wrote {json_out}")
