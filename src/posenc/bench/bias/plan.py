"""Which cases ``posenc bench bias`` runs: the biases and candidates, the presets' sweeps, the
command-line parsers, and :func:`plan_cases`."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import torch

from ... import registry
from ..harness import DTYPES, dtype_name
from .rows import GPU_TARGET_BIASES


class RegisteredBiases(Sequence[str]):
    """The registered bias encodings (``registry.names("bias")``), read at each use: a bias
    registered after this module was imported is benched too. Equal to a tuple or list of the
    same names."""

    def _names(self) -> tuple[str, ...]:
        return tuple(registry.names("bias"))

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RegisteredBiases, tuple, list)):
            return self._names() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())


BIASES = RegisteredBiases()
CANDIDATES = ("materialized", "flex", "causal")


@dataclass(frozen=True)
class Sweep:
    """Every combination of these lengths, dtypes and biases."""

    lengths: tuple[int, ...]
    dtypes: tuple[str, ...]
    biases: Sequence[str]  # BIASES: every registered bias


# "full" is the RESULTS.md run, sized to about 10 minutes on 2 CPU cores, where a
# materialized-bias call takes 6-12 s at s = 8k and a flex call 13 s at 32k, and every
# (bias, s, dtype) compiles its own kernel (3-8 s): float32, every bias, 1k to 8k (the CPU target,
# while the materialized bias still fits in memory); bfloat16, every bias at 2k and 4k, then the
# two biases of the GPU targets at 8k and 16k, and ALiBi alone at 32k.
PRESETS: dict[str, tuple[Sweep, ...]] = {
    "quick": (Sweep((1024, 2048), ("float32",), BIASES),),
    "full": (
        Sweep((1024, 2048, 4096, 8192), ("float32",), BIASES),
        Sweep((2048, 4096), ("bfloat16",), BIASES),
        Sweep((8192, 16384), ("bfloat16",), GPU_TARGET_BIASES),
        Sweep((32768,), ("bfloat16",), ("alibi",)),
    ),
}
# Timed calls per candidate at most; one whose samples pass the time budget stops after 3.
PRESET_REPEATS = {"quick": 5, "full": 3}
# On CUDA "full" also runs T5 at 32k and both at s = 64k (the length of the GPU target).
CUDA_FULL_EXTRA = Sweep((32768, 65536), ("bfloat16",), GPU_TARGET_BIASES)


@dataclass(frozen=True)
class Case:
    """One sequence length and dtype: the biases to run there (the causal floor is shared)."""

    s: int
    dtype: torch.dtype
    biases: tuple[str, ...]


def parse_lengths(spec: str) -> list[int]:
    """``"1024,2k,32k"`` -> ``[1024, 2048, 32768]`` (``k`` = 1024)."""
    out = []
    for part in spec.split(","):
        text = part.strip().lower()
        m = re.fullmatch(r"(\d+)(k?)", text)
        value = int(m.group(1)) * (1024 if m.group(2) else 1) if m else 0
        if value < 1:
            raise ValueError(
                f"lengths must be positive integers, comma-separated (e.g. 1024,2k,32k), "
                f"got {part.strip()!r}"
            )
        out.append(value)
    return out


def parse_biases(spec: str) -> list[str]:
    """``"alibi,t5"`` or ``"all"`` -> bias names, checked against :data:`BIASES`."""
    if spec.strip() == "all":
        return list(BIASES)
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in BIASES]
    if unknown or not names:
        raise ValueError(f"unknown bias {unknown or spec!r}; known: {', '.join(BIASES)} (or all)")
    return names


def parse_dtype_names(spec: str) -> list[str]:
    """``"float32,bf16"`` -> canonical names (``["float32", "bfloat16"]``)."""
    out = []
    for name in spec.split(","):
        name = name.strip()
        if name not in DTYPES:
            raise ValueError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
        out.append(dtype_name(DTYPES[name]))
    return out


def parse_skip(spec: str) -> tuple[str, ...]:
    """``"flex,causal"`` -> candidates to leave out, checked against :data:`CANDIDATES`."""
    names = tuple(n.strip() for n in spec.split(",") if n.strip())
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown candidate(s) {unknown}; known: {', '.join(CANDIDATES)}")
    return names


def plan_cases(
    preset: str = "quick",
    lengths: Sequence[int] | None = None,
    dtypes: Sequence[str] | None = None,
    biases: Sequence[str] | None = None,
    device_type: str = "cpu",
) -> list[Case]:
    """The cases of a preset, with ``lengths``/``dtypes``/``biases`` (when given) replacing the
    preset's in each of its sweeps; ordered by dtype, then length (shorter lengths first, so
    that longer ones can be predicted from them)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    sweeps = list(PRESETS[preset])
    if preset == "full" and device_type == "cuda":
        sweeps.append(CUDA_FULL_EXTRA)
    grouped: dict[tuple[str, int], list[str]] = {}  # (dtype, s) -> biases, in order of first use
    for sw in sweeps:
        for dt in dtypes or sw.dtypes:
            for s in lengths or sw.lengths:
                names = grouped.setdefault((dt, s), [])
                names += [b for b in biases or sw.biases if b not in names]
    dtype_order = list(dict.fromkeys(dt for dt, _ in grouped))
    keys = sorted(grouped, key=lambda k: (dtype_order.index(k[0]), k[1]))
    return [Case(s, DTYPES[dt], tuple(grouped[(dt, s)])) for dt, s in keys]
