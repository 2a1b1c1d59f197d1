"""Peak memory of one call (CPU resident set, CUDA allocator), the memory a materialized bias
would need, and the rules that skip a candidate for memory or time (the package docstring has
the method)."""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import re
from collections.abc import Callable
from pathlib import Path

import torch

GiB = 1024**3
MiB = 1024**2
# What a materialized-bias call may need, as a fraction of the device's memory. On CPU the
# machine is shared: 0.4 of 24 GiB admits s = 8k with h = 8 (about 110 bytes per score measured,
# 7.4 GiB) and keeps s = 16k (about 30 GiB) out.
DEFAULT_MEMORY_FRACTION = {"cpu": 0.4, "cuda": 0.8}


def _proc_status_kib(name: str) -> int:
    m = re.search(rf"^{name}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    if m is None:
        raise OSError(f"/proc/self/status has no {name}")
    return int(m.group(1))


def _malloc_trim() -> Callable[[], None]:
    """glibc's ``malloc_trim(0)``, which hands freed heap pages back to the OS (so that they are
    not reused unseen by the next call), or a no-op where there is no such function."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return lambda: None

    def call() -> None:
        trim(0)

    return call


class PeakMemory:
    """Peak memory growth of one call on ``device`` (module docstring): ``start()``, the call,
    ``stop() -> bytes`` (None where it cannot be measured; ``why`` says why)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.why = ""
        self._base = 0
        if device.type == "cuda":
            self.method = (
                "CUDA: torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), "
                "minus memory_allocated() before the call"
            )
            return
        self.method = (
            "CPU: resident-set growth: malloc_trim(0), reset the high-water mark "
            "(echo 5 > /proc/self/clear_refs), peak = VmHWM after the call - VmRSS before it"
        )
        self._trim = _malloc_trim()
        try:
            self._reset_hwm()
            _proc_status_kib("VmHWM")
        except OSError as e:
            self.why = f"peak RSS cannot be reset here ({e}); memory not measured"

    @property
    def supported(self) -> bool:
        return not self.why and self.device.type in ("cpu", "cuda")

    @staticmethod
    def _reset_hwm() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def start(self) -> None:
        if not self.supported:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._trim()
            self._reset_hwm()
            self._base = _proc_status_kib("VmRSS") * 1024

    def stop(self) -> int | None:
        if not self.supported:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device) - self._base)
        return max(0, _proc_status_kib("VmHWM") * 1024 - self._base)


def total_memory(device: torch.device) -> int:
    """Bytes of RAM (CPU) or of the GPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    return int(m.group(1)) * 1024 if m else 0


def memory_limit_for(device: torch.device, fraction: float | None = None) -> int:
    """``fraction`` (default :data:`DEFAULT_MEMORY_FRACTION`) of the device's memory, in bytes."""
    if fraction is None:
        fraction = DEFAULT_MEMORY_FRACTION.get(device.type, 0.4)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction}")
    return int(total_memory(device) * fraction)


def available_memory(device: torch.device) -> int | None:
    """Bytes free now (``MemAvailable`` or the CUDA driver's free memory), None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        m = re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def human_bytes(n: float) -> str:
    """``34359738368`` -> ``"32.0 GiB"``; MiB below a GiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def materialized_need(heads: int, s: int, t: int, measured: tuple[int, int] | None = None) -> int:
    """Estimated bytes of one materialized-bias call at ``s`` queries over ``t`` keys.

    The float32 ``[h, s, t]`` bias (``h * s * t * 4``) is the lower bound; ``measured = (peak
    bytes, s_prev * t_prev)`` from a shorter run of the same bias scales that peak by the
    number of scores (every large buffer of the path is ``O(s * t)``).
    """
    need = heads * s * t * 4
    if measured is not None and measured[1] > 0:
        need = max(need, math.ceil(measured[0] / measured[1] * s * t))
    return need


def memory_skip_reason(need: int, limit: int, available: int | None = None) -> str | None:
    """Why a call needing ``need`` bytes is not tried, or None when it fits.

    ``limit`` is the configured ceiling; ``available`` (free memory now, on a shared machine) must
    also hold it with a tenth to spare.
    """
    if need > limit:
        return f"memory (would need {human_bytes(need)} > limit {human_bytes(limit)})"
    if available is not None and need > 0.9 * available:
        return f"memory (would need {human_bytes(need)}, only {human_bytes(available)} available)"
    return None


def time_skip_reason(previous: tuple[int, float] | None, s: int, max_call_s: float) -> str | None:
    """Why a candidate is not timed at ``s``: its median ``previous = (s_prev, seconds)`` at a
    shorter length, scaled by ``(s / s_prev)**2`` (attention is quadratic), exceeds
    ``max_call_s``; None when it does not (or nothing is known yet)."""
    if previous is None:
        return None
    s_prev, sec = previous
    predicted = sec * (s / s_prev) ** 2
    if predicted > max_call_s:
        return (
            f"time (~{predicted:.0f} s per call predicted from s={s_prev}, limit {max_call_s:g} s)"
        )
    return None
