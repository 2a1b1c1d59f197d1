"""What ``posenc lab`` checks and prints before anything trains: every option of the grid (a
number out of range, a model shape, an encoding that does not build, a device that is not
there), the run's peak memory against the memory available (:mod:`posenc.lab.grid.estimate`; a run
that will not fit is refused in one line), and the :class:`Plan` that ``--dry-run`` prints: the
cells, the estimate of each and of the run, and the output folder.

Nothing here reads the corpus: cells are resolved on bytes (a vocabulary of 256).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...model import ModelConfig
from ..cells.config import LabConfig
from ..cells.flags import check_device, check_grid
from .estimate import Estimate, label_cost, with_time
from .timing import measure

#: The vocabulary the preflight resolves cells on (bytes), before any data is read.
PREFLIGHT_VOCAB = 256


def preflight(cfg: LabConfig, device: str = "auto", *, jobs: int = 1, threads: int = 1) -> Estimate:
    """Refuse a grid before any data is read or cell trained: ValueError naming what is wrong
    (a number out of range, a model shape, an encoding or option that does not build at this
    shape, a device that is not there, a run whose estimated peak memory with ``jobs`` cells
    at once does not fit in the memory available). Each label is resolved into its cell (on
    bytes), its model counted on the meta device and, once the run fits, its encoding built as
    the model would. Returns the run's (untimed) :class:`~posenc.lab.grid.estimate.Estimate`."""
    dev = check_options(cfg, device)
    models = cell_models(cfg)
    # Blocks and activations first (nothing built), then with each encoding built and counted:
    # an encoding's tables are never allocated for a run whose activations cannot fit.
    estimate_run(cfg, models, dev, jobs=jobs, threads=threads, encodings=False).check()
    estimate = estimate_run(cfg, models, dev, jobs=jobs, threads=threads)
    estimate.check()
    return estimate


def check_options(cfg: LabConfig, device: str) -> str:
    """The grid's options and model shape, and the device (returned resolved: ``cpu``,
    ``cuda:0``)."""
    from ..._checks import check_positive_int
    from ..training.dist import resolve_device
    from .experiment import check_config

    check_grid(cfg)
    check_device(device)
    check_config(cfg)
    shape = cfg.model
    for name, value in (("dim", shape.dim), ("layers", shape.num_layers),
                        ("heads", shape.num_heads)):  # fmt: skip
        check_positive_int(f"--{name}", value)
    if shape.dim % shape.num_heads:
        raise ValueError(f"--dim ({shape.dim}) must be divisible by --heads ({shape.num_heads})")
    try:
        dev = resolve_device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device}: {e}") from None
    return str(dev) if dev.type != "cuda" or dev.index is not None else "cuda:0"


def cell_models(cfg: LabConfig) -> dict[str, ModelConfig]:
    """Each label's model config (its first seed's cell, on bytes), in grid order."""
    from ..cells.cell import resolve_cell, resolve_labels

    return {
        label.text: resolve_cell(cfg, label, cfg.seeds[0], PREFLIGHT_VOCAB, "preflight").model
        for label in resolve_labels(cfg.encodings)
    }


def estimate_run(
    cfg: LabConfig,
    models: dict[str, ModelConfig],
    device: str,
    *,
    jobs: int,
    threads: int,
    timed: bool = False,
    encodings: bool = True,
) -> Estimate:
    """The run's :class:`~posenc.lab.grid.estimate.Estimate` (``timed``: with the first cell of
    each encoding timed, :func:`~posenc.lab.grid.timing.measure`, and that throughput used
    for the family's other cells; ``encodings``: build and count each encoding). ValueError
    naming a label whose encoding does not build at this shape."""
    from ..._sizes import available_bytes

    costs, timings = [], {}
    for label, model in models.items():
        try:
            cost = label_cost(cfg, label, model, device, encodings=encodings)
        except (TypeError, ValueError) as e:
            raise ValueError(f"encoding {label!r} cannot be built at this shape: {e}") from None
        # Timed per encoding, not per family: DeBERTa's step is twice Shaw's.
        if timed and model.encoding not in timings:
            timings[model.encoding] = measure(cfg, model, device, threads)
        timing = timings.get(model.encoding)
        costs.append(cost if timing is None else with_time(cost, cfg, model, timing))
    return Estimate(
        costs=tuple(costs),
        seeds=len(cfg.seeds),
        jobs=max(1, min(jobs, len(costs) * len(cfg.seeds))),
        threads=threads,
        device=device.split(":")[0],
        available=available_bytes(device),
        batch_size=cfg.train.batch_size,
        train_len=cfg.train_len,
    )


@dataclass(frozen=True)
class Plan:
    """A checked grid: its ``cells`` (``label s<seed>``, seeds outer), output folder and
    :class:`~posenc.lab.grid.estimate.Estimate` (None: not estimated)."""

    cells: tuple[str, ...]
    out: Path
    estimate: Estimate | None = None

    def text(self) -> str:
        """What ``posenc lab --dry-run`` prints."""
        if self.estimate is None:
            lines = [f"{len(self.cells)} cell(s):", *(f"  {c}" for c in self.cells)]
        else:
            lines = self.estimate.lines(self.cells)
        lines.append(f"output folder: {self.out}")
        return "\n".join(lines)


def run_jobs(cfg: LabConfig, opts: Any, device: str) -> tuple[int, int]:
    """``(jobs, threads per job)`` the grid will run with (:func:`~posenc.lab.grid.run.resolve_jobs`)."""
    from .run import resolve_jobs

    return resolve_jobs(opts, cfg.threads, device)


def plan_run(cfg: LabConfig, opts: Any, *, timed: bool = False) -> Plan:
    """Check ``cfg`` for a run with ``opts`` (a :class:`~posenc.lab.grid.run.RunOptions`): every
    option, and its peak memory against the memory available (:func:`preflight`); with
    ``timed`` (``--dry-run``, which prints the time) also time a short training step of each
    family's first cell. Return its :class:`Plan`. ValueError (one line) naming what is wrong
    (a row of another results schema in the store at ``opts.out``, which the run's report could
    not read) or, for a run that will not fit, the estimate, the memory available and the options
    to lower."""
    from ..cells.cell import resolve_labels
    from ..reports.results import check_store

    dev = check_options(cfg, opts.device)
    # The report after training reads the whole store: a row it cannot read is refused now.
    check_store(opts.out)
    jobs, threads = run_jobs(cfg, opts, dev)
    estimate = preflight(cfg, opts.device, jobs=jobs, threads=threads)
    if timed:  # a run that trains needs no forecast of its time: only --dry-run prints it
        estimate = estimate_run(cfg, cell_models(cfg), dev, jobs=jobs, threads=threads, timed=True)
    labels = resolve_labels(cfg.encodings)
    cells = tuple(f"{label.text} s{seed}" for seed in cfg.seeds for label in labels)
    return Plan(cells=cells, out=opts.out, estimate=estimate)
