"""What a training run is set up with before its first step: seeds, the learning-rate schedule,
the optimizer, and whether (and how) the blocks are compiled. Shared by the grid's training and
``posenc lab extend``'s fine-tunes, so both follow the same schedule.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch
from torch import nn

from ...model import TransformerLM
from ..cells.config import TrainConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup over ``warmup_steps`` to ``lr``, then cosine down to ``min_lr_ratio * lr``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_optimizer(
    model: nn.Module, cfg: TrainConfig, device: torch.device | None = None
) -> torch.optim.AdamW:
    """AdamW; matrices decay, vectors (norm gains, biases, per-head scalars) do not.

    On CUDA the multi-tensor (``foreach``) implementation: the per-parameter loop launches ~10
    kernels per parameter tensor (~1,000 a step for ~100 tensors), each microseconds of host
    time on a step of milliseconds. Elsewhere the per-parameter loop, as before: the CPU results
    (and resumed runs) stay bit for bit what they were. ``device`` defaults to the parameters'.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if device is None:
        device = params[0].device if params else torch.device("cpu")
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=device.type == "cuda"
    )


def compiles(compile_model: bool, device: torch.device) -> bool:
    """Whether :func:`train_model` trains through ``torch.compile``: when asked, on CUDA only.

    On the CPU Inductor builds C++ kernels for every cell (8-15 s per encoding measured for a
    2-layer, dim-32 model on one core of the 2-core VM), a large part of the CPU presets' 20-40 s
    of training per cell; there ``compile`` is ignored and the model trains eagerly (the same
    numbers as ``compile_model=False``).
    """
    return compile_model and device.type == "cuda"


def compile_blocks(model: TransformerLM) -> None:
    """``torch.compile`` each block in place (regional compilation), for training.

    The blocks are one module class with the same shapes, so dynamo traces one block and every
    layer reuses its graph: the compile costs one block's trace, not ``num_layers`` of them
    (measured on the gpu-small model, dynamo + AOTAutograd, one CPU core: ~2.5 s for a block
    against ~9 s for the whole model, per encoding). What stays eager (embedding, absolute
    encoding, final norm, head) is a few kernels. ``Module.compile`` keeps the state_dict keys
    (no ``_orig_mod.`` prefix), so checkpoints load into a plain :class:`TransformerLM`.

    Dynamo's caches are reset first: ``Block.forward`` is one code object for every encoding, and
    past ``recompile_limit`` (8) graphs of it dynamo falls back to eager with a warning, so
    without the reset a grid's ninth encoding onwards would train uncompiled.
    """
    torch.compiler.reset()
    for block in model.blocks:
        block.compile()
