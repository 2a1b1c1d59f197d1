"""Lab configuration as data: the dataclasses of one grid (:class:`LabConfig` and its parts),
the encoding lists the grids use, and eval lengths as token counts (:func:`resolve_lengths`).

Nothing here reads the registry or builds a model: labels are parsed in
:mod:`posenc.lab.cells.labels`, resolved into cells in :mod:`posenc.lab.cells.cell`, and the named presets
live in :mod:`posenc.lab.cells.presets`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The encodings the default grid trains, in table order; those not registered (yet) are
#: skipped. ``--encodings all`` takes every registered name instead.
DEFAULT_ENCODINGS: tuple[str, ...] = (
    "none",
    "sinusoidal",
    "learned",
    "rope",
    "xpos",
    "alibi",
    "t5",
    "kerple",
    "fire",
    "sandwich",
    "shaw",
    "transformer-xl",
    "deberta",
)

#: gpu-small's order: the four encodings of the ALiBi paper's comparison first (a run cut short
#: by its time limit still has them), then the rest of :data:`DEFAULT_ENCODINGS`.
GPU_SMALL_ENCODINGS: tuple[str, ...] = (
    "sinusoidal",
    "rope",
    "alibi",
    "t5",
    *(e for e in DEFAULT_ENCODINGS if e not in ("sinusoidal", "rope", "alibi", "t5")),
)

#: The length-generalization grid (``--encodings length``): training-time length methods (the
#: training positions of a longer context, :func:`lab_options`) on RoPE and ALiBi beside their
#: plain cells, CoPE (contextual positions), and Llama-4's interleaved NoPE layers without and
#: with its query temperature (cpu-small has 2 layers: layer 1 is the NoPE one).
LENGTH_ENCODINGS: tuple[str, ...] = (
    "rope",
    "rope:positions=randomized",
    "rope:positions=pose",
    "alibi",
    "alibi:positions=randomized",
    "alibi:positions=pose",
    "cope",
    "rope:nope_every=2",
    "rope:nope_every=2:temperature=llama4",
)

#: Encoding options every preset uses. Sinusoidal: token embeddings times sqrt(dim) before the
#: table is added, as in Vaswani et al. and fairseq (the ALiBi paper's baseline). Without it the
#: unit-amplitude table drowns this model's 0.02-std embeddings (measured on cpu-small: 3.75 vs
#: 3.00 bits per byte at L).
LAB_ENCODING_KWARGS: dict[str, dict[str, Any]] = {"sinusoidal": {"scale_input": True}}

#: Inference-time RoPE rescalings swept on every rotary model that offers ``with_scaling``
#: (Hugging Face ``rope_type`` names; "ntk" is static NTK-aware scaling).
DEFAULT_ROPE_SCALINGS: tuple[str, ...] = ("linear", "ntk", "dynamic", "yarn")


@dataclass(frozen=True)
class ModelShape:
    """The model's size; the encoding and ``max_len`` come from the cell."""

    dim: int = 128
    num_layers: int = 2
    num_heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0


@dataclass(frozen=True)
class TrainConfig:
    """AdamW with linear warmup and cosine decay to ``min_lr_ratio * lr``, gradient clipping.

    ``batch_size`` is the global batch (sequences per optimizer step, summed over DDP ranks).
    """

    steps: int = 500
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0


@dataclass(frozen=True)
class DataConfig:
    """Where tokens come from.

    ``source``: ``"stdlib"`` (the Python standard library's ``*.py`` files, as bytes),
    ``"text"`` (``path``: a file, a directory or a glob), ``"hf"`` (``dataset``: a Hugging Face
    dataset ``name`` or ``name:config`` already in the local cache) or ``"task"`` (``task``: a
    synthetic length-generalization task, :mod:`posenc.lab.evaluation.tasks`).
    """

    source: str = "stdlib"
    path: str | None = None
    dataset: str | None = None
    task: str | None = None
    split_seed: int = 0
    valid_frac: float = 0.05
    test_frac: float = 0.05
    include_tests: bool = False


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation on the test split.

    ``lengths`` are eval lengths: an int is absolute, a string ``"4x"`` is a multiple of the train
    length. ``tokens``: scored tokens per length (the same stretch of the test split for every
    length). ``stride``: None for non-overlapping windows, else sliding windows that score the
    last ``stride`` tokens of each window. ``rope_scalings``: inference-time rescalings swept on
    rotary models. ``learned_interp``: also evaluate learned tables past their length with a
    linearly interpolated table (a labelled variant). ``curve_points``: per-position loss curves
    are averaged into at most this many bins.
    """

    lengths: tuple[int | str, ...] = ("1x", "2x", "4x", "8x")
    tokens: int = 32768
    batch_tokens: int = 8192
    stride: int | None = None
    rope_scalings: tuple[str, ...] = DEFAULT_ROPE_SCALINGS
    learned_interp: bool = True
    curve_points: int = 64


@dataclass(frozen=True)
class LabConfig:
    """One grid: ``encodings`` x ``seeds`` cells sharing model shape, data, training, evaluation.

    ``encoding_kwargs`` maps an encoding label or name to its registry options (``posenc list``);
    options in the label itself (``sinusoidal:scale_input=false``) override them.
    ``ckpt_every``: a resumable checkpoint every this many steps. ``threads``: torch CPU
    threads (None: torch's default, every core). ``compile``: train through ``torch.compile``,
    on CUDA only (ignored on the CPU, where the compile would cost more than the CPU presets'
    training; :func:`posenc.lab.training.schedule.compiles`). None of the three is part of any hash: they
    change how fast a cell trains, not what it means (a compiled model computes the same
    function, up to kernel rounding, like another thread count).
    """

    preset: str = "cpu-small"
    encodings: tuple[str, ...] = DEFAULT_ENCODINGS
    encoding_kwargs: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {k: dict(v) for k, v in LAB_ENCODING_KWARGS.items()}
    )
    train_len: int = 64
    seeds: tuple[int, ...] = (0,)
    model: ModelShape = field(default_factory=ModelShape)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ckpt_every: int = 100
    threads: int | None = None
    compile: bool = False

    def eval_lengths(self) -> list[int]:
        """The eval lengths as absolute token counts, sorted and deduplicated."""
        return resolve_lengths(self.eval.lengths, self.train_len)


def resolve_lengths(lengths: tuple[int | str, ...] | list[int | str], train_len: int) -> list[int]:
    """``(64, "2x", "4x")`` with ``train_len=64`` -> ``[64, 128, 256]``: absolute, sorted, unique.

    Each length must be a positive integer (a target needs at least one token of context, so
    >= 1) or a positive multiple ``"<k>x"`` of the train length.
    """
    if not lengths:
        raise ValueError("at least one eval length is needed")
    out: set[int] = set()
    for item in lengths:
        value: int
        if isinstance(item, str):
            text = item.strip().lower()
            try:
                if text.endswith("x"):
                    mult = float(text[:-1])
                    value = round(mult * train_len)
                    if mult <= 0 or abs(mult * train_len - value) > 1e-9:
                        raise ValueError
                else:
                    value = int(text)
            except ValueError:
                raise ValueError(
                    f"eval length {item!r} must be a positive integer (tokens) or a positive "
                    f"multiple of the train length like '4x' that gives whole tokens "
                    f"(train length {train_len})"
                ) from None
        elif isinstance(item, bool) or not isinstance(item, int):
            raise ValueError(f"eval length must be an int or 'Kx', got {item!r}")
        else:
            value = item
        if value < 1:
            raise ValueError(f"eval lengths must be positive, got {item!r} -> {value}")
        out.add(value)
    return sorted(out)
