"""The probes of :func:`posenc.testing.check_rope`: named batches of ``position_ids``.

Each probe targets one way a RoPE implementation goes wrong. Shapes: ``position_ids [b, s]``
int64 (Hugging Face's), ``[3, b, s]`` for M-RoPE (temporal, height, width; text probes carry the
same position on the three axes).

The length that picks the frequencies of the length-dependent types is transformers' rule:
``max(position_ids) + 1`` over the whole batch (``dynamic_rope_update``; posenc's module does
the same). So a switch-point probe is a dense ``arange(n)`` whose length ``s = n`` equals
``max + 1``: an implementation that decides by ``s`` and one that decides by the largest position
see the same length there (one row: more would repeat it). (Past ``dense_limit`` tokens a switch probe keeps the last 64
positions and a sample below them: then only the largest position decides.) The far and decode
probes are sparse: their ``s`` is small while their largest position is far, which is what a
KV-cache decode step looks like.

========================  ==============================================================
probe                     what it catches
========================  ==============================================================
position_0                the identity at position 0 (times the attention factor)
first_64                  plain ``arange(64)``
max_position-1            positions up to ``max_position_embeddings - 1``
4x_max                    positions up to ``4 * max_position_embeddings - 1`` (extrapolation)
random_far                random positions in ``[0, 4 * max)``, distinct per row, unsorted
decode_far                one token per row at a far position (decode with a KV cache)
batched_offsets           ``arange(32) + offset``, another offset per row
left_padded               ``attention_mask.cumsum(-1) - 1`` with the padding set to 1
longrope_switch_L-1/L/L+1 LongRoPE: ``n = L`` is the last length on the short factors
dynamic_switch_M/M+1      dynamic NTK: ``n = M`` plain, ``n = M + 1`` the first grown base
dynamic_grown_2M          dynamic NTK: the base grown for length ``2M``
original_length           YaRN, Llama-3: positions around the original length
wavelength_band           YaRN, Llama-3: positions where the band-edge pairs finish a turn
mrope_vision              M-RoPE: text, an image grid and text, distinct T/H/W positions
========================  ==============================================================
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..rotary.mrope import mrope_positions

ORIG = "original_max_position_embeddings"


@dataclass(frozen=True, eq=False)
class Probe:
    """One named batch of positions: ``position_ids [b, s]`` (``[3, b, s]`` for M-RoPE)."""

    name: str
    position_ids: torch.Tensor
    why: str

    @property
    def seq_len(self) -> int:
        """The length that picks the frequencies: ``max(position_ids) + 1`` (transformers)."""
        return int(self.position_ids.max()) + 1


def _rows(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long)  # [b, s]


def _same(row: list[int], batch: int) -> torch.Tensor:
    return _rows([row] * batch)  # [b, s]: the row repeated


def _sparse(points: set[int], end: int) -> list[int]:
    """Sorted positions below ``end`` from ``points``, then ``end`` itself (the largest)."""
    return [*sorted(p for p in points if 0 <= p < end), end]


def _dense_or_tail(n: int, dense_limit: int, rng: random.Random) -> list[int]:
    """``arange(n)``, or past ``dense_limit`` its last 64 positions after a sample below them."""
    if n <= dense_limit:
        return list(range(n))
    tail = list(range(n - 64, n))
    below = {0, 1, 2, 3, 100, n // 2} | {rng.randrange(n - 64) for _ in range(16)}
    return sorted(p for p in below if p < n - 64) + tail


def _left_padded(batch: int, s: int) -> torch.Tensor:
    """transformers' ``position_ids`` of a left-padded batch (row ``i`` has ``5 i`` pads)."""
    pads = [min(5 * i, s - 1) for i in range(batch)]
    mask = _rows([[0] * p + [1] * (s - p) for p in pads])  # [b, s]: 0 = padding
    position_ids = mask.cumsum(-1) - 1  # [b, s]
    position_ids.masked_fill_(mask == 0, 1)
    return position_ids


def _switch_probes(
    prefix: str,
    letter: str,
    orig: int,
    deltas: tuple[int, ...],
    sides: tuple[str, str],
    dense_limit: int,
    rng: random.Random,
) -> list[Probe]:
    """One dense probe of length ``n = orig + d`` for each ``d`` in ``deltas``, named
    ``{prefix}_{letter}-1`` etc.; ``sides``: what applies at ``n <= orig`` and at ``n > orig``."""
    out = []
    for d in deltas:
        n = orig + d
        label = letter + (f"{d:+d}" if d else "")
        row = _same(_dense_or_tail(n, dense_limit, rng), 1)
        out.append(
            Probe(f"{prefix}_{label}", row, f"length {n} ({letter} = {orig}): {sides[n > orig]}")
        )
    return out


def _scaling_probes(
    scaling: Mapping[str, Any] | None,
    batch: int,
    dense_limit: int,
    rng: random.Random,
) -> list[Probe]:
    """The switch points and bands of the config's scaling type."""
    orig = int((scaling or {}).get(ORIG) or 0)
    if scaling is None or not orig:
        return []  # linear, proportional: no length in the formula
    rope_type = scaling["rope_type"]
    out: list[Probe] = []
    if rope_type == "longrope":
        sides = ("short factors", "long factors")
        out += _switch_probes("longrope_switch", "L", orig, (-1, 0, 1), sides, dense_limit, rng)
    elif rope_type == "dynamic":
        sides = ("plain base", "grown base")
        out += _switch_probes("dynamic_switch", "M", orig, (0, 1), sides, dense_limit, rng)
        grown = _sparse({0, 1, orig - 1, orig, orig + 1, rng.randrange(2 * orig)}, 2 * orig - 1)
        out.append(
            Probe("dynamic_grown_2M", _same(grown, batch), f"base grown for length {2 * orig}")
        )
    if rope_type in ("yarn", "llama3"):
        near = _sparse({0, 1, 7, orig // 2, orig - 2, orig - 1, orig}, orig + 1)
        out.append(Probe("original_length", _same(near, batch), f"around L = {orig}"))
    edges: list[float] = []
    if rope_type == "llama3":
        edges = [orig / scaling["high_freq_factor"], orig / scaling["low_freq_factor"]]
    elif rope_type == "yarn":
        edges = [orig / (scaling.get("beta_fast") or 32), orig / (scaling.get("beta_slow") or 1)]
    if edges:
        points = {max(0, math.floor(e) + d) for e in edges for d in (-1, 0, 1)}
        out.append(
            Probe(
                "wavelength_band",
                _same(sorted(points), batch),
                "one turn of the band-edge wavelengths " + ", ".join(f"{e:g}" for e in edges),
            )
        )
    return out


def rope_probes(
    max_position_embeddings: int,
    scaling: Mapping[str, Any] | None = None,
    *,
    batch: int = 2,
    mrope: bool = False,
    max_position: int | None = None,
    dense_limit: int = 8192,
    seed: int = 0,
) -> tuple[list[Probe], list[str]]:
    """The probes for one layer type: ``(probes, skipped)``.

    ``scaling``: the layer type's posenc scaling dict (``hf_rope_kwargs(...)["scaling"]``).
    ``max_position``: the largest position any probe may hold (default ``4 * M - 1``); probes
    that need more are left out and named in ``skipped``. ``mrope``: positions ``[3, b, s]``.
    """
    m = max_position_embeddings
    top = 4 * m - 1 if max_position is None else max_position
    rng = random.Random(seed)
    probes = [
        *_common_probes(m, top, batch, rng),
        *_scaling_probes(scaling, batch, dense_limit, rng),
    ]
    if mrope:
        probes = [*(_as_mrope(p) for p in probes), _mrope_vision(m, batch)]
    kept = [p for p in probes if p.seq_len - 1 <= top]
    skipped = [
        f"{p.name}: needs position {p.seq_len - 1} > max_position {top}"
        for p in probes
        if p.seq_len - 1 > top
    ]
    return kept, skipped


def _common_probes(m: int, top: int, batch: int, rng: random.Random) -> list[Probe]:
    """The probes every layer type gets, up to position ``top`` (``m``: max_position_embeddings)."""
    far = [rng.randrange(top + 1) for _ in range(batch * 16)]
    return [
        Probe("position_0", torch.zeros(batch, 1, dtype=torch.long), "the identity (x factor)"),
        Probe("first_64", _same(list(range(64)), batch), "arange(64)"),
        Probe(
            "max_position-1",
            _same(_sparse({0, 1, 2, 7, 100, m // 2, m - 3, m - 2}, m - 1), batch),
            f"up to max_position_embeddings - 1 = {m - 1}",
        ),
        Probe(
            "4x_max",
            _same(_sparse({0, 1, m - 1, m, m + 1, 2 * m, 3 * m + 7}, 4 * m - 1), batch),
            f"up to 4 x max_position_embeddings - 1 = {4 * m - 1}",
        ),
        Probe(
            "random_far",
            _rows([far[16 * i : 16 * (i + 1)] for i in range(batch)]),
            f"random positions in [0, {top}], distinct per row",
        ),
        Probe(
            "decode_far",
            _rows([[rng.randrange(m, top + 1) if top >= m else top] for _ in range(batch)]),
            "one token per row at a far position (KV-cache decode)",
        ),
        Probe(
            "batched_offsets",
            _rows([[o + j for j in range(32)] for o in _offsets(batch, top - 31)]),
            "arange(32) + another offset per row",
        ),
        Probe("left_padded", _left_padded(batch, 24), "cumsum(mask) - 1, padding at 1"),
    ]


def _as_mrope(p: Probe) -> Probe:
    """A text probe for M-RoPE: the same positions on the three axes ``[3, b, s]``."""
    return Probe(p.name, p.position_ids.expand(3, -1, -1), p.why)


def _mrope_vision(m: int, batch: int) -> Probe:
    """Text, an image grid and text with distinct T/H/W positions ``[3, b, s]``; row 1 placed so
    that its largest position is ``m - 1``, later rows past ``m``."""
    grid = mrope_positions([("text", 5), ("image", (1, 4, 6)), ("text", 3)])  # [3, s]
    offsets = torch.tensor([0, m - int(grid.max()) - 1][:batch] + [m] * max(0, batch - 2))
    vision = grid[:, None, :] + offsets.clamp(min=0)[None, :, None]  # [3, b, s]
    return Probe("mrope_vision", vision, "text, a 4 x 6 image grid, text")


def _offsets(batch: int, end: int) -> list[int]:
    """Distinct per-row offsets: 0, then spread over ``[0, end]``."""
    return [0] + [(i * end) // batch + 17 * i for i in range(1, batch)]
