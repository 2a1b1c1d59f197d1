"""posenc inside a transformers model: a stock and a patched (:func:`posenc.hf.apply_posenc`)
Llama timed in the same run, a prefill and a decode step, with the share of a step RoPE takes.

The model has TinyLlama-1.1B's attention and MLP shapes (hidden 2048, 32 query heads of 64, 4
KV heads, MLP 5632) with fewer layers and a small vocabulary, so a CPU times it in seconds. Both
models hold the same weights. A decode step appends one token to a cache of ``context`` tokens
and crops the cache back, so every timed call sees the same length. The RoPE share is the time
of the step's rotations alone (one call per layer, at the step's q/k shapes) over the step.
Rows are data (:class:`ModelRow`, :func:`model_doc`); :func:`block` renders them as Markdown.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from . import harness
from .rows import BenchRows

#: TinyLlama-1.1B's shapes, fewer layers, a small vocabulary.
MODEL_SHAPES: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 4096,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
}


@dataclass(frozen=True)
class ModelRow:
    """One case: times in ms per call (medians), stock transformers against patched."""

    phase: str  # "prefill" or "decode"
    batch: int
    tokens: int  # prefill: the prompt length; decode: the cached context
    dtype: str
    layers: int
    stock_ms: float
    posenc_ms: float
    rope_stock_ms: float  # the step's rotations alone (layers x one call), stock
    rope_posenc_ms: float  # the same with posenc's fused kernel
    # The step speedup's noise: quartiles of the per-round ratios stock / posenc (round i times
    # both models back to back). NaN in rows written before they were recorded.
    speedup_q1: float = float("nan")
    speedup_q3: float = float("nan")
    # The median of those ratios: the speedup (a paired figure: a burst of load in one round
    # hits both models, where the ratio of two medians can pair a loaded sample with a quiet one)
    speedup_median: float = float("nan")

    @property
    def speedup(self) -> float:
        """The median of the per-round ratios stock / posenc; in rows written before it was
        recorded, the ratio of the medians."""
        if self.speedup_median == self.speedup_median:  # not NaN
            return self.speedup_median
        return self.stock_ms / self.posenc_ms

    @property
    def rope_share(self) -> float:
        """The share of a stock step that RoPE takes."""
        return self.rope_stock_ms / self.stock_ms

    @property
    def rope_share_posenc(self) -> float:
        """The share of a patched step that posenc's rotation takes."""
        return self.rope_posenc_ms / self.posenc_ms

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "speedup": self.speedup, "rope_share": self.rope_share,
                "rope_share_posenc": self.rope_share_posenc}  # fmt: skip


def tiny_llama(
    layers: int, dtype: torch.dtype, shapes: dict[str, Any] = MODEL_SHAPES
) -> tuple[Any, Any]:
    """``(stock, patched)``: two Llama models with the same random weights."""
    import transformers
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaForCausalLM

    from ..hf import apply_posenc

    transformers.logging.set_verbosity_error()
    config = LlamaConfig(num_hidden_layers=layers, **shapes)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    stock = LlamaForCausalLM(config).to(dtype).eval()  # type: ignore[arg-type]
    return stock, apply_posenc(copy.deepcopy(stock))


def _rope_candidates(
    batch: int, seq: int, dtype: torch.dtype, layers: int, shapes: dict[str, Any]
) -> dict[str, Any]:
    """The step's rotations alone: stock ``apply_rotary_pos_emb`` and posenc's, once per layer."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as stock_apply

    from ..hf import apply_rotary_pos_emb

    d = shapes["hidden_size"] // shapes["num_attention_heads"]
    q = torch.randn(batch, shapes["num_attention_heads"], seq, d, dtype=dtype)
    k = torch.randn(batch, shapes["num_key_value_heads"], seq, d, dtype=dtype)
    angle = torch.arange(seq)[None, :, None] * torch.rand(d // 2)  # [1, s, n]
    cos, sin = (f(torch.cat((angle, angle), -1)).to(dtype) for f in (torch.cos, torch.sin))

    def run(fn: Any) -> Any:
        return lambda: [fn(q, k, cos, sin) for _ in range(layers)]

    return {"rope-stock": run(stock_apply), "rope-posenc": run(apply_rotary_pos_emb)}


def _step_candidates(stock: Any, fused: Any, phase: str, batch: int, tokens: int) -> dict[str, Any]:
    import transformers

    g = torch.Generator().manual_seed(0)
    vocab = stock.config.vocab_size
    if phase == "prefill":
        ids = torch.randint(vocab, (batch, tokens), generator=g)

        def prefill(model: Any) -> Any:
            return lambda: model(input_ids=ids, use_cache=False)

        return {"stock": prefill(stock), "posenc": prefill(fused)}
    prompt = torch.randint(vocab, (batch, tokens), generator=g)
    step = torch.randint(vocab, (batch, 1), generator=g)
    position = torch.full((batch, 1), tokens)

    def decode(model: Any) -> Any:
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=prompt, cache=cache, use_cache=True)

        def one() -> None:
            model(input_ids=step, position_ids=position, cache=cache, use_cache=True)
            cache.crop(-1)  # back to `tokens` cached

        return one

    return {"stock": decode(stock), "posenc": decode(fused)}


def step_clock() -> Any:
    """This thread's CPU time where torch runs one thread (other processes' load then does not
    count), else wall time (CPU time of one thread would miss the other threads' work)."""
    import time

    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def run_cases(
    cases: list[tuple[str, int, int]],
    dtypes: list[torch.dtype],
    layers: int = 4,
    repeats: int = 10,
    budget_s: float = 20.0,
    shapes: dict[str, Any] = MODEL_SHAPES,
) -> list[ModelRow]:
    """Time ``(phase, batch, tokens)`` cases in each dtype; one :class:`ModelRow` per case."""
    rows = []
    cpu = torch.device("cpu")
    for dtype in dtypes:
        stock, fused = tiny_llama(layers, dtype, shapes)
        for phase, batch, tokens in cases:
            seq = tokens if phase == "prefill" else 1
            candidates = {
                **_step_candidates(stock, fused, phase, batch, tokens),
                **_rope_candidates(batch, seq, dtype, layers, shapes),
            }
            with torch.no_grad():
                t = harness.time_round_robin(
                    candidates, cpu, repeats, budget_s=budget_s, calls=1 if seq > 1 else 5,
                    clock=step_clock(),
                )  # fmt: skip
            errors = [f"{n}: {x.error}" for n, x in t.items() if x.error]
            if errors:
                raise RuntimeError("; ".join(errors))
            ms = {name: 1e3 * x.median for name, x in t.items()}
            q1, q2, q3 = paired_quartiles(t["stock"].samples, t["posenc"].samples)
            rows.append(
                ModelRow(
                    phase, batch, tokens, harness.dtype_name(dtype), layers, ms["stock"],
                    ms["posenc"], ms["rope-stock"], ms["rope-posenc"], q1, q3, q2,
                )
            )  # fmt: skip
    return rows


def paired_quartiles(stock: list[float], posenc: list[float]) -> tuple[float, float, float]:
    """``(q1, median, q3)`` of the round-by-round ratios ``stock[i] / posenc[i]`` (the two were
    timed back to back in round ``i``, so a burst of load hits both): the speedup and its
    noise."""
    ratios = sorted(a / b for a, b in zip(stock, posenc, strict=False) if b > 0)
    if len(ratios) < 2:
        return (ratios[0],) * 3 if ratios else (float("nan"),) * 3
    q1, q2, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, q2, q3


def model_doc(rows: list[ModelRow], env: dict[str, str], command: str) -> BenchRows:
    """The run as data (block ``hf-model-cpu``): one row per :class:`ModelRow`
    (:meth:`ModelRow.as_dict`: its fields, ``speedup`` and ``rope_share``)."""
    return BenchRows("hf-model", "hf-model-cpu", dict(env), command, {"device": "cpu"},
                     [r.as_dict() for r in rows])  # fmt: skip


def rows_of(doc: BenchRows) -> list[ModelRow]:
    """The :class:`ModelRow` of a rows file (derived keys dropped: they are recomputed)."""
    names = {f.name for f in dataclasses.fields(ModelRow)}
    return [ModelRow(**{k: v for k, v in r.items() if k in names}) for r in doc.rows]


def block(doc: BenchRows) -> str:
    """The Markdown block of a run: environment, then one table row per case."""
    rows = rows_of(doc)
    lines = ["## posenc in a transformers model (patched vs stock Llama, cpu)", ""]
    lines += [f"- {k}: {v}" for k, v in doc.env.items()]
    lines += [f"- command: `{doc.command}`", ""]
    lines += [
        f"Llama with TinyLlama-1.1B's shapes (hidden 2048, 32/4 heads of 64, MLP 5632), "
        f"{rows[0].layers if rows else '?'} layers, vocabulary 4096, SDPA attention; stock "
        "transformers and `apply_posenc` on the same weights, timed round-robin in one run "
        "(medians). decode: one new token per sequence after `tokens` cached. rope: the step's "
        "rotations alone (one `apply_rotary_pos_emb` per layer at the step's shapes); share: "
        "rope stock / step stock (posenc: rope posenc / step posenc). step speedup: the median "
        "of the round-by-round ratios stock / posenc (each round times both back to back; rows "
        "recorded before that: the ratio of the medians), q1-q3 their quartiles, its noise. "
        "Clock: "
        f"{doc.env.get('clock', 'perf_counter')}.",
        "",
    ]
    header = ["phase", "batch", "tokens", "dtype", "stock ms", "posenc ms", "step speedup",
              "speedup q1-q3", "rope stock ms", "rope posenc ms", "rope speedup", "rope share",
              "share posenc"]  # fmt: skip
    lines.append(harness.markdown_table(header, [_table_row(r) for r in rows]))
    return "\n".join(lines) + "\n"


def _table_row(r: ModelRow) -> list[str]:
    return [
        r.phase,
        str(r.batch),
        str(r.tokens),
        r.dtype,
        harness.fmt(r.stock_ms, 3),
        harness.fmt(r.posenc_ms, 3),
        harness.fmt(r.speedup, 3),
        f"{harness.fmt(r.speedup_q1, 3)}-{harness.fmt(r.speedup_q3, 3)}",
        harness.fmt(r.rope_stock_ms, 3),
        harness.fmt(r.rope_posenc_ms, 3),
        harness.fmt(r.rope_stock_ms / r.rope_posenc_ms, 2),
        f"{100 * r.rope_share:.1f}%",
        f"{100 * r.rope_share_posenc:.1f}%",
    ]


def model_block(rows: list[ModelRow], env: dict[str, str], command: str) -> str:
    """The Markdown block of a run (:func:`block` of :func:`model_doc`)."""
    return block(model_doc(rows, env, command))
