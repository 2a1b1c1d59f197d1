"""How much memory this process may still take, and a one-line refusal for a size that will not
fit: what the lab's preflight and the plots check before they allocate by a user's sizes.

:func:`available_bytes` reads the host's ``MemAvailable`` (``/proc/meminfo``) and the
cgroup's limit less its usage when that is lower (a container); on CUDA, the device's free
memory (``torch.cuda.mem_get_info``). Elsewhere (no ``/proc``) it answers None and
:func:`check_fits` lets the run go. ``POSENC_NO_MEMORY_CHECK=1`` turns the check off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Set to 1 to run what :func:`check_fits` would refuse.
NO_CHECK_ENV = "POSENC_NO_MEMORY_CHECK"

#: What drawing and saving a figure takes besides its data (matplotlib's renderer and canvas;
#: measured ~100 MB for the package's figures).
FIGURE_BYTES = 100 * 2**20

_CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
    (
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
        "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    ),
)


def gb(n: float) -> str:
    """``41_200_000_000`` -> ``"41.2 GB"`` (decimal units; MB below 0.1 GB)."""
    if n < 1e8:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e9:.1f} GB"


def _meminfo_available(path: str = "/proc/meminfo") -> int | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) > 1 and parts[1].isdigit() else None
    return None


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_available() -> int | None:
    """The cgroup's limit less its usage, or None without a limit (v2 ``max``, v1's huge
    number)."""
    for limit_file, usage_file in _CGROUP_FILES:
        limit = _read_int(limit_file)
        if limit is None or limit >= 2**60:
            continue
        usage = _read_int(usage_file) or 0
        return max(0, limit - usage)
    return None


def host_available() -> int | None:
    """Bytes the host can still give this process: the lower of ``MemAvailable`` and the
    cgroup's room; None when neither is known."""
    known = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return min(known) if known else None


def available_bytes(device: Any = "cpu") -> int | None:
    """Bytes free where tensors of ``device`` live (a name or ``torch.device``): the CUDA
    device's free memory, else :func:`host_available`."""
    kind = str(device)
    if kind.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            free, _total = torch.cuda.mem_get_info(torch.device(kind))
            return int(free)
        return None
    return host_available()


def check_disabled() -> bool:
    """Whether ``POSENC_NO_MEMORY_CHECK`` turns the memory check off."""
    return os.environ.get(NO_CHECK_ENV, "").strip() not in ("", "0")


def check_fits(
    need: float,
    what: str,
    shrink: str,
    *,
    detail: str | None = None,
    device: Any = "cpu",
    available: int | None = None,
) -> None:
    """ValueError, one line, when ``need`` bytes will not fit in the memory available on
    ``device`` (``available``: given instead of read).

    ``what`` says what needs it (``"this run"``, ``"the table of --dim 100000 x --positions
    100000"``), ``detail`` the estimate's parts (shown in parentheses), ``shrink`` the options
    to lower (``"--dim or --positions"``). Nothing is checked when the memory is unknown or
    ``POSENC_NO_MEMORY_CHECK=1``."""
    if check_disabled():
        return
    free = available if available is not None else available_bytes(device)
    if free is None or need <= free:
        return
    where = "on the GPU" if str(device).startswith("cuda") else ""
    raise ValueError(
        f"{what} needs about {gb(need)}{f' ({detail})' if detail else ''}; {gb(free)} is available{' ' + where if where else ''}; "
        f"lower {shrink} (or set {NO_CHECK_ENV}=1 to run it anyway)"
    )
