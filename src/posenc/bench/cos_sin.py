"""``posenc bench cos-sin``: building the cos/sin tables of positions ``[b, s]``.

Candidates: ``posenc`` (:func:`posenc.functional.rope_cos_sin`, float32 angles, ``[b, s, d/2]``
float32), ``posenc-module`` (``posenc.rotary.RotaryEmbedding.cos_sin``: rows of its cached
table), ``hf-eager`` / ``hf-compile`` (``LlamaRotaryEmbedding.forward``: ``[b, s, d]`` in the
input dtype), ``rotary-embedding-torch`` (``RotaryEmbedding.forward``: the angles ``[s, d]``
only; it takes cos/sin inside the rotation). Each builds what its own rotation consumes, so the
outputs differ in size; speedups are ratios of median times from the same run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .harness import Shape, Timing, dtype_name, time_round_robin

IMPLEMENTATIONS = (
    "posenc",
    "posenc-module",
    "hf-eager",
    "hf-compile",
    "rotary-embedding-torch",
)


@dataclass
class CosSinCase:
    shape: Shape
    dtype: torch.dtype
    timings: dict[str, Timing]
    notes: dict[str, str]

    def ms(self, name: str) -> float:
        t = self.timings.get(name)
        return t.median * 1e3 if t and t.samples else float("nan")


def cos_sin_case(
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    skip: tuple[str, ...] = (),
    budget_s: float = 10.0,
) -> CosSinCase:
    b, s, d = shape.b, shape.s, shape.d
    notes: dict[str, str] = {}
    positions = torch.arange(s, device=device).expand(b, s)  # [b, s] (Hugging Face position_ids)
    x = torch.empty(1, device=device, dtype=dtype)  # only its dtype and device are read by HF
    candidates: dict[str, Callable[[], object]] = {}
    names = [n for n in IMPLEMENTATIONS if n not in skip]

    if "posenc" in names:
        from ..functional.rotary import rope_cos_sin, rope_inv_freq

        inv_freq, _ = rope_inv_freq(d, device=device)  # [d/2] float32
        candidates["posenc"] = lambda: rope_cos_sin(positions, inv_freq)
    if "posenc-module" in names:
        try:
            from ..rotary import RotaryEmbedding

            module = RotaryEmbedding(d, cache_len=max(s, 1)).to(device)
            module.cos_sin(positions)  # fill the table cache once
            candidates["posenc-module"] = lambda: module.cos_sin(positions)
        except Exception as e:  # the module's API is optional here
            notes["posenc-module"] = f"{type(e).__name__}: {e}"[:200]
    if "hf-eager" in names or "hf-compile" in names:
        try:
            from transformers import LlamaConfig
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        except ImportError as e:
            notes["hf-eager"] = f"transformers not installed ({e})"
        else:
            config = LlamaConfig(
                hidden_size=d * 8, num_attention_heads=8, head_dim=d, max_position_embeddings=s
            )
            hf = LlamaRotaryEmbedding(config).to(device)
            if "hf-eager" in names:
                candidates["hf-eager"] = lambda: hf(x, positions)
            if "hf-compile" in names:
                hfc = torch.compile(hf, dynamic=False)
                candidates["hf-compile"] = lambda: hfc(x, positions)
    if "rotary-embedding-torch" in names:
        try:
            from rotary_embedding_torch import RotaryEmbedding as RET
        except ImportError as e:
            notes["rotary-embedding-torch"] = f"not installed ({e})"
        else:
            ret = RET(dim=d, cache_if_possible=False).to(device)
            seq = torch.arange(s, device=device, dtype=torch.float32)
            candidates["rotary-embedding-torch"] = lambda: ret(seq)
            notes["rotary-embedding-torch"] = "angles [s, d] only (no cos/sin, no batch)"

    timings = time_round_robin(candidates, device, repeats, budget_s=budget_s)
    for name, t in timings.items():
        if t.error:
            notes[name] = t.error
    return CosSinCase(shape, dtype, timings, notes)


CASE_HEADER = ["impl", "median ms", "posenc speedup", "first call ms"]


def case_rows(case: CosSinCase) -> list[list[str]]:
    rows = []
    for name in IMPLEMENTATIONS:
        t = case.timings.get(name)
        if t is None or not t.samples:
            continue
        speed = case.ms(name) / case.ms("posenc") if name != "posenc" else float("nan")
        rows.append(
            [
                name,
                f"{case.ms(name):.3f}",
                "-" if math.isnan(speed) else f"{speed:.2f}x",
                f"{t.first * 1e3:.0f}",
            ]
        )
    return rows


def label(case: CosSinCase) -> str:
    return f"positions [{case.shape.b}, {case.shape.s}], d={case.shape.d}, {dtype_name(case.dtype)}"
