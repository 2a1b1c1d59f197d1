"""Batches as pure functions of ``(seed, step)``, and the token conventions every lab data source
shares (:mod:`posenc.lab.training.data`'s corpora, :mod:`posenc.lab.evaluation.tasks`' synthetic tasks)."""

from __future__ import annotations

import hashlib

import torch

IGNORE = -100  #: target value of an unscored position (``F.cross_entropy``'s ignore_index)
SPLITS = ("train", "valid", "test")


def step_generator(seed: int, step: int, salt: int = 0) -> torch.Generator:
    """A generator seeded by ``(seed, step, salt)``: batches are pure functions of the step.

    Mixing through a hash (not ``seed + step``) keeps seed 0 step 1 from equalling seed 1 step 0.
    """
    digest = hashlib.sha256(f"{seed}:{step}:{salt}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


def shard(batch_size: int, rank: int, world: int) -> slice:
    """Rows of a global batch that ``rank`` of ``world`` takes (every ``world``-th row)."""
    if batch_size % world:
        raise ValueError(
            f"batch_size ({batch_size}) must be divisible by the number of processes ({world})"
        )
    return slice(rank, batch_size, world)
