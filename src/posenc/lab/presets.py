"""Lab configuration: dataclasses, the named presets, and the builder that turns one grid cell
into a :class:`posenc.model.ModelConfig`.

A :class:`LabConfig` describes a whole grid (encodings x seeds); a *cell* is one
``(encoding, seed)`` pair of it. Everything that changes what a cell computes goes into its hash
(:func:`train_identity`, :func:`cell_identity`); everything that only changes how fast or where it
runs (threads, compile, output folder, progress bar, checkpoint interval) stays out, so a finished
cell is found again whatever those are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..model import ModelConfig

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

#: Encoding options every preset uses. Sinusoidal: token embeddings times sqrt(dim) before the
#: table is added, as in Vaswani et al. and fairseq (the ALiBi paper's baseline). Without it the
#: unit-amplitude table drowns this model's 0.02-std embeddings (measured on cpu-small: 3.75 vs
#: 3.00 bits per byte at L).
LAB_ENCODING_KWARGS: dict[str, dict[str, Any]] = {"sinusoidal": {"scale_input": True}}

#: Inference-time RoPE rescalings swept on every rotary model that offers ``with_scaling``
#: (Hugging Face ``rope_type`` names; "ntk" is static NTK-aware scaling).
DEFAULT_ROPE_SCALINGS: tuple[str, ...] = ("linear", "ntk", "dynamic", "yarn")

#: Bump when the meaning of a stored result changes (a new metric definition, a data change).
RESULTS_SCHEMA = 1


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
    synthetic length-generalization task, :mod:`posenc.lab.tasks`).
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
    training; :func:`posenc.lab.train.compiles`). None of the three is part of any hash: they
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


# Presets. cpu-small is the README's first command: every default encoding (13 with the rotary,
# bias and relative families) trained and evaluated in posenc.lab.DEFAULT_RUN_TIME (measured;
# the wall time of each cell is in its result row and the report). cpu is the same study larger (L=128,
# 8x the tokens, 3x the parameters): about an hour on two idle cores with --threads 2 (estimated
# from measured throughput, 9K tokens/s on one core, 17K on two). gpu is sized for one H100: a
# ~100M-parameter model at the ALiBi paper's train length of 512, evaluated to 16x (8192).
# gpu-small is that setting at 25M parameters and 4.9M tokens per encoding, compiled, sized for
# the few minutes `make gpu-check` has (its sizing is written above its entry).
PRESETS: dict[str, LabConfig] = {
    "cpu-small": LabConfig(
        preset="cpu-small",
        train_len=64,
        model=ModelShape(dim=128, num_layers=2, num_heads=4),
        # 500 x 16 x 64 = 512K training bytes per encoding: ~20-40 s each on one core.
        train=TrainConfig(steps=500, batch_size=16, lr=3e-3, warmup_steps=40),
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x"), tokens=32768, batch_tokens=8192),
        ckpt_every=100,
        # One thread. Measured on 2 cores: two threads train this model 1.7x faster on an idle
        # machine but up to 20x slower on one shared with other work (OpenMP threads spinning on
        # each other); one thread also gives the same numbers bit for bit on any core count.
        # `--threads 2` on a machine of your own.
        threads=1,
    ),
    "cpu": LabConfig(
        preset="cpu",
        train_len=128,
        model=ModelShape(dim=192, num_layers=3, num_heads=6),
        # 2000 x 16 x 128 = 4M tokens per encoding, 8x cpu-small's.
        train=TrainConfig(steps=2000, batch_size=16, lr=2e-3, warmup_steps=100),
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x"), tokens=65536, batch_tokens=16384),
        ckpt_every=250,
    ),
    "gpu": LabConfig(
        preset="gpu",
        train_len=512,
        # 14 layers x (4 + 8) x 768^2 ~= 99M parameters in the blocks (+ a 256 x 768 embedding).
        model=ModelShape(dim=768, num_layers=14, num_heads=12),
        # 64 x 512 = 32K tokens a step, 10K steps ~= 330M tokens.
        train=TrainConfig(steps=10000, batch_size=64, lr=6e-4, warmup_steps=500),
        # Eval batches of 16K tokens: a materialized bias at 8192 is [2, 12, 8192, 8192] fp32 = 6 GB.
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x", "16x"), tokens=262144, batch_tokens=16384),
        # The stdlib with its tests is ~31 MB: ~10 epochs at this budget, so a 100M model will
        # overfit it. Give it a bigger corpus where one is at hand: --dataset
        # wikitext:wikitext-103-raw-v1 (the ALiBi paper's data, ~540 MB) or --text.
        data=DataConfig(include_tests=True),
        ckpt_every=500,
    ),
    # gpu-small: the ALiBi paper's setting (train at L = 512; evaluate at 512, 1024, 2048 and
    # 4096, with the RoPE rescalings) small enough to run inside `make gpu-check`: every default
    # encoding in at most 5 minutes on one H100/H200, trained the way a GPU run is: bf16 autocast,
    # compiled blocks (compile=True: posenc.lab.train.compile_blocks), FlexAttention for the
    # biases wherever `Attention`'s "auto" picks it on CUDA (the eval lengths >= 1024; training
    # at 512 stays below its threshold and uses SDPA). Sized from measured CPU throughput
    # (benchmarks/gpu_check.py: GPU_SMALL_SIZING and estimate_lab_seconds; method in
    # benchmarks/README.md): this model (25.3M parameters, ~177 MFLOP per trained token) trained
    # at 252-427 tokens/s on one thread of the 2-core EPYC VM in float32 (RoPE: 347 tokens/s,
    # 61 GFLOP/s). Assumed CPU -> H200 factor ~3,200 = 989 dense bf16 TFLOP/s x 20% utilization
    # (an eager 25M model) / 61 GFLOP/s, times 1.3 compiled; plus 5 ms a step of host overhead
    # (multi-tensor AdamW on CUDA), 8 s per encoding to compile its block and 5 s per
    # FlexAttention compile (5 biases x 3 lengths). Estimate: 63 s of training (300 steps x 16K
    # tokens = 4.9M tokens per encoding, under half an epoch of the 12 MB stdlib), 104 s of model
    # compiles, 75 s of FlexAttention compiles, 28 s of start-up and evaluation: ~270 s, 1.1x
    # inside the 5 minutes. Eager it would be ~180 s: at 300 steps per encoding the compile costs
    # more time than it saves. The published comparison's encodings come first, so a run cut
    # short by gpu-check's time limit still has them.
    "gpu-small": LabConfig(
        preset="gpu-small",
        encodings=GPU_SMALL_ENCODINGS,
        train_len=512,
        # 8 blocks x 12 x 512^2 = 25.2M parameters (+ a 256 x 512 embedding); head_dim 64.
        model=ModelShape(dim=512, num_layers=8, num_heads=8),
        train=TrainConfig(steps=300, batch_size=32, lr=1.5e-3, warmup_steps=30),
        # 64K test bytes per length: 128 windows at L, 16 at 8L. Eval batches of 32K tokens
        # keep the explicit (relative-family) scores at 4096 to a few GiB.
        eval=EvalConfig(lengths=("1x", "2x", "4x", "8x"), tokens=65536, batch_tokens=32768),
        # No mid-run checkpoints: each would write model + optimizer (~300 MB) for a cell that
        # takes seconds; the final weights are still saved.
        ckpt_every=1000,
        compile=True,
    ),
}

#: The presets sized for a GPU (the lab warns when one runs on the CPU).
GPU_PRESETS: tuple[str, ...] = ("gpu", "gpu-small")


def preset(name: str) -> LabConfig:
    """The named preset (``cpu-small``, ``cpu``, ``gpu``, ``gpu-small``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


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


def parse_encoding(spec: str) -> tuple[str, dict[str, Any]]:
    """``"rope:base=500:partial=0.5"`` -> ``("rope", {"base": 500, "partial": 0.5})``.

    Values are read as JSON where they parse (numbers, true/false, null, quoted strings),
    else kept as strings.
    """
    name, *opts = spec.strip().split(":")
    if not name:
        raise ValueError(f"empty encoding name in {spec!r}")
    kwargs: dict[str, Any] = {}
    for opt in opts:
        key, sep, raw = opt.partition("=")
        if not sep or not key:
            raise ValueError(f"encoding option {opt!r} in {spec!r} must look like key=value")
        try:
            kwargs[key] = json.loads(raw)
        except json.JSONDecodeError:
            kwargs[key] = raw
    return name, kwargs


def model_config(cfg: LabConfig, encoding: str, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of cell ``encoding`` (a label: ``name`` or ``name:key=value``)."""
    name, kwargs = parse_encoding(encoding)
    # Options by label ("rope:base=500") or by name ("rope"); the label's own options win.
    defaults = cfg.encoding_kwargs.get(encoding, cfg.encoding_kwargs.get(name, {}))
    kwargs = {**defaults, **kwargs}
    return ModelConfig(
        vocab_size=vocab_size,
        dim=cfg.model.dim,
        num_layers=cfg.model.num_layers,
        num_heads=cfg.model.num_heads,
        max_len=cfg.train_len,
        mlp_ratio=cfg.model.mlp_ratio,
        dropout=cfg.model.dropout,
        causal=True,
        encoding=name,
        encoding_kwargs=kwargs,
    )


def stable_hash(obj: Any, n: int = 12) -> str:
    """A short hash of a JSON-able object, independent of dict order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def train_identity(
    cfg: LabConfig, encoding: str, seed: int, vocab_size: int, data_fingerprint: str
) -> dict[str, Any]:
    """Everything that decides a cell's trained weights (the checkpoint's identity)."""
    return {
        "schema": RESULTS_SCHEMA,
        "model": model_config(cfg, encoding, vocab_size).to_dict(),
        "train": asdict(cfg.train),
        "data": {**asdict(cfg.data), "fingerprint": data_fingerprint},
        "seed": seed,
    }


def eval_identity(cfg: LabConfig) -> dict[str, Any]:
    """Everything that decides a cell's metrics once the weights are fixed."""
    return {**asdict(cfg.eval), "lengths": cfg.eval_lengths()}


def cell_identity(train_id: dict[str, Any], eval_id: dict[str, Any]) -> dict[str, Any]:
    return {"train": train_id, "eval": eval_id}


def group_identity(cfg: LabConfig, data_fingerprint: str) -> dict[str, Any]:
    """What the cells of one table share: the grid minus its encodings and seeds."""
    return {
        "schema": RESULTS_SCHEMA,
        "train_len": cfg.train_len,
        "model": asdict(cfg.model),
        "train": asdict(cfg.train),
        "data": {**asdict(cfg.data), "fingerprint": data_fingerprint},
        "eval": eval_identity(cfg),
    }
