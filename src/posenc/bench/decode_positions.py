"""``posenc bench decode-positions``: one decode step's rotary calls deep into a long context.

A decode step's rotation costs its Python and dispatch overhead (a few KB move), so what can
change with the position is how the call finds its angles: a module's cos/sin table covers the
position (its rows are gathered by the kernel) or the angles are computed for the call. Each
call is timed at the positions :data:`POSITIONS` against transformers' own
``apply_rotary_pos_emb`` (``transformers.models.llama.modeling_llama``) in the same run:

=======================  =====================================================================
``hf-apply``             transformers' ``apply_rotary_pos_emb(q, k, cos, sin)`` on ready
                         cos/sin in q's dtype (the same cost at every position)
``hf-rotary``            transformers' ``LlamaRotaryEmbedding(config)(x, position_ids)``
``rope_qk``              :func:`posenc.kernels.rope_qk` on per-token float32 rows
``rope_qk-table``        the same from a float32 table with a row for every position up to
                         the largest position (at most ``2 ** 20``), and ``positions=``
``RotaryEmbedding``      ``RotaryEmbedding(d)(q, k, positions)``: positions to rotated q, k
``RotaryEmbedding-win``  the same with ``max_cache_len=4096``: the table stays at 4096 rows
                         and later positions take the window path (as every module does
                         past ``2 ** 20``)
``HFRotaryEmbedding``    :class:`posenc.hf.HFRotaryEmbedding` ``(x, position_ids)``: the rotary
                         module :func:`posenc.hf.apply_posenc` puts into a model (cos/sin)
``patched-step``         ``HFRotaryEmbedding`` then :func:`posenc.hf.apply_rotary_pos_emb`
``hf-step``              ``hf-rotary`` then ``hf-apply``
=======================  =====================================================================

One instance of each module serves every position, in increasing order, as a model decoding
further does; ``first_ms`` is the first call at a position (a table that grows grows there).
Timing: thread CPU time, round-robin over the calls at one position, each sample the mean of
:data:`CALLS_PER_SAMPLE` back-to-back calls (:func:`.decode_calls.time_calls`), medians.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .decode_calls import CALLS_PER_SAMPLE, time_calls
from .harness import Shape, dtype_name

#: Inside the first 4096-row table, at its end, two long-context positions past it, and one
#: past the largest table (2 ** 20 rows).
POSITIONS = (100, 4096, 10**5, 10**6, 4 * 10**6)
#: The largest table rope_qk-table is given (512 MiB of float32 cos and sin at d = 128).
TABLE_ROWS = 1 << 20
CALLS = (
    "hf-apply", "hf-rotary", "rope_qk", "rope_qk-table", "RotaryEmbedding",
    "RotaryEmbedding-win", "HFRotaryEmbedding", "patched-step", "hf-step",
)  # fmt: skip
#: A call compared with its transformers counterpart as well (``x ref``).
COUNTERPART = {"HFRotaryEmbedding": "hf-rotary", "patched-step": "hf-step"}
#: No cliff: a call's µs at any position within this factor of its µs at the first position.
TARGET_OVER_FIRST = 1.3
#: The calls held to TARGET_OVER_FIRST.
HELD = (
    "rope_qk", "rope_qk-table", "RotaryEmbedding", "RotaryEmbedding-win", "HFRotaryEmbedding",
    "patched-step",
)  # fmt: skip


class Fixtures:
    """The modules and tables of one shape, shared by every dtype and position."""

    def __init__(self, shape: Shape, positions: tuple[int, ...]) -> None:
        from transformers.models.llama.configuration_llama import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        from ..hf import HFRotaryEmbedding
        from ..rotary import RotaryEmbedding

        d = shape.d
        config = LlamaConfig(
            hidden_size=shape.h * d, num_attention_heads=shape.h, num_key_value_heads=shape.hk,
            head_dim=d, max_position_embeddings=max(positions) + 1,
        )  # fmt: skip
        self.hf_rotary = LlamaRotaryEmbedding(config)
        self.drop_in = HFRotaryEmbedding(config)
        self.rope = RotaryEmbedding(d)
        self.rope_window = RotaryEmbedding(d, max_cache_len=4096)
        self.inv_freq = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
        self.table = _table(min(max(positions) + 1, TABLE_ROWS), self.inv_freq)  # [N, d/2]


def _table(rows: int, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin ``[rows, n]`` from float64 angles, built a block of rows at a time."""
    cos = torch.empty(rows, inv_freq.shape[0])
    sin = torch.empty_like(cos)
    for lo in range(0, rows, 1 << 16):
        hi = min(lo + (1 << 16), rows)
        angles = torch.arange(lo, hi, dtype=torch.float64)[:, None] * inv_freq  # [hi - lo, n]
        cos[lo:hi], sin[lo:hi] = angles.cos(), angles.sin()
    return cos, sin


def _calls(
    fx: Fixtures, shape: Shape, dtype: torch.dtype, position: int
) -> dict[str, Callable[[], object]]:
    """Each call at one decode step at ``position`` on seeded inputs of ``shape`` (s = 1)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

    from ..hf import apply_rotary_pos_emb
    from ..kernels import rope_qk

    b, d = shape.b, shape.d
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(b, shape.h, 1, d, generator=gen).to(dtype)  # [b, h, 1, d]
    k = torch.randn(b, shape.hk, 1, d, generator=gen).to(dtype)  # [b, hk, 1, d]
    positions = torch.full((b, 1), position)  # [b, 1]
    angles = positions[..., None].double() * fx.inv_freq  # [b, 1, d/2]
    cos_rows, sin_rows = angles.cos().float(), angles.sin().float()  # [b, 1, d/2]
    # transformers' rotary output: cat(freqs, freqs) in q's dtype, [b, 1, d]
    cos_hf = torch.cat((cos_rows, cos_rows), -1).to(dtype)
    sin_hf = torch.cat((sin_rows, sin_rows), -1).to(dtype)
    cos_t, sin_t = fx.table
    in_table = position < cos_t.shape[0]  # rope_qk-table runs where its table has the row

    def hf_step() -> object:
        cos, sin = fx.hf_rotary(q, positions)
        return hf_apply(q, k, cos, sin)

    def patched_step() -> object:
        cos, sin = fx.drop_in(q, positions)
        return apply_rotary_pos_emb(q, k, cos, sin)

    calls: dict[str, Callable[[], object]] = {
        "hf-apply": lambda: hf_apply(q, k, cos_hf, sin_hf),
        "hf-rotary": lambda: fx.hf_rotary(q, positions),
        "rope_qk": lambda: rope_qk(q, k, cos_rows, sin_rows),
        "rope_qk-table": lambda: rope_qk(q, k, cos_t, sin_t, positions=positions),
        "RotaryEmbedding": lambda: fx.rope(q, k, positions),
        "RotaryEmbedding-win": lambda: fx.rope_window(q, k, positions),
        "HFRotaryEmbedding": lambda: fx.drop_in(q, positions),
        "patched-step": patched_step,
        "hf-step": hf_step,
    }
    if not in_table:
        del calls["rope_qk-table"]
    return calls


def _first_ms(calls: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Wall ms of each call's first call (a table that grows for the position grows here)."""
    first = {}
    for name, fn in calls.items():
        t0 = time.perf_counter()
        fn()
        first[name] = (time.perf_counter() - t0) * 1e3
    return first


def position_rows(
    shapes: list[Shape],
    dtypes: list[torch.dtype],
    repeats: int,
    positions: tuple[int, ...] = POSITIONS,
) -> list[dict[str, Any]]:
    """One row per (shape, dtype, position, call): median µs, first-call ms, the ratios."""
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        fx = Fixtures(shape, positions)
        for dtype in dtypes:
            at_first: dict[str, float] = {}
            for position in sorted(positions):
                calls = _calls(fx, shape, dtype, position)
                first = _first_ms(calls)
                samples = time_calls(calls, repeats)
                medians = {name: statistics.median(v) for name, v in samples.items()}
                for name, us in medians.items():
                    at_first.setdefault(name, us)  # the call's first position
                    ref = COUNTERPART.get(name)
                    rows.append({
                        "shape": shape.short, "dtype": dtype_name(dtype), "position": position,
                        "call": name, "us": us, "first_ms": first[name],
                        "x_hf": medians["hf-apply"] / us,
                        "x_ref": None if ref is None else medians[ref] / us,
                        "over_first": us / at_first[name], "samples": repeats,
                    })  # fmt: skip
    return rows


def target_text(row: dict[str, Any]) -> str:
    """``ok`` / ``MISSED`` for the calls held to :data:`TARGET_OVER_FIRST`, else ""."""
    if row["call"] not in HELD:
        return ""
    return "ok" if row["over_first"] <= TARGET_OVER_FIRST else "MISSED"


HEADER = ["shape", "dtype", "position", "call", "us/call", "first ms", "x hf-apply", "x ref",
          "x first pos", "target"]  # fmt: skip
_SHORT_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    """The printed/Markdown rows of :func:`position_rows`' rows."""
    return [
        [r["shape"], _SHORT_DTYPES.get(r["dtype"], r["dtype"]), f"{r['position']:,}", r["call"],
         f"{r['us']:.1f}", f"{r['first_ms']:.2f}", f"{r['x_hf']:.2f}",
         "" if r["x_ref"] is None else f"{r['x_ref']:.2f}", f"{r['over_first']:.2f}",
         target_text(r)]
        for r in rows
    ]  # fmt: skip


LEGEND = (
    "us/call: median thread CPU time per call (round-robin over the calls at one position, each "
    f"sample the mean of {CALLS_PER_SAMPLE} back-to-back calls); first ms: wall time of the "
    "first call at the position (one instance of each module serves the positions in order, so "
    "a table that grows grows there); x hf-apply: transformers' apply_rotary_pos_emb us / call "
    "us (> 1 faster); x ref: the transformers counterpart's us / call us (HFRotaryEmbedding: "
    "LlamaRotaryEmbedding; patched-step: LlamaRotaryEmbedding + apply_rotary_pos_emb); x first "
    "pos: call us / its us at the first position. Target (no cliff): x first pos <= "
    f"{TARGET_OVER_FIRST:g} for {', '.join(HELD)}. RotaryEmbedding-win: max_cache_len=4096, "
    "positions past 4096 on the window path (every module's path past 2**20 rows); "
    "rope_qk-table runs where its table (at most 2**20 rows) has the position's row."
)


def block(doc: Any) -> str:
    """The ``decode-positions-<device>[-tag]`` block of RESULTS.md."""
    from .harness import markdown_table

    env = [*(f"- {k}: {v}" for k, v in doc.env.items()), f"- command: `{doc.command}`"]
    return "\n".join([
        f"## rope decode by position ({doc.device})", "", *env, "",
        markdown_table(HEADER, table_rows(doc.rows)), "", LEGEND,
    ])  # fmt: skip
