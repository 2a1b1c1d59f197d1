"""Synthetic length-generalization tasks: train on sequences of length L, test on 2L, 4L, 8L.

Each sequence is ``seq_len + 1`` tokens; only the answer tokens are scored (targets elsewhere
are ``IGNORE``), so "bits" are bits per answer token and accuracy is exact per answer token.

Layouts (``|`` only separates fields here; ``BOS``, ``SEP`` and ``PAD`` are tokens)::

    copy                BOS | a1 a2 .. ak | SEP | a1 a2 .. ak | PAD ..
    reverse             BOS | a1 a2 .. ak | SEP | ak .. a2 a1 | PAD ..
    associative-recall  BOS | k1 v1 k2 v2 .. | SEP | q1 a1 q2 a2 .. | PAD ..
    passkey             BOS | f .. f | KEY d1 .. dD | f .. f | QUERY | d1 .. dD

In associative recall each sequence draws its own key -> value map; keys may repeat (always with
the same value), queries ask keys that occur before ``SEP``; ``k`` grows with the length so a
longer sequence is a harder instance of the same task.

Passkey retrieval (the long-context probe of Landmark Attention, Mohtashami & Jaggi 2023, and
LongLoRA, as tokens): a key of ``D`` digits hides in filler and is asked for at the end. The
filler (``f``, uniform over its own alphabet, fresh per sequence) fills the whole length, so a
longer sequence puts the key further back. ``depth`` places the key: the ``KEY`` marker sits
after ``round(depth * F)`` of the ``F = seq_len - 2 - 2D`` filler tokens (0: right after ``BOS``;
1: right before ``QUERY``). Training draws the depth uniformly; evaluation uses the fixed
:data:`PASSKEY_DEPTHS`, the same count of sequences at each, so one pass gives the length x depth
heatmap (:meth:`SyntheticTask.depth_index`). ``QUERY`` is ``SEP``: every task's answer follows
its ``SEP``. Only the ``D`` digits after it are scored.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ..training.batches import IGNORE, SPLITS, shard, step_generator

PAD, BOS, SEP = 0, 1, 2
SYMBOLS = range(16, 80)  # copy/reverse alphabet: 64 symbols
KEYS = range(80, 144)  # associative recall: 64 keys ...
VALUES = range(144, 208)  # ... and 64 values
KEY = 3  # passkey: marks the hidden key ...
QUERY = SEP  # ... and asks for it
DIGITS = range(208, 218)  # passkey digits: 10 symbols
FILLER = range(224, 256)  # passkey filler: 32 symbols
#: D, the key's digits. Two: the longest key the cpu-small models learn at L=64 in 500 steps
#: (per-digit accuracy at L, RoPE, 32 filler symbols: D=1 1.00, D=2 1.00, D=3 0.86, D=4 0.49,
#: D=5 0.38; D=5 with 4 filler symbols 0.44, with distinct digits 0.34: the first digit is found,
#: the chain to the next ones is not learned in time). With D=2 nearly every encoding is at
#: 1.00 at L, so what changes past L is length alone, not capacity.
PASSKEY_DIGITS = 2
#: The depths of the evaluation heatmap (fraction of the filler before the key).
PASSKEY_DEPTHS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Evaluation sequences per (length, depth) at least, whatever the token budget: at 8L the
#: budget alone would leave a dozen per depth.
PASSKEY_MIN_PER_DEPTH = 32
TASKS = ("copy", "reverse", "associative-recall", "passkey")
_EVAL_SALT = 7_919  # eval sequences come from a stream no training seed reaches


@dataclass
class SyntheticTask:
    """A task as a :class:`posenc.lab.training.data.LabData` source (vocabulary 256, unit "token")."""

    name: str
    vocab_size: int = 256
    unit: str = "token"

    digits: int = PASSKEY_DIGITS  # passkey only: D

    @property
    def fingerprint(self) -> str:
        if self.name == "passkey":  # the sizes enter every cell's hash
            return f"task-passkey-D{self.digits}-digits{len(DIGITS)}-filler{len(FILLER)}-v1"
        return f"task-{self.name}-v1"

    @property
    def eval_depths(self) -> tuple[float, ...] | None:
        """The depths evaluation sequences are drawn at (passkey), else None."""
        return PASSKEY_DEPTHS if self.name == "passkey" else None

    def sample(
        self,
        g: torch.Generator,
        batch: int,
        seq_len: int,
        depth: float | Sequence[float] | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x, y [batch, seq_len]`` with ``y = IGNORE`` except at answer positions.

        ``depth`` (passkey only): where the key sits, in ``[0, 1]``, one for the batch or one per
        row ``[batch]``; None draws it uniformly per row.
        """
        if self.name == "passkey":
            return self._passkey(g, batch, seq_len, depth)
        if depth is not None:
            raise ValueError(f"depth applies to the passkey task only, not {self.name!r}")
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

    def filler_len(self, seq_len: int) -> int:
        """``F``: passkey filler tokens in a sequence of ``seq_len`` inputs."""
        return seq_len + 1 - 3 - 2 * self.digits  # BOS, KEY, QUERY and the key twice

    def _passkey(
        self,
        g: torch.Generator,
        batch: int,
        seq_len: int,
        depth: float | Sequence[float] | torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d, n, fill = self.digits, seq_len + 1, self.filler_len(seq_len)
        if fill < 0:
            raise ValueError(
                f"task 'passkey' with {d} digits needs sequences of at least {2 * d + 2} "
                f"tokens, got {seq_len}"
            )
        key = torch.randint(DIGITS.start, DIGITS.stop, (batch, d), generator=g)
        if depth is None:
            before = torch.randint(0, fill + 1, (batch,), generator=g)  # filler before KEY
        else:
            dep = torch.as_tensor(depth, dtype=torch.float64).expand(batch)
            if not bool(((dep >= 0) & (dep <= 1)).all()):
                raise ValueError(f"passkey depth must be in [0, 1], got {depth}")
            before = (dep * fill).round().long()  # half to even, as Python's round
        seq = torch.randint(FILLER.start, FILLER.stop, (batch, n), generator=g)
        seq[:, 0] = BOS
        rows = torch.arange(batch)[:, None]
        at = before[:, None] + 1 + torch.arange(d + 1)  # [b, D + 1]: KEY, then the digits
        seq[rows, at] = torch.cat([torch.full((batch, 1), KEY), key], 1)
        seq[:, n - d - 1] = QUERY
        seq[:, n - d :] = key
        y = torch.full((batch, seq_len), IGNORE, dtype=torch.long)
        y[:, seq_len - d :] = key  # targets of QUERY, d1, .., d(D-1)
        return seq[:, :-1], y

    def depth_index(self, x: torch.Tensor) -> torch.Tensor:
        """``[b]``: the index in :data:`PASSKEY_DEPTHS` nearest each passkey row's depth,
        read from where its ``KEY`` marker sits in ``x [b, s]``."""
        if self.name != "passkey":
            raise ValueError(f"depth_index applies to the passkey task only, not {self.name!r}")
        fill = self.filler_len(x.shape[1])
        before = (x == KEY).int().argmax(1) - 1  # [b] filler tokens before KEY
        depth = before.double() / max(fill, 1)
        grid = torch.tensor(PASSKEY_DEPTHS, dtype=torch.float64, device=x.device)
        return (depth[:, None] - grid).abs().argmin(1)

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

        Tasks are whole sequences, so ``stride`` (sliding windows) does not apply. Passkey: the
        count is rounded up to a multiple of ``len(PASSKEY_DEPTHS)``, at least
        ``PASSKEY_MIN_PER_DEPTH`` each, and row ``i`` sits at depth ``i % len(PASSKEY_DEPTHS)``.
        """
        if stride is not None:
            raise ValueError("sliding-window evaluation applies to text corpora, not to tasks")
        count = max(1, max_tokens // seq_len)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        grid = self.eval_depths
        if grid is not None:
            per_depth = max(PASSKEY_MIN_PER_DEPTH, -(-count // len(grid)))
            count = per_depth * len(grid)
        g = step_generator(_EVAL_SALT, seq_len, salt=SPLITS.index(split))
        chunk = max(1, 8192 // seq_len)
        done = 0
        while done < count:
            b = min(chunk, count - done)
            if grid is None:
                yield self.sample(g, b, seq_len)
            else:
                depth = [grid[(done + i) % len(grid)] for i in range(b)]
                yield self.sample(g, b, seq_len, depth=depth)
            done += b


def make_task(name: str, digits: int | None = None) -> SyntheticTask:
    """The task ``name``; ``digits``: the passkey's key length ``D`` (default
    :data:`PASSKEY_DIGITS`)."""
    if name not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {name!r}")
    if digits is None:
        return SyntheticTask(name)
    if name != "passkey":
        raise ValueError(f"digits applies to the passkey task only, not {name!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or digits < 1:
        raise ValueError(f"passkey digits must be a positive integer, got {digits!r}")
    return SyntheticTask(name, digits=digits)
