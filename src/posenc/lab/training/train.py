"""Training one lab cell: AdamW, warmup + cosine, clipping, bf16 autocast (and, when asked,
compiled blocks) on GPU, fixed seeds, atomic resumable checkpoints, and DDP when launched by
``torchrun``.

Checkpoints hold only tensors and plain containers/numbers/strings, so they load with
``torch.load(weights_only=True)``: a results folder from elsewhere can never run code. A run
resumed from a checkpoint continues bit for bit (on the CPU, with the same thread count) where it
stopped: the checkpoint carries the model, the optimizer, the step (which fixes the learning rate
and, through :func:`posenc.lab.training.data.step_generator`, the next batch) and the RNG states.
"""

from __future__ import annotations

import math
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...model import ModelConfig, TransformerLM
from ...runs.checkpoint import (
    CKPT_FORMAT,
    CKPT_VERSION,
    FINAL,
    LAST,
    CheckpointError,
    load_checkpoint,
    load_checkpoint_identity,
    load_weights,
    payload_digest,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from ...runs.identity import config_diff
from ...runs.metrics import MetricsLog, logged_steps
from ..cells.config import TrainConfig
from .data import IGNORE, LabData, shard
from .dist import Dist, init_distributed, resolve_device
from .schedule import compile_blocks, compiles, lr_at, make_optimizer, seed_everything

__all__ = [
    "CKPT_FORMAT", "CKPT_VERSION", "FINAL", "LAST", "CheckpointError", "Dist", "Interrupted",
    "PositionSampler", "ProgressFn", "ResumeRequired", "StepHook", "StopFlag", "TrainResult",
    "compile_blocks", "compiles", "config_diff", "init_distributed", "load_checkpoint",
    "load_checkpoint_identity", "lr_at", "make_optimizer", "payload_digest", "read_checkpoint",
    "resolve_device", "rng_state", "save_checkpoint", "seed_everything", "set_rng_state",
    "train_model",
]  # fmt: skip


class ResumeRequired(RuntimeError):
    """An interrupted run's checkpoint exists and neither resume nor restart was asked for."""


class Interrupted(Exception):
    """Training stopped on a signal after writing a checkpoint; ``--resume`` continues it."""

    def __init__(self, signum: int, step: int | None = None) -> None:
        where = f"at step {step} (checkpoint written)" if step is not None else "between cells"
        super().__init__(f"stopped by signal {signum} {where}")
        self.signum, self.step = signum, step


# --- training ------------------------------------------------------------------------------


@dataclass
class StopFlag:
    """Set by a signal handler; the loop checkpoints at the next step boundary and stops."""

    signum: int | None = None

    def install(self) -> Callable[[], None]:
        """Catch SIGTERM and SIGINT until the returned function restores the old handlers."""
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum: int, frame: Any) -> None:
            if self.signum is not None:  # a second signal: stop now
                signal.default_int_handler(signum, frame)
            self.signum = signum

        for s in old:
            signal.signal(s, handler)

        def restore() -> None:
            for s, h in old.items():
                signal.signal(s, h)

        return restore


@dataclass
class TrainResult:
    model: TransformerLM
    stats: dict[str, Any]
    resumed_from: int | None = None  # the step a checkpoint resumed at, if any
    reused: bool = False  # the final weights were already there; nothing was trained


ProgressFn = Callable[[int, float, float], None]  # (steps done, loss in bits, tokens/s)


#: ``(step, batch_size, seq_len, seed) -> position ids [batch_size, seq_len]`` int64 for the
#: whole global batch of ``step`` (each rank takes its rows), or None for ``arange``. A pure
#: function of its arguments, so a resumed run draws the positions the first run would have.
PositionSampler = Callable[[int, int, int, int], torch.Tensor]

#: ``(step, model) -> None``, called at the steps of ``train_model(hook_steps=...)``.
StepHook = Callable[[int, TransformerLM], None]


def _loss(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    autocast: bool,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x) if positions is None else model(x, positions)  # [b, s, vocab]
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)


@dataclass
class _Run:
    """One training run in progress: the model, its optimizer, what the loop has recorded."""

    model: TransformerLM
    opt: torch.optim.Optimizer
    identity: dict[str, Any]
    seed: int
    start: int = 0
    resumed_from: int | None = None
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)
    metrics: MetricsLog | None = None  # rank 0's per-step log, if any
    step_cpu_times: list[float] = field(default_factory=list)  # process CPU seconds per step

    def record(self, step: int, loss: float, seconds: float, cpu: float, cfg: TrainConfig) -> None:
        """Step ``step`` (0-based) took ``seconds`` (``cpu`` of process CPU time) and gave
        ``loss`` (nats): kept for the statistics (when finite) and logged when due. Raises
        FloatingPointError on a non-finite loss, after logging it."""
        done, metrics = step + 1, self.metrics
        finite = math.isfinite(loss)
        if metrics is not None and (metrics.due(done, cfg.steps) or not finite):
            tokens = cfg.batch_size * self.model.cfg.max_len * done
            metrics.log(done, loss, lr_at(step, cfg), tokens, sum(self.step_times) + seconds)
        if not finite:
            raise FloatingPointError(f"the training loss became {loss} at step {step}")
        self.step_times.append(seconds)
        self.step_cpu_times.append(cpu)
        self.losses.append(loss)

    def payload(self, step: int) -> dict[str, Any]:
        """A resumable checkpoint at ``step``. Always ``model``, never a wrapper: DDP's
        ``module.`` or torch.compile's ``_orig_mod.`` would prefix every key and the checkpoint
        would not load into a plain TransformerLM."""
        return {
            "identity": self.identity,
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "rng": rng_state(),
            "sampler": {"kind": "step-seeded", "seed": self.seed, "next_step": step},
            "losses": self.losses,
            "step_times": self.step_times,
            "step_cpu_times": self.step_cpu_times,
        }


def train_model(
    model_cfg: ModelConfig,
    cfg: TrainConfig,
    data: LabData,
    *,
    seed: int,
    identity: dict[str, Any],
    ckpt_dir: Path | None,
    ckpt_every: int = 100,
    resume: bool = False,
    restart: bool = False,
    dist: Dist | None = None,
    progress: ProgressFn | None = None,
    stop: StopFlag | None = None,
    compile_model: bool = False,
    positions: PositionSampler | None = None,
    init: dict[str, torch.Tensor] | None = None,
    hook: StepHook | None = None,
    hook_steps: tuple[int, ...] = (),
    metrics: MetricsLog | None = None,
) -> TrainResult:
    """Train (or resume, or reuse) one cell and return the model and its training statistics.

    ``ckpt_dir/final.pt`` (the trained weights) is reused when present; ``ckpt_dir/last.pt`` (an
    interrupted run) is continued when ``resume``, discarded when ``restart``, else an error.
    ``ckpt_dir=None``: no checkpoint written or read (the figures' tiny models).

    ``compile_model``: train with compiled blocks (CUDA only, :func:`compiles`;
    :func:`compile_blocks`). The compile happens in the first step (its time is in that step's,
    so in ``train_seconds``; the throughput figures skip the first steps). Checkpoints hold the
    plain module's keys, and the returned model is an eager copy of the trained weights.

    ``positions``: the position ids of each step's batch (:data:`PositionSampler`; training-time
    length methods such as randomized positions or PoSE), None for ``arange``. ``init``: the
    weights to start from (a fine-tune) instead of a fresh initialisation. ``hook(step, model)``
    runs after each step of ``hook_steps`` below ``cfg.steps``, right after a checkpoint of that
    step is written, and again at that step when a run resumes from it (the process may have
    been killed inside the hook): it must be idempotent. The last step is the caller's (it has
    the returned model). ``metrics``: rank 0's step log (:class:`~posenc.runs.metrics.MetricsLog`).
    """
    dist = dist or Dist()
    if ckpt_dir is not None and (ckpt_dir / FINAL).exists():
        return _reuse(model_cfg, ckpt_dir / FINAL, identity, dist)
    seed_everything(seed)
    model = _fresh_model(model_cfg, init, dist.device)
    run = _Run(model, make_optimizer(model, cfg, dist.device), identity, seed)
    last_path = ckpt_dir / LAST if ckpt_dir is not None else None
    if last_path is not None and last_path.exists():
        _resume_or_restart(run, last_path, resume, restart, dist)
    compiled = compiles(compile_model, dist.device)
    net = _wrap(model, dist, compiled)
    ckpts = _Checkpoints(last_path, ckpt_every, frozenset(hook_steps) if hook else frozenset())
    with _logged(run, metrics if dist.main else None):
        _loop(run, net, cfg, data, dist, ckpts, progress, stop, positions, hook)
    stats = _stats(cfg, model_cfg.max_len, run, model, dist)
    _save_final(run, stats, ckpt_dir, dist)
    if compiled:
        model = _eager_copy(model, model_cfg, dist)
    return TrainResult(model, stats, resumed_from=run.resumed_from)


def _fresh_model(
    model_cfg: ModelConfig, init: dict[str, torch.Tensor] | None, device: torch.device
) -> TransformerLM:
    """A new model (seeded by the caller), from ``init``'s weights when given, on ``device``."""
    model = TransformerLM(model_cfg)
    if init is not None:
        load_weights(model, init, Path("<init>"))
    return model.to(device)


@contextmanager
def _logged(run: _Run, metrics: MetricsLog | None) -> Iterator[None]:
    """``metrics`` open for the ``with`` body, from the step ``run`` starts or resumes at (a
    resume drops the lines past it), and closed however the body ends."""
    run.metrics = metrics
    if metrics is None:
        yield
        return
    metrics.open(run.start)
    try:
        yield
    finally:
        metrics.close()


def _save_final(run: _Run, stats: dict[str, Any], ckpt_dir: Path | None, dist: Dist) -> None:
    """Rank 0 writes the trained weights (``final.pt``) and drops the interrupted run's
    ``last.pt``; every rank waits for it."""
    if dist.main and ckpt_dir is not None:
        final = {"identity": run.identity, "model": run.model.state_dict(), "stats": stats}
        save_checkpoint(ckpt_dir / FINAL, final)
        if (ckpt_dir / LAST).exists():
            (ckpt_dir / LAST).unlink()
    dist.barrier()


def _eager_copy(model: TransformerLM, model_cfg: ModelConfig, dist: Dist) -> TransformerLM:
    """A plain copy of compiled-block weights: evaluation runs eagerly (the compiled blocks
    would recompile for each eval length, and FlexAttention picks its own compiled path)."""
    with torch.random.fork_rng(devices=[]):  # the copy's init draws leave the RNG as it was
        eager = TransformerLM(model_cfg)
    eager.load_state_dict(model.state_dict())
    return eager.to(dist.device)


def _reuse(model_cfg: ModelConfig, path: Path, identity: dict[str, Any], dist: Dist) -> TrainResult:
    """The trained weights at ``path`` (``final.pt`` of this cell): nothing to train."""
    ckpt = load_checkpoint(path, identity)
    model = TransformerLM(model_cfg)
    load_weights(model, ckpt["model"], path)
    return TrainResult(model.to(dist.device), ckpt["stats"], reused=True)


def _resume_or_restart(run: _Run, last_path: Path, resume: bool, restart: bool, dist: Dist) -> None:
    """An interrupted run's checkpoint exists: continue it, discard it, or refuse to choose."""
    if restart:
        dist.barrier()
        if dist.main:
            last_path.unlink()
        return
    if not resume:
        raise ResumeRequired(
            f"{last_path} holds an interrupted run of this cell; pass --resume to continue "
            "it, or --restart to discard it and train from step 0"
        )
    ckpt = load_checkpoint(last_path, run.identity)
    load_weights(run.model, ckpt["model"], last_path)
    run.opt.load_state_dict(ckpt["optimizer"])
    set_rng_state(ckpt["rng"])
    run.start = run.resumed_from = int(ckpt["step"])
    run.losses, run.step_times = list(ckpt["losses"]), list(ckpt["step_times"])
    run.step_cpu_times = list(ckpt.get("step_cpu_times", []))


def _wrap(model: TransformerLM, dist: Dist, compiled: bool) -> nn.Module:
    """What the loop calls: DDP around the model under torchrun, compiled blocks when asked."""
    net: nn.Module = model
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        ids = [dist.device.index] if dist.device.type == "cuda" else None
        # static_graph: the same parameters take part in every step, whatever the encoding
        # (some encodings own parameters a short sequence never reaches, e.g. far T5 buckets).
        net = DistributedDataParallel(model, device_ids=ids, static_graph=True)
    if compiled:
        compile_blocks(model)  # in place: `net` (and DDP) call the compiled blocks
    return net


@dataclass(frozen=True)
class _Checkpoints:
    """Where and how often the loop writes a resumable checkpoint (``path`` None: never), and
    the steps of the hook (each also gets a checkpoint, written before the hook runs)."""

    path: Path | None
    every: int
    hook_steps: frozenset[int] = frozenset()


def _loop(
    run: _Run,
    net: nn.Module,
    cfg: TrainConfig,
    data: LabData,
    dist: Dist,
    ckpt: _Checkpoints,
    progress: ProgressFn | None,
    stop: StopFlag | None,
    positions: PositionSampler | None = None,
    hook: StepHook | None = None,
) -> None:
    """Steps ``run.start .. cfg.steps - 1``; a checkpoint every ``ckpt.every`` steps and at each
    hook step (then the hook), and one before raising :class:`Interrupted` when ``stop`` was set
    by a signal."""
    seq_len = run.model.cfg.max_len
    autocast = dist.device.type == "cuda"
    tokens_per_step = cfg.batch_size * seq_len
    if hook is not None and run.start in ckpt.hook_steps:
        _run_hook(
            hook, run.start, run, net, dist
        )  # resumed at a hook step: it may not have finished
    net.train()
    for step in range(run.start, cfg.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = data.train_batch(step, cfg.batch_size, seq_len, run.seed, dist.rank, dist.world)
        pos = None
        if positions is not None:
            pos = positions(step, cfg.batch_size, seq_len, run.seed)  # [batch_size, seq_len]
            pos = pos[shard(cfg.batch_size, dist.rank, dist.world)].to(dist.device)
        for group in run.opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = _loss(net, x.to(dist.device), y.to(dist.device), autocast, pos)
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            nn.utils.clip_grad_norm_(run.model.parameters(), cfg.grad_clip)
        run.opt.step()
        value = float(dist.sum_(loss.detach().float().reshape(1)) / dist.world)
        run.record(step, value, time.perf_counter() - t0, time.process_time() - c0, cfg)
        done = step + 1
        if progress is not None:
            recent = run.step_times[-20:]  # a short moving window: single steps are noisy
            progress(done, value / math.log(2), tokens_per_step * len(recent) / sum(recent))
        interrupted = stop is not None and stop.signum is not None and not dist.enabled
        hooked = hook is not None and done in ckpt.hook_steps and done < cfg.steps
        due = interrupted or hooked or (done % ckpt.every == 0 and done < cfg.steps)
        if due and ckpt.path is not None:
            if dist.main:
                save_checkpoint(ckpt.path, run.payload(done))
            dist.barrier()
        if hooked and not interrupted:
            assert hook is not None
            _run_hook(hook, done, run, net, dist)
        if interrupted:
            assert stop is not None and stop.signum is not None
            raise Interrupted(stop.signum, done)


def _run_hook(hook: StepHook, step: int, run: _Run, net: nn.Module, dist: Dist) -> None:
    """The hook at ``step`` (steps done), the model put back in training mode after."""
    hook(step, run.model)
    net.train()
    dist.barrier()


def cpu_throughput(tokens_per_step: int, cpu_times: list[float]) -> dict[str, float]:
    """``{"tokens_per_cpu_s": tokens per second of this process's CPU time}`` from the median
    CPU time of a training step (warm-up steps skipped as for the wall clock; ``{}`` without
    steps). CPU time, unlike wall time, does not grow while the process waits for a core that
    another process holds, so two cells timed minutes apart or side by side on a loaded machine
    compare on the work their steps do; the median leaves out the odd step with a collection
    or a page fault storm."""
    skip = min(len(cpu_times) - 1, max(2, len(cpu_times) // 20))
    timed = cpu_times[skip:]
    if not timed:
        return {}
    return {"tokens_per_cpu_s": tokens_per_step / max(statistics.median(timed), 1e-9)}


def _stats(
    cfg: TrainConfig, seq_len: int, run: _Run, model: nn.Module, dist: Dist
) -> dict[str, Any]:
    """Training statistics (on the CPU with :func:`cpu_throughput`'s ``tokens_per_cpu_s``; not on
    CUDA, where the host's CPU time is the kernel launches, not the work).

    Throughput skips the first steps (allocator and kernel warm-up). ``tokens_per_s`` is the
    plain mean over the timed steps: wall-clock honest, but on a shared machine it moves with
    whatever else runs. ``tokens_per_s_fast`` divides by the 10th-percentile step time, the speed
    of the steps the machine gave this run undisturbed: encodings trained minutes apart compare
    fairly on it (the benchmark habit of taking the best of repeated timings).
    """
    losses, step_times = run.losses, run.step_times
    skip = min(len(step_times) - 1, max(2, len(step_times) // 20))
    timed = step_times[skip:]
    fast = sorted(timed)[len(timed) // 10]
    tokens_per_step = cfg.batch_size * seq_len
    tail = losses[-max(1, len(losses) // 10) :]
    every = logged_steps(len(losses))
    return {
        "steps": len(losses),
        "tokens": tokens_per_step * len(losses),
        "train_seconds": sum(step_times),
        "tokens_per_s": tokens_per_step * len(timed) / max(sum(timed), 1e-9),
        "tokens_per_s_fast": tokens_per_step / max(fast, 1e-9),
        "final_loss_bits": sum(tail) / len(tail) / math.log(2),
        "loss_curve_bits": [
            [i + 1, losses[i] / math.log(2)] for i in range(every - 1, len(losses), every)
        ],
        "params": sum(p.numel() for p in model.parameters()),
        "config": asdict(cfg),
        **(
            cpu_throughput(tokens_per_step, run.step_cpu_times) if dist.device.type == "cpu" else {}
        ),
    }
