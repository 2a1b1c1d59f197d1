"""What ``posenc lab`` checks and prints before anything trains: every option of the grid (a
number out of range, a model shape, an encoding that does not build, a device that is not
there), and the :class:`Plan` that ``--dry-run`` prints: the cells and the output folder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import LabConfig
from .flags import check_device, check_grid


def preflight(cfg: LabConfig, device: str = "auto") -> None:
    """Refuse a grid before any data is read or cell trained: ValueError naming what is wrong
    (a number out of range, a model shape, an encoding or option that does not build at this
    shape, a device that is not there). Each label is resolved into its cell (on bytes) and the
    cell's encoding built as the model would."""
    from .. import registry
    from .._checks import check_positive_int
    from .cell import resolve_cell, resolve_labels
    from .dist import resolve_device
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
        resolve_device(device)
    except RuntimeError as e:
        raise ValueError(f"--device {device}: {e}") from None
    for label in resolve_labels(cfg.encodings):
        m = resolve_cell(cfg, label, cfg.seeds[0], 256, "preflight").model
        try:
            registry.build(m.encoding, dim=m.dim, num_heads=m.num_heads, max_len=m.max_len,
                           causal=m.causal, **m.encoding_kwargs)  # fmt: skip
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"encoding {label.text!r} cannot be built at this shape: {e}"
            ) from None


@dataclass(frozen=True)
class Plan:
    """A checked grid: its ``cells`` (``label s<seed>``, seeds outer) and output folder."""

    cells: tuple[str, ...]
    out: Path

    def text(self) -> str:
        """What ``posenc lab --dry-run`` prints."""
        lines = [f"{len(self.cells)} cell(s):", *(f"  {c}" for c in self.cells)]
        lines.append(f"output folder: {self.out}")
        return "\n".join(lines)


def plan_run(cfg: LabConfig, opts: Any) -> Plan:
    """Check ``cfg`` for a run with ``opts`` (a :class:`~posenc.lab.run.RunOptions`) and return
    its :class:`Plan`; ValueError naming what is wrong."""
    from .cell import resolve_labels

    preflight(cfg, opts.device)
    labels = resolve_labels(cfg.encodings)
    cells = tuple(f"{label.text} s{seed}" for seed in cfg.seeds for label in labels)
    return Plan(cells=cells, out=opts.out)
