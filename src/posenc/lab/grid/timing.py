"""A grid's throughput measured on this machine before anything trains: one training step and
forward passes of the real model at the run's shapes on a short batch, timed by the work this
process does (:class:`_Clock`), for :func:`~posenc.lab.grid.estimate.with_time` to scale by the
run's tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ...model import ModelConfig
from ..cells.config import LabConfig

#: Tokens of the batch :func:`measure` times; longer train lengths take one row.
MEASURE_TOKENS = 1024
#: The longest length :func:`measure` times a forward pass at (below FlexAttention's compiles).
MEASURE_MAX_LEN = 1000
#: Train lengths past this are not timed (a step would take too long to be a preflight).
MEASURE_MAX_TRAIN_LEN = 4096


@dataclass(frozen=True)
class Throughput:
    """Seconds per token measured by :func:`measure`: a training step at the train length, a
    forward pass there, and ``(length, seconds per token)`` of a forward pass at a longer eval
    length (None when the grid evaluates no longer length or it could not run)."""

    train: float
    forward: float
    forward_long: tuple[int, float] | None = None


def measure(cfg: LabConfig, model: ModelConfig, device: str, threads: int) -> Throughput | None:
    """Time ``model`` at grid ``cfg``'s shapes on a short batch (:data:`MEASURE_TOKENS`): one
    training step to warm up and one timed, a forward pass at the train length, and one at the
    longest eval length up to :data:`MEASURE_MAX_LEN`. On ``device`` with ``threads`` CPU
    threads; the global RNG and thread count are left as they were. None past
    :data:`MEASURE_MAX_TRAIN_LEN`."""
    from ...model import TransformerLM

    if cfg.train_len > MEASURE_MAX_TRAIN_LEN:
        return None
    dev = torch.device(device)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(0)
            net = TransformerLM(model).to(dev)
            train = _time_train(net, cfg, dev, threads)
            forward = _time_forward(net, cfg.train_len, dev, threads)
            n = min(max(cfg.eval_lengths()), MEASURE_MAX_LEN)
            long = None
            if n > cfg.train_len:
                try:
                    long = (n, _time_forward(net, n, dev, threads))
                except (RuntimeError, ValueError, IndexError):
                    long = None  # e.g. a learned table shorter than n
    finally:
        torch.set_num_threads(before)
    return Throughput(train, forward, long)


class _Clock:
    """Seconds of work since it started: on the CPU the process's CPU time over its threads
    where that is less than the wall time (a busy machine's other processes are not this run's
    cost: the estimate is for the machine as the run will find it once they are done), the
    wall time on CUDA (after a synchronize)."""

    def __init__(self, dev: torch.device, threads: int) -> None:
        self.dev, self.threads = dev, threads
        self._sync()
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def _sync(self) -> None:
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)

    def seconds(self) -> float:
        self._sync()
        wall = time.perf_counter() - self.wall
        if self.dev.type == "cuda":
            return wall
        return min(wall, (time.process_time() - self.cpu) / self.threads)


def _tokens(n: int, vocab: int, dev: torch.device) -> torch.Tensor:
    rows = max(1, MEASURE_TOKENS // n)
    return torch.randint(0, vocab, (rows, n), device=dev)  # [b, s]


def _time_train(net: Any, cfg: LabConfig, dev: torch.device, threads: int) -> float:
    """Seconds per token of a training step's forward and backward (the second of two) at the
    train length. AdamW's update is left out: a loop over ~30 tensors, milliseconds against the
    step, and building an optimizer imports torch's compiler stack (seconds) in a run that may
    end at the dry run."""
    import torch.nn.functional as F

    x = _tokens(cfg.train_len, net.cfg.vocab_size, dev)
    net.train()
    elapsed = 0.0
    for _ in range(2):
        clock = _Clock(dev, threads)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            logits = net(x)  # [b, s, vocab]
        F.cross_entropy(logits.float().flatten(0, 1), x.flatten()).backward()
        net.zero_grad(set_to_none=True)
        elapsed = clock.seconds()
    return elapsed / x.numel()


def _time_forward(net: Any, n: int, dev: torch.device, threads: int) -> float:
    """Seconds per token of an evaluation forward pass at length ``n``."""
    x = _tokens(n, net.cfg.vocab_size, dev)
    net.eval()
    with torch.no_grad():
        clock = _Clock(dev, threads)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            net(x).float().argmax(-1)
        return clock.seconds() / x.numel()
