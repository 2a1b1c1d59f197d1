"""``posenc bench rope``: RoPE on q and k, posenc against the references installed here.

Candidates (each skipped with a note when not installed or not applicable to the device):

=========================  ======================================================================
``copy``                   ``q_out.copy_(q); k_out.copy_(k)`` into preallocated buffers: the
                           bandwidth reference (reads q, k once and writes them once)
``fresh``                  ``torch.empty_like(q).copy_(q)`` and the same for k: the real limit of
                           any out-of-place rotation, a fresh output written once (on a CPU the
                           new pages' first touch costs more than the copy)
``posenc``                 :func:`posenc.kernels.rope_qk`, out of place, ``backend="auto"``
``posenc-inplace``         the same with ``inplace=True``
``posenc-torch``           the same with ``backend="torch"`` (the pure-PyTorch reference)
``posenc-module``          ``RotaryEmbedding(d)(q, k, positions)``: positions to rotated q, k,
                           checks and cos/sin included (what a model calls each step)
``hf-eager``               transformers' LLaMA ``apply_rotary_pos_emb``
``hf-compile``             the same under ``torch.compile``
``hf-module``              ``LlamaRotaryEmbedding.forward`` (cos/sin from ``position_ids``, as
                           transformers computes them each call) then ``apply_rotary_pos_emb``
``rotary-embedding-torch`` ``RotaryEmbedding(d).rotate_queries_or_keys`` on q, then on k
``flash-attn``             ``flash_attn.layers.rotary.apply_rotary_emb`` on q, then k (GPU)
``liger``                  ``liger_kernel.transformers.rope.liger_rotary_pos_emb`` (GPU)
=========================  ======================================================================

cos/sin are built once per case outside the timed region (``posenc bench cos-sin`` times that),
each in the form its consumer takes: posenc float32 ``[s, d/2]``; transformers and liger
``[1, s, d]`` in the input dtype (what ``LlamaRotaryEmbedding`` returns); flash-attn ``[s, d/2]``
in the input dtype.

Figures: median ms; GB/s counts reading and writing q and k once (twice with ``--backward``);
``x copy`` = copy time / candidate time (1.0 = copy bandwidth); speedups = reference time /
posenc time, from the same run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .harness import Shape, TimedCase, dtype_name, time_round_robin

POSENC = ("posenc", "posenc-inplace", "posenc-torch", "posenc-module")
REFERENCES = (
    "hf-eager",
    "hf-compile",
    "hf-module",
    "rotary-embedding-torch",
    "flash-attn",
    "liger",
)
IMPLEMENTATIONS = ("copy", "fresh", *POSENC, *REFERENCES)
# Module candidates are compared with each other, the functional ones with posenc's kernel.
_PAIRED = {"hf-module": "posenc-module"}
# Where decode steps are timed: deep in a cache, inside the module's table (4096 rows).
DECODE_POSITION = 1000
# A decode step takes ~0.1 ms: each sample is the mean of this many back-to-back calls, as a
# model's decode loop runs them (one call alone between other candidates times a cold cache).
DECODE_CALLS = 50


@dataclass
class RopeCase(TimedCase):
    """One shape and dtype of ``bench rope`` (rows: :class:`~.harness.TimedCase`, plus
    ``bytes_moved``; ``backward`` is the run's)."""

    backward: bool = False
    bytes_moved: int = 0  # q and k read and written once (twice with backward)

    CANDIDATES: ClassVar[tuple[str, ...]] = IMPLEMENTATIONS
    CASE_KEYS: ClassVar[tuple[str, ...]] = ("bytes_moved",)

    def fraction_of_copy(self, name: str) -> float:
        return self.ms("copy") / self.ms(name)

    def gbps(self, name: str) -> float:
        return self.bytes_moved / (self.ms(name) * 1e-3) / 1e9

    def speedup(self, reference: str, of: str | None = None) -> float:
        return self.ms(reference) / self.ms(of or _PAIRED.get(reference, "posenc"))


def cases_from_rows(rows: list[dict[str, Any]], backward: bool) -> list[RopeCase]:
    """The cases of a ``rope`` rows file, in the order they ran."""
    return RopeCase.from_rows(rows, backward=backward)


_compiled_hf: Callable | None = None


def _hf_compiled() -> Callable:
    """One compiled ``apply_rotary_pos_emb`` for the run (recompiles per shape and dtype)."""
    global _compiled_hf
    if _compiled_hf is None:
        import torch._dynamo
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _compiled_hf = torch.compile(apply_rotary_pos_emb, dynamic=False)
    return _compiled_hf


def _flash_attn() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    from flash_attn.layers.rotary import apply_rotary_emb

    # flash-attn takes [b, s, h, d]: a transposed view, as a caller in bhsd would pass.
    return lambda q, k, t: (
        apply_rotary_emb(q.transpose(1, 2), t["cos_x"], t["sin_x"]),
        apply_rotary_emb(k.transpose(1, 2), t["cos_x"], t["sin_x"]),
    )


def _liger() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    return lambda q, k, t: liger_rotary_pos_emb(q, k, t["cos_hf"], t["sin_hf"])


#: The GPU-only references: name -> a loader of ``fn(q, k, tables)`` (ImportError when the
#: package is not installed).
_GPU_REFERENCES: dict[str, Callable[[], Callable[..., tuple[torch.Tensor, torch.Tensor]]]] = {
    "flash-attn": _flash_attn,
    "liger": _liger,
}


def _reference_fns(
    names: list[str], device: torch.device, notes: dict[str, str]
) -> dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]]:
    """``fn(q, k, tables) -> (q', k')`` for each reference that can run here."""
    fns: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
    if "hf-eager" in names or "hf-compile" in names:
        try:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        except ImportError as e:
            notes["hf-eager"] = notes["hf-compile"] = f"transformers not installed ({e})"
        else:
            if "hf-eager" in names:
                fns["hf-eager"] = lambda q, k, t: apply_rotary_pos_emb(
                    q, k, t["cos_hf"], t["sin_hf"]
                )
            if "hf-compile" in names:
                hfc = _hf_compiled()
                fns["hf-compile"] = lambda q, k, t: hfc(q, k, t["cos_hf"], t["sin_hf"])
            if "hf-module" in names:
                fns["hf-module"] = _hf_module(device)
    if "rotary-embedding-torch" in names:
        try:
            from rotary_embedding_torch import RotaryEmbedding as RET
        except ImportError as e:
            notes["rotary-embedding-torch"] = f"not installed ({e})"
        else:

            def ret(q: torch.Tensor, k: torch.Tensor, t: dict) -> tuple[torch.Tensor, torch.Tensor]:
                module = t.setdefault("ret", RET(dim=q.shape[-1]).to(q.device))
                return module.rotate_queries_or_keys(q), module.rotate_queries_or_keys(k)

            fns["rotary-embedding-torch"] = ret
    for name, load in _GPU_REFERENCES.items():
        if name in names:
            if device.type != "cuda":
                notes[name] = "GPU only"
                continue
            try:
                fns[name] = load()
            except ImportError as e:
                notes[name] = f"not installed ({e})"
    return fns


def _hf_module(device: torch.device) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """transformers' whole per-step RoPE: ``LlamaRotaryEmbedding`` then ``apply_rotary_pos_emb``."""
    from transformers.models.llama.configuration_llama import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    modules: dict[int, LlamaRotaryEmbedding] = {}

    def run(q: torch.Tensor, k: torch.Tensor, t: dict) -> tuple[torch.Tensor, torch.Tensor]:
        d = q.shape[-1]
        if d not in modules:
            kw: dict[str, Any] = {
                "hidden_size": d * q.shape[1], "num_attention_heads": q.shape[1], "head_dim": d,
                "num_key_value_heads": k.shape[1], "rope_theta": 10000.0,
            }  # fmt: skip
            cfg = LlamaConfig(**kw)
            modules[d] = LlamaRotaryEmbedding(cfg).to(device)
        cos, sin = modules[d](q, t["position_ids"])  # [b, s, d] in q's dtype
        return apply_rotary_pos_emb(q, k, cos, sin)

    return run


_Fn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _inputs(
    shape: Shape, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """``(q, k, cos, sin, tables)``: seeded q, k; posenc's float32 tables; ``tables`` holds the
    other consumers' forms (module docstring) and the position ids."""
    b, h, hk, s, d = shape.b, shape.h, shape.hk, shape.s, shape.d
    gen = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(b, h, s, d, generator=gen).to(device=device, dtype=dtype)  # [b, h, s, d]
    k = torch.randn(b, hk, s, d, generator=gen).to(device=device, dtype=dtype)  # [b, hk, s, d]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    angles = torch.arange(s, dtype=torch.float64)[:, None] * inv_freq  # [s, d/2]
    cos = angles.cos().float().to(device)  # [s, d/2], float32: posenc's tables
    sin = angles.sin().float().to(device)
    start = DECODE_POSITION if shape.decode else 0
    position_ids = torch.arange(start, start + s, device=device).repeat(b, 1)  # [b, s]
    tables = {
        "position_ids": position_ids,
        "cos_hf": torch.cat((cos, cos), -1)[None].to(dtype),  # [1, s, d] in the input dtype
        "sin_hf": torch.cat((sin, sin), -1)[None].to(dtype),
        "cos_x": cos.to(dtype),  # [s, d/2] in the input dtype (flash-attn)
        "sin_x": sin.to(dtype),
    }
    return q, k, cos, sin, tables


def _backward_candidates(
    names: list[str],
    fns: dict[str, _Fn],
    q: torch.Tensor,
    k: torch.Tensor,
    tables: dict[str, torch.Tensor],
    notes: dict[str, str],
) -> dict[str, Callable[[], object]]:
    """Forward+backward of each candidate, after ``copy`` (two copies: the bandwidth bound)."""
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)

    def copy_twice() -> None:
        # forward and backward each read and write q and k once
        q_out.copy_(q), k_out.copy_(k), q_out.copy_(gq), k_out.copy_(gk)

    candidates: dict[str, Callable[[], object]] = {"copy": copy_twice}
    notes["posenc-inplace"] = notes["fresh"] = "not timed with --backward"

    def fwd_bwd(fn: _Fn) -> Callable[[], object]:
        # autograd.grad returns the gradients instead of accumulating into .grad, which
        # would add a read-modify-write of q and k to every call after the first.
        return lambda: torch.autograd.grad(fn(qg, kg, tables), (qg, kg), (gq, gk))

    for name in names:
        if name in fns:
            candidates[name] = fwd_bwd(fns[name])
    return candidates


def _forward_candidates(
    names: list[str],
    fns: dict[str, _Fn],
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    tables: dict[str, torch.Tensor],
) -> dict[str, Callable[[], object]]:
    """The forward of each candidate, after ``copy`` and ``fresh`` (and posenc in place, which
    needs its own buffers)."""
    from ..kernels import rope_qk

    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    candidates: dict[str, Callable[[], object]] = {
        "copy": lambda: (q_out.copy_(q), k_out.copy_(k)),
        "fresh": lambda: (torch.empty_like(q).copy_(q), torch.empty_like(k).copy_(k)),
    }

    def forward(fn: _Fn) -> Callable[[], object]:
        return lambda: fn(q, k, tables)

    if "posenc-inplace" in names:
        # Rotating the same buffers again each call: values stay bounded (a rotation).
        q_ip, k_ip = q.clone(), k.clone()
        candidates["posenc-inplace"] = lambda: rope_qk(q_ip, k_ip, cos, sin, inplace=True)
    for name in names:
        if name in fns:
            candidates[name] = forward(fns[name])
    return candidates


def rope_case(
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    skip: tuple[str, ...] = (),
    backward: bool = False,
    budget_s: float = 20.0,
) -> RopeCase:
    """Build inputs for one shape and dtype and time every candidate on them."""
    from ..kernels import rope_qk, select_backend
    from ..rotary import RotaryEmbedding

    names = [n for n in IMPLEMENTATIONS if n not in skip or n == "copy"]
    notes: dict[str, str] = {}
    q, k, cos, sin, tables = _inputs(shape, dtype, device)
    module = RotaryEmbedding(shape.d, 10000.0)
    fns: dict[str, _Fn] = {
        "posenc": lambda q, k, t: rope_qk(q, k, cos, sin),
        "posenc-torch": lambda q, k, t: rope_qk(q, k, cos, sin, backend="torch"),
        "posenc-module": lambda q, k, t: module(q, k, t["position_ids"]),
    }
    fns.update(_reference_fns(names, device, notes))
    bytes_moved = 2 * (q.numel() + k.numel()) * q.element_size()
    if backward:
        bytes_moved *= 2
        candidates = _backward_candidates(names, fns, q, k, tables, notes)
    else:
        candidates = _forward_candidates(names, fns, q, k, cos, sin, tables)
    notes.setdefault("posenc", f"backend {select_backend('auto', q, (cos, sin))}")
    calls = DECODE_CALLS if shape.decode else 1
    timings = time_round_robin(candidates, device, repeats, budget_s=budget_s, calls=calls)
    case = RopeCase(shape, dtype_name(dtype), backward=backward, bytes_moved=bytes_moved)
    case.record(timings, notes)
    return case


def case_rows(case: RopeCase) -> list[list[str]]:
    """Per-candidate rows: impl, median ms, GB/s, x copy, posenc speedup over it, first call."""
    rows = []
    for name in IMPLEMENTATIONS:
        if name not in case.medians:
            continue
        speed = case.speedup(name) if name in REFERENCES else float("nan")
        rows.append(
            [
                name,
                f"{case.ms(name):.3f}",
                f"{case.gbps(name):.1f}",
                f"{case.fraction_of_copy(name):.2f}",
                "-" if math.isnan(speed) else f"{speed:.2f}x",
                f"{case.firsts[name]:.0f}",
            ]
        )
    return rows


CASE_HEADER = ["impl", "median ms", "GB/s", "x copy", "posenc speedup", "first call ms"]
# Short names: the summary stays readable in an 80-column terminal. Each ratio is reference
# ms / posenc ms from the same run ("module": hf-module / posenc-module, whole steps).
SUMMARY_HEADER = [
    "shape", "dtype", "copy", "fresh", "inpl", "eager", "comp", "mod", "RET", "flash", "liger",
]  # fmt: skip
SUMMARY_LEGEND = (
    "copy: copy ms / posenc ms (1.00 = copy bandwidth); fresh: posenc ms / fresh-output ms "
    "(the out-of-place limit, 1.00 = at it); inpl: copy ms / in-place ms. Speedups "
    "(reference ms / posenc ms): eager, comp: hf-eager, hf-compile; mod: hf-module / "
    "posenc-module (whole steps, cos/sin from positions included); RET: "
    "rotary-embedding-torch; flash: flash-attn; liger: Liger."
)
SUMMARY_COLUMNS = {
    "eager": "hf-eager",
    "comp": "hf-compile",
    "mod": "hf-module",
    "RET": "rotary-embedding-torch",
    "flash": "flash-attn",
    "liger": "liger",
}


def drop_empty_columns(
    header: list[str], rows: list[list[str]]
) -> tuple[list[str], list[list[str]]]:
    """Leave out the columns with no figure in any row (e.g. GPU-only references on a CPU)."""
    keep = [i for i in range(len(header)) if any(r[i] != "-" for r in rows)] if rows else []
    return [header[i] for i in keep], [[r[i] for i in keep] for r in rows]


def summary_table(header: list[str], rows: list[list[str]]) -> Any:
    """The summary as a rich table that fits an 80-column terminal: no vertical rules, one
    space between columns, nothing wrapped or cut (checked by the tests)."""
    from rich.table import Table

    table = Table(
        *header, title="posenc rope: summary", box=None, padding=(0, 1, 0, 0), pad_edge=False,
    )  # fmt: skip
    for column in table.columns:
        column.no_wrap = True
    for row in rows:
        table.add_row(*row)
    return table


_SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _speedup(value: float) -> str:
    """Three significant digits, no unit ("2.14", "12.3", "150"): narrow columns."""
    return "-" if math.isnan(value) else f"{value:.3g}"


def summary_row(case: RopeCase) -> list[str]:
    """One summary row: fractions of the copy and fresh-output times, then the speedups."""
    fresh = case.ms("posenc") / case.ms("fresh")  # >= 1: how far from a fresh output's time
    return [
        case.shape.short,
        _SHORT_DTYPES.get(case.dtype, case.dtype),
        _ratio(case.fraction_of_copy("posenc")),
        _ratio(fresh),
        _ratio(case.fraction_of_copy("posenc-inplace")),
        *(_speedup(case.speedup(SUMMARY_COLUMNS[c])) for c in SUMMARY_HEADER[5:]),
    ]
