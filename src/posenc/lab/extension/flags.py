"""``posenc lab extend``'s options: its flag -> field table (:data:`EXTEND_FLAGS`, which the
command line and a ``--config`` file both read) and the :class:`~posenc.lab.extension.plan.ExtendConfig`
its values make (:func:`extend_config`), each value checked where it is converted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..cells.flags import (
    DEVICE,
    IMPORT,
    OUT,
    PLOTS,
    QUIET,
    REPORT_TO,
    RESTART,
    RESUME,
    Flag,
    option_list,
)

if TYPE_CHECKING:
    from .plan import ExtendConfig

#: ``posenc lab extend``: flag -> field (its :class:`~posenc.lab.extension.plan.ExtendConfig`'s
#: where a ``path`` is given), in ``--help`` order.
EXTEND_FLAGS: tuple[Flag, ...] = (
    Flag("config", ("--config",), Path | None,
         "A TOML file whose keys are these options' long names (target = 2.0, methods = "
         "['none', 'yarn']); an option given here too overrides the file.", grid=False,
         metavar="FILE"),
    OUT,
    Flag("group", ("--group", "-g"), str | None, "The grid (hash prefix).",
         show_default="the newest"),
    Flag("target", ("--target",), float, "Fine-tune length as a multiple of L.", 4.0,
         path="target"),
    Flag("steps", ("--steps",), int | None, "Fine-tune steps.", min=1, path="steps",
         show_default="2% of the grid's steps"),
    Flag("lr", ("--lr",), float | None, "Constant fine-tune learning rate.", path="lr",
         show_default="the grid's final"),
    Flag("methods", ("--methods",), str | None,
         "RoPE methods: none (unscaled), linear (PI), ntk, yarn, longrope, dynamic.",
         path="methods", convert=lambda v: extend_methods(v), show_default="all six",
         several=True),
    Flag("encodings", ("--encodings", "-e"), str | None,
         "Grid encodings to extend (rotary ones with every method, the others unchanged).",
         path="encodings", convert=lambda v: tuple(option_list("--encodings", v, _EXTENDABLE)),
         show_default="rope and the registered biases", several=True),
    Flag("reference", ("--reference",), str | None,
         "Encodings trained from scratch at the target length (the bar); 'none' for none.",
         path="reference", show_default="rope", several=True,
         convert=lambda v: () if v.strip().lower() == "none"
         else tuple(option_list("--reference", v, _EXTENDABLE + ", or none"))),
    Flag("curve", ("--curve",), str | None,
         "Fine-tune steps evaluated at the target length (e.g. 1,2,5).", path="curve",
         convert=lambda v: tuple(int_list("--curve", v)),
         show_default="1,2,5,10,... below --steps", several=True),
    RESUME,
    RESTART,
    Flag("threads", ("--threads",), int | None, "torch CPU threads.", min=1, grid=False,
         show_default="the grid's"),
    REPORT_TO,
    IMPORT,
    DEVICE,
    QUIET,
    PLOTS,
)  # fmt: skip


def extend_config(given: dict[str, Any]) -> ExtendConfig:
    """The :class:`~posenc.lab.extension.plan.ExtendConfig` of ``posenc lab extend``'s options
    ``given`` (by field, as the command line or a ``--config`` file gives them; None: the default)."""
    from .plan import ExtendConfig  # torch: not at import (``posenc --help`` stays fast)

    target = given.get("target")
    if target is not None and not math.isfinite(target):
        raise ValueError(f"--target must be a finite multiple of the train length, got {target}")
    fields: dict[str, Any] = {}
    for flag in EXTEND_FLAGS:
        value = given.get(flag.field)
        if flag.path is not None and value is not None:
            fields[flag.path] = flag.convert(value) if flag.convert else value
    return ExtendConfig(**fields)


def int_list(option: str, value: str) -> list[int]:
    """``value`` (``--curve 1,2,5``) as integers, or a ValueError naming ``option``."""
    items = option_list(option, value, "comma-separated integers")
    try:
        return [int(v) for v in items]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, got {value!r}") from None


_EXTENDABLE = "comma-separated names of the grid's encodings (rope, alibi, t5, ...)"


def extend_methods(value: str) -> tuple[str, ...]:
    """``--methods``: some of the extend's RoPE methods, each known."""
    from .plan import ROPE_METHODS

    allowed = ", ".join(ROPE_METHODS)
    methods = [m.lower() for m in option_list("--methods", value, f"some of {allowed}")]
    unknown = [m for m in methods if m not in ROPE_METHODS]
    if unknown:
        raise ValueError(f"--methods: unknown method {unknown[0]!r}; allowed: {allowed}")
    return tuple(methods)
