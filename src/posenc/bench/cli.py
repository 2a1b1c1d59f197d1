"""``posenc bench``: benchmarks of posenc's fast paths against the references installed here.

Subcommands: ``rope`` (RoPE on q and k), ``cos-sin`` (the cos/sin tables), ``decode-positions``
(a decode step's rotary calls at positions up to 10^6), ``bias`` (bias attention: materialized
vs FlexAttention vs plain causal SDPA). A new subcommand
goes in its own module of this package (timing and report helpers in :mod:`.harness`) and is
registered below with ``@bench_app.command("NAME")``. A run's figures are rows
(:class:`.rows.BenchRows`, saved as JSON); its block of ``benchmarks/RESULTS.md`` is rendered
from them (:mod:`.render`), and ``bench render`` re-renders every block that has rows.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    import torch
    from rich.console import Console

    from .bias import BiasRow, Case
    from .cos_sin import CosSinCase
    from .harness import Shape
    from .rope import RopeCase
    from .rows import BenchRows

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

    from . import rope

    title = escape(f"rope {case.shape.label} {case.dtype}")
    table = Table(*rope.CASE_HEADER, title=title)
    for row in rope.case_rows(case):
        table.add_row(*row)
    console.print(table)
    for name, note in case.notes.items():
        console.print(escape(f"  {name}: {note}"))


def _print_rope_summary(console: Console, doc: BenchRows, cases: list[RopeCase]) -> None:
    """Print the summary table, its legend and the target lines."""
    from rich.markup import escape

    from . import render, rope

    header, rows = rope.drop_empty_columns(
        rope.SUMMARY_HEADER, [rope.summary_row(c) for c in cases]
    )
    console.print(rope.summary_table(header, rows))
    console.print(escape(rope.SUMMARY_LEGEND))
    for line in render.rope_target_lines(doc):
        console.print(escape(f"target {line}"))


def _publish(console: Console, doc: BenchRows, results: Path | None, json_out: Path | None) -> None:
    """Write the rows and the block rendered from them (:func:`.render.publish`)."""
    from . import render

    for path in render.publish(doc, results, json_out):
        console.print(f"wrote {path}")


_JSON_HELP = "Write the rows here (default with --results: rows/<block>.json beside it)."


_DECODE_CALLS = typer.Option(
    True,
    "--decode-calls/--no-decode-calls",
    help="With decode shapes on the CPU: also the per-call table of every public rotary call "
    "against transformers' apply (thread CPU time; block rope-decode-cpu).",
)


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
    json_out: Path | None = typer.Option(None, "--json", help=_JSON_HELP),
    decode_calls: bool = _DECODE_CALLS,
) -> None:
    """RoPE on q and k: posenc's kernels vs transformers (eager, compiled),
    rotary-embedding-torch, flash-attn and Liger (GPU), and the copy-bandwidth reference."""
    import torch
    from rich.markup import escape

    from . import harness, rope
    from .rows import BenchRows

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
    _note_load(env)
    name = ("rope-backward" if backward else "rope") + f"-{dev.type}" + (f"-{tag}" if tag else "")
    settings: dict[str, object] = {"device": dev.type, "tag": tag, "backward": backward}
    settings["decode_calls"] = rope.DECODE_CALLS
    rows = [r for c in cases for r in c.as_rows()]
    doc = BenchRows("rope", name, env, _command_line(), settings, rows)
    _print_rope_summary(console, doc, cases)
    _publish(console, doc, results, json_out)
    if decode_calls and dev.type == "cpu" and not backward:
        _rope_decode_calls(console, shape_list, dtype_list, repeats, env, tag, results, json_out)


def _rope_decode_calls(
    console: Console,
    shape_list: list[Shape],
    dtype_list: list[torch.dtype],
    repeats: int,
    env: dict[str, str],
    tag: str,
    results: Path | None,
    json_out: Path | None,
) -> None:
    """Time, print and publish the decode per-call table (:mod:`.decode_calls`) of the decode
    shapes among ``shape_list`` (none: nothing)."""
    from . import decode_calls

    shape_list = [s for s in shape_list if s.decode]
    if not shape_list:
        return

    console.print("decode per-call table (thread CPU time) ...")
    rows = decode_calls.decode_rows(shape_list, dtype_list, max(repeats, 5))
    out = None if json_out is None else json_out.with_name(json_out.stem + "-decode.json")
    title = "rope: decode, per call"
    _publish_per_call(console, decode_calls, "rope-decode", title, rows, env, tag, results, out)


def _publish_per_call(
    console: Console,
    bench: ModuleType,
    name: str,
    title: str,
    rows: list,
    env: dict[str, str],
    tag: str,
    results: Path | None,
    json_out: Path | None,
) -> None:
    """Print and publish the rows of a CPU per-call bench (:mod:`.decode_calls`,
    :mod:`.decode_positions`: its ``HEADER``, ``table_rows``, ``LEGEND``, ``CALLS_PER_SAMPLE``)
    as block ``{name}-cpu[-tag]``."""
    from rich.markup import escape
    from rich.table import Table

    from .rows import BenchRows

    table = Table(*bench.HEADER, title=title)
    for row in bench.table_rows(rows):
        table.add_row(*map(escape, row))
    console.print(table)
    console.print(escape(bench.LEGEND))
    block = f"{name}-cpu" + (f"-{tag}" if tag else "")
    settings = {"device": "cpu", "tag": tag, "calls_per_sample": bench.CALLS_PER_SAMPLE}
    doc = BenchRows(name, block, env, _command_line(), settings, rows)
    _publish(console, doc, results, json_out)


# --- cos-sin --------------------------------------------------------------------------------


def _cos_sin_cases(
    console: Console,
    shape_list: list[Shape],
    dtype_list: list[torch.dtype],
    dev: torch.device,
    repeats: int,
    skipped: tuple[str, ...],
) -> list[CosSinCase]:
    """Time and print each distinct (b, s, d) in each dtype."""
    from rich.markup import escape
    from rich.table import Table

    from . import cos_sin

    cases = []
    seen = set()
    for shape in shape_list:
        if (shape.b, shape.s, shape.d) in seen:
            continue  # heads do not matter to the tables
        seen.add((shape.b, shape.s, shape.d))
        for dtype in dtype_list:
            case = cos_sin.cos_sin_case(shape, dtype, dev, repeats, skipped)
            table = Table(*cos_sin.CASE_HEADER, title=escape(f"cos-sin {cos_sin.label(case)}"))
            for row in cos_sin.case_rows(case):
                table.add_row(*row)
            console.print(table)
            for name, note in case.notes.items():
                console.print(escape(f"  {name}: {note}"))
            cases.append(case)
    return cases


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
    json_out: Path | None = typer.Option(None, "--json", help=_JSON_HELP),
) -> None:
    """cos/sin tables of positions (b, s): posenc vs transformers' LlamaRotaryEmbedding
    (eager, compiled) and rotary-embedding-torch."""
    import torch

    from . import cos_sin
    from .rows import BenchRows

    shape_list, dtype_list, skipped = _parse_cases(shapes, dtypes, skip, cos_sin.IMPLEMENTATIONS)
    if threads is not None:
        torch.set_num_threads(threads)
    dev = _device(device)
    console, env = _console(dev, _PACKAGES)
    cases = _cos_sin_cases(console, shape_list, dtype_list, dev, repeats, skipped)
    rows = [r for c in cases for r in c.as_rows()]
    doc = BenchRows(
        "cos-sin", f"cos-sin-{dev.type}", env, _command_line(), {"device": dev.type}, rows
    )
    _publish(console, doc, results, json_out)


# --- decode-positions -----------------------------------------------------------------------


@bench_app.command("decode-positions")
def bench_decode_positions(
    shapes: str = typer.Option("1x32/8x1x128", "--shapes", help=_SHAPES_HELP),
    dtypes: str = typer.Option("float32,bfloat16", "--dtypes", help="Comma-separated dtypes."),
    positions: str = typer.Option(
        "100,4096,100000,1000000,4000000", "--positions", help="Comma-separated decode positions."
    ),
    repeats: int = typer.Option(21, "--repeats", min=1, help="Samples per call and position."),
    threads: int | None = typer.Option(1, "--threads", min=1, help="torch CPU threads."),
    results: Path | None = typer.Option(
        None, "--results", help="Write the figures into this markdown file (its block)."
    ),
    tag: str = typer.Option("", "--tag", help="Name this run's block."),
    json_out: Path | None = typer.Option(None, "--json", help=_JSON_HELP),
) -> None:
    """A decode step's rotary calls at positions deep into a long context (CPU, per call):
    RotaryEmbedding, rope_qk, the drop-in and the patched model's step against transformers."""
    import torch

    from . import decode_positions as dp

    shape_list, dtype_list, _ = _parse_cases(shapes, dtypes, "", ())
    try:
        at = tuple(sorted({int(p) for p in positions.split(",") if p.strip()}))
    except ValueError as e:
        raise _bad(f"positions must be comma-separated integers, got {positions!r}") from e
    if not at or at[0] < 0:
        raise _bad(f"positions must be non-negative integers, got {positions!r}")
    if any(not s.decode for s in shape_list):
        raise _bad("decode-positions times one-token steps: shapes need S = 1 (BxH/HKx1xD)")
    if threads is not None:
        torch.set_num_threads(threads)
    dev = torch.device("cpu")
    console, env = _console(dev, _PACKAGES)
    rows = dp.position_rows(shape_list, dtype_list, repeats, at)
    _note_load(env)
    title = "rope decode by position, per call"
    _publish_per_call(console, dp, "decode-positions", title, rows, env, tag, results, json_out)


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
    json_out: Path | None = typer.Option(None, "--json", help=_JSON_HELP),
) -> None:
    """Bias attention (ALiBi, T5, KERPLE, FIRE, Sandwich): SDPA with a materialized [h, s, t]
    bias vs compiled FlexAttention vs plain causal SDPA; median ms and peak memory. Inference on
    CPU, forward+backward on CUDA."""
    import torch
    from rich.markup import escape

    from . import bias

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
    doc = bias.rows_doc(rows, env, _command_line(), limit, max_call_s, dev)
    _publish(console, doc, results, json_out)


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
    json_out: Path | None = typer.Option(None, "--json", help=_JSON_HELP),
) -> None:
    """A transformers Llama with posenc applied (posenc.hf.apply_posenc) against the stock
    model: a prefill and decode steps (CPU), with the share of a step RoPE takes."""
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
    env["clock"] = hf_model.step_clock().__name__  # thread_time with one torch thread
    rows = hf_model.run_cases(cases, dtype_list, layers, repeats)
    _note_load(env)
    doc = hf_model.model_doc(rows, env, _command_line())
    console.print(hf_model.block(doc))
    _publish(console, doc, results, json_out)


# --- render ---------------------------------------------------------------------------------


@bench_app.command("render")
def bench_render(
    results: Path = typer.Option(
        Path("benchmarks/RESULTS.md"), "--results", help="The results file whose blocks to render."
    ),
    rows: Path | None = typer.Option(
        None, "--rows", help="Folder of rows files (default: rows/ beside --results)."
    ),
) -> None:
    """Re-render every block of a results file that has a rows file (text between blocks and
    blocks without rows stay as they are)."""
    from . import render

    folder = rows or results.parent / "rows"
    try:
        names = render.rerender(results, folder)
    except ValueError as e:
        raise _bad(str(e)) from e
    typer.echo(f"rendered {len(names)} blocks from {folder}: {', '.join(names) or '(none)'}")
