"""Passkey retrieval over bytes: can a model find a number hidden in filler text and repeat it?

The prompt is the one of Landmark Attention (Mohtashami & Jaggi 2023) that LongLoRA reuses,
lines joined by ``"\\n"``::

    There is an important info hidden inside a lot of irrelevant text. Find it and memorize ...
    <filler: "The grass is green. The sky is blue. ..." repeated, cut to a byte count>
    The pass key is 12345. Remember it. 12345 is the pass key.
    <filler, again from its start>
    What is the pass key? The pass key is 12345

The filler is split at ``depth`` (0: the key line right after the task line; 1: right before
the question) and sized so the whole sample, answer included, is ``length`` bytes. Unlike the
originals (a key from 1 to 50000), the key has a fixed number of uniform digits, so a model that
guesses digits scores 10% per digit. ``task_description=False`` drops the first line
for models trained on short contexts.

Scoring is by teacher forcing: the model reads the whole sample once and digit ``j`` counts as
right when the argmax at the byte before it is that digit. The whole key is right under teacher
forcing exactly when greedy decoding would reproduce it (each step then sees the true prefix),
so ``key_accuracy`` is greedy exact match at the cost of one forward pass; ``digit_accuracy``
gives partial credit that greedy decoding would not (after a wrong digit it goes off track).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..._checks import check_number, check_positive_int

__all__ = ["PasskeyGrid", "PasskeySample", "passkey_grid", "passkey_sample", "score_passkey"]

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
    "them. I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"

#: ``model(tokens [b, s] int64) -> logits [b, s, vocab]`` (a :class:`~posenc.model.TransformerLM`).
Model = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PasskeySample:
    """One sample: ``tokens [length]`` int64 bytes, the prompt followed by ``" " + key``.

    ``answer_start`` is the index of the key's first digit (``length - len(key)``),
    ``needle_start`` that of the key line.
    """

    tokens: torch.Tensor
    key: str
    answer_start: int
    needle_start: int

    @property
    def text(self) -> str:
        return bytes(self.tokens.tolist()).decode("ascii")


def _filler(n: int) -> str:
    """The first ``n`` bytes of the filler sentences joined by spaces (as ``garbage_inf``)."""
    reps = n // (len(FILLER) + 1) + 1
    return " ".join([FILLER] * reps)[:n]


def passkey_sample(
    length: int,
    depth: float,
    *,
    generator: torch.Generator | None = None,
    key: str | None = None,
    digits: int = 5,
    task_description: bool = True,
) -> PasskeySample:
    """The sample of ``length`` bytes with the key line at ``depth`` in ``[0, 1]`` of the filler.

    ``key``: the digits to hide; default ``digits`` uniform digits drawn from ``generator``
    (``torch.randint(0, 10, (digits,))``). Raises if ``length`` cannot hold the fixed lines.
    """
    check_positive_int("length", length)
    depth = check_number("depth", depth, low=0.0, high=1.0)
    if key is None:
        key = "".join(map(str, torch.randint(0, 10, (digits,), generator=generator).tolist()))
    if not key.isascii() or not key.isdigit():
        raise ValueError(f"key must be a string of digits, got {key!r}")
    head = [TASK] if task_description else []
    needle = NEEDLE.format(key=key)
    tail = f"{QUESTION} {key}"
    # Lines: head..., prefix, needle, suffix, tail, joined by newlines.
    fixed = sum(map(len, head)) + len(needle) + len(tail) + len(head) + 3
    n_filler = length - fixed
    if n_filler < 0:
        raise ValueError(
            f"length must be >= {fixed} bytes to hold the task, key line and question with a "
            f"{len(key)}-digit key (task_description=False saves {len(TASK) + 1}), got {length}"
        )
    n_before = round(depth * n_filler)
    lines = [*head, _filler(n_before), needle, _filler(n_filler - n_before), tail]
    text = "\n".join(lines)
    tokens = torch.tensor(list(text.encode("ascii")), dtype=torch.long)  # [length]
    needle_start = sum(len(line) + 1 for line in lines[: len(head) + 1])
    return PasskeySample(tokens, key, length - len(key), needle_start)


@torch.no_grad()
def score_passkey(model: Model, tokens: torch.Tensor, digits: int) -> torch.Tensor:
    """Teacher-forced digit hits: ``tokens [b, L]`` samples ending in a ``digits``-digit key ->
    bool ``[b, digits]``, True where the argmax before a digit is that digit."""
    if tokens.dim() != 2 or not 0 < digits < tokens.shape[1]:
        raise ValueError(
            f"tokens must be [b, L] with L > digits={digits}, got {list(tokens.shape)}"
        )
    length = tokens.shape[1]
    logits = model(tokens)  # [b, L, vocab]
    guess = logits[:, length - digits - 1 : length - 1].argmax(-1)  # [b, digits]
    return guess == tokens[:, length - digits :]


@dataclass(frozen=True)
class PasskeyGrid:
    """Accuracies ``[len(lengths), len(depths)]``: ``digit_accuracy`` (fraction of right digits)
    and ``key_accuracy`` (fraction of keys entirely right = greedy exact match)."""

    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    digit_accuracy: np.ndarray
    key_accuracy: np.ndarray


def passkey_grid(
    model: Model,
    lengths: Sequence[int],
    depths: Sequence[float],
    *,
    trials: int = 10,
    digits: int = 5,
    seed: int = 0,
    batch_size: int = 8,
    task_description: bool = True,
    device: torch.device | str | None = None,
) -> PasskeyGrid:
    """Score ``trials`` samples per (length, depth) cell, by teacher forcing (module docstring).

    Samples come from one generator seeded with ``seed``, cell by cell (lengths outer), so a grid
    is the same on every run and for every model. An ``nn.Module`` is evaluated in eval mode and
    put back as it was; ``device`` defaults to the module's parameters' (else CPU).
    """
    check_positive_int("trials", trials)
    check_positive_int("batch_size", batch_size)
    g = torch.Generator().manual_seed(seed)
    hits = np.zeros((len(lengths), len(depths), trials, digits), dtype=bool)
    module = model if isinstance(model, nn.Module) else None
    if device is None and module is not None:
        device = next((p.device for p in module.parameters()), None)
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    try:
        for i, length in enumerate(lengths):
            for j, depth in enumerate(depths):
                batch = [
                    passkey_sample(
                        length, depth, generator=g, digits=digits, task_description=task_description
                    ).tokens
                    for _ in range(trials)
                ]
                tokens = torch.stack(batch).to(device)  # [trials, length]
                for r in range(0, trials, batch_size):
                    got = score_passkey(model, tokens[r : r + batch_size], digits)
                    hits[i, j, r : r + batch_size] = got.cpu().numpy()
    finally:
        if module is not None:
            module.train(was_training)
    return PasskeyGrid(
        tuple(lengths), tuple(depths), hits.mean(axis=(2, 3)), hits.all(axis=3).mean(axis=2)
    )
