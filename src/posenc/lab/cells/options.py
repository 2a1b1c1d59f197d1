"""The lab options of a label: training-time length methods and Llama-4's NoPE layers and query
temperature, which any encoding takes (``rope:positions=pose``, ``rope:nope_every=2``).

:func:`check_lab_options` checks what needs no grid; :func:`resolve_options` resolves a label's
options against its grid (ranges in tokens) into :class:`LabOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ... import registry
from ..._checks import check_positive_int
from ...functional.length import pose_positions, randomized_positions
from ...model import nope_layers
from ...rotary.temperature import QueryTemperature
from ..training.batches import step_generator
from .config import LabConfig, resolve_lengths
from .labels import Label

# Syntax and meaning (each optional; a label without them is the cell it always was):
#
#   positions=randomized  Ruoss et al. (2023): each training sequence's L positions are a sorted
#                         uniform random subset of [0, positions_len) (default: the grid's
#                         longest eval length, e.g. 8L; the paper's max_len >= the test length).
#   positions=pose        PoSE (Zhu et al. 2024): the L positions in pose_chunks chunks (default
#                         2, the paper's), chunk i shifted by a random skip, covering
#                         [0, positions_len) (default 4L: a 4x context extension).
#   positions_len=K       the range of the training positions: K tokens, or "Nx" = N * L (>= L).
#   pose_chunks=N         PoSE's chunk count, 2 <= N <= L (with positions=pose only).
#   nope_every=N          Llama-4's interleaved NoPE: layer i (0-based) with (i + 1) % N == 0
#                         has no position encoding (ModelConfig.nope_every; not on an absolute
#                         encoding, and N <= the layer count so that some layer is NoPE).
#   temperature=llama4    Llama-4's query temperature on the NoPE layers (requires nope_every).
#   temperature=ministral Ministral-3's query scaling on every layer.
#
# The positions methods change training only: evaluation scores every length with arange
# positions, as PoSE tests (the point of a context extension). Ruoss et al.'s own code also
# samples at test time (google-deepmind/randomized_positional_encodings, models/transformer.py
# draws noisy positions on every call); here that test distribution is met only at the longest
# eval length, where a sorted subset of all of [0, max_len) is arange. The sampled positions go to every position-dependent part of
# the model (the encoding; Ministral's temperature); Llama-4's temperature reads the index in
# the KV cache, which is arange in training too, as in transformers. Encodings that read no
# position ids (CoPE's contextual positions) train as with arange.

#: Label keys the lab reads itself; split off before ``registry.build`` (:func:`split_options`).
LAB_OPTIONS: tuple[str, ...] = (
    "positions",
    "positions_len",
    "pose_chunks",
    "nope_every",
    "temperature",
)
POSITION_METHODS: tuple[str, ...] = ("randomized", "pose")
TEMPERATURES: tuple[str, ...] = ("llama4", "ministral")
#: PoSE's default target: 4x the train length, a context extension that stays inside the
#: grid's 8x eval range (so 8L measures extrapolation past the extended window too).
POSE_DEFAULT_LEN = "4x"
POSE_DEFAULT_CHUNKS = 2  # Zhu et al. 2024, Section 3.2: two chunks by default
#: Randomized positions draw ``[batch, positions_len]`` float64 keys a step: cap the range
#: (16 x 2**20 x 8 B = 128 MiB a step).
RANDOMIZED_MAX_LEN = 2**20
#: Salt of :func:`posenc.lab.training.data.step_generator` for the training positions (token batches use
#: salt 0), so positions and tokens come from independent streams of the same (seed, step).
POSITIONS_SALT = 104_729
# Temperature scales. Llama-4: transformers' Llama4TextConfig defaults attn_scale=0.1 and
# floor_scale=8192 (the published Llama-4-Scout config, tests/data/hf_configs/
# llama-4-scout-17b-16e-instruct-fp8-dynamic.json, leaves both at these defaults); 8192 is its
# training context, so the analogue here is floor_scale = L: the scale is 1 up to position L - 2
# and grows past it. Ministral-3 / Devstral-2: llama_4_scaling_beta=0.1 with
# original_max_position_embeddings, its context before the YaRN extension
# (tests/data/hf_configs/devstral-small-2-24b-instruct-2512.json); the analogue is beta 0.1,
# length L.
LLAMA4_ATTN_SCALE = 0.1
MINISTRAL_BETA = 0.1


@dataclass(frozen=True)
class PositionSampling:
    """A training-time length method as :data:`posenc.lab.training.train.PositionSampler`:
    ``(step, batch_size, seq_len, seed) -> [batch_size, seq_len]`` int64 position ids of the
    step's global batch, a pure function of its arguments (resume-safe).

    ``method``: ``"randomized"`` (:func:`~posenc.functional.length.randomized_positions` with
    ``max_len = length``) or ``"pose"`` (:func:`~posenc.functional.length.pose_positions` with
    ``target_len = length``, ``chunks`` chunks).
    """

    method: str
    length: int
    chunks: int = POSE_DEFAULT_CHUNKS

    def __call__(self, step: int, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
        g = step_generator(seed, step, POSITIONS_SALT)
        if self.method == "randomized":
            return randomized_positions(batch_size, seq_len, self.length, generator=g)
        return pose_positions(batch_size, seq_len, self.length, self.chunks, generator=g)

    def identity(self) -> dict[str, Any]:
        """What enters the train identity: the method and its resolved numbers."""
        out: dict[str, Any] = {"method": self.method, "length": self.length}
        if self.method == "pose":
            out["chunks"] = self.chunks
        return out


@dataclass(frozen=True)
class LabOptions:
    """The lab options of one label, resolved against its grid (:func:`lab_options`)."""

    positions: PositionSampling | None = None
    nope_every: int | None = None
    temperature: str | None = None  # one of TEMPERATURES

    def query_temperature(self, num_layers: int, train_len: int) -> QueryTemperature | None:
        """The model's :class:`QueryTemperature` (scales: see LLAMA4_ATTN_SCALE)."""
        if self.temperature == "llama4":  # Llama-4: only the NoPE layers
            layers = nope_layers(num_layers, self.nope_every)
            return QueryTemperature("llama4_temperature", LLAMA4_ATTN_SCALE, train_len, layers)
        if self.temperature == "ministral":  # Ministral-3: every layer
            return QueryTemperature("llama4_scaling", MINISTRAL_BETA, train_len)
        return None

    def row(self) -> dict[str, Any]:
        """The options that are set, resolved, for a result row (``{}`` for a plain label)."""
        out: dict[str, Any] = {}
        if self.positions is not None:
            out["positions"] = self.positions.method
            out["positions_len"] = self.positions.length
            if self.positions.method == "pose":
                out["pose_chunks"] = self.positions.chunks
        if self.nope_every is not None:
            out["nope_every"] = self.nope_every
        if self.temperature is not None:
            out["temperature"] = self.temperature
        return out


def split_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``{"base": 500, "nope_every": 2}`` -> ``({"base": 500}, {"nope_every": 2})``: the
    encoding's own options and the lab's (:data:`LAB_OPTIONS`)."""
    enc = {k: v for k, v in kwargs.items() if k not in LAB_OPTIONS}
    lab = {k: v for k, v in kwargs.items() if k in LAB_OPTIONS}
    return enc, lab


def _choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def check_lab_options(name: str, lab: dict[str, Any]) -> None:
    """Check lab options ``lab`` of encoding ``name`` where no grid is needed: values, the
    options that need another, and the encoding's family. ValueError naming what is allowed."""
    unknown = sorted(set(lab) - set(LAB_OPTIONS))
    if unknown:
        raise ValueError(f"unknown lab option(s) {unknown}; allowed: {list(LAB_OPTIONS)}")
    family = registry.entry(name).family
    method = lab.get("positions")
    if method is not None:
        _choice("positions", method, POSITION_METHODS)
    elif "positions_len" in lab:
        raise ValueError(
            f"positions_len sets the range of a training-time length method; add positions="
            f"{' or positions='.join(POSITION_METHODS)}"
        )
    if "pose_chunks" in lab:
        if method != "pose":
            raise ValueError("pose_chunks is PoSE's chunk count; it needs positions=pose")
        chunks = lab["pose_chunks"]
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 2:
            raise ValueError(
                f"pose_chunks must be an integer >= 2 (1 chunk is arange), got {chunks!r}"
            )
    if "nope_every" in lab:
        check_positive_int("nope_every", lab["nope_every"])
        if family == "absolute":
            raise ValueError(
                f"nope_every removes the encoding from some attention layers, but {name!r} is "
                "absolute (added once to the token embeddings): use a rotary, bias or relative "
                "encoding"
            )
    temperature = lab.get("temperature")
    if temperature is not None:
        _choice("temperature", temperature, TEMPERATURES)
        if temperature == "llama4" and "nope_every" not in lab:
            raise ValueError(
                "temperature=llama4 scales the queries of the NoPE layers, as Llama-4 does; "
                "add nope_every=N (or use temperature=ministral, on every layer)"
            )
    reads = registry.entry(name).reads_positions
    if method is not None and not reads and temperature != "ministral":
        raise ValueError(
            f"positions={method} changes the training positions, but {name!r} reads no "
            "position ids: the cell would train as with arange"
        )


def _positions_len(value: Any, train_len: int) -> int:
    try:
        (length,) = resolve_lengths((value,), train_len)
    except ValueError:
        raise ValueError(
            f"positions_len must be a positive integer (tokens) or a multiple of the train length "
            f"like '4x' that gives whole tokens, got {value!r}"
        ) from None
    return length


def resolve_options(cfg: LabConfig, label: Label) -> LabOptions:
    """The lab options of ``label`` resolved against grid ``cfg`` (ranges in tokens).

    Raises ValueError for a bad value (:func:`check_lab_options`), a range below the train
    length, a learned table shorter than the training positions (give it
    ``max_positions=<positions_len>``: its table is not resized silently), or a ``nope_every``
    larger than the model's layer count (no layer would be NoPE).
    """
    enc, lab = split_options(label.options(cfg))
    check_lab_options(label.name, lab)
    nope_every = lab.get("nope_every")
    if nope_every is not None and not nope_layers(cfg.model.num_layers, nope_every):
        raise ValueError(
            f"nope_every={nope_every} leaves no NoPE layer in a {cfg.model.num_layers}-layer "
            f"model; use 1..{cfg.model.num_layers}"
        )
    method = lab.get("positions")
    sampling = None if method is None else _sampling(cfg, label, method, enc, lab)
    return LabOptions(sampling, nope_every, lab.get("temperature"))


def _sampling(
    cfg: LabConfig, label: Label, method: str, enc: dict[str, Any], lab: dict[str, Any]
) -> PositionSampling:
    """The training positions of a label with ``positions=method``, checked against the grid."""
    L = cfg.train_len
    default = max(cfg.eval_lengths()) if method == "randomized" else POSE_DEFAULT_LEN
    length = _positions_len(lab.get("positions_len", default), L)
    if length < L:
        raise ValueError(
            f"positions_len ({length}) must be >= the train length ({L}): the {L} training "
            f"positions are drawn from [0, positions_len)"
        )
    if method == "randomized" and length > RANDOMIZED_MAX_LEN:
        raise ValueError(
            f"positions_len for positions=randomized must be <= {RANDOMIZED_MAX_LEN}, got {length}"
        )
    chunks = lab.get("pose_chunks", POSE_DEFAULT_CHUNKS)
    if method == "pose" and chunks > L:
        raise ValueError(f"pose_chunks must be <= the train length ({L}), got {chunks}")
    if "max_positions" in registry.options(label.name):  # a learned table
        table = enc.get("max_positions") or L
        if length > table:
            raise ValueError(
                f"positions={method} trains {label.text!r} at positions up to {length - 1}, past "
                f"its learned table of {table} positions; add max_positions={length} to the "
                "label (or a smaller positions_len)"
            )
    return PositionSampling(method, length, chunks if method == "pose" else 2)
