"""Per-step training metrics that a user's tools read: ``metrics.jsonl`` beside each cell's
checkpoints, and on request (``--report-to tensorboard``) a TensorBoard event file there too.

One strict-JSON object a logged step (:mod:`posenc.runs.strict_json`: a non-finite loss is
``null``)::

    {"step": 20, "loss": 4.61, "loss_bits": 6.65, "lr": 0.0008, "tokens": 1280, "elapsed_s": 0.91}

``step`` counts the steps done, ``loss`` is the step's cross-entropy in nats (``loss_bits`` the
same in bits, the lab's unit), ``tokens`` the training tokens seen so far and ``elapsed_s`` the
training seconds so far (both carried across a resume). Each line is flushed as it is written,
so a killed run keeps what it logged; a resumed run first drops the lines past the step it
resumes at, so no step appears twice. The TensorBoard scalars (``train/<key>``) are the same
numbers at the same steps.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import IO, Any

from .atomic import write_file_atomically
from .strict_json import dumps

METRICS_FILE = "metrics.jsonl"
#: What ``--report-to`` takes: the metrics file is always written; these add a logger.
REPORT_TO = ("none", "tensorboard")
#: The keys of a metrics line after ``step``, in order (the TensorBoard tags are ``train/<key>``).
KEYS = ("loss", "loss_bits", "lr", "tokens", "elapsed_s")


def check_report_to(value: str) -> str:
    """``value`` if ``--report-to`` takes it and what it needs is installed; ValueError else."""
    if value not in REPORT_TO:
        raise ValueError(f"--report-to must be one of {', '.join(REPORT_TO)}, got {value!r}")
    if value == "tensorboard":
        try:
            import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
        except ModuleNotFoundError:
            raise ValueError(
                "--report-to tensorboard needs the package 'tensorboard', which is not "
                "installed: pip install -e '.[tensorboard]' in the posenc clone"
            ) from None
    return value


def logged_steps(steps: int) -> int:
    """Every how many steps a run of ``steps`` logs a point: the result row's loss curve's
    spacing (about 200 points a run), so the two hold the same points."""
    return max(1, steps // 200)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The whole lines of a metrics file (a torn last line, from a killed writer, is left out)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


class MetricsLog:
    """One cell's per-step metrics: ``metrics.jsonl`` in ``folder`` and, with
    ``report_to="tensorboard"``, an event file there. :meth:`open` before the first step (at the
    step a run starts or resumes from), :meth:`log` after each step, :meth:`close` at the end."""

    def __init__(self, folder: Path, every: int = 1, report_to: str = "none") -> None:
        self.folder, self.every, self.report_to = Path(folder), max(1, every), report_to
        self._file: IO[str] | None = None
        self._tb: Any = None

    @property
    def path(self) -> Path:
        return self.folder / METRICS_FILE

    def open(self, start: int) -> None:
        """Keep the lines of steps ``<= start`` (those a resume at ``start`` does not redo) and
        append from there; ``start=0`` starts the file afresh."""
        self.folder.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r["step"] <= start] if start else []
        # Atomic: a kill here leaves the old file or the new one.
        write_file_atomically(self.path, "".join(dumps(r) + "\n" for r in kept))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
        if self.report_to == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: TensorBoard hides the events a first run wrote past the resume step.
            self._tb = SummaryWriter(str(self.folder), purge_step=start + 1 if start else None)

    def due(self, step: int, last: int) -> bool:
        """Whether step ``step`` (steps done) of a run of ``last`` steps is logged."""
        return step % self.every == 0 or step == last

    def log(self, step: int, loss: float, lr: float, tokens: int, elapsed: float) -> None:
        """One logged step: ``loss`` in nats (non-finite is written null)."""
        bits = loss / math.log(2) if math.isfinite(loss) else loss
        row = dict(zip(("step", *KEYS), (step, loss, bits, lr, tokens, elapsed), strict=True))
        if self._file is not None:
            self._file.write(dumps(row) + "\n")
            self._file.flush()  # a killed run keeps every line it logged
        if self._tb is not None:
            for key in KEYS:
                value = row[key]
                if isinstance(value, float) and not math.isfinite(value):
                    continue  # TensorBoard has no null; the jsonl line says it
                self._tb.add_scalar(f"train/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
