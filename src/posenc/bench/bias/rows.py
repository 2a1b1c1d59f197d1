"""One row of the benchmark (a bias at one length and dtype: its three candidates), as data.
The benchmark's target figures live with their rules in :mod:`posenc.bench.targets` and are
re-exported here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..rows import number
from ..targets import GPU_TARGET_BIASES, GPU_TARGET_RATIO, TARGET_MIN_S, TARGET_SPEEDUP

__all__ = [
    "GPU_TARGET_BIASES",
    "GPU_TARGET_RATIO",
    "TARGET_MIN_S",
    "TARGET_SPEEDUP",
    "BiasRow",
    "Measurement",
]


@dataclass
class Measurement:
    """One candidate in one row: median ms, first call (s), peak memory growth (bytes)."""

    status: str = "not run"  # "ok", "skipped", "error", "not run"
    ms: float = float("nan")
    first_s: float = float("nan")
    peak_bytes: int | None = None
    samples: int = 0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class BiasRow:
    """One bias at one length and dtype: the three candidates and how they compare."""

    bias: str
    s: int
    dtype: str
    device: str
    mode: str  # "inference" or "forward+backward"
    heads: int
    head_dim: int
    batch: int
    materialized: Measurement = field(default_factory=Measurement)
    flex: Measurement = field(default_factory=Measurement)
    causal: Measurement = field(default_factory=Measurement)
    max_abs_diff: float = float("nan")  # |flex - materialized| on the first call's outputs
    notes: list[str] = field(default_factory=list)

    @property
    def speedup_vs_materialized(self) -> float:
        """materialized ms / flex ms (> 1: flex is faster)."""
        return self.materialized.ms / self.flex.ms

    @property
    def flex_over_causal(self) -> float:
        """flex ms / plain causal SDPA ms (1.0: the bias costs nothing)."""
        return self.flex.ms / self.causal.ms

    def as_row(self) -> dict[str, Any]:
        """The row as JSON-ready data: every field, each candidate a nested
        :class:`Measurement` dict (``status``, ``ms``, ``first_s``, ``peak_bytes``, ``samples``,
        ``note``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> BiasRow:
        def measurement(d: dict[str, Any]) -> Measurement:
            return Measurement(**{**d, "ms": number(d["ms"]), "first_s": number(d["first_s"])})

        kinds = ("materialized", "flex", "causal")
        fields: dict[str, Any] = {k: v for k, v in row.items() if k not in kinds}
        fields["max_abs_diff"] = number(fields.get("max_abs_diff"))
        fields.update({k: measurement(row[k]) for k in kinds})
        return cls(**fields)
