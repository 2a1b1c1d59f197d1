"""What :func:`posenc.testing.check_rope` found: one row per (layer type, dtype, probe).

``assert report.ok, report`` prints a table whose first line names the first failing probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .diagnose import Diagnosis

Position = int | tuple[int, ...]


@dataclass(frozen=True)
class ProbeResult:
    """One probe of one layer type in one dtype.

    ``q_err``/``k_err``: the worst absolute error of the rotated queries/keys against the
    float64 reference (inputs of unit norm per head vector; ``inf`` when the call raised or
    returned the wrong shape). ``cos_sin_err``: for implementations that return cos/sin, the
    worst error of the tables themselves (None otherwise), judged against
    ``cos_sin_threshold``. ``first_failing_position``: the position id of the first token (in
    batch-row, then sequence order) over the threshold, ``(t, h, w)`` for M-RoPE.
    """

    layer_type: str | None
    dtype: str
    probe: str
    q_err: float
    k_err: float
    threshold: float
    passed: bool
    first_failing_position: Position | None = None
    cos_sin_err: float | None = None
    cos_sin_threshold: float | None = None
    note: str = ""

    @property
    def where(self) -> str:
        """``"[layer_type dtype] probe"``."""
        layer = "" if self.layer_type is None else f"{self.layer_type} "
        return f"[{layer}{self.dtype}] {self.probe}"

    def summary(self) -> str:
        """One line: the worst error against the threshold, and where it first went wrong."""
        worst = max(self.q_err, self.k_err)
        line = f"{self.where}: max |err| {worst:.3g} (threshold {self.threshold:.3g})"
        if self.cos_sin_err is not None:
            line += f", cos/sin {self.cos_sin_err:.3g} (threshold {self.cos_sin_threshold:.3g})"
        if self.first_failing_position is not None:
            line += f", first failing position {self.first_failing_position}"
        return line + (f"; {self.note}" if self.note else "")


@dataclass
class RopeReport:
    """The results of :func:`~posenc.testing.check_rope`, in probe order.

    ``ok``: every probe passed (and at least one ran). ``failures``: the failing rows.
    ``skipped``: probes and layer types not run, each with the reason. ``diagnosis``: for a
    failing report, the likely cause fitted to the error's pattern
    (:func:`~posenc.testing.diagnose.diagnose`), printed under the first line; None if none fits.
    """

    config: str
    kind: str
    results: list[ProbeResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    max_rows: int = 40
    diagnosis: Diagnosis | None = None

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> list[ProbeResult]:
        return [r for r in self.results if not r.passed]

    def _table(self) -> list[str]:
        rows = [*self.failures, *(r for r in self.results if r.passed)]
        cos_sin = any(r.cos_sin_err is not None for r in rows)
        head = ["", "layer type", "dtype", "probe", "q err", "k err"]
        head += ["cos/sin err"] if cos_sin else []
        head += ["threshold", "first failing"]
        lines = []
        for r in rows[: self.max_rows]:
            cells = ["FAIL" if not r.passed else "ok", str(r.layer_type or "-"), r.dtype, r.probe]
            cells += [f"{r.q_err:.3g}", f"{r.k_err:.3g}"]
            if cos_sin:
                cells.append("-" if r.cos_sin_err is None else f"{r.cos_sin_err:.3g}")
            first = r.first_failing_position  # position 0 is a position, not "none"
            cells += [f"{r.threshold:.3g}", "-" if first is None else str(first)]
            lines.append(cells)
        widths = [max(len(c) for c in col) for col in zip(head, *lines, strict=False)]
        out = ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
               for cells in (head, *lines)]  # fmt: skip
        if len(rows) > self.max_rows:
            out.append(f"... {len(rows) - self.max_rows} more rows (all passed)")
        return out

    def __str__(self) -> str:
        failures = self.failures
        if not self.results:
            status = "FAIL: no probe ran"
        elif failures:
            status = f"FAIL: {len(failures)} of {len(self.results)} probes failed; first {failures[0].summary()}"
        else:
            status = f"ok: {len(self.results)} probes passed"
        lines = [f"RopeReport for {self.config} ({self.kind}): {status}"]
        lines += [str(self.diagnosis)] if self.diagnosis is not None else []
        lines += self._table()
        lines += [f"skipped {s}" for s in self.skipped]
        return "\n".join(lines)
