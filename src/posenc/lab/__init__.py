"""The lab: train short, test long. Every registered encoding trained on real text at length L
and measured at L, 2L, 4L, 8L, with inference-time RoPE rescaling, on one CPU or many GPUs.

Subpackages, in the order a cell goes through them: :mod:`~posenc.lab.cells` (configuration,
presets, labels, options, a cell resolved once, its identities, the CLI's flag table),
:mod:`~posenc.lab.training` (tokens, batches, distributed state, checkpoints, training),
:mod:`~posenc.lab.evaluation` (bits per byte, tasks, passkey, the attention probe),
:mod:`~posenc.lab.grid` (the grid, worker processes, what a run holds, grid files, preflight
and the estimate), :mod:`~posenc.lab.reports` (rows, the one reader, tables, CSV, figures,
intervals); :mod:`~posenc.lab.extension` is ``posenc lab extend`` (extension by fine-tuning)
and :mod:`~posenc.lab.cli` is ``posenc lab``. The machinery a run needs that is not the
experiment (store, lock, progress, metrics, tables, strict JSON) is :mod:`posenc.runs`.

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

#: Public name -> the module that defines it.
_EXPORTS = {
    "LabConfig": "posenc.lab.cells.presets",
    "ModelShape": "posenc.lab.cells.presets",
    "TrainConfig": "posenc.lab.cells.presets",
    "DataConfig": "posenc.lab.cells.presets",
    "EvalConfig": "posenc.lab.cells.presets",
    "PRESETS": "posenc.lab.cells.presets",
    "preset": "posenc.lab.cells.presets",
    "model_config": "posenc.lab.cells.presets",
    "load_data": "posenc.lab.training.data",
    "train_model": "posenc.lab.training.train",
    "evaluate_model": "posenc.lab.evaluation.evaluate",
    "run_grid": "posenc.lab.grid.experiment",
    "RunOptions": "posenc.lab.grid.experiment",
    "ResultStore": "posenc.runs.store",
    "write_report": "posenc.lab.reports.report",
    "print_table": "posenc.lab.reports.report",
    "load_rows": "posenc.lab.reports.results",
    "Cell": "posenc.lab.cells.cell",
    "resolve_cell": "posenc.lab.cells.cell",
    "parse_label": "posenc.lab.cells.labels",
    "GridRow": "posenc.lab.reports.rows",
    "ExtendRow": "posenc.lab.reports.rows",
    "ExtendConfig": "posenc.lab.extension.plan",
    "run_extend": "posenc.lab.extension.extend",
    "extend_rows": "posenc.lab.reports.results",
    "mean_ci": "posenc.lab.reports.stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'posenc.lab' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
