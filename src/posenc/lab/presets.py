"""Lab configuration: dataclasses, the named presets, and the builder that turns one grid cell
into a :class:`posenc.model.ModelConfig`.

A :class:`LabConfig` describes a whole grid (encodings x seeds); a *cell* is one
``(encoding, seed)`` pair of it. A cell's label is ``name`` or ``name:key=value:...``: the keys
are the encoding's registry options, plus the lab options of :data:`LAB_OPTIONS` (training-time
length methods and Llama-4's NoPE layers and query temperature), which any encoding takes
(:func:`lab_options`). Everything that changes what a cell computes goes into its hash
(:func:`train_identity`, :func:`cell_identity`); everything that only changes how fast or where it
runs (threads, compile, output folder, progress bar, checkpoint interval) stays out, so a finished
cell is found again whatever those are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .. import registry
from .._checks import check_positive_int
from ..functional.length import pose_positions, randomized_positions
from ..model import ModelConfig, nope_layers
from ..rotary.temperature import QueryTemperature

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
# 8x the tokens, 3x the parameters, 3 seeds): about an hour per seed on two idle cores with
# --threads 2 (estimated from measured throughput, 9K tokens/s on one core, 17K on two). gpu is sized for one H100: a
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
        # Three seeds: the report's 95% intervals (mean ± t * s / sqrt(3)) say which differences
        # are noise; cpu-small stays at one seed to keep its few minutes.
        seeds=(0, 1, 2),
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


# --- lab options: training positions and Llama-4's layers, for any encoding ------------------
#
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
#: Salt of :func:`posenc.lab.data.step_generator` for the training positions (token batches use
#: salt 0), so positions and tokens come from independent streams of the same (seed, step).
POSITIONS_SALT = 104_729
# Temperature scales. Llama-4: transformers' Llama4TextConfig defaults attn_scale=0.1 and
# floor_scale=8192 (the published Llama-4-Maverick config, tests/data/hf_configs/
# llama-4-maverick-17b-128e.json, leaves both at these defaults); 8192 is its training context,
# so the analogue here is floor_scale = L: the scale is 1 up to position L - 2 and grows past it.
# Ministral-3: llama_4_scaling_beta=0.1 with original_max_position_embeddings=16384, its context
# before the YaRN extension (tests/data/hf_configs/ministral-3-3b-reasoning-2512.json); the
# analogue is beta 0.1, length L.
LLAMA4_ATTN_SCALE = 0.1
MINISTRAL_BETA = 0.1


@dataclass(frozen=True)
class PositionSampling:
    """A training-time length method as :data:`posenc.lab.train.PositionSampler`:
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
        from .data import step_generator  # data imports this module

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


def _label_kwargs(cfg: LabConfig, encoding: str) -> tuple[str, dict[str, Any]]:
    """Name and every option of label ``encoding``: the grid's defaults for it, then its own."""
    name, kwargs = parse_encoding(encoding)
    # Options by label ("rope:base=500") or by name ("rope"); the label's own options win.
    defaults = cfg.encoding_kwargs.get(encoding, cfg.encoding_kwargs.get(name, {}))
    return name, {**defaults, **kwargs}


def _positions_len(value: Any, train_len: int) -> int:
    try:
        (length,) = resolve_lengths((value,), train_len)
    except ValueError:
        raise ValueError(
            f"positions_len must be a positive integer (tokens) or a multiple of the train length "
            f"like '4x' that gives whole tokens, got {value!r}"
        ) from None
    return length


def lab_options(cfg: LabConfig, encoding: str) -> LabOptions:
    """The lab options of label ``encoding`` resolved against grid ``cfg`` (ranges in tokens).

    Raises ValueError for a bad value (:func:`check_lab_options`), a range below the train
    length, a learned table shorter than the training positions (give it
    ``max_positions=<positions_len>``: its table is not resized silently), or a ``nope_every``
    larger than the model's layer count (no layer would be NoPE).
    """
    name, kwargs = _label_kwargs(cfg, encoding)
    enc, lab = split_options(kwargs)
    check_lab_options(name, lab)
    nope_every = lab.get("nope_every")
    if nope_every is not None and not nope_layers(cfg.model.num_layers, nope_every):
        raise ValueError(
            f"nope_every={nope_every} leaves no NoPE layer in a {cfg.model.num_layers}-layer "
            f"model; use 1..{cfg.model.num_layers}"
        )
    sampling = None
    method = lab.get("positions")
    if method is not None:
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
                f"positions_len for positions=randomized must be <= {RANDOMIZED_MAX_LEN}, got "
                f"{length}"
            )
        chunks = lab.get("pose_chunks", POSE_DEFAULT_CHUNKS)
        if method == "pose" and chunks > L:
            raise ValueError(f"pose_chunks must be <= the train length ({L}), got {chunks}")
        if "max_positions" in registry.options(name):  # a learned table
            table = enc.get("max_positions") or L
            if length > table:
                raise ValueError(
                    f"positions={method} trains {encoding!r} at positions up to {length - 1}, past "
                    f"its learned table of {table} positions; add max_positions={length} to the "
                    "label (or a smaller positions_len)"
                )
        sampling = PositionSampling(method, length, chunks if method == "pose" else 2)
    return LabOptions(sampling, nope_every, lab.get("temperature"))


def position_sampler(cfg: LabConfig, encoding: str) -> PositionSampling | None:
    """The training positions of label ``encoding`` (``train_model(positions=...)``), or None
    for ``arange``."""
    return lab_options(cfg, encoding).positions


def model_config(cfg: LabConfig, encoding: str, vocab_size: int) -> ModelConfig:
    """The :class:`ModelConfig` of cell ``encoding`` (a label: ``name`` or ``name:key=value``);
    the lab options become ``nope_every`` and ``temperature``, the rest the encoding's options."""
    name, kwargs = _label_kwargs(cfg, encoding)
    kwargs, _ = split_options(kwargs)
    opts = lab_options(cfg, encoding)
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
        nope_every=opts.nope_every,
        temperature=opts.query_temperature(cfg.model.num_layers, cfg.train_len),
    )


def stable_hash(obj: Any, n: int = 12) -> str:
    """A short hash of a JSON-able object, independent of dict order."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:n]


def train_identity(
    cfg: LabConfig, encoding: str, seed: int, vocab_size: int, data_fingerprint: str
) -> dict[str, Any]:
    """Everything that decides a cell's trained weights (the checkpoint's identity).

    Lab options enter only when set (a plain label keeps the identity it had before they
    existed): ``nope_every`` and ``temperature`` through the model's dict, the training
    positions as ``"positions"`` with their resolved range (a randomized cell's default range is
    the longest eval length, so a longer eval length retrains it: it trains on other positions).
    """
    identity = {
        "schema": RESULTS_SCHEMA,
        "model": model_config(cfg, encoding, vocab_size).to_dict(),
        "train": asdict(cfg.train),
        "data": {**asdict(cfg.data), "fingerprint": data_fingerprint},
        "seed": seed,
    }
    sampling = position_sampler(cfg, encoding)
    if sampling is not None:
        identity["positions"] = sampling.identity()
    return identity


def eval_identity(cfg: LabConfig) -> dict[str, Any]:
    """Everything that decides a cell's metrics once the weights are fixed (for the passkey
    task also its heatmap's depths and sequences per depth, which live in the task module)."""
    out = {**asdict(cfg.eval), "lengths": cfg.eval_lengths()}
    if cfg.data.source == "task" and cfg.data.task == "passkey":
        from .tasks import PASSKEY_DEPTHS, PASSKEY_MIN_PER_DEPTH

        out["passkey"] = {"depths": list(PASSKEY_DEPTHS), "min_per_depth": PASSKEY_MIN_PER_DEPTH}
    return out


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
