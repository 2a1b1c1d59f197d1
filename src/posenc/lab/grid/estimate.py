"""A grid's peak memory and time, estimated before anything trains, from its shapes and a
measured throughput, without reading the corpus (the vocabulary is bytes, 256).

Memory of one cell (one process), in bytes:

- state: parameters, their gradients and AdamW's two moments, ``16 * params``, plus buffers
  (counted on a model built on the meta device: nothing is allocated);
- one training step's activations: ``b * L * (dim * layers * (48 + 8 * mlp_ratio) + 16 *
  vocab)``, plus the attention scores ``b * h * L * L`` per layer where the path materializes
  them (bias encodings: SDPA with a bias tensor; relative ones: the explicit path), times
  :data:`TRAIN_SCORE_BYTES` of the family (or of the encoding, :data:`SCORE_BYTES_BY_NAME`);
- evaluation at the longest eval length ``n`` (no gradients, one layer alive at a time):
  ``rows = batch_tokens // n`` windows, ``rows * n * (32 * dim + 16 * vocab)`` plus ``rows * h
  * n * n`` scores where materialized (a bias family on FlexAttention, from
  :data:`~posenc.attention.policy.FLEX_MIN_SCORES` scores where it runs, materializes none).

Both activations are taken :data:`ALLOCATOR_SLACK` above the live tensors. A cell's peak is
``state + max(training, evaluation)``; ``jobs`` cells run at once, each in a
worker process of its own (:data:`WORKER_BYTES`: the interpreter and torch).
The constants were measured on this package's model (CPU, float32, ``MALLOC_MMAP_THRESHOLD_``
low so that the resident size follows the live tensors): 73-81 bytes per token, width unit and
layer; 13 per token and vocabulary entry; per score and layer 6 (ALiBi, T5), 7-8 (Shaw), 15
(DeBERTa), 56 (CoPE) in training, 8, 11-14, 17 and 40 in evaluation. Each is rounded up.

Time: :func:`~posenc.lab.grid.timing.measure` times a training step (forward and backward) and forward passes of the real model at the run's
shapes on a short batch (well under a second at the presets' shapes; CPU time over threads
where the machine is busy, :class:`~posenc.lab.grid.timing._Clock`), and :func:`with_time` scales by tokens: ``steps * b *
L`` for training, the scored tokens of every eval length and variant for evaluation. Checked
against the default grid's cells (1 thread): estimated 39 s for NoPE and 50 s for RoPE, run in
34 s (31 s training, 3 s evaluation) and 49 s (35 s, 15 s).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ... import registry
from ..._malloc import retains
from ..._sizes import check_fits, gb
from ...model import ModelConfig, nope_layers
from ..cells.config import LabConfig
from .timing import MEASURE_MAX_TRAIN_LEN, Throughput

#: Bytes per materialized attention score and layer, by family (others materialize none).
TRAIN_SCORE_BYTES: dict[str, int] = {"bias": 8, "relative": 10}
EVAL_SCORE_BYTES: dict[str, int] = {"bias": 10, "relative": 16}
#: Encodings that keep more per score than their family: ``name -> (training, evaluation)``.
SCORE_BYTES_BY_NAME: dict[str, tuple[int, int]] = {"deberta": (16, 20), "cope": (64, 48)}
#: Bytes per token, width unit and layer of a training step at ``mlp_ratio`` r: 48 + 8 r.
TRAIN_TOKEN_DIM_BYTES = 48
TRAIN_TOKEN_MLP_BYTES = 8
#: Bytes per token and vocabulary entry: logits, their log-softmax and gradient.
TOKEN_VOCAB_BYTES = 16
EVAL_TOKEN_DIM_BYTES = 32
#: Activations are taken this much above the live tensors: glibc's allocator keeps freed blocks
#: under its mmap threshold (up to 32 MB) in its arenas, so the resident size of a run made of
#: smaller tensors exceeds their live peak (measured 1.7x for a 32 x 256 Shaw cell of
#: ``posenc lab``), while tensors past it are returned when freed (1.0x): the runs large enough
#: to be refused are made of those.
ALLOCATOR_SLACK = 1.25
#: What one cell's process holds besides its tensors' growth (allocator, autograd, threads).
CELL_FIXED_BYTES = 32 * 2**20
#: A worker process of ``--jobs``: the interpreter, torch and the data (measured: 390 MB).
WORKER_BYTES = 400 * 2**20
#: Each of two one-thread workers on a 2-core host runs a cell this much slower than one alone,
#: when glibc maps and unmaps every large tensor (``POSENC_MALLOC=system``; the default grid:
#: 662 s of cell time with ``--jobs 2`` against 494 s serially, Intel VM, 2026-12-01; 471.6 s
#: against 416.9 s, 1.13x, on the AMD EPYC Zen 4 VM, 2026-12-04).
PAIR_SLOWDOWN = 1.34
#: The same when the workers keep the memory they free (:mod:`posenc._malloc`, the default):
#: the two cores no longer fault in pages for each other (the default grid: 389.5 s of cell
#: time with two workers against 396.4 s serially, AMD EPYC Zen 4 VM, 2026-12-04).
RETAINED_PAIR_SLOWDOWN = 1.0
#: A ``--jobs`` worker's start before its first cell (the interpreter, torch, the data, the
#: compiler stack AdamW imports), seconds of wall time on that host.
WORKER_START_S = 8.0


@dataclass(frozen=True)
class LabelCost:
    """One label's cell: memory in bytes (``state``: weights, gradients, optimizer moments and
    buffers; ``train``: one step's activations; ``eval``: at ``eval_len``), and seconds
    (``train_s``, ``eval_s``; None when not measured)."""

    label: str
    family: str
    params: int
    state: int
    train: int
    eval: int
    eval_len: int
    train_s: float | None = None
    eval_s: float | None = None
    weight: tuple[int, int] = (0, 0)  # handout_weight: where the cell's workers take it

    @property
    def peak(self) -> int:
        return CELL_FIXED_BYTES + self.state + max(self.train, self.eval)

    @property
    def seconds(self) -> float | None:
        if self.train_s is None or self.eval_s is None:
            return None
        return self.train_s + self.eval_s


def score_bytes(model: ModelConfig, training: bool) -> int:
    """Bytes per materialized score and layer for ``model``'s encoding (0: none kept)."""
    by_name = SCORE_BYTES_BY_NAME.get(model.encoding)
    if by_name is not None:
        return by_name[0 if training else 1]
    family = registry.entry(model.encoding).family
    return (TRAIN_SCORE_BYTES if training else EVAL_SCORE_BYTES).get(family, 0)


def encoded_layers(model: ModelConfig) -> int:
    """Layers whose attention holds the encoding (all but ``nope_every``'s)."""
    return model.num_layers - len(nope_layers(model.num_layers, model.nope_every))


def count_state(model: ModelConfig, encodings: bool = True) -> tuple[int, int]:
    """``(parameters, bytes of weights + gradients + AdamW moments + buffers)`` of the model:
    its blocks, embedding and head counted on the meta device (no memory, nothing
    initialized) with no encoding, and (``encodings``) the encoding built as the model builds
    it, times the modules the model holds (one if shared or absolute, else one per encoded
    layer). ValueError or TypeError from an encoding that does not build at this shape."""
    from ...model import TransformerLM

    bare = replace(model, encoding="none", encoding_kwargs={}, nope_every=None)
    with torch.device("meta"), _NoInit():
        params, size = _state(TransformerLM(bare))
    if not encodings or registry.entry(model.encoding).family == "none":
        return params, size
    enc = registry.build(model.encoding, dim=model.dim, num_heads=model.num_heads,
                         max_len=model.max_len, causal=model.causal,
                         **model.encoding_kwargs)  # fmt: skip
    entry = registry.entry(model.encoding)
    copies = 1 if entry.shared or entry.family == "absolute" else encoded_layers(model)
    enc_params, enc_size = _state(enc)
    return params + copies * enc_params, size + copies * enc_size


def _state(net: torch.nn.Module) -> tuple[int, int]:
    """Trained parameters of ``net``, and the bytes they take with their gradients and two
    AdamW moments, plus frozen parameters and buffers."""
    params = sum(p.numel() for p in net.parameters() if p.requires_grad)
    frozen = sum(p.numel() * p.element_size() for p in net.parameters() if not p.requires_grad)
    buffers = sum(b.numel() * b.element_size() for b in net.buffers())
    return params, 16 * params + frozen + buffers


class _NoInit(TorchFunctionMode):
    """Skip in-place initializers on meta tensors: torch runs them there through its Python
    references, which import torch's compiler stack (seconds) to fill nothing."""

    NAMES = frozenset(
        {"normal_", "uniform_", "trunc_normal_", "zeros_", "ones_", "constant_", "fill_",
         "zero_", "copy_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
         "kaiming_normal_", "orthogonal_", "exponential_", "random_", "bernoulli_"}
    )  # fmt: skip

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if (
            getattr(func, "__name__", "") in self.NAMES
            and isinstance(target, torch.Tensor)
            and target.is_meta
        ):
            return target
        return func(*args, **kwargs)


def train_bytes(model: ModelConfig, batch: int, train_len: int) -> int:
    """One training step's activations (module docstring)."""
    tokens = batch * train_len
    per_dim = TRAIN_TOKEN_DIM_BYTES + TRAIN_TOKEN_MLP_BYTES * model.mlp_ratio
    dense = tokens * (model.dim * model.num_layers * per_dim + TOKEN_VOCAB_BYTES * model.vocab_size)
    scores = batch * model.num_heads * train_len * train_len * encoded_layers(model)
    return int(ALLOCATOR_SLACK * (dense + scores * score_bytes(model, training=True)))


def eval_bytes(model: ModelConfig, n: int, batch_tokens: int, device: str) -> int:
    """Evaluation's activations at length ``n`` (module docstring)."""
    from ...attention.policy import FLEX_MIN_SCORES, flex_available

    rows = max(1, batch_tokens // n)
    dense = rows * n * (EVAL_TOKEN_DIM_BYTES * model.dim + TOKEN_VOCAB_BYTES * model.vocab_size)
    per_score = score_bytes(model, training=False)
    family = registry.entry(model.encoding).family
    if family == "bias" and n * n >= FLEX_MIN_SCORES and flex_available(device):
        per_score = 0
    return int(ALLOCATOR_SLACK * (dense + rows * model.num_heads * n * n * per_score) + 32 * n)


def label_cost(
    cfg: LabConfig, label: str, model: ModelConfig, device: str, encodings: bool = True
) -> LabelCost:
    """``label``'s :class:`LabelCost` in grid ``cfg`` (``model``: its cell's config), without
    seconds; ``encodings``: count the encoding's own weights and tables (building it;
    :func:`count_state`)."""
    params, state = count_state(model, encodings)
    lengths = cfg.eval_lengths()
    return LabelCost(
        label=label,
        family=registry.entry(model.encoding).family,
        params=params,
        state=state,
        train=train_bytes(model, cfg.train.batch_size, cfg.train_len),
        eval=max(eval_bytes(model, m, cfg.eval.batch_tokens, device) for m in lengths),
        eval_len=max(lengths),
        weight=handout_weight(cfg, model),
    )


def handout_weight(cfg: LabConfig, model: ModelConfig) -> tuple[int, int]:
    """What :func:`handout_order` ranks a cell of grid ``cfg`` by, from shapes alone (nothing
    is timed before a run): one training step's activations, which grow with what an encoding
    adds to attention (DeBERTa's two extra score terms the most), then the evaluation's work,
    every variant at every length (RoPE's rescalings past L)."""
    family = registry.entry(model.encoding).family
    forwards = sum(_variants(cfg, model, family, n) * n for n in cfg.eval_lengths())
    return train_bytes(model, cfg.train.batch_size, cfg.train_len), forwards


def handout_order(weights: list[tuple[int, int]]) -> list[int]:
    """The order in which the workers of ``--jobs`` take a grid's cells (indices into
    ``weights``, the cells' :func:`handout_weight` in grid order): the heaviest first, grid
    order among equals. Longest first keeps the longest cell from running alone at the end
    while the other workers idle (the default grid handed out in grid order ended on DeBERTa,
    twice any other cell's time, with one core idle)."""
    return sorted(range(len(weights)), key=lambda i: (-weights[i][0], -weights[i][1], i))


def with_time(cost: LabelCost, cfg: LabConfig, model: ModelConfig, timing: Throughput) -> LabelCost:
    """``cost`` with seconds: ``timing`` scaled by the tokens of training (``steps * b * L``)
    and of every eval length and variant."""
    train_s = cfg.train.steps * cfg.train.batch_size * cfg.train_len * timing.train
    eval_s = sum(
        _variants(cfg, model, cost.family, m) * _forward_tokens(cfg, m)
        * _forward_cost(m, cfg.train_len, timing.forward, timing.forward_long)
        for m in cfg.eval_lengths()
    )  # fmt: skip
    return replace(cost, train_s=train_s, eval_s=eval_s)


def _variants(cfg: LabConfig, model: ModelConfig, family: str, n: int) -> int:
    """How many variants of the model are scored at length ``n``: the model, and past the train
    length each RoPE rescaling (rotary) or the interpolated table (learned)."""
    if n <= cfg.train_len:
        return 1
    if family == "rotary":
        return 1 + len(cfg.eval.rope_scalings)
    if model.encoding == "learned" and cfg.eval.learned_interp:
        return 2
    return 1


def _forward_tokens(cfg: LabConfig, n: int) -> float:
    """Tokens run through the model to score ``cfg.eval.tokens`` at length ``n`` (sliding
    windows score their last ``stride`` tokens each)."""
    stride = cfg.eval.stride
    if stride is None or stride >= n:
        return float(cfg.eval.tokens)
    return cfg.eval.tokens * n / stride


def _forward_cost(n: int, train_len: int, at_l: float, at_n: tuple[int, float] | None) -> float:
    """Seconds per token of a forward pass at length ``n``: linear in ``n`` (attention's share
    grows with the keys) through the points measured at the train length and at ``at_n``;
    with one point, half of it taken to grow with the length."""
    if at_n is not None and at_n[0] > train_len:
        slope = max(0.0, (at_n[1] - at_l) / (at_n[0] - train_len))
        return at_l + slope * (n - train_len)
    return at_l * (0.5 + 0.5 * n / train_len)


@dataclass(frozen=True)
class Estimate:
    """A grid's estimate: one :class:`LabelCost` per label, ``seeds`` cells of each, ``jobs``
    at once (``threads`` each) on ``device``; ``available``: the memory free there (None:
    unknown)."""

    costs: tuple[LabelCost, ...]
    seeds: int
    jobs: int
    threads: int
    device: str
    available: int | None
    batch_size: int
    train_len: int

    @property
    def cell_peak(self) -> int:
        return max(c.peak for c in self.costs)

    @property
    def peak(self) -> int:
        """The run's peak: ``jobs`` of the largest cell at once, each in its own worker."""
        worker = WORKER_BYTES if self.jobs > 1 and self.device == "cpu" else 0
        return self.jobs * (self.cell_peak + worker)

    @property
    def seconds(self) -> float | None:
        """The run's wall time (None when a label was not timed): the cells handed out in
        :func:`handout_order` (one worker: grid order, seeds outer) to whichever of the
        ``jobs`` workers is free first, as :mod:`posenc.lab.grid.jobs` does, each cell slowed by
        :func:`concurrency_slowdown` when workers share the CPU, plus each worker's start-up
        (:data:`WORKER_START_S`)."""
        times = [c.seconds for c in self.costs]
        if any(t is None for t in times):
            return None
        cells = [c for _ in range(self.seeds) for c in self.costs]
        workers = min(self.jobs, len(cells))
        if workers > 1:
            cells = [cells[i] for i in handout_order([c.weight for c in cells])]
        slow = concurrency_slowdown(workers, self.device)
        start = WORKER_START_S if workers > 1 and self.device == "cpu" else 0.0
        return makespan([c.seconds * slow for c in cells if c.seconds is not None], workers) + start

    def largest(self) -> LabelCost:
        return max(self.costs, key=lambda c: c.peak)

    def detail(self) -> str:
        """The largest cell's parts, for the refusal: ``training 38.0 GB at --batch-size ...``."""
        c = self.largest()
        parts = [
            f"training {gb(c.train)} at --batch-size {self.batch_size} x --train-len "
            f"{self.train_len}",
            f"evaluation {gb(c.eval)} at --eval-lens {c.eval_len}",
            f"weights and optimizer {gb(c.state)} ({c.params:,} parameters)",
        ]
        if self.jobs > 1:
            parts.append(f"{self.jobs} jobs at once")
        return f"{c.label}: " + "; ".join(parts)

    def shrink(self) -> str:
        """The options that lower the largest part of the estimate."""
        c = self.largest()
        if c.state >= max(c.train, c.eval):
            names = ["--dim", "--layers"]
        elif c.train >= c.eval:
            names = ["--batch-size", "--train-len", "--dim", "--layers"]
        else:
            names = ["--eval-lens", "--dim", "--heads"]
        if self.jobs > 1:
            names.append("--jobs")
        return ", ".join(names[:-1]) + " or " + names[-1]

    def check(self) -> None:
        """ValueError (one line) when :attr:`peak` will not fit in :attr:`available`."""
        check_fits(
            self.peak,
            "this run",
            self.shrink(),
            detail=self.detail(),
            device=self.device,
            available=self.available,
        )

    def lines(self, cells: tuple[str, ...]) -> list[str]:
        """What ``--dry-run`` prints of the estimate: each cell's time and peak, then the
        run's."""
        by_label = {c.label: c for c in self.costs}
        width = max((len(cell) for cell in cells), default=0)
        out = [f"{len(cells)} cell(s), {self.jobs} at once ({self.threads} thread(s) each):"]
        for cell in cells:
            cost = by_label.get(cell.rsplit(" ", 1)[0])
            if cost is None:
                out.append(f"  {cell}")
                continue
            secs = "time not measured" if cost.seconds is None else f"~{duration(cost.seconds)}"
            out.append(f"  {cell.ljust(width)}  {secs}, peak ~{gb(cost.peak)}")
        free = "unknown" if self.available is None else gb(self.available)
        out.append(f"peak memory: about {gb(self.peak)} ({free} available)")
        total = self.seconds
        out.append(
            "time: not measured (train length past "
            f"{MEASURE_MAX_TRAIN_LEN})" if total is None
            else f"time: about {duration(total)} (from a measured step of each encoding, "
            f"{self.jobs} worker(s) sharing the CPU; data loading not counted)"
        )  # fmt: skip
        return out


def concurrency_slowdown(workers: int, device: str) -> float:
    """How much longer a cell takes when ``workers`` one-thread workers share the CPU than
    alone: they share the memory bandwidth and the last-level cache, and the kernel's zeroing
    of the pages of every large tensor glibc maps anew, which the lab's workers avoid unless
    ``POSENC_MALLOC=system`` (:func:`posenc._malloc.retains`). Measured on the 2-core hosts
    the presets are sized for (:data:`RETAINED_PAIR_SLOWDOWN`, :data:`PAIR_SLOWDOWN`); taken
    the same for more workers (each pair of cores shares as these two did), 1 on CUDA and for
    one worker."""
    if workers <= 1 or device != "cpu":
        return 1.0
    return RETAINED_PAIR_SLOWDOWN if retains() else PAIR_SLOWDOWN


def makespan(seconds: list[float], workers: int) -> float:
    """When the last of the cells ``seconds`` (in the order handed out) finishes on ``workers``
    workers that each take the next cell as soon as they are free."""
    free = [0.0] * max(1, workers)
    for t in seconds:
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += t
    return max(free)


def duration(seconds: float) -> str:
    """``75`` -> ``"1.2 min"``; ``12`` -> ``"12 s"``; hours past 90 minutes."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 1 else f"{seconds:.1f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def check_training_fits(model: ModelConfig, batch: int, what: str, shrink: str) -> None:
    """ValueError (one line) when training ``model`` on batches of ``batch`` sequences of its
    ``max_len`` will not fit in the host's memory (weights, gradients, AdamW's moments and one
    step's activations; ``what`` and ``shrink`` as :func:`~posenc._sizes.check_fits`)."""
    _params, state = count_state(model, encodings=False)
    need = CELL_FIXED_BYTES + state + train_bytes(model, batch, model.max_len)
    check_fits(need, what, shrink)
