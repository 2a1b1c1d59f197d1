"""Synthetic length-generalization tasks: train on sequences of length L, test on 2L, 4L, 8L.

Each sequence is ``seq_len + 1`` tokens; only the answer tokens are scored (targets elsewhere
are ``IGNORE``), so "bits" are bits per answer token and accuracy is exact per answer token.

Layouts (``|`` only separates fields here; ``BOS``, ``SEP`` and ``PAD`` are tokens)::

    copy                BOS | a1 a2 .. ak | SEP | a1 a2 .. ak | PAD ..
    reverse             BOS | a1 a2 .. ak | SEP | ak .. a2 a1 | PAD ..
    associative-recall  BOS | k1 v1 k2 v2 .. | SEP | q1 a1 q2 a2 .. | PAD ..

In associative recall each sequence draws its own key -> value map; keys may repeat (always with
the same value), queries ask keys that occur before ``SEP``; ``k`` grows with the length so a
longer sequence is a harder instance of the same task.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .data import IGNORE, SPLITS, shard, step_generator

PAD, BOS, SEP = 0, 1, 2
SYMBOLS = range(16, 80)  # copy/reverse alphabet: 64 symbols
KEYS = range(80, 144)  # associative recall: 64 keys ...
VALUES = range(144, 208)  # ... and 64 values
TASKS = ("copy", "reverse", "associative-recall")
_EVAL_SALT = 7_919  # eval sequences come from a stream no training seed reaches


@dataclass
class SyntheticTask:
    """A task as a :class:`posenc.lab.data.LabData` source (vocabulary 256, unit "token")."""

    name: str
    vocab_size: int = 256
    unit: str = "token"

    @property
    def fingerprint(self) -> str:
        return f"task-{self.name}-v1"

    def sample(
        self, g: torch.Generator, batch: int, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x, y [batch, seq_len]`` with ``y = IGNORE`` except at answer positions."""
        if seq_len < 4:
            raise ValueError(
                f"task {self.name!r} needs sequences of at least 4 tokens, got {seq_len}"
            )
        n = seq_len + 1
        seq = torch.full((batch, n), PAD, dtype=torch.long)
        scored = torch.zeros(batch, n, dtype=torch.bool)
        seq[:, 0] = BOS
        if self.name in ("copy", "reverse"):
            k = (n - 2) // 2
            a = torch.randint(SYMBOLS.start, SYMBOLS.stop, (batch, k), generator=g)
            seq[:, 1 : k + 1] = a
            seq[:, k + 1] = SEP
            seq[:, k + 2 : 2 * k + 2] = a if self.name == "copy" else a.flip(1)
            scored[:, k + 2 : 2 * k + 2] = True
        elif self.name == "associative-recall":
            pairs = max(1, (n // 2 - 1) // 2)
            queries = (n - 2 - 2 * pairs) // 2
            table = torch.randint(VALUES.start, VALUES.stop, (batch, len(KEYS)), generator=g)
            keys = torch.randint(0, len(KEYS), (batch, pairs), generator=g)  # key indices
            seq[:, 1 : 2 * pairs + 1 : 2] = keys + KEYS.start
            seq[:, 2 : 2 * pairs + 2 : 2] = table.gather(1, keys)
            seq[:, 2 * pairs + 1] = SEP
            pick = torch.randint(0, pairs, (batch, queries), generator=g)
            q = keys.gather(1, pick)  # [b, queries] asked key indices
            base = 2 * pairs + 2
            seq[:, base : base + 2 * queries : 2] = q + KEYS.start
            seq[:, base + 1 : base + 2 * queries + 1 : 2] = table.gather(1, q)
            scored[:, base + 1 : base + 2 * queries + 1 : 2] = True
        else:  # pragma: no cover - make_task checks the name
            raise ValueError(self.name)
        y = seq[:, 1:].masked_fill(~scored[:, 1:], IGNORE)
        return seq[:, :-1], y

    def train_batch(
        self, step: int, batch_size: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.sample(step_generator(seed, step), batch_size, seq_len)
        rows = shard(batch_size, rank, world)
        return x[rows], y[rows]

    def eval_windows(
        self, seq_len: int, max_tokens: int, stride: int | None = None, split: str = "test"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``max(1, max_tokens // seq_len)`` fixed sequences of length ``seq_len``, in chunks.

        Tasks are whole sequences, so ``stride`` (sliding windows) does not apply.
        """
        if stride is not None:
            raise ValueError("sliding-window evaluation applies to text corpora, not to tasks")
        count = max(1, max_tokens // seq_len)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        g = step_generator(_EVAL_SALT, seq_len, salt=SPLITS.index(split))
        chunk = max(1, 8192 // seq_len)
        done = 0
        while done < count:
            b = min(chunk, count - done)
            yield self.sample(g, b, seq_len)
            done += b


def make_task(name: str) -> SyntheticTask:
    if name not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {name!r}")
    return SyntheticTask(name)
