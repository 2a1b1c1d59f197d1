"""Key-token perplexity (LongPPL): perplexity only on the tokens that need a long context.

Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?" (ICLR 2025;
their code: the ``longppl`` package, ``longppl/longppl.py``). Plain perplexity is dominated by
tokens a few words of context predict; LongPPL averages the loss only over *key tokens*: those an
evaluator predicts well with the whole context and much worse with only the last ``trunc_len``
tokens. With ``full`` and ``short`` the evaluator's losses of a token with the whole context and
with the truncated one, a token is key when

    ``full < beta`` and ``short - full > alpha``    (both strict; the paper's alpha = beta = 2)

(the authors write ``beta = -2`` on the log-probability: ``loss_full < -beta``). LongPPL of a
model is ``exp`` of its own whole-context loss averaged over the key tokens.

The truncated losses come in the authors' windows: for ``s`` in
``range(0, L - trunc_len, window)`` one forward of ``ids[s : s + trunc_len + w]``
(``w = min(window, L - s - trunc_len)``) scores its last ``w`` tokens, so the token at position
``p = s + trunc_len + j`` (``0 <= j < w``) is predicted from ``ids[s : p]``: ``trunc_len + j``
tokens, between ``trunc_len`` and ``trunc_len + window - 1``, never exactly the last
``trunc_len`` when ``j > 0``. Tokens at positions ``< trunc_len`` have no truncated loss (their
whole context is shorter) and are never key. The windows do not depend on ``L`` except for the
last one's end, so a token's truncated context is the same whatever the document's length.

Shapes and alignment follow :func:`posenc.extend.measures.perplexity.token_nll`: ``ids [1, L]`` ->
``nll [L - 1]``, ``nll[i]`` the loss of the token at position ``i + 1``; a key-token *position*
is a token's index in ``ids`` (the authors' ``start_token + trunc_len + i``), so position ``p``
reads ``nll[p - 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .perplexity import token_losses

TRUNC_LEN = 4096  # the authors' default truncated context (tokens)
WINDOW = 1024  # the authors' default tokens per truncated forward ("sliding_window")
ALPHA = 2.0  # the loss gain a key token must show with the whole context (nats)
BETA = 2.0  # the whole-context loss a key token must stay under (nats)


def short_windows(length: int, trunc_len: int, window: int) -> list[tuple[int, int]]:
    """The authors' truncated forwards of an ``length``-token sequence as ``(start, w)``: the
    forward reads ``ids[start : start + trunc_len + w]`` and scores its last ``w`` tokens;
    empty when ``length <= trunc_len``."""
    if trunc_len < 1 or window < 1:
        raise ValueError(f"LongPPL needs trunc_len >= 1 and window >= 1, got {trunc_len}, {window}")
    return [(s, min(window, length - s - trunc_len)) for s in range(0, length - trunc_len, window)]


@torch.inference_mode()
def short_context_nll(
    model: Any, ids: torch.Tensor, trunc_len: int = TRUNC_LEN, window: int = WINDOW
) -> torch.Tensor:
    """``ids [1, L]`` -> float32 ``nll [L - 1]`` aligned with ``token_nll``: ``nll[p - 1]`` is
    the loss of the token at position ``p >= trunc_len`` given only ``ids[s : p]`` of its window
    (:func:`short_windows`: ``trunc_len`` to ``trunc_len + window - 1`` tokens); NaN for the
    positions ``1 .. trunc_len - 1`` (no truncated context). One forward per window through
    :func:`~posenc.extend.measures.perplexity.token_losses` (the head only on the scored positions); the
    caller applies the method and, for a long one, :func:`~posenc.hf.linear_memory.linear_memory`
    (the study's ``run_cell`` does both)."""
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(f"short_context_nll takes ids of shape [1, L], got {tuple(ids.shape)}")
    length = ids.shape[1]
    out = torch.full((length - 1,), math.nan, dtype=torch.float32, device=ids.device)
    for start, w in short_windows(length, trunc_len, window):
        piece = ids[:, start : start + trunc_len + w]  # [1, trunc_len + w]
        p = start + trunc_len  # the first scored position
        out[p - 1 : p - 1 + w] = token_losses(model, piece, start=trunc_len)
    return out


def key_token_mask(
    full_nll: torch.Tensor, short_nll: torch.Tensor, alpha: float = ALPHA, beta: float = BETA
) -> torch.Tensor:
    """``full_nll, short_nll [n]`` -> bool ``[n]``: ``full < beta`` and ``short - full > alpha``
    (strict, as the authors'); a NaN loss (no truncated context) is never key."""
    if full_nll.shape != short_nll.shape:
        raise ValueError(
            f"key_token_mask needs losses of one shape, got {tuple(full_nll.shape)} and "
            f"{tuple(short_nll.shape)}"
        )
    full, short = full_nll.double(), short_nll.double()
    return (full < beta) & ((short - full) > alpha)


def key_positions(mask: torch.Tensor) -> list[int]:
    """bool ``mask [L - 1]`` aligned with ``token_nll`` -> the key tokens' positions in ``ids``
    (``mask[i]`` is the token at position ``i + 1``), increasing."""
    return [int(i) + 1 for i in torch.nonzero(mask, as_tuple=True)[0].tolist()]


def positions_mask(positions: Iterable[int], size: int) -> torch.Tensor:
    """The inverse of :func:`key_positions`: bool ``[size]`` (``size = L - 1``) true at
    ``p - 1`` for each position ``p``; a position outside ``[1, size]`` is a ValueError."""
    mask = torch.zeros(size, dtype=torch.bool)
    for p in positions:
        if not 1 <= p <= size:
            raise ValueError(f"key-token position {p} is outside [1, {size}]")
        mask[p - 1] = True
    return mask


def key_token_perplexity(
    nll: torch.Tensor, mask: torch.Tensor, lengths: Sequence[int]
) -> tuple[dict[int, float | None], dict[int, int]]:
    """``nll, mask [L - 1]`` (aligned with ``token_nll``) -> ``({length: LongPPL}, {length:
    key tokens})``: at each length ``n``, ``exp`` of the mean loss over the key tokens at
    positions ``< n`` (``nll[: n - 1]``), None where there are none (every ``n <= trunc_len``)."""
    if nll.shape != mask.shape:
        raise ValueError(
            f"key_token_perplexity needs nll and mask of one shape, got {tuple(nll.shape)} and "
            f"{tuple(mask.shape)}"
        )
    values, counts = {}, {}
    for n in lengths:
        if not 2 <= n <= nll.shape[0] + 1:
            raise ValueError(f"length {n} is outside [2, {nll.shape[0] + 1}] of these losses")
        key = nll[: n - 1].double()[mask[: n - 1]]
        counts[n] = int(key.numel())
        values[n] = math.exp(float(key.mean())) if key.numel() else None
    return values, counts


def plain_perplexity(nll: torch.Tensor, lengths: Sequence[int]) -> dict[int, float]:
    """``nll [L - 1]`` -> ``{length: exp(mean loss of the tokens at positions 1 .. n - 1)}``:
    every token of the first ``n``, the authors' ``ppl`` beside LongPPL (the ``ppl`` rows'
    perplexity is the last bin's only)."""
    return {n: math.exp(float(nll[: n - 1].double().mean())) for n in lengths}
