"""What ``posenc extend --dry-run`` says, and a real run prints before its first cell: the cells a
study has left, what they cost on this machine and the memory its longest forward needs.

The time is operations times the measured seconds per operation (:mod:`.estimate`: the median of
three timed forwards after a warm-up), plus for each task sample its decode steps at the measured
fixed cost of a one-token step; it is an upper bound in the tokens generated (each task's full
answer budget is counted) and a point estimate in speed. Questions asked of one prefilled context
(``--questions-per-context``) share its prefill: a cell costs one prefill per context.
"""

from __future__ import annotations

from typing import Any

from ..._markdown import counted


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def study_seconds(model: Any, shape: Any, cfg: Any, todo: list[Any]) -> float:
    """The seconds the cells ``todo`` of study ``cfg`` take on this machine (see the module)."""
    from ..measures.tasks import get_task
    from .estimate import forward_flops, seconds_per_flop, step_seconds, task_cell_flops
    from .longppl_cells import cell_forwards

    per_flop, per_step = seconds_per_flop(model, shape), step_seconds(model)
    total = 0.0
    for c in todo:
        if c.kind != "task":  # a keytokens cell: its whole forward and its short windows'
            forwards = cell_forwards(c.kind, c.length, cfg)
            total += sum(forward_flops(shape, n, c.method.name) for n in forwards) * per_flop
            continue
        steps = get_task(c.task).max_new_tokens + 16  # the reference's tokens: a few
        flops = task_cell_flops(shape, c.length, c.method.name, cfg.task_samples, steps,
                                cfg.questions_for(str(c.task)))  # fmt: skip
        total += flops * per_flop + cfg.task_samples * steps * per_step
    return total


def plan_text(model: Any, shape: Any, cfg: Any, todo: list[Any], need: int, have: int,
              done: int = 0) -> str:  # fmt: skip
    """One paragraph: the cells ``todo`` not yet in the folder (``done`` are there already: a
    resumed study costs what is left), by kind, with their lengths; their time on this machine;
    the peak memory ``need`` against ``have``."""
    from ..measures.tasks import get_task
    from .longppl_cells import cell_forwards

    kinds = {k: sum(c.kind == k for c in todo) for k in ("passkey", "task", "keytokens", "longppl")}
    parts = [f"{counted(len(cfg.methods), 'method')} set for {cfg.target} tokens"]
    if cfg.documents:
        parts.append(f"perplexity at {cfg.lengths[-1]} tokens on "
                     f"{counted(len(cfg.documents), 'document')}")  # fmt: skip
    if cfg.longppl:
        short = sum(len(cell_forwards(c.kind, c.length, cfg)) - 1 for c in todo)
        parts.append(f"{counted(kinds['keytokens'], 'key-token cell')} "
                     f"({counted(short, 'short forward')}, evaluator {cfg.evaluator}), "
                     f"{counted(kinds['longppl'], 'LongPPL cell')}")  # fmt: skip
    if cfg.passkey_lengths:
        parts.append(counted(kinds["passkey"], "passkey prompt"))
    tasks = [c for c in todo if c.kind == "task"]
    task_text = f"{counted(kinds['task'], 'task cell')} of {counted(cfg.task_samples, 'sample')}"
    grouped = sorted({str(c.task) for c in tasks if cfg.questions_for(str(c.task)) > 1})
    if grouped:
        contexts = counted(cfg.task_samples // cfg.task_questions, "prefilled context")
        task_text += f" ({contexts} of {cfg.task_questions} questions"
        if len(grouped) < len({c.task for c in tasks}):
            task_text += f" for {', '.join(grouped)}; one question a context for the others"
        task_text += ")"
    if tasks:
        lengths = ", ".join(str(n) for n in sorted({c.length for c in tasks}))
        answer = max(get_task(str(c.task)).max_new_tokens for c in tasks)
        task_text += f" at {lengths} tokens, each answer at most {answer} new tokens"
    if cfg.tasks:
        parts.append(task_text)
    if done:
        parts.append(f"{done} more already in the folder")
    seconds = study_seconds(model, shape, cfg, todo)
    return (f"{counted(len(todo), 'cell')} ({'; '.join(parts)}): about {_duration(seconds)} on "
            f"this machine at most, peak memory about {need / 2**30:.1f} GiB of "
            f"{have / 2**30:.1f} GiB available")  # fmt: skip
