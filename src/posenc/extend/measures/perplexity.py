"""What a long context does to a real model: loss at every position, perplexity by length, and
passkey retrieval by length and depth.

One forward of the longest length per (method, document) gives the negative log-likelihood of
every token given all before it (:func:`token_nll`; :func:`token_losses` for a range of
positions); the loss in bins and the perplexity at each length come from that one vector. The
logits are formed a chunk of positions at a time from the final hidden states, so memory holds
``chunk x vocab`` logits, never ``L x vocab``.

Shapes: ``ids [1, L]`` -> ``nll [L - 1]`` (``nll[i]`` is the loss of token ``i + 1``).
"""

from __future__ import annotations

import math
import random
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

LOGIT_CHUNK = 1024  # positions per lm_head call: 1024 x 49,152 float32 logits = 192 MiB


def _hidden(model: Any, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's final hidden states ``[b, L, hidden]`` (the model's own norm applied)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    out = decoder(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state


def _logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The model's head on hidden states, float32 (Gemma's final soft cap where it has one)."""
    logits = model.get_output_embeddings()(hidden).float()
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


@torch.inference_mode()
def token_losses(
    model: Any,
    ids: torch.Tensor,
    start: int = 1,
    end: int | None = None,
    chunk: int = LOGIT_CHUNK,
) -> torch.Tensor:
    """``ids [1, L]`` -> float32 ``nll [end - start]``: ``nll[j]`` is the loss of token
    ``start + j`` given every token before it, ``-log p(ids[start + j] | ids[:start + j])``.

    The model's body runs once, over ``ids[:, :end]`` (later tokens cannot change a causal
    model's earlier losses); the head, float32 log-softmax and NLL then run ``chunk`` positions at
    a time over the hidden states of positions ``[start - 1, end - 1)`` only, so memory holds
    ``chunk x vocab`` logits, never ``L x vocab``, and positions that are not scored never reach
    the head. ``start=1, end=None`` scores every token after the first (:func:`token_nll`); a
    LongPPL-style key-token loss scores a range, e.g. the last 4k tokens of a long context.
    The head is the model's own, Gemma's final logit soft cap included (:func:`_logits`)."""
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(
            f"token_losses takes ids of shape [1, L] with L >= 2, got {tuple(ids.shape)}"
        )
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"token_losses takes integer token ids, got dtype {ids.dtype}")
    length = ids.shape[1]
    end = length if end is None else end
    if not 1 <= start < end <= length:
        raise ValueError(
            f"token_losses scores tokens [start, end) with 1 <= start < end <= L = {length}, "
            f"got start {start}, end {end}"
        )
    if chunk < 1:
        raise ValueError(f"token_losses needs chunk >= 1 positions, got {chunk}")
    hidden = _hidden(model, ids[:, :end])[0, start - 1 : end - 1]  # [n, hidden]
    targets = ids[0, start:end]  # [n]
    out = torch.empty(targets.shape[0], dtype=torch.float32, device=ids.device)
    for i in range(0, targets.shape[0], chunk):
        logits = _logits(model, hidden[i : i + chunk])  # [c, vocab] float32
        out[i : i + logits.shape[0]] = torch.nn.functional.cross_entropy(
            logits, targets[i : i + logits.shape[0]], reduction="none"
        )
    return out


def token_nll(model: Any, ids: torch.Tensor, chunk: int = LOGIT_CHUNK) -> torch.Tensor:
    """``ids [1, L]`` -> float32 ``nll [L - 1]``, the loss of each token given all before it
    (:func:`token_losses` over every token after the first)."""
    return token_losses(model, ids, chunk=chunk)


def bin_means(nll: Sequence[float] | torch.Tensor, bin_size: int) -> list[float]:
    """Mean loss per bin of ``bin_size`` target tokens (the last bin may be shorter)."""
    t = torch.as_tensor(nll, dtype=torch.float64)
    return [float(t[i : i + bin_size].mean()) for i in range(0, t.shape[0], bin_size)]


def perplexity_at(nll: Sequence[float] | torch.Tensor, length: int, window: int) -> float:
    """Perplexity of the tokens at positions ``[length - window, length)`` given everything
    before them: the number that measures use of a context of ``length`` tokens."""
    t = torch.as_tensor(nll, dtype=torch.float64)
    if length > t.shape[0] + 1 or window < 1 or window >= length:
        raise ValueError(
            f"perplexity_at needs 1 <= window < length <= {t.shape[0] + 1}, got window {window}, "
            f"length {length}"
        )
    return math.exp(float(t[length - window - 1 : length - 1].mean()))


# --- documents ------------------------------------------------------------------------------------


def default_documents(count: int) -> list[Path]:
    """The longest ``.py`` files of the installed Python's standard library, ``pydoc_data``'s
    ``topics.py`` first: long, real, and present on every machine that runs Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    topics = stdlib / "pydoc_data" / "topics.py"
    files = sorted(
        (p for p in stdlib.glob("*.py") if p.is_file()),
        key=lambda p: p.stat().st_size,
        reverse=True,
    )
    picked = ([topics] if topics.is_file() else []) + files
    return picked[:count]


def document_ids(tokenizer: Any, path: Path, length: int) -> torch.Tensor:
    """The first ``length`` tokens of the file at ``path`` (BOS first where the tokenizer has
    one) as ``[1, length]``; a document too short is one line naming it."""
    text = path.read_text(encoding="utf-8", errors="replace")
    bos = tokenizer.bos_token_id
    ids = leading_ids(tokenizer, text, length - (bos is not None))
    if bos is not None:
        ids = [bos, *ids]
    if len(ids) < length:
        raise ValueError(f"{path} has {len(ids)} tokens, fewer than the {length} asked for")
    return torch.tensor([ids[:length]])


def leading_ids(tokenizer: Any, text: str, count: int) -> list[int]:
    """The first ``count`` ids of ``text`` tokenized whole (no special token), from a prefix:
    the default documents run to 700 kB, and a study read them at every cell (a third of a tiny
    model's study went to the tokenizer). A cut changes only the ids of the words it cuts, so a
    prefix whose first ``count`` ids equal those of a prefix twice as long gives them; else the
    prefix doubles, up to the whole text. All of ``text``'s ids where it has fewer."""

    def enc(part: str) -> list[int]:
        return list(tokenizer(part, add_special_tokens=False)["input_ids"])

    n = max(4096, 8 * count)
    ids = enc(text[:n])
    while n < len(text):
        longer = enc(text[: 2 * n])
        if len(ids) > count and ids[:count] == longer[:count]:
            return ids[:count]
        n, ids = 2 * n, longer
    return ids[:count]


# --- passkey ------------------------------------------------------------------------------------

PASSKEY_INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n"
)
PASSKEY_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = "\nWhat is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyPrompt:
    """``ids [1, length]``: intro, filler with the needle at ``depth``, question, then the key's
    tokens, which are the last ``key_tokens`` ids (scored, never seen before they are predicted)."""

    ids: torch.Tensor
    key: str
    key_tokens: int
    depth: float


def passkey_prompt(tokenizer: Any, length: int, depth: float, seed: int) -> PasskeyPrompt:
    """A passkey prompt of exactly ``length`` tokens with a 5-digit key at ``depth`` (0: just
    after the intro, 1: just before the question) of the filler."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey depth must be in [0, 1], got {depth}")
    key = str(random.Random(seed).randint(10000, 99999))

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    intro, filler, needle = (
        enc(PASSKEY_INTRO),
        enc(PASSKEY_FILLER),
        enc(PASSKEY_NEEDLE.format(key=key)),
    )
    question, answer = enc(PASSKEY_QUESTION), enc(" " + key)
    room = length - len(bos) - len(intro) - len(needle) - len(question) - len(answer)
    if room < 0:
        raise ValueError(
            f"passkey length {length} is too short for the prompt ({length - room} tokens)"
        )
    body = (filler * (room // max(1, len(filler)) + 1))[:room]
    at = round(depth * room)
    ids = bos + intro + body[:at] + needle + body[at:] + question + answer
    return PasskeyPrompt(torch.tensor([ids]), key, len(answer), depth)


@torch.inference_mode()
def score_passkey(model: Any, prompt: PasskeyPrompt) -> dict[str, Any]:
    """The key's total log-probability, each key token's rank (1: the greedy choice) and
    whether greedy decoding writes the key exactly (every rank 1) — one forward."""
    ids = prompt.ids.to(next(model.parameters()).device)
    n = prompt.key_tokens
    hidden = _hidden(model, ids)[0, -n - 1 : -1]  # [n, hidden]: the states that predict the key
    logits = _logits(model, hidden)  # [n, vocab]
    targets = ids[0, -n:]  # [n]
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(1, targets[:, None])[:, 0]  # [n]
    ranks = (logp > chosen[:, None]).sum(-1) + 1  # [n]
    return {
        "key_logprob": float(chosen.sum()),
        "ranks": [int(r) for r in ranks],
        "exact": bool((ranks == 1).all()),
    }
