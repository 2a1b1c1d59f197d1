"""What a study will cost before it runs: peak memory of one forward and the time of every cell.

Time: timed forwards of ``CALIBRATION_TOKENS`` tokens of the model as loaded (the median of
three after a warm-up) give seconds per floating-point operation on this machine; each cell's forward is its operation count times
that. Operations of a forward of ``L`` tokens: ``2 P L`` for the weights (``P`` parameters
outside the embedding), ``2 vocab hidden L`` for the logits, and ``2 layers heads head_dim L^2``
for causal attention (``q k^T`` and ``p v`` over half the matrix), the last times the method's
measured attention cost (:data:`ATTENTION_COST`: the methods over key sets, Self-Extend, Dual
Chunk Attention and the others, run two or three sets of calls where the others run fused SDPA).

Memory: the weights, the activations of one layer at ``L`` tokens, the logits of one chunk, and
the attention's working set (fused SDPA's blocks, or the extension path's blocks of logits, and
the blocks :mod:`posenc.hf.linear_memory` runs sliding-window and soft-capped layers in: the
study's forwards build no ``L x L`` mask).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from ...hf.linear_memory import BLOCK as LINEAR_BLOCK
from ..measures.perplexity import LOGIT_CHUNK
from ..methods.explicit import BLOCK_ELEMENTS

CALIBRATION_TOKENS = 1024

#: Seconds of attention per causal-attention operation, relative to fused SDPA: fitted to
#: SmolLM2-135M's 12,288-token forwards on the 2-core CPU host (none 136 s, Self-Extend 298 s,
#: DCA 483 s on the same document; benchmarks/RESULTS.md) with the operation counts above.
#: STRING, ReRoPE, Leaky ReRoPE and log-n are not fitted: they run Self-Extend's fused calls (a
#: near and a far set; log-n one set), so they take its cost.
ATTENTION_COST = {
    "self_extend": 3.0,
    "dual_chunk": 5.0,
    "string": 3.0,
    "rerope": 3.0,
    "leaky_rerope": 3.0,
    "logn": 3.0,
}


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    body_params: int  # parameters outside the token embedding
    bytes_per_value: int
    window: int = 0  # the widest sliding window of its layers (0: none)
    softcap: bool = False  # soft-capped attention logits (Gemma-2)


def model_shape(model: Any) -> Shape:
    text = model.config.get_text_config(decoder=True)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    embed = model.get_input_embeddings().weight
    total = sum(p.numel() for p in model.parameters())
    return Shape(
        layers=int(text.num_hidden_layers),
        heads=heads,
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        hidden=int(text.hidden_size),
        intermediate=int(getattr(text, "intermediate_size", 4 * text.hidden_size)),
        vocab=int(text.vocab_size),
        body_params=int(total - embed.numel()),
        bytes_per_value=embed.element_size(),
        window=int(getattr(text, "sliding_window", None) or 0),
        softcap=bool(getattr(text, "attn_logit_softcapping", None)),
    )


def forward_flops(shape: Shape, length: int, method: str = "none") -> float:
    """Operations of one forward of ``length`` tokens (module docstring)."""
    attention = 2.0 * shape.layers * shape.heads * shape.head_dim * length**2
    return (
        2.0 * shape.body_params * length
        + 2.0 * shape.vocab * shape.hidden * length
        + attention * ATTENTION_COST.get(method, 1.0)
    )


def forward_bytes(shape: Shape, length: int, method: str = "none") -> int:
    """Peak memory of one forward of ``length`` tokens beyond what is loaded (module docstring)."""
    b = shape.bytes_per_value
    activations = length * (8 * shape.hidden + 3 * shape.intermediate) * b
    logits = 3 * LOGIT_CHUNK * shape.vocab * 4
    qkv = length * (shape.heads + 2 * shape.kv_heads) * shape.head_dim * b
    if method in ATTENTION_COST:  # rotated copies of q and k per set, and blocks of logits
        attention = 4 * qkv + 6 * BLOCK_ELEMENTS * 4
    else:
        attention = 2 * qkv + shape.heads * length * 256 * 4  # fused SDPA's tiles
    # hf.linear_memory's blocks: a sliding layer's keys and scores per block of query rows, a
    # soft-capped layer's scores against every earlier key (no [s, t] mask is ever built)
    keys = length if shape.softcap else min(length, LINEAR_BLOCK + shape.window)
    blocks = 3 * shape.heads * LINEAR_BLOCK * keys * 4 + (2 * qkv if shape.window else 0)
    return int(activations + logits + attention + blocks)


def loaded_bytes(model: Any) -> int:
    return int(sum(p.numel() * p.element_size() for p in model.parameters()))


def available_bytes(device: torch.device) -> int:
    """Memory free for a forward on ``device`` now (CUDA: free device memory; CPU: the
    system's available memory)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


@torch.inference_mode()
def seconds_per_flop(model: Any, shape: Shape) -> float:
    """The median of three timed forwards of :data:`CALIBRATION_TOKENS` tokens (after a warm-up
    of the same shape) divided by its operation count. One timed forward swung the estimate
    twenty-fold between runs of one command: the first call of a shape pays for kernel choice
    and page faults, and a busy neighbour for a moment inflates any single time."""
    from ..model.limits import position_table_length

    device = next(model.parameters()).device
    # within a learned position table (a GPT-2 of n_positions below CALIBRATION_TOKENS)
    n = min(CALIBRATION_TOKENS, position_table_length(model) or CALIBRATION_TOKENS)
    ids = torch.randint(0, shape.vocab, (1, n), device=device)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    times = []
    for i in range(4):  # the first is the warm-up
        start = time.perf_counter()
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
        head(hidden[0, :LOGIT_CHUNK])
        if i:
            times.append(time.perf_counter() - start)
    return sorted(times)[1] / forward_flops(shape, n)


#: The tokens of a question asked after a shared context (its tail: question and answer
#: prefix; RULER's niah tails are 30-60 tokens), an upper bound for the estimate.
QUESTION_TOKENS = 64


def task_cell_flops(shape: Shape, length: int, method: str, samples: int, steps: int,
                    questions: int = 1) -> float:  # fmt: skip
    """Operations of a task cell: one prefill of ``length`` tokens per context (``samples /
    questions`` of them: each sample's own where ``questions`` is 1) and per sample at most
    ``steps`` one-token steps through the cache (the reference's teacher-forced tokens and the
    greedy answer), each the operations one more token adds to the forward; a question after a
    shared context adds its :data:`QUESTION_TOKENS` tokens through the fork, costed like steps."""
    prefill = forward_flops(shape, length, method)
    per_step = forward_flops(shape, length + 1, method) - prefill
    suffix = QUESTION_TOKENS if questions > 1 else 0
    return samples / questions * prefill + samples * (steps + suffix) * per_step


@torch.inference_mode()
def step_seconds(model: Any) -> float:
    """The fixed cost of one one-token step through a KV cache on this machine (the median of 8
    after a 64-token prefill): on a CPU a short step costs its calls, not its operations."""
    from transformers.cache_utils import DynamicCache

    from ..measures.tasks.generation import _cache_kw
    from ..model.limits import position_table_length

    device = next(model.parameters()).device
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    kw = {_cache_kw(decoder): DynamicCache(config=model.config)}
    vocab = int(model.get_output_embeddings().weight.shape[0])
    # prefill and steps within a learned position table (a GPT-2 of n_positions below 72)
    prefill = max(1, min(64, (position_table_length(model) or 72) - 8))
    decoder(input_ids=torch.randint(0, vocab, (1, prefill), device=device), use_cache=True, **kw)
    times = []
    for _ in range(8):
        start = time.perf_counter()
        decoder(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=True,
                **kw)  # fmt: skip
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]
