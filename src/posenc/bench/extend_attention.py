"""Self-Extend and Dual Chunk Attention in a real model: the fused path (:mod:`posenc.extend.methods.fused`)
against the explicit one (:mod:`posenc.extend.methods.explicit`) and the stock forward, timed in one run.

A prefill is one forward of ``tokens`` tokens with no cache and the logits of the last position
only (``logits_to_keep=1``, as ``generate`` runs it), so the times are the model's body, where
attention is. A decode step appends one token to a cache of ``tokens`` and crops it back, so every
timed call sees the same length; the patched model's cache is built once and stepped through by
both paths (the cache holds unrotated keys either way). The candidates of one case are timed
round-robin (every other round in reverse) on this thread's CPU clock with torch on one thread;
the figures are medians. ``max_abs_diff``: the largest difference of the fused and explicit
paths' last-position logits (prefill) or step logits (decode) in the same run.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import harness
from .rows import BenchRows, number

#: The settings of the method last run, as the rows write them ("group_size=4,...").
OPTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class ExtendRow:
    """One case: ms per call (medians; NaN where a candidate was not run)."""

    phase: str  # "prefill" or "decode"
    tokens: int  # prefill: the prompt; decode: the cached context
    method: str  # "self_extend" or "dual_chunk"
    options: str  # the method's settings, "group_size=4,neighbor_window=1024"
    stock_ms: float
    fused_ms: float
    explicit_ms: float
    samples: int  # rounds of the fused candidate
    max_abs_diff: float  # fused vs explicit logits, NaN when explicit did not run

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fused_x_stock": self.fused_ms / self.stock_ms,
                "explicit_x_stock": self.explicit_ms / self.stock_ms,
                "explicit_x_fused": self.explicit_ms / self.fused_ms}  # fmt: skip


def _round_robin(candidates: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each candidate (this thread's CPU time), ``repeats`` rounds."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    order = list(candidates.items())
    for i in range(repeats):
        for name, fn in order if i % 2 == 0 else order[::-1]:
            t0 = time.thread_time()
            fn()
            samples[name].append(time.thread_time() - t0)
    return samples


def _with_path(model: Any, path: str, step: Callable[[Any], Any]) -> Callable[[], Any]:
    """``step(model)`` with :data:`posenc.extend.methods.fused.PATH` set to ``path``; keeps the output."""
    from ..extend.methods import fused

    def call() -> Any:
        before, fused.PATH = fused.PATH, path
        try:
            return step(model)
        finally:
            fused.PATH = before

    return call


def _keep_last(fn: Callable[[], Any], outputs: dict[str, torch.Tensor], name: str) -> Callable:
    def call() -> None:
        outputs[name] = fn()

    return call


def _prefill(ids: torch.Tensor) -> Callable[[Any], torch.Tensor]:
    def step(model: Any) -> torch.Tensor:
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]

    return step


def _decode(model: Any, prompt: torch.Tensor, token: torch.Tensor) -> Callable[[Any], Any]:
    """A step function over a cache of ``prompt`` built once (by the fused path)."""
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    position = torch.full((1, 1), prompt.shape[1])
    _with_path(model, "auto", lambda m: m(input_ids=prompt, cache=cache, use_cache=True))()

    def step(m: Any) -> torch.Tensor:
        out = m(input_ids=token, position_ids=position, cache=cache, use_cache=True)
        cache.crop(-1)  # back to the prompt's length
        return out.logits[:, -1]

    return step


def _candidates(
    stock: Any, patched: dict[str, Any], phase: str, ids: torch.Tensor, explicit: bool
) -> tuple[dict[str, Callable[[], Any]], dict[str, torch.Tensor]]:
    """``stock``, then ``METHOD:fused`` (and ``METHOD:explicit``) per patched model; the second
    dict receives each patched candidate's last output."""
    tokens = ids.shape[1] - 1

    def step_of(model: Any) -> Callable[[Any], Any]:
        if phase == "prefill":
            return _prefill(ids[:, :tokens])
        return _decode(model, ids[:, :tokens], ids[:, tokens:])

    outputs: dict[str, torch.Tensor] = {}
    candidates = {"stock": _with_path(stock, "auto", step_of(stock))}
    for method, model in patched.items():
        step = step_of(model)
        for path in ("fused", "explicit") if explicit else ("fused",):
            name = f"{method}:{path}"
            candidates[name] = _keep_last(_with_path(model, path, step), outputs, name)
    return candidates, outputs


def run_case(
    stock: Any, patched: dict[str, Any], phase: str, tokens: int, repeats: int, explicit: bool
) -> list[ExtendRow]:
    """One case, every method in the same rounds (the stock forward timed once for all);
    ``patched``: ``{method: model}``, its settings in :data:`OPTIONS`."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(stock.config.vocab_size, (1, tokens + 1), generator=g)
    with torch.no_grad():
        candidates, outputs = _candidates(stock, patched, phase, ids, explicit)
        if phase == "decode":  # one untimed call each: the first step builds tables
            for fn in candidates.values():
                fn()
        samples = _round_robin(candidates, repeats)
    ms = {n: 1e3 * statistics.median(x) for n, x in samples.items()}
    rows = []
    for method in patched:
        diff = float("nan")
        if explicit:
            diff = float((outputs[f"{method}:fused"] - outputs[f"{method}:explicit"]).abs().max())
        options = OPTIONS.get(method, "")
        rows.append(
            ExtendRow(
                phase, tokens, method, options, ms["stock"], ms[f"{method}:fused"],
                ms.get(f"{method}:explicit", float("nan")), repeats, diff,
            )
        )  # fmt: skip
    return rows


def run(
    model: Any,
    extensions: list[dict[str, Any]],
    cases: list[tuple[str, int, int, bool]],
) -> list[ExtendRow]:
    """``cases``: ``(phase, tokens, repeats, explicit too)``; one row per case and method."""
    from ..hf import apply_posenc

    patched = {}
    for extension in extensions:
        method = extension["method"]
        patched[method] = apply_posenc(copy.deepcopy(model), extension=extension)
        OPTIONS[method] = ",".join(f"{k}={v}" for k, v in extension.items() if k != "method")
    rows = []
    for phase, tokens, repeats, explicit in cases:
        rows += run_case(model, patched, phase, tokens, repeats, explicit)
    return rows


def extend_doc(rows: list[ExtendRow], env: dict[str, str], command: str) -> BenchRows:
    """The run as data (block ``extend-attention-cpu``): one row per :class:`ExtendRow`
    (:meth:`ExtendRow.as_dict`: its fields and the three ratios)."""
    settings = {"device": "cpu", "threads": torch.get_num_threads(), "clock": "thread_time"}
    return BenchRows("extend-attention", "extend-attention-cpu", dict(env), command, settings,
                     [r.as_dict() for r in rows])  # fmt: skip


def rows_of(doc: BenchRows) -> list[ExtendRow]:
    """The :class:`ExtendRow` of a rows file (``null`` figures read as NaN; ratios dropped)."""
    names = {f.name for f in dataclasses.fields(ExtendRow)}
    fields: list[dict[str, Any]] = [{k: v for k, v in r.items() if k in names} for r in doc.rows]
    for f in fields:
        f.update({k: number(v) for k, v in f.items() if k.endswith(("_ms", "diff"))})
    return [ExtendRow(**f) for f in fields]


def block(doc: BenchRows) -> str:
    """The Markdown block of a run: environment, then one table row per case."""
    lines = ["## Self-Extend and DCA: fused vs explicit vs stock (SmolLM2-135M, cpu)", ""]
    lines += [f"- {k}: {v}" for k, v in doc.env.items()]
    lines += [f"- command: `{doc.command}`", ""]
    lines += [
        "SmolLM2-135M (float32, SDPA) from its packaged GGUF; stock transformers and the model "
        "patched by `apply_posenc(extension=...)`, fused path (`posenc.extend.methods.fused`: CPU flash "
        "kernel calls per key set, merged by log-sum-exp) and explicit path "
        "(`posenc.extend.methods.explicit`), timed round-robin in one run on this thread's CPU time, "
        f"torch threads {doc.settings.get('threads', '?')}; medians of `samples` rounds. "
        "prefill: one forward, no cache, last-position logits only; decode: one token after "
        "`tokens` cached. diff: max |fused - explicit| of the logits in the same run.",
        "",
    ]
    header = ["phase", "tokens", "method", "options", "stock ms", "fused ms", "explicit ms",
              "fused / stock", "explicit / stock", "explicit / fused", "samples", "diff"]  # fmt: skip
    lines.append(harness.markdown_table(header, [_table_row(r) for r in rows_of(doc)]))
    return "\n".join(lines) + "\n"


def _table_row(r: ExtendRow) -> list[str]:
    digits = 1 if r.phase == "prefill" else 2
    return [
        r.phase, str(r.tokens), r.method, r.options, harness.fmt(r.stock_ms, digits),
        harness.fmt(r.fused_ms, digits), harness.fmt(r.explicit_ms, digits),
        harness.fmt(r.fused_ms / r.stock_ms, 2), harness.fmt(r.explicit_ms / r.stock_ms, 2),
        harness.fmt(r.explicit_ms / r.fused_ms, 2), str(r.samples),
        "-" if r.max_abs_diff != r.max_abs_diff else f"{r.max_abs_diff:.1e}",
    ]  # fmt: skip
