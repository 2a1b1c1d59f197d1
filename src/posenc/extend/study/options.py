"""``posenc extend MODEL``'s options as a :class:`~.config.StudyConfig`, checked before the model
loads: every refusal one line naming the option, and what it allows."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def default_lengths(trained: int) -> str:
    """``--lengths`` when none is given: a quarter, a half, one and one and a half times the
    model's trained length (SmolLM2-135M, trained at 8k: ``2048,4096,8192,12288``), so a default
    study reaches past any model's trained length and no further than it can say something."""
    return ",".join(str(max(2, trained * k // 4)) for k in (1, 2, 4, 6))


def study_config(options: dict[str, Any], trained: int | None = None) -> Any:
    """The command's options as a :class:`~posenc.extend.study.config.StudyConfig` (checked);
    ``--lengths`` not given: :func:`default_lengths` of the model's ``trained`` length."""
    from ..measures.perplexity import default_documents
    from ..methods.names import parse_methods
    from .config import StudyConfig, default_bin_size, parse_lengths

    methods = tuple(parse_methods(options["methods"]))
    texts = [Path(p) for p in options["text"] or []]
    for p in texts:
        if not p.is_file():
            raise ValueError(f"--text {str(p)!r} is not a file")
    docs = texts or default_documents(options["documents"])
    passkey_methods = (
        tuple(m.strip() for m in options["passkey_methods"].split(",") if m.strip())
        if options["passkey_methods"]
        else None
    )
    if options["lengths"] is None and trained is None:
        raise ValueError("--lengths is not given and the model's trained length is unknown")
    lengths = parse_lengths(options["lengths"] or default_lengths(int(trained or 0)))
    keys = options["passkey_lengths"]
    tasks = parse_tasks(options["tasks"] or "")
    _check_task_options(options, tasks)
    task_lengths = options["task_lengths"]
    return StudyConfig(
        methods=methods,
        lengths=lengths,
        documents=tuple(str(p) for p in docs),
        bin_size=options["bin_size"] or default_bin_size(lengths),  # derived from the lengths
        passkey_lengths=parse_lengths(keys, "--passkey-lengths") if keys else (),
        passkey_depths=_depths(options["passkey_depths"]),
        passkey_methods=passkey_methods,
        tasks=tasks,
        task_lengths=_task_lengths(task_lengths, lengths) if tasks else (),
        task_depths=_depths(options["task_depths"], "--task-depths"),
        task_samples=options["samples"],
        task_seed=options["task_seed"],
        task_questions=options.get("questions_per_context", 1),
        longppl=options["longppl"],
        longppl_evaluator=options["longppl_evaluator"],
        longppl_trunc=options["longppl_trunc"],
        longppl_window=options["longppl_window"] or max(1, options["longppl_trunc"] // 4),
    )


def length_options(cfg: Any, n: int) -> str:
    """The options that asked for length ``n``: what a user lowers when it does not fit."""
    named = [opt for opt, have in (("--lengths", cfg.lengths), ("--task-lengths", cfg.task_lengths),
             ("--passkey-lengths", cfg.passkey_lengths)) if n in have]  # fmt: skip
    return " and ".join(named) or "--lengths"


def _check_task_options(options: dict[str, Any], tasks: tuple[str, ...]) -> None:
    """Task settings without a task would be ignored in silence: refused, as ``--tasks ""``."""
    if options["tasks"] is not None and not tasks:
        raise ValueError("--tasks names no task: give task names (niah_single_2,vt), "
                         "ruler (every task) or niah (the needles)")  # fmt: skip
    if tasks:
        return
    for key in ("task_lengths", "task_depths", "samples", "task_seed", "questions_per_context"):
        # given on the command line, even as its default (click's ParameterSource, by name)
        source = options["ctx"].get_parameter_source(key)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            option = "--" + key.replace("_", "-")
            raise ValueError(f"{option} is set but no --tasks: name the tasks it is for "
                             "(--tasks niah_single_2,vt, or ruler)")  # fmt: skip


def _task_lengths(text: str, lengths: tuple[int, ...]) -> tuple[int, ...]:
    """``--task-lengths`` (default: the perplexity lengths)."""
    from .config import parse_lengths

    return parse_lengths(text, "--task-lengths") if text else lengths


def parse_tasks(text: str) -> tuple[str, ...]:
    """``--tasks``: registered task names, comma-separated, or a group: ``ruler`` (every task),
    ``niah`` (the needle tasks); an unknown name is one line naming those there are."""
    from ..measures.tasks import get_task, task_names

    groups = {"ruler": task_names(), "niah": tuple(n for n in task_names() if n.startswith("niah"))}
    out: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        names = groups.get(part.lower()) or (get_task(part).name,)
        out += [n for n in names if n not in out]
    return tuple(out)


def _depths(text: str, option: str = "--passkey-depths") -> tuple[float, ...]:
    """Depths: numbers in [0, 1]; anything else (NaN, inf, a list) one line naming ``option``."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            depth = float(part)
        except ValueError:
            depth = math.nan
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"{option}: {part!r} is not a number in [0, 1]")
        out.append(depth)
    return tuple(out)


def check_options(options: dict[str, Any]) -> None:
    """What the command can check before the model loads: ``--out`` a folder it can write
    (nothing created), ``--device`` one this machine has, the fine-tune's settings."""
    import torch

    from ...cli_errors import check_can_write

    check_can_write(Path(options["out"]), "--out")
    device = options["device"]
    try:
        kind = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"--device {device!r} is no torch device (cpu, cuda, cuda:1)") from None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind.type == "cuda" and not count:
        raise ValueError(f"--device {device}: CUDA is not available here; use --device cpu")
    if kind.type == "cuda" and kind.index is not None and kind.index >= count:
        raise ValueError(f"--device {device}: this machine has {count} CUDA device(s)")
    if kind.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: MPS is not available here; use --device cpu")


def check_finetune(options: dict[str, Any], cfg: Any) -> None:
    """``--finetune pose`` and its settings, before the model loads: the method a RoPE scaling
    (by name), the training length below the target, a finite positive learning rate."""
    from ..methods.finetune import FinetuneConfig
    from ..methods.names import SCALING_METHODS

    if options["finetune"] is None:
        return
    if options["finetune"] != "pose":
        raise ValueError(f"--finetune must be 'pose', got {options['finetune']!r}")
    if options["finetune_method"] not in SCALING_METHODS:
        raise ValueError(
            f"--finetune-method must be one of {', '.join(SCALING_METHODS)}, "
            f"got {options['finetune_method']!r}"
        )
    if not math.isfinite(options["lr"]) or options["lr"] <= 0:
        raise ValueError(f"--lr must be a finite number > 0, got {options['lr']}")
    FinetuneConfig(steps=options["steps"], train_len=options["train_len"], target_len=cfg.target)
