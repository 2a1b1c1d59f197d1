"""The lab: train short, test long. Every registered encoding trained on real text at length L
and measured at L, 2L, 4L, 8L, with inference-time RoPE rescaling, on one CPU or many GPUs.

Modules, by concern: :mod:`~posenc.lab.presets` (configuration), :mod:`~posenc.lab.data` and
:mod:`~posenc.lab.tasks` (tokens), :mod:`~posenc.lab.train`, :mod:`~posenc.lab.evaluate`,
:mod:`~posenc.lab.experiment` (the grid), :mod:`~posenc.lab.store` (results),
:mod:`~posenc.lab.lock` (one run per output folder), :mod:`~posenc.lab.progress` (progress bars),
:mod:`~posenc.lab.report` (table, CSV, the figure), :mod:`~posenc.lab.stats` (intervals over
seeds), :mod:`~posenc.lab.extend` and :mod:`~posenc.lab.extend_report` (``posenc lab extend``:
extension by fine-tuning), :mod:`~posenc.lab.passkey` (the byte-level passkey prompt),
:mod:`~posenc.lab.cli` (``posenc lab``).

Names below are imported on first use, so ``import posenc.lab`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

#: How long the default grid (bare ``posenc lab``: preset cpu-small, 13 encodings, one thread)
#: takes, measured: 5 min 54 s from a fresh clone after set-up on the 2-core x86-64 VM of the
#: README's table (each result row records its own ``cell_seconds``). Every place that states
#: the run time (README, ``posenc lab --help``, the docs, ``posenc report``) says this.
DEFAULT_RUN_TIME = "about 8 minutes on two CPU cores"

_EXPORTS = {
    "LabConfig": "presets",
    "ModelShape": "presets",
    "TrainConfig": "presets",
    "DataConfig": "presets",
    "EvalConfig": "presets",
    "PRESETS": "presets",
    "preset": "presets",
    "model_config": "presets",
    "load_data": "data",
    "train_model": "train",
    "evaluate_model": "evaluate",
    "run_grid": "experiment",
    "RunOptions": "experiment",
    "ResultStore": "store",
    "write_report": "report",
    "print_table": "report",
    "load_rows": "report",
    "ExtendConfig": "extend",
    "run_extend": "extend",
    "extend_rows": "extend_report",
    "mean_ci": "stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'posenc.lab' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
