"""The lab: train short, test long. Every registered encoding trained on real text at length L
and measured at L, 2L, 4L, 8L, with inference-time RoPE rescaling, on one CPU or many GPUs.

Modules, by concern: configuration: :mod:`~posenc.lab.config` (the dataclasses),
:mod:`~posenc.lab.presets` (the named presets), :mod:`~posenc.lab.labels` (the one label
parser), :mod:`~posenc.lab.options` (the lab options of a label), :mod:`~posenc.lab.cell` (a cell
resolved once), :mod:`~posenc.lab.identity` (the versioned identities that key results),
:mod:`~posenc.lab.flags` (the CLI's flag table); tokens: :mod:`~posenc.lab.batches`,
:mod:`~posenc.lab.data`, :mod:`~posenc.lab.tasks`; running: :mod:`~posenc.lab.dist`,
:mod:`~posenc.lab.checkpoint`, :mod:`~posenc.lab.train`, :mod:`~posenc.lab.evaluate`,
:mod:`~posenc.lab.run` (what a run holds: lock, distributed state, stop signal, progress, log,
store), :mod:`~posenc.lab.experiment` (the grid), :mod:`~posenc.lab.extend` (``posenc lab
extend``: extension by fine-tuning), :mod:`~posenc.lab.lock`, :mod:`~posenc.lab.progress`;
results: :mod:`~posenc.lab.rows` (the rows as dataclasses), :mod:`~posenc.lab.store`,
:mod:`~posenc.lab.results` (the one reader), :mod:`~posenc.lab.report` and
:mod:`~posenc.lab.extend_report` (tables, CSV, figures), :mod:`~posenc.lab.stats` (intervals over
seeds); :mod:`~posenc.lab.passkey` (the byte-level passkey prompt), :mod:`~posenc.lab.probe` (the
attention probe's model), :mod:`~posenc.lab.cli` (``posenc lab``).

Names below are imported on first use, so ``import posenc.lab`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

#: How long the default grid (bare ``posenc lab``: preset cpu-small, 13 encodings, one thread)
#: takes, measured: ``make lab`` 3 min 30 s after set-up from a fresh clone, two workers, on the
#: 2-core AMD EPYC (Zen 4) VM on 2026-12-04 (6 min 18 s to 6 min 59 s on the slower AVX2 VMs,
#: measured before the lab's processes kept their freed memory; each result row records its own
#: ``cell_seconds``). Every place that states the run time (README, ``posenc lab --help``, the
#: docs, ``posenc report``) says this.
DEFAULT_RUN_TIME = "about 4 minutes on two CPU cores (up to 7 on older AVX2 ones)"

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
    "load_rows": "results",
    "Cell": "cell",
    "resolve_cell": "cell",
    "parse_label": "labels",
    "GridRow": "rows",
    "ExtendRow": "rows",
    "ExtendConfig": "extend",
    "run_extend": "extend",
    "extend_rows": "results",
    "mean_ci": "stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'posenc.lab' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
