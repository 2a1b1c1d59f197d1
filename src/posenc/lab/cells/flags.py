"""``posenc lab``'s options as one table: each :class:`Flag` names its command-line spelling, the
field it fills and, for a knob of the grid, where that value goes in a
:class:`~posenc.lab.cells.config.LabConfig` (``"train.steps"``). The typer commands, the
:class:`Overrides` dataclass and :func:`build_config` are all generated from the table, so a
knob is added in one line.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass, replace
from pathlib import Path
from typing import Any

import typer

from .config import LabConfig
from .labels import normalize_label
from .preset_table import PRESETS
from .preset_table import preset as get_preset


def csv_list(value: str | None) -> list[str] | None:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; None stays None."""
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def option_list(option: str, value: str, allowed: str) -> list[str]:
    """``"a, b"`` -> ``["a", "b"]`` for option ``option``; ValueError naming it for an empty
    list or an empty item (``"a,,b"``), saying what is ``allowed``."""
    items = [v.strip() for v in value.split(",")]
    if not any(items):
        raise ValueError(f"{option} is empty; give {allowed}")
    if not all(items):
        raise ValueError(f"{option} {value!r} has an empty item; give {allowed}")
    return items


#: The largest value each integer option takes: far past any run this machine or a GPU node
#: finishes, and small enough that nothing is allocated or looped over from a typo.
MAX_TOKENS = 2**24
INT_CAPS: dict[str, int] = {
    "train_len": MAX_TOKENS,
    "seeds": 1000,
    "seed": 2**63 - 1,
    "steps": 10**9,
    "batch_size": 2**20,
    "dim": 2**16,
    "layers": 2**10,
    "heads": 2**12,
    "eval_tokens": 2**32,
    "sliding": MAX_TOKENS,
    "threads": 2**12,
    "jobs": 2**10,
    "ckpt_every": 10**9,
}

_LENGTHS = "comma-separated eval lengths: tokens (256) or multiples of the train length (4x)"


def _lengths(value: str) -> tuple[int | str, ...]:
    items = option_list("--eval-lens", value, _LENGTHS)
    return tuple(int(v) if v.isdigit() else v for v in items)


def rope_scaling_names() -> tuple[str, ...]:
    """The inference-time RoPE rescalings the grid sweeps (the scaling table's, less
    ``default``)."""
    from ...functional.rope_scaling import ROPE_TYPES

    return tuple(t for t in ROPE_TYPES if t != "default")


def check_rope_scalings(
    scalings: tuple[str, ...] | list[str], option: str = "--rope-scalings"
) -> None:
    """ValueError naming ``option`` for a rescaling the grid cannot sweep (or ``none`` with
    others)."""
    allowed = rope_scaling_names()
    others = [s for s in scalings if s != "none"]
    if "none" in scalings and others:
        raise ValueError(
            f"{option}: 'none' (no rescaling) stands alone, not with {','.join(others)}; "
            f"give none, or some of {', '.join(allowed)}"
        )
    for name in scalings:
        if name not in allowed:
            raise ValueError(
                f"{option}: unknown rescaling {name!r}; allowed: {', '.join(allowed)}, "
                "or none alone"
            )


def _scalings(value: str) -> tuple[str, ...]:
    allowed = f"one or more of {', '.join(rope_scaling_names())}, or none alone"
    scal = [v.lower() for v in option_list("--rope-scalings", value, allowed)]
    if scal == ["none"]:
        return ()
    check_rope_scalings(scal)
    return tuple(scal)


#: ``--device``: what it takes.
DEVICES = ("auto", "cpu", "cuda")


def check_device(device: str) -> None:
    """ValueError naming ``--device`` unless it is auto, cpu, cuda or cuda:N."""
    kind, _, index = str(device).partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(
            f"--device must be one of {', '.join(DEVICES)} (or cuda:N), got {device!r}"
        )


def check_caps(values: dict[str, Any]) -> None:
    """ValueError naming the option whose integer (by field) is past :data:`INT_CAPS`."""
    for name, value in values.items():
        cap = INT_CAPS.get(name)
        if cap is None or isinstance(value, bool) or not isinstance(value, int) or value <= cap:
            continue
        digits = len(str(value)) if value < 10**30 else None
        shown = f"{value}" if digits else "a number of more than 30 digits"
        flag = next((f.decls[0] for f in LAB_FLAGS if f.field == name), name)
        raise ValueError(f"{flag} must be at most {cap}, got {shown}")


@dataclass(frozen=True)
class Flag:
    """One option: ``field`` (the command's parameter), its ``decls`` (``--train-len``, ``-L``),
    ``type`` and ``default``; ``path`` where its value goes in a LabConfig (None: not a field of
    it, or set by :func:`build_config` itself), ``convert`` from the option's text to that value;
    ``grid``: a knob of the grid (an :class:`Overrides` field) rather than of the run;
    ``metavar``: the value's name in ``--help`` (default: its type); ``several``: the option
    takes several values (comma-separated or repeated), so a grid file's key takes a list
    (:mod:`posenc.lab.grid.grid_file`)."""

    field: str
    decls: tuple[str, ...]
    type: Any
    help: str
    default: Any = None
    path: str | None = None
    convert: Callable[[Any], Any] | None = None
    grid: bool = True
    min: int | None = None
    none: str = "none"
    show_default: str | bool | None = None
    get: Callable[[LabConfig], Any] | None = None
    unset: Any = None
    metavar: str | None = None
    several: bool = False

    def option(self) -> Any:
        """The typer option; a knob with a ``path`` shows each preset's value as its default."""
        kw: dict[str, Any] = {"help": self.help}
        if self.metavar is not None:
            kw["metavar"] = self.metavar
        if self.min is not None:
            kw["min"] = self.min
        if self.show_default is not None:
            kw["show_default"] = self.show_default
        elif self.get is not None or (self.path is not None and self.default is None):
            get = self.get or (lambda cfg: _get(cfg, self.path or ""))
            kw["show_default"] = preset_default(get, self.none)
        return typer.Option(self.default, *self.decls, **kw)


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set(cfg: Any, path: str, value: Any) -> Any:
    """``cfg`` with the field at dotted ``path`` replaced (frozen dataclasses, rebuilt upwards)."""
    head, _, rest = path.partition(".")
    return replace(cfg, **{head: _set(getattr(cfg, head), rest, value) if rest else value})


def preset_default(get: Callable[[LabConfig], Any], none: str = "none") -> str:
    """Each preset's value of an option (``get`` reads it), for ``--help``: ``"cpu-small 500, cpu 2000, ..."``, or
    the one value when every preset has it; ``none`` says what None means."""

    def show(v: Any) -> str:
        if v is None:
            return none
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, tuple):
            return ",".join(map(str, v)) or "none"
        return str(v)

    values = {name: show(get(cfg)) for name, cfg in PRESETS.items()}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return ", ".join(f"{name} {v}" for name, v in values.items())


_SEEDS = "Number of seeds per encoding (the report gives mean and 95% interval)."
_ENCODINGS = (
    "Comma-separated names from `posenc list` (name:key=value sets an option; module:name "
    "imports module and runs its encoding name), 'default' (the "
    "standard set that is registered), 'length' (training-time length methods, CoPE, Llama-4 "
    "NoPE layers and temperature) or 'all'."
)
_TASK = "A synthetic task: copy, reverse, associative-recall, passkey (retrieval heatmaps)."
_SLIDING = "Sliding-window evaluation with this stride (none: non-overlapping windows)."

#: Options shared by ``posenc lab`` and ``posenc lab extend``.
OUT = Flag("out", ("--out", "-o"), Path, "Output folder.", Path("runs/lab"), grid=False)
RESUME = Flag("resume", ("--resume",), bool, "Continue interrupted cells.", False, grid=False)
RESTART = Flag(
    "restart", ("--restart",), bool, "Discard interrupted cells' progress.", False, grid=False
)
DEVICE = Flag("device", ("--device",), str, "auto, cpu or cuda.", "auto", grid=False)
QUIET = Flag("quiet", ("--quiet", "-q"), bool, "No progress bar or log.", False, grid=False)
PLOTS = Flag("plots", ("--plots/--no-plots",), bool, "Write PNG plots.", True, grid=False)
JOBS = Flag(
    "jobs",
    ("--jobs", "-j"),
    int | None,
    "Cells run at once, in worker processes (each with its share of the threads); 1 on CUDA "
    "and under torchrun.",
    min=1,
    none="one per core",
    show_default="one per core",
    grid=False,
)
FORCE = Flag(
    "force",
    ("--force",),
    str | None,
    "Train these cells again from step 0 though finished, their new row replacing the stored "
    "one: comma-separated labels as the grid spells them, or 'all'.",
    grid=False,
    several=True,
)
DRY_RUN = Flag(
    "dry_run",
    ("--dry-run",),
    bool,
    "Print the cells, the memory and time estimate and the output folder; train nothing.",
    False,
    grid=False,
)
REPORT_TO = Flag(
    "report_to",
    ("--report-to",),
    str,
    "none, or tensorboard: an event file per cell beside its metrics.jsonl (needs "
    "pip install -e '.[tensorboard]' in the posenc clone).",
    "none",
    grid=False,
)
IMPORT = Flag(
    "imports",
    ("--import",),
    list[str] | None,
    "Import this module first (repeatable): its register() calls add encodings.",
    grid=False,
    metavar="MODULE",
    several=True,
)
CONFIG = Flag(
    "config",
    ("--config",),
    Path | None,
    "A TOML grid file whose keys are these options' long names (train-len = 64, encodings = "
    "['rope', 'alibi']); an option given here too overrides the file.",
    grid=False,
    metavar="FILE",
)

#: ``posenc lab``: flag -> field (and LabConfig path), in ``--help`` order.
LAB_FLAGS: tuple[Flag, ...] = (
    CONFIG,
    Flag("encodings", ("--encodings", "-e"), str, _ENCODINGS, "default", several=True),
    Flag("preset", ("--preset", "-p"), str, "cpu-small, cpu, gpu or gpu-small.", "cpu-small",
         grid=False),
    Flag("train_len", ("--train-len", "-L"), int | None, "Train length L.", path="train_len",
         min=2),
    Flag("eval_lens", ("--eval-lens",), str | None,
         "Comma-separated eval lengths: tokens (256) or multiples (4x).", path="eval.lengths",
         convert=_lengths, several=True),
    Flag("seeds", ("--seeds",), int | None, _SEEDS, min=1, get=lambda c: len(c.seeds)),
    Flag("seed", ("--seed",), int, "First seed.", 0, unset=0),
    Flag("steps", ("--steps",), int | None, "Training steps.", path="train.steps", min=1),
    Flag("batch_size", ("--batch-size",), int | None, "Global batch (sequences).",
         path="train.batch_size", min=1),
    Flag("lr", ("--lr",), float | None, "Peak learning rate (> 0).", path="train.lr"),
    Flag("dim", ("--dim",), int | None, "Model width.", path="model.dim", min=1),
    Flag("layers", ("--layers",), int | None, "Number of blocks.", path="model.num_layers",
         min=1),
    Flag("heads", ("--heads",), int | None, "Attention heads.", path="model.num_heads", min=1),
    Flag("eval_tokens", ("--eval-tokens",), int | None, "Test tokens per length.",
         path="eval.tokens", min=1),
    Flag("sliding", ("--sliding",), int | None, _SLIDING, path="eval.stride", min=1),
    Flag("rope_scalings", ("--rope-scalings",), str | None,
         "RoPE rescalings to sweep (linear,ntk,dynamic,yarn or none).",
         path="eval.rope_scalings", convert=_scalings, several=True),
    Flag("text", ("--text",), str | None, "Your corpus: a file, folder or glob."),
    Flag("dataset", ("--dataset",), str | None,
         "A Hugging Face dataset NAME[:CONFIG] in the local cache."),
    Flag("task", ("--task",), str | None, _TASK),
    Flag("include_tests", ("--include-tests/--no-include-tests",), bool | None,
         "Read the stdlib's test suites too.", path="data.include_tests"),
    OUT,
    RESUME,
    RESTART,
    Flag("threads", ("--threads",), int | None, "torch CPU threads.", path="threads", min=1,
         none="every core", grid=False),
    JOBS,
    FORCE,
    DRY_RUN,
    REPORT_TO,
    IMPORT,
    DEVICE,
    Flag("ckpt_every", ("--ckpt-every",), int | None, "Checkpoint interval.", path="ckpt_every",
         min=1),
    Flag("compile_model", ("--compile/--no-compile",), bool | None,
         "Train through torch.compile, on CUDA only. Not part of any hash.", path="compile"),
    QUIET,
    PLOTS,
)  # fmt: skip

#: What ``posenc lab``'s options change in a preset, by field; None keeps the preset's value.
#: ``encodings``, ``eval_lens`` and ``rope_scalings`` are comma-separated (``rope_scalings``
#: ``"none"``: no rescaling); ``text``, ``dataset`` and ``task`` pick the data (at most one);
#: ``seeds`` seeds from ``seed`` on (None: the preset's number of seeds).
Overrides = make_dataclass(
    "Overrides",
    [(f.field, f.type, field(default=f.unset)) for f in LAB_FLAGS if f.grid],
    frozen=True,
)
Overrides.__module__ = __name__
Overrides.__doc__ = (
    "What ``posenc lab``'s options change in a preset (:data:`LAB_FLAGS`' grid knobs)."
)


def build_config(preset: str, over: Any = None) -> LabConfig:
    """The preset named ``preset`` with the fields of ``over`` (an :class:`Overrides`) set."""
    over = over or Overrides()
    check_caps({f.field: getattr(over, f.field, None) for f in LAB_FLAGS if f.grid})
    cfg = get_preset(preset)
    seeds = over.seeds if over.seeds is not None else len(cfg.seeds)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    labels = (
        list(cfg.encodings)
        if over.encodings is None
        else option_list(
            "--encodings",
            over.encodings,
            "comma-separated names from `posenc list`, default, length or all",
        )
    )
    cfg = replace(cfg, encodings=tuple(map(normalize_label, labels)),
                  seeds=tuple(range(over.seed, over.seed + seeds)))  # fmt: skip
    for flag in LAB_FLAGS:
        value = getattr(over, flag.field, None) if flag.grid and flag.path else None
        if value is not None:
            cfg = _set(cfg, flag.path, flag.convert(value) if flag.convert else value)  # type: ignore[arg-type]
    if over.eval_lens is not None:
        check_eval_lengths(cfg)
    if cfg.train.warmup_steps >= cfg.train.steps:
        cfg = _set(cfg, "train.warmup_steps", max(1, cfg.train.steps // 10))
    return _data_source(cfg, over)


def check_eval_lengths(cfg: LabConfig) -> list[int]:
    """The grid's eval lengths in tokens; ValueError naming ``--eval-lens`` for a length that is
    not positive or past :data:`MAX_TOKENS`."""
    from .config import resolve_lengths

    given = ",".join(map(str, cfg.eval.lengths))
    try:
        lengths = resolve_lengths(cfg.eval.lengths, cfg.train_len)
    except ValueError as e:
        raise ValueError(f"--eval-lens {given!r}: {e}") from None
    if max(lengths) > MAX_TOKENS:
        raise ValueError(
            f"--eval-lens {given!r}: each length must be at most {MAX_TOKENS} tokens, got {max(lengths)}"
        )
    return lengths


def check_grid(cfg: LabConfig) -> None:
    """What the options of ``posenc lab`` refuse in a grid built without them (the Python
    API): integers past :data:`INT_CAPS`, bad eval lengths, unknown RoPE rescalings."""
    seeds = {"seeds": len(cfg.seeds), "seed": max(cfg.seeds, default=0)}
    check_caps({"threads": cfg.threads, **seeds})
    check_caps({f.field: _get(cfg, f.path) for f in LAB_FLAGS if f.path is not None})
    lr = cfg.train.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
        raise ValueError(f"--lr must be a positive finite number, got {lr!r}")
    check_eval_lengths(cfg)
    check_rope_scalings(cfg.eval.rope_scalings)


def _data_source(cfg: LabConfig, over: Any) -> LabConfig:
    """``--text``, ``--dataset`` or ``--task`` (at most one): the grid's data source."""
    sources = [s for s, v in (("text", over.text), ("hf", over.dataset), ("task", over.task)) if v]
    if len(sources) > 1:
        raise ValueError("pass at most one of --text, --dataset, --task")
    if not sources:
        return cfg
    data = replace(cfg.data, source=sources[0], path=over.text, dataset=over.dataset,
                   task=over.task)  # fmt: skip
    return replace(cfg, data=data)


def with_flags(body: Callable[..., None], flags: tuple[Flag, ...], *, context: bool) -> Any:
    """A command function for typer whose parameters are ``flags`` (after a ``ctx`` when
    ``context``), calling ``body(ctx, **values)`` or ``body(**values)``."""

    def command(*args: Any, **values: Any) -> None:
        body(*args, **values)

    params = [
        inspect.Parameter(f.field, inspect.Parameter.KEYWORD_ONLY, default=f.option(),
                          annotation=f.type)
        for f in flags
    ]  # fmt: skip
    annotations = {f.field: f.type for f in flags}
    if context:
        ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=typer.Context)  # fmt: skip
        params.insert(0, ctx)
        annotations["ctx"] = typer.Context
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    command.__annotations__ = {**annotations, "return": None}
    command.__doc__ = body.__doc__
    command.__name__ = body.__name__.lstrip("_")
    return command
