"""One row of the benchmark (a bias at one length and dtype: its three candidates) and the
benchmark's targets it is checked against."""

from __future__ import annotations

from dataclasses import dataclass, field

# The CPU target: compiled FlexAttention at least this much faster than the materialized
# bias, at s >= TARGET_MIN_S, inference.
TARGET_SPEEDUP = 1.5
TARGET_MIN_S = 2048
# GPU targets (forward + backward): ALiBi and T5 flex within this factor of plain causal SDPA
# at s = 8k, and flex running at s = 64k where the materialized bias cannot.
GPU_TARGET_RATIO = 1.25
GPU_TARGET_BIASES = ("alibi", "t5")


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

    def targets(self) -> str:
        """The benchmark's targets that apply to this row, each ``met``/``MISSED``, or ``-``."""
        if self.device == "cpu" and self.mode == "inference" and self.s >= TARGET_MIN_S:
            name = f"flex >={TARGET_SPEEDUP:g}x materialized"
            if not self.flex.ok:
                return f"{name}: flex did not run"
            if not self.materialized.ok:
                return f"{name}: - (materialized {self.materialized.status}; flex ran)"
            ok = self.speedup_vs_materialized >= TARGET_SPEEDUP
            return f"{name} {'met' if ok else 'MISSED'}"
        if self.device == "cuda" and self.bias in GPU_TARGET_BIASES:
            if self.s == 8192:
                name = f"flex <={GPU_TARGET_RATIO:g}x causal at 8k"
                if not (self.flex.ok and self.causal.ok):
                    return f"{name}: not measured"
                ok = self.flex_over_causal <= GPU_TARGET_RATIO
                return f"{name} {'met' if ok else 'MISSED'}"
            if self.s == 65536:
                ok = self.flex.ok and not self.materialized.ok
                return f"flex runs at 64k, materialized cannot {'met' if ok else 'MISSED'}"
        return "-"
