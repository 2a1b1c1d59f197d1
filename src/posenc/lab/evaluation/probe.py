"""The attention probe: the model whose attention maps ``posenc plot attention`` draws, and the
maps to draw (:func:`attention_data`; drawn by :func:`posenc.plots.attention.draw_attention`).

Without a checkpoint, a tiny model is trained for a few seconds to repeat the token five
positions back (:func:`lag_batch`), with the lab's own training loop: the model that solves it
has a head looking exactly five tokens back, a stripe parallel to the diagonal. The task is the
same at every length, so whether that stripe survives at 4x the training length is the
extrapolation question in one picture. With a lab checkpoint, its model on input like its data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..._checks import check_positive_int
from ...model import ModelConfig, TransformerLM
from ...plots.attention import model_attention
from ...runs.checkpoint import CheckpointError, read_checkpoint
from ...runs.progress import progress_bars, step_task
from ..cells.config import TrainConfig
from ..grid.estimate import check_training_fits
from ..training.batches import SPLITS, shard, step_generator
from ..training.train import train_model

TINY_VOCAB = 32
TINY_LAG = 5
#: Sequences per training step of the tiny model.
TINY_BATCH = 32


def lag_batch(
    g: torch.Generator, batch: int, length: int, lag: int = TINY_LAG
) -> tuple[torch.Tensor, torch.Tensor]:
    """The "repeat the token ``lag`` back" task: ``x [b, n]`` random, ``y[:, i] = x[:, i - lag]``.

    The first ``lag`` targets are ``-100`` (ignored). A model solves it with one head looking
    exactly ``lag`` tokens back: a stripe parallel to the diagonal, the same at every length, so
    whether the stripe survives at 4x the training length shows extrapolation in one picture.
    """
    x = torch.randint(0, TINY_VOCAB, (batch, length), generator=g)  # [b, n]
    y = torch.full_like(x, -100)
    y[:, lag:] = x[:, :-lag]  # [b, n]
    return x, y


@dataclass(frozen=True)
class LagTask:
    """:func:`lag_batch` as a lab data source (:class:`posenc.lab.training.data.LabData`), so the tiny
    model trains through the lab's own loop (:func:`posenc.lab.training.train.train_model`): each
    step's batch a pure function of ``(seed, step)``."""

    lag: int = TINY_LAG
    name: str = "lag"
    vocab_size: int = TINY_VOCAB
    unit: str = "token"

    @property
    def fingerprint(self) -> str:
        return f"lag-{self.lag}-v1"

    def train_batch(
        self, step: int, batch_size: int, seq_len: int, seed: int, rank: int = 0, world: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = lag_batch(step_generator(seed, step), batch_size, seq_len, self.lag)
        rows = shard(batch_size, rank, world)
        return x[rows], y[rows]

    def eval_windows(
        self, seq_len: int, max_tokens: int, stride: int | None = None, split: str = "test"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``max(1, max_tokens // seq_len)`` sequences of the task from a fixed seed."""
        g = torch.Generator().manual_seed(1_000 + SPLITS.index(split))
        yield lag_batch(g, max(1, max_tokens // seq_len), seq_len, self.lag)


def tiny_model_config(
    encoding: str = "rope",
    train_len: int = 32,
    steps: int = 300,
    dim: int = 64,
    num_heads: int = 4,
    num_layers: int = 2,
    batch_size: int = TINY_BATCH,
) -> ModelConfig:
    """The tiny model's config, its sizes checked (ValueError, one line) and its training
    checked to fit in memory: what :func:`train_tiny_model` trains, checked before a progress
    line is shown."""
    check_positive_int("steps", steps)
    check_positive_int("train_len", train_len)
    if train_len <= TINY_LAG:
        raise ValueError(f"train_len must exceed the task's lag {TINY_LAG}, got {train_len}")
    cfg = ModelConfig(vocab_size=TINY_VOCAB, dim=dim, num_layers=num_layers,
                      num_heads=num_heads, max_len=train_len, encoding=encoding)  # fmt: skip
    check_training_fits(
        cfg, batch_size, f"the tiny model at --train-len {train_len}", "--train-len"
    )
    return cfg


def train_tiny_model(
    cfg: ModelConfig,
    steps: int = 300,
    seed: int = 0,
    batch_size: int = TINY_BATCH,
    lr: float = 3e-3,
    progress: Callable[[int, float, float], None] | None = None,
) -> tuple[TransformerLM, dict[str, Any]]:
    """Train the tiny LM of ``cfg`` (:func:`tiny_model_config`, checked there with ``steps`` and
    ``batch_size``) on :func:`lag_batch` for ``steps`` AdamW steps (a few seconds on one core),
    with the lab's training loop and schedule (:func:`posenc.lab.training.train.train_model`, no
    checkpoints): warmup over the first tenth, cosine decay, the lab's weight decay and clipping.
    (A constant learning rate without them, tried first, often left two of four heads off the
    lag at 120 steps; this schedule put every head on it for seeds 0-3.)

    ``progress(steps done, loss in bits, tokens/s)`` is called after each step. Returns the
    model (eval mode) and ``info`` (``steps``, ``seconds``, ``final_loss_bits``: the mean over
    the last tenth of the steps, ``task``).
    """
    schedule = TrainConfig(
        steps=steps, batch_size=batch_size, lr=lr, warmup_steps=max(1, steps // 10)
    )
    # Matrices this small run fastest on one thread: with more, the synchronization costs more
    # than the work (measured 10x slower with two threads on a busy two-core machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = train_model(
            cfg, schedule, LagTask(), seed=seed, identity={}, ckpt_dir=None, progress=progress
        )
    finally:
        torch.set_num_threads(threads)
    info = {
        "steps": steps,
        "seconds": result.stats["train_seconds"],
        "final_loss_bits": result.stats["final_loss_bits"],
        "task": f"repeat the token {TINY_LAG} back",
    }
    return result.model.eval(), info


def load_checkpoint_model(path: str | Path) -> tuple[TransformerLM, dict[str, Any]]:
    """A :class:`TransformerLM` from a lab checkpoint (``final.pt`` or ``last.pt`` of a cell).

    Read and verified by :func:`posenc.lab.training.train.read_checkpoint` (``weights_only=True``, so a
    checkpoint from elsewhere cannot run code; its stored digest checked). The model's shape
    comes from the checkpoint's identity (``identity["model"]``, a :class:`ModelConfig` as a
    dict). Returns ``(model, info)`` with ``info["data"]`` the data configuration it was trained
    on. Raises :class:`posenc.lab.training.train.CheckpointError` naming the file when it is missing,
    unreadable, corrupt or not a lab checkpoint.
    """
    p = Path(path)
    if p.is_dir():
        found = [c for c in (p / "final.pt", p / "last.pt") if c.exists()]
        if not found:
            raise CheckpointError(f"no final.pt or last.pt in {p}")
        p = found[0]
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} does not exist")
    hint = "pass the final.pt/last.pt a `posenc lab` run writes under <out>/ckpt/<cell>/"
    ckpt = read_checkpoint(p, hint)
    identity = ckpt.get("identity") or {}
    try:
        cfg = ModelConfig(**identity["model"])
        model = TransformerLM(cfg)
        model.load_state_dict(ckpt["model"])
    except (KeyError, TypeError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {p} has no usable model ({first}); {hint}") from e
    model.eval()
    info = {"path": str(p), "step": ckpt.get("step"), "data": identity.get("data", {})}
    return model, info


def checkpoint_tokens(info: dict[str, Any], length: int) -> torch.Tensor:
    """An input ``[1, length]`` like the checkpoint's training data.

    A synthetic task: one test sequence of it. Text: the bytes of a standard-library source
    file, real text of the kind the default corpus holds (not the test split itself, which may
    need a corpus build or a download).
    """
    data = info.get("data") or {}
    if data.get("source") == "task" and data.get("task"):
        from .tasks import make_task

        g = torch.Generator().manual_seed(1)
        x, _ = make_task(data["task"]).sample(g, 1, length)
        return x  # [1, length]
    import json.decoder

    text = Path(json.decoder.__file__).read_bytes()
    while len(text) < length:
        text = text + b"\n" + text
    return torch.tensor(list(text[:length]), dtype=torch.long)[None]  # [1, length]


def lag_layer(weights: list[torch.Tensor], lag: int = TINY_LAG) -> int:
    """The layer whose heads put the most weight on the key ``lag`` tokens back (mean over
    queries and heads). ``weights``: per layer ``[b, h, s, s]``."""
    scores = [float(w.diagonal(offset=-lag, dim1=-2, dim2=-1).mean()) for w in weights]
    return max(range(len(scores)), key=scores.__getitem__)


def tiny_task_tokens(length: int, seed: int = 1) -> torch.Tensor:
    """One input sequence of the tiny model's task, ``[1, length]``, from a fixed seed."""
    x, _ = lag_batch(torch.Generator().manual_seed(seed), 1, length)
    return x


def _model_and_source(
    checkpoint: str | Path | None,
    encoding: str,
    train_len: int,
    steps: int,
    seed: int,
    progress: bool,
) -> tuple[TransformerLM, dict[str, Any], str]:
    """The model to look at (a checkpoint's, or a tiny one trained here with a progress bar when
    ``progress``), its info, and a sentence saying where it came from."""
    if checkpoint is not None:
        model, info = load_checkpoint_model(checkpoint)
        path = Path(info["path"])
        return model, info, f"lab checkpoint {path.parent.name}/{path.name}"
    cfg = tiny_model_config(encoding, train_len, steps)  # a refusal comes before any progress line
    with progress_bars(progress, transient=True, stderr=True) as bars:
        on_step, finish = step_task(bars, f"tiny {encoding} model", steps)
        model, info = train_tiny_model(cfg, steps, seed, progress=on_step)
        finish()
    source = (
        f"a tiny model trained here for {info['steps']} steps ({info['seconds']:.1f} s) "
        f"to {info['task']}, final loss {info['final_loss_bits']:.2f} bits"
    )
    return model, info, source


def _sequences(
    tokens: torch.Tensor | None, info: dict[str, Any], checkpoint: bool, train_len: int, n: int
) -> dict[str, torch.Tensor]:
    """The inputs ``{"train": [1, L], "long": [1, n]}`` (module docstring of each source)."""
    if tokens is not None:
        if tokens.dim() != 2 or tokens.shape[1] < n:
            raise ValueError(
                f"tokens must be [1, n] with n >= {n} (factor x train length), "
                f"got {tuple(tokens.shape)}"
            )
        return {"train": tokens[:1, :train_len], "long": tokens[:1, :n]}
    if checkpoint:
        # A task sequence is laid out for its length, so each length gets its own instance.
        return {"train": checkpoint_tokens(info, train_len), "long": checkpoint_tokens(info, n)}
    long = tiny_task_tokens(n)  # [1, F*L]; the short map reads its first L tokens
    return {"train": long[:, :train_len], "long": long}


def attention_data(
    checkpoint: str | Path | None = None,
    *,
    encoding: str = "rope",
    train_len: int = 32,
    factor: int = 4,
    steps: int = 300,
    layer: int | None = None,
    seed: int = 0,
    tokens: torch.Tensor | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Attention maps of one layer at the training length and at ``factor`` times it.

    ``checkpoint``: a lab checkpoint; else a tiny model is trained (:func:`train_tiny_model`;
    ``progress``: with a progress bar on stderr). ``layer``: default the last layer of a
    checkpoint, and for the tiny model the layer that looks back ``TINY_LAG`` tokens (most
    attention weight at that offset at the training length; which layer learns it varies with
    the encoding). ``tokens [1, n]``: input (``n >= factor * train_len``); default a sequence
    of the tiny model's task.

    Returns ``maps``: ``{"train": [h, L, L], "long": [h, F*L, F*L]}`` (numpy, float32),
    ``lengths`` ``(L, F*L)``, ``layer`` (non-negative index), ``encoding``, ``source`` (a sentence
    for the caption) and ``info`` (training or checkpoint details).
    """
    check_positive_int("factor", factor)
    model, info, source = _model_and_source(checkpoint, encoding, train_len, steps, seed, progress)
    train_len = model.cfg.max_len
    seqs = _sequences(tokens, info, checkpoint is not None, train_len, factor * train_len)
    attn = {name: model_attention(model, seq) for name, seq in seqs.items()}  # [1, h, n, n] each
    num_layers = len(model.blocks)
    if layer is None:
        layer = num_layers - 1 if checkpoint is not None else lag_layer(attn["train"])
    if not -num_layers <= layer < num_layers:
        raise ValueError(f"layer must be in [-{num_layers}, {num_layers - 1}], got {layer}")
    layer = layer % num_layers
    return {
        "maps": {name: a[layer][0].float().numpy() for name, a in attn.items()},  # [h, n, n]
        "lengths": (train_len, factor * train_len),
        "layer": layer,
        "encoding": model.cfg.encoding,
        "source": source,
        "info": info,
    }
