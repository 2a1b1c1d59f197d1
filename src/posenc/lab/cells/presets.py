"""The named presets (``cpu-small``, ``cpu``, ``gpu``, ``gpu-small``) and, for the lab's
callers, the names of its configuration in one place.

A :class:`LabConfig` describes a whole grid (encodings x seeds); a *cell* is one
``(encoding, seed)`` pair of it (:mod:`posenc.lab.cells.cell`). A cell's label is ``name`` or
``name:key=value:...`` (:mod:`posenc.lab.cells.labels`): the keys are the encoding's registry options,
plus the lab options of :data:`LAB_OPTIONS` (:mod:`posenc.lab.cells.options`). The identities that
key results live in :mod:`posenc.lab.cells.identity`; the dataclasses in :mod:`posenc.lab.cells.config`.
"""

from __future__ import annotations

from typing import Any

from ...model import ModelConfig
from ...runs.identity import stable_hash
from .cell import cell_model, resolve_cell
from .config import (
    DEFAULT_ENCODINGS,
    DEFAULT_ROPE_SCALINGS,
    GPU_SMALL_ENCODINGS,
    LAB_ENCODING_KWARGS,
    LENGTH_ENCODINGS,
    DataConfig,
    EvalConfig,
    LabConfig,
    ModelShape,
    TrainConfig,
    resolve_lengths,
)
from .identity import RESULTS_SCHEMA, cell_identity, eval_identity, group_identity
from .labels import parse_encoding, parse_label
from .options import (
    LAB_OPTIONS,
    LLAMA4_ATTN_SCALE,
    MINISTRAL_BETA,
    POSE_DEFAULT_CHUNKS,
    POSE_DEFAULT_LEN,
    POSITION_METHODS,
    POSITIONS_SALT,
    RANDOMIZED_MAX_LEN,
    TEMPERATURES,
    LabOptions,
    PositionSampling,
    check_lab_options,
    resolve_options,
    split_options,
)
from .preset_table import GPU_PRESETS, PRESETS, preset

__all__ = [
    "DEFAULT_ENCODINGS", "DEFAULT_ROPE_SCALINGS", "GPU_PRESETS", "GPU_SMALL_ENCODINGS",
    "LAB_ENCODING_KWARGS", "LAB_OPTIONS", "LENGTH_ENCODINGS", "LLAMA4_ATTN_SCALE",
    "MINISTRAL_BETA", "POSE_DEFAULT_CHUNKS", "POSE_DEFAULT_LEN", "POSITIONS_SALT",
    "POSITION_METHODS", "PRESETS", "RANDOMIZED_MAX_LEN", "RESULTS_SCHEMA", "TEMPERATURES",
    "DataConfig", "EvalConfig", "LabConfig", "LabOptions", "ModelShape", "PositionSampling",
    "TrainConfig", "cell_identity", "check_lab_options", "eval_identity", "group_identity",
    "lab_options", "model_config", "parse_encoding", "position_sampler", "preset",
    "resolve_lengths", "split_options", "stable_hash", "train_identity",
]  # fmt: skip


# --- one label at a time (each resolves the label; a grid resolves its cells once) -----------


def lab_options(cfg: LabConfig, encoding: str) -> LabOptions:
    """The lab options of label ``encoding`` in grid ``cfg`` (:func:`.options.resolve_options`)."""
    return resolve_options(cfg, parse_label(encoding))


def position_sampler(cfg: LabConfig, encoding: str) -> PositionSampling | None:
    """The training positions of label ``encoding`` (``train_model(positions=...)``), or None
    for ``arange``."""
    return lab_options(cfg, encoding).positions


def model_config(cfg: LabConfig, encoding: str, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of cell ``encoding`` (a label: ``name`` or ``name:key=value``)."""
    label = parse_label(encoding)
    return cell_model(cfg, label, resolve_options(cfg, label), vocab_size)


def train_identity(
    cfg: LabConfig, encoding: str, seed: int, vocab_size: int, data_fingerprint: str
) -> dict[str, Any]:
    """The training identity of cell ``(encoding, seed)`` (:func:`.identity.train_identity`)."""
    return resolve_cell(cfg, encoding, seed, vocab_size, data_fingerprint).train_id
