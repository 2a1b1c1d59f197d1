"""A model's answer to a sample: greedy generation through the KV cache, scored, and the
teacher-forced log-probability of the reference beside it.

One prefill of the prompt serves both: the reference's tokens are fed through the cache after
it (their log-probabilities read as they go), the cache is cut back to the prompt, and greedy
decoding continues from the prompt's last logits, one token a step, until an end-of-sequence
token or the task's ``max_new_tokens`` (RULER's ``tokens_to_generate``; RULER decodes greedily,
``TEMPERATURE="0.0"`` in ``scripts/config_models.sh``). A cache that cannot be cut back (a
sliding-window layer that has dropped keys: Gemma 3's) is refilled by a second prefill instead.

The logits are the model's head on the decoder's last hidden state only (never ``[L, vocab]``
for a long prompt), with Gemma's final soft cap, as :mod:`posenc.extend.measures.perplexity` forms them.
Several questions of one context (samples whose first ``Sample.prefix`` ids are the same:
:func:`answer_group`): the shared ids are prefilled once, and each question forks the cache
after them (:func:`_fork`: the layers' tensors shared, never written in place, since a cache
layer appends by concatenation), feeds its own suffix through the fork, then goes on as
:func:`answer` does; the same tokens and log-probabilities as its whole prompt prefilled alone
(the suffix's logits are the decoder's over the same keys and positions, in another order of
float sums). The questions then decode together (:func:`_greedy_rows`): the forks that hold as
many positions stacked into one batch (a shorter question stepping alone until it reaches a
longer one's position), one decoder step a token for all of them, a question leaving the batch
at its end-of-sequence token or budget. On a CPU a step's cost is the weights read once, so
four questions decode in about the time of one or two; each row's tokens are those it would
write alone up to the float differences of the batched kernels (rows of one step never mix;
equal on the tested tiny models and on SmolLM2's benchmark cells). Caches with a layer other
than a plain or sliding-window one (a recurrent state) decode one question at a time.

Whatever method is applied to the model (a RoPE scaling, Self-Extend, DCA) is in place for the
prefill and every decoding step. Run long prompts inside
:func:`posenc.hf.linear_memory.linear_memory` as the study does.
"""

from __future__ import annotations

import copy
import functools
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...._stats import cluster_wilson_interval, wilson_interval
from ..perplexity import _logits
from .base import Sample, Task, get_task
from .scoring import postprocess


@dataclass(frozen=True)
class Answer:
    """What the model wrote for a sample and how it scored: ``output`` (decoded new tokens, RULER's
    post-processing applied), ``score`` in ``[0, 1]``, ``new_tokens``, ``target_logprob`` (the
    reference continuation's total log-probability given the prompt, None when not asked),
    ``target_tokens`` and ``seconds``."""

    output: str
    score: float
    new_tokens: int
    target_logprob: float | None
    target_tokens: int
    seconds: float


def _decoder(model: Any) -> Any:
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def _cache_kw(decoder: Any) -> str:
    """The decoder's name for the cache argument: ``cache`` (transformers 5) or, before it,
    ``past_key_values`` (5 still reads the old name, with a warning each run)."""
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _step(model: Any, ids: torch.Tensor, cache: Any) -> torch.Tensor:
    """``ids [1, s]`` through the decoder, ``cache`` holding the keys before them and gaining
    theirs -> float32 logits ``[s, vocab]``."""
    decoder = _decoder(model)
    out = decoder(input_ids=ids, use_cache=True, **{_cache_kw(decoder): cache})
    return _logits(model, out.last_hidden_state[0])


def _prefill(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """The prompt ``ids [1, L]`` through the decoder into a fresh cache -> (last position's
    logits ``[vocab]``, cache); only the last hidden state goes through the head."""
    from transformers.cache_utils import DynamicCache

    decoder = _decoder(model)
    cache = DynamicCache(config=model.config)
    out = decoder(input_ids=ids, use_cache=True, **{_cache_kw(decoder): cache})
    return _logits(model, out.last_hidden_state[0, -1:])[0], cache


def _rollback(cache: Any, keep: int) -> bool:
    """Cut ``cache`` back to its first ``keep`` positions where every layer is a plain growing
    one (transformers' ``DynamicLayer``); False, untouched, where one is not (a sliding window
    has dropped keys it would need). By hand: ``crop``'s argument changed meaning in 5.0."""
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", None) or [])
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return False
    for layer in layers:
        if getattr(layer, "keys", None) is not None:
            layer.keys = layer.keys[..., :keep, :]
            layer.values = layer.values[..., :keep, :]
    return True


def _fork(cache: Any) -> Any:
    """A cache that grows apart from ``cache``: plain and sliding-window layers (which replace
    their tensors as they grow, never write into them) copied shallowly, any other layer (a
    recurrent state updated in place) deeply."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    out = copy.copy(cache)
    out.layers = [copy.copy(layer) if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer)
                  else copy.deepcopy(layer) for layer in cache.layers]  # fmt: skip
    return out


def _target_logprob(model: Any, last: torch.Tensor, target: torch.Tensor,
                    cache: Any) -> float:  # fmt: skip
    """The total log-probability of ``target [t]`` following the prompt whose last logits are
    ``last [vocab]`` and whose keys are in ``cache`` (which gains ``t - 1`` positions)."""
    logp = torch.log_softmax(last, -1)[target[0]]
    if target.shape[0] > 1:
        logits = _step(model, target[None, :-1], cache)  # [t - 1, vocab]
        rest = torch.log_softmax(logits, -1).gather(1, target[1:, None])
        logp = logp + rest.sum()
    return float(logp)


def _greedy(model: Any, last: torch.Tensor, cache: Any, max_new: int,
            stop: set[int]) -> list[int]:  # fmt: skip
    """Greedy tokens after the prompt (its last logits ``last``, its keys in ``cache``): at
    most ``max_new``, the first of ``stop`` ending it (not kept)."""
    out: list[int] = []
    token = int(last.argmax())
    device = last.device
    while token not in stop and len(out) < max_new:
        out.append(token)
        if len(out) == max_new:
            break
        logits = _step(model, torch.tensor([[token]], device=device), cache)
        token = int(logits[-1].argmax())
    return out


def _stackable(cache: Any) -> bool:
    """Whether ``cache`` can share a batch with other forks of its context: transformers'
    ``DynamicCache`` of plain and sliding-window layers only (a recurrent state cannot)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    kinds = (DynamicLayer, _appending_layer(), DynamicSlidingWindowLayer)
    return type(cache) is DynamicCache and all(
        type(layer) in kinds and not getattr(layer, "record_past", False) for layer in cache.layers
    )


@functools.cache
def _appending_layer() -> type:
    """transformers' ``DynamicLayer`` whose keys and values are views of buffers with room to
    grow: a decode step writes its one position in place, where ``DynamicLayer`` copies the whole
    cache (``torch.cat``) at every step, a copy as large as the batch's keys and values."""
    from transformers.cache_utils import DynamicLayer

    class AppendingLayer(DynamicLayer):  # type: ignore[misc]
        room: torch.Tensor  # [b, h, capacity, d]: keys in the first positions
        value_room: torch.Tensor

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
            keys, values = self.keys, self.values
            assert keys is not None and values is not None  # filled when the batch was made
            n, s = keys.shape[-2], key_states.shape[-2]
            if n + s > self.room.shape[-2]:  # out of room: twice as much (not on a study's path)
                self.room = _with_room(keys, 2 * (n + s))
                self.value_room = _with_room(values, 2 * (n + s))
            self.room[..., n : n + s, :] = key_states
            self.value_room[..., n : n + s, :] = value_states
            self.keys = self.room[..., : n + s, :]
            self.values = self.value_room[..., : n + s, :]
            return self.keys, self.values

    return AppendingLayer


def _with_room(x: torch.Tensor, size: int) -> torch.Tensor:
    """A new ``[b, h, size, d]`` buffer whose first positions are ``x [b, h, n, d]``."""
    out = x.new_empty(*x.shape[:-2], size, x.shape[-1])
    out[..., : x.shape[-2], :] = x
    return out


def _rows(caches: Sequence[Any], rows: Sequence[int] | None = None, room: int = 0) -> Any:
    """One cache whose batch rows are those of ``caches`` (forks of one context after as many
    positions each) stacked, or (``rows``) the rows ``rows`` of the one cache ``caches[0]``;
    layers copied shallowly, their tensors new, the plain layers' with ``room`` positions to
    grow in place (:func:`_appending_layer`)."""
    from transformers.cache_utils import DynamicSlidingWindowLayer

    out = copy.copy(caches[0])
    out.layers = []
    for i, layer in enumerate(caches[0].layers):
        new = copy.copy(layer)
        if layer.keys is not None:
            if rows is None:
                keys = torch.cat([c.layers[i].keys for c in caches], 0)
                values = torch.cat([c.layers[i].values for c in caches], 0)
            else:
                index = torch.tensor(rows, device=layer.keys.device)
                keys, values = layer.keys[index], layer.values[index]
            new.keys, new.values = keys, values
            if type(layer) is not DynamicSlidingWindowLayer:  # a window's copy is its window
                new.__class__ = _appending_layer()
                n = keys.shape[-2]
                new.room, new.value_room = _with_room(keys, n + room), _with_room(values, n + room)
                new.keys, new.values = new.room[..., :n, :], new.value_room[..., :n, :]
        out.layers.append(new)
    return out


def _greedy_rows(model: Any, lasts: Sequence[torch.Tensor], caches: Sequence[Any],
                 lengths: Sequence[int], budgets: Sequence[int],
                 stop: set[int]) -> list[list[int]]:  # fmt: skip
    """:func:`_greedy` for several prompts of one context at once (their last logits ``lasts``,
    each ``[vocab]``, their ``lengths`` positions in ``caches``), in decoder steps shared by the
    rows whose caches hold as many positions: such rows feed their next token at the same
    position over keys at the same positions, one batch. A shorter prompt steps alone (or with
    its equals) until it reaches a longer one's position, and they go on together; a row leaves
    at its first ``stop`` token or its budget. Caches that cannot stack
    (:func:`_stackable`) decode each prompt in turn."""
    if not all(_stackable(c) for c in caches):
        return [_greedy(model, last, cache, budget, stop)
                for last, cache, budget in zip(lasts, caches, budgets, strict=True)]  # fmt: skip
    out: list[list[int]] = [[] for _ in lasts]
    tokens = [int(last.argmax()) for last in lasts]
    at: dict[int, tuple[list[int], Any]] = {}  # cache length -> its rows, their batched cache
    room = max(budgets) + max(lengths) - min(lengths)  # positions any batch may still append
    for i, token in enumerate(tokens):
        if token in stop or budgets[i] < 1:
            continue
        out[i].append(token)
        if len(out[i]) < budgets[i]:
            _join(at, lengths[i], [i], caches[i], room)
            if isinstance(caches, list):
                caches[i] = None  # the fork's memory freed once the batch holds its copy
    device = lasts[0].device
    decoder = _decoder(model)
    while at:
        length = min(at)
        live, cache = at.pop(length)
        ids = torch.tensor([[tokens[i]] for i in live], device=device)  # [rows, 1]
        hidden = decoder(input_ids=ids, use_cache=True,
                         **{_cache_kw(decoder): cache}).last_hidden_state[:, -1]  # fmt: skip
        keep = []
        for row, (i, token) in enumerate(zip(live, _logits(model, hidden).argmax(-1).tolist(),
                                             strict=True)):  # fmt: skip
            tokens[i] = token
            if token not in stop:
                out[i].append(token)
                if len(out[i]) < budgets[i]:
                    keep.append(row)
        if keep:
            cache = cache if len(keep) == len(live) else _rows([cache], keep, room)
            _join(at, length + 1, [live[row] for row in keep], cache, room, fresh=False)
    return out


def _join(at: dict[int, tuple[list[int], Any]], length: int, rows: list[int], cache: Any,
          room: int, fresh: bool = True) -> None:  # fmt: skip
    """``rows`` (their cache ``cache``, ``length`` positions) into the batch at ``length``; a
    ``fresh`` cache (a fork's, shared with its context) copied into buffers with ``room``."""
    if length in at:
        others, theirs = at[length]
        rows, cache = others + rows, _rows([theirs, cache], room=room)
    elif fresh:
        cache = _rows([cache], room=room)
    at[length] = (rows, cache)


def _stop_ids(tokenizer: Any, model: Any) -> set[int]:
    """End-of-sequence ids: the tokenizer's and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids.update(gen if isinstance(gen, list) else [gen] if gen is not None else [])
    return {int(i) for i in ids}


@torch.inference_mode()
def answer(model: Any, tokenizer: Any, sample: Sample, *, logprob: bool = True,
           max_new_tokens: int | None = None, task: Task | None = None) -> Answer:  # fmt: skip
    """``sample`` answered by ``model`` (a transformers causal LM, any method applied) greedily
    through its KV cache, at most ``max_new_tokens`` new tokens (default: the task's, RULER's),
    scored by the task's rule, and (``logprob``) the teacher-forced log-probability of
    ``sample.target`` from the same prefill. ``tokenizer`` decodes the new tokens; ``task``
    defaults to the registered one of ``sample.task``."""
    device = next(model.parameters()).device
    ids = torch.tensor([sample.ids], device=device)  # [1, L]
    start = time.perf_counter()
    last, cache = _prefill(model, ids)
    return _finish(model, tokenizer, sample, last, cache, lambda: _prefill(model, ids), start,
                   logprob=logprob, max_new_tokens=max_new_tokens, task=task)  # fmt: skip


@torch.inference_mode()
def answer_group(model: Any, tokenizer: Any, samples: Sequence[Sample], *, logprob: bool = True,
                 max_new_tokens: int | None = None, task: Task | None = None) -> list[Answer]:  # fmt: skip
    """The questions ``samples`` of one shared context (their first ``prefix`` ids the same)
    answered as :func:`answer` answers each alone, the context prefilled once, the cache forked
    after it for each, and the questions of one prompt length decoded as one batch (module
    docstring). Each answer's ``seconds``: its own question and reference, and equal shares of
    the shared prefill and of all the questions' decoding."""
    prefix = samples[0].prefix
    shared = samples[0].ids[:prefix]
    if prefix < 1 or any(s.prefix != prefix or s.ids[:prefix] != shared or len(s.ids) <= prefix
                         for s in samples):  # fmt: skip
        raise ValueError("answer_group needs samples that share their first `prefix` ids, each "
                         "with a question after them")  # fmt: skip
    device = next(model.parameters()).device
    start = time.perf_counter()
    _, context = _prefill(model, torch.tensor([shared], device=device))  # [1, prefix]
    share = (time.perf_counter() - start) / len(samples)
    asked = []  # per question: its prompt's last logits, cache, reference, seconds so far
    for s in samples:
        suffix = torch.tensor([s.ids[prefix:]], device=device)  # [1, L - prefix]

        def ask(suffix: torch.Tensor = suffix) -> tuple[torch.Tensor, Any]:
            cache = _fork(context)
            return _step(model, suffix, cache)[-1], cache

        begin = time.perf_counter()
        last, cache = ask()
        last, cache, reference = _reference(model, tokenizer, s, last, cache, ask, logprob)
        asked.append((last, cache, reference, share + time.perf_counter() - begin))
    caches = [a[1] for a in asked]  # emptied as their questions join a batch (then copied)
    asked = [(a[0], None, a[2], a[3]) for a in asked]
    begin = time.perf_counter()
    new = _greedy_rows(model, [a[0] for a in asked], caches,
                       [len(s.ids) for s in samples],
                       [_budget(s, max_new_tokens) for s in samples], _stop_ids(tokenizer, model))  # fmt: skip
    took = (time.perf_counter() - begin) / len(samples)
    return [_scored(tokenizer, s, tokens, *a[2], a[3] + took, task)
            for s, tokens, a in zip(samples, new, asked, strict=True)]  # fmt: skip


def _budget(sample: Sample, max_new_tokens: int | None) -> int:
    return sample.max_new_tokens if max_new_tokens is None else max_new_tokens


def _reference(model: Any, tokenizer: Any, sample: Sample, last: torch.Tensor, cache: Any,
               again: Any, logprob: bool) -> tuple[torch.Tensor, Any, tuple[float | None, int]]:  # fmt: skip
    """After the prompt (its last logits ``last [vocab]``, its keys in ``cache``): the
    reference's teacher-forced log-probability and token count (None, 0 without ``logprob``),
    and the prompt's logits and cache to decode from: ``cache`` cut back, or ``again()``'s."""
    if not logprob:
        return last, cache, (None, 0)
    target = tokenizer(sample.target, add_special_tokens=False)["input_ids"]
    value = _target_logprob(model, last, torch.tensor(target, device=last.device), cache)
    if not _rollback(cache, len(sample.ids)):  # a cache that forgets: the prompt again
        last, cache = again()
    return last, cache, (value, len(target))


def _scored(tokenizer: Any, sample: Sample, new: list[int], target_logprob: float | None,
            target_len: int, seconds: float, task: Task | None) -> Answer:  # fmt: skip
    output = postprocess(tokenizer.decode(new, skip_special_tokens=True))
    task = task or get_task(sample.task)
    return Answer(output, task.score(output, sample), len(new), target_logprob, target_len,
                  seconds)  # fmt: skip


def _finish(model: Any, tokenizer: Any, sample: Sample, last: torch.Tensor, cache: Any,
            again: Any, start: float, *, logprob: bool, max_new_tokens: int | None,
            task: Task | None) -> Answer:  # fmt: skip
    """The answer after the prompt (its last logits ``last [vocab]``, its keys in ``cache``):
    the reference's log-probability, the cache cut back (or ``again()``: the prompt's logits
    and cache anew), greedy decoding, the score; ``start`` the clock at its beginning."""
    last, cache, reference = _reference(model, tokenizer, sample, last, cache, again, logprob)
    new = _greedy(model, last, cache, _budget(sample, max_new_tokens), _stop_ids(tokenizer, model))
    return _scored(tokenizer, sample, new, *reference, time.perf_counter() - start, task)


# --- scores over samples ---------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """The mean of ``n`` sample scores in ``[0, 1]`` with its Wilson interval ``[low, high]``
    (:func:`posenc._stats.wilson_interval`, ``level``; samples sharing a context:
    :func:`posenc._stats.cluster_wilson_interval`)."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95


def summarize(scores: Sequence[float], level: float = 0.95,
              contexts: Sequence[str] | None = None) -> Score:  # fmt: skip
    """``scores`` (one per sample, each in ``[0, 1]``) -> their mean and Wilson interval;
    ``contexts`` (one id per sample: samples of one id asked of one shared context) makes it
    the cluster-aware interval of :func:`posenc._stats.cluster_wilson_interval`."""
    values = [float(s) for s in scores]
    if not values:
        raise ValueError("summarize needs at least one score")
    if any(not 0.0 <= v <= 1.0 for v in values):
        raise ValueError(f"scores must be in [0, 1], got {values}")
    if contexts is None:
        low, high = wilson_interval(sum(values), len(values), level)
    else:
        low, high = cluster_wilson_interval(values, list(contexts), level)
    return Score(sum(values) / len(values), low, high, len(values), level)
