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
from typing import ClassVar

import torch

from .harness import Shape, TimedCase, dtype_name, time_round_robin

IMPLEMENTATIONS = (
    "posenc",
    "posenc-module",
    "hf-eager",
    "hf-compile",
    "rotary-embedding-torch",
)


@dataclass
class CosSinCase(TimedCase):
    """One ``[b, s]`` positions case at head_dim ``d`` (rows: :class:`~.harness.TimedCase`)."""

    CANDIDATES: ClassVar[tuple[str, ...]] = IMPLEMENTATIONS


def _posenc_candidates(
    names: list[str], positions: torch.Tensor, d: int, notes: dict[str, str]
) -> dict[str, Callable[[], object]]:
    """posenc's functional tables and the module's cached rows."""
    from ..functional.rotary import rope_cos_sin, rope_inv_freq

    candidates: dict[str, Callable[[], object]] = {}
    if "posenc" in names:
        inv_freq, _ = rope_inv_freq(d, device=positions.device)  # [d/2] float32
        candidates["posenc"] = lambda: rope_cos_sin(positions, inv_freq)
    if "posenc-module" in names:
        try:
            from ..rotary import RotaryEmbedding

            module = RotaryEmbedding(d, cache_len=max(positions.shape[-1], 1))
            module = module.to(positions.device)
            module.cos_sin(positions)  # fill the table cache once
            candidates["posenc-module"] = lambda: module.cos_sin(positions)
        except Exception as e:  # the module's API is optional here
            notes["posenc-module"] = f"{type(e).__name__}: {e}"[:200]
    return candidates


def _hf_candidates(
    names: list[str], positions: torch.Tensor, d: int, dtype: torch.dtype, notes: dict[str, str]
) -> dict[str, Callable[[], object]]:
    """transformers' ``LlamaRotaryEmbedding``, eager and compiled."""
    if "hf-eager" not in names and "hf-compile" not in names:
        return {}
    try:
        from transformers.models.llama.configuration_llama import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    except ImportError as e:
        notes["hf-eager"] = f"transformers not installed ({e})"
        return {}
    s, device = positions.shape[-1], positions.device
    x = torch.empty(1, device=device, dtype=dtype)  # only its dtype and device are read by HF
    config = LlamaConfig(
        hidden_size=d * 8, num_attention_heads=8, head_dim=d, max_position_embeddings=s
    )
    hf = LlamaRotaryEmbedding(config).to(device)
    candidates: dict[str, Callable[[], object]] = {}
    if "hf-eager" in names:
        candidates["hf-eager"] = lambda: hf(x, positions)
    if "hf-compile" in names:
        hfc = torch.compile(hf, dynamic=False)
        candidates["hf-compile"] = lambda: hfc(x, positions)
    return candidates


def _ret_candidates(
    names: list[str], s: int, d: int, device: torch.device, notes: dict[str, str]
) -> dict[str, Callable[[], object]]:
    """rotary-embedding-torch's angles (it takes cos/sin inside the rotation)."""
    if "rotary-embedding-torch" not in names:
        return {}
    try:
        from rotary_embedding_torch import RotaryEmbedding as RET
    except ImportError as e:
        notes["rotary-embedding-torch"] = f"not installed ({e})"
        return {}
    ret = RET(dim=d, cache_if_possible=False).to(device)
    seq = torch.arange(s, device=device, dtype=torch.float32)
    notes["rotary-embedding-torch"] = "angles [s, d] only (no cos/sin, no batch)"
    return {"rotary-embedding-torch": lambda: ret(seq)}


def cos_sin_case(
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    skip: tuple[str, ...] = (),
    budget_s: float = 10.0,
) -> CosSinCase:
    """Time every candidate (module docstring) on positions ``[b, s]`` at head_dim ``d``."""
    b, s, d = shape.b, shape.s, shape.d
    notes: dict[str, str] = {}
    positions = torch.arange(s, device=device).expand(b, s)  # [b, s] (Hugging Face position_ids)
    names = [n for n in IMPLEMENTATIONS if n not in skip]
    candidates = {
        **_posenc_candidates(names, positions, d, notes),
        **_hf_candidates(names, positions, d, dtype, notes),
        **_ret_candidates(names, s, d, device, notes),
    }
    timings = time_round_robin(candidates, device, repeats, budget_s=budget_s)
    case = CosSinCase(shape, dtype_name(dtype))
    case.record(timings, notes)
    return case


CASE_HEADER = ["impl", "median ms", "posenc speedup", "first call ms"]


def case_rows(case: CosSinCase) -> list[list[str]]:
    rows = []
    for name in IMPLEMENTATIONS:
        if name not in case.medians:
            continue
        speed = case.ms(name) / case.ms("posenc") if name != "posenc" else float("nan")
        rows.append(
            [
                name,
                f"{case.ms(name):.3f}",
                "-" if math.isnan(speed) else f"{speed:.2f}x",
                f"{case.firsts[name]:.0f}",
            ]
        )
    return rows


def label(case: CosSinCase) -> str:
    return f"positions [{case.shape.b}, {case.shape.s}], d={case.shape.d}, {case.dtype}"
