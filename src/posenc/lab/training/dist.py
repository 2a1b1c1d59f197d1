"""Where a lab process runs: one process, or a rank of a ``torchrun`` group (DDP)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Dist:
    """Where this process runs: ``rank`` of ``world`` processes, on ``device``."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def sum_(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce ``t`` in place (sum over ranks); a no-op in one process."""
        if self.enabled:
            torch.distributed.all_reduce(t)
        return t

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> CUDA if available, else CPU; or an explicit ``cpu``/``cuda``/``cuda:N``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' was asked for but CUDA is not available")
    return device


def init_distributed(device: str = "auto") -> Dist:
    """Join the process group ``torchrun`` set up (``WORLD_SIZE`` > 1), else a single process.

    Backend: nccl on GPU, gloo on CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist(device=resolve_device(device))
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    if not torch.distributed.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    return Dist(rank=rank, world=world, local_rank=local, device=dev)
