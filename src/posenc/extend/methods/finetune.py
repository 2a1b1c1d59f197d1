"""A short fine-tune for context extension: PoSE (Zhu et al. 2023, "PoSE: Efficient Context
Window Extension of LLMs via Positional Skip-wise Training") with a RoPE scaling applied.

PoSE trains long positions at a short length: each ``train_len``-token example is two segments
of one long document, the first at positions ``0 ..`` and the second shifted by a random skip
so that positions up to ``target_len - 1`` are seen, as the authors' ``train_pose.py`` builds them
(first segment ``ids[0:r1]`` with ``r1 ~ U[1, (T + 1) // 2]``; second segment the ``T - r1``
tokens ending at ``r2 ~ U[T, len]``; skip ``~ U[0, target - T]``). The model is trained with the
method's scaling in place (``apply_posenc(model, scaling=...)``), and written with
:func:`~posenc.extend.methods.export.export_model`, so the result is a folder stock transformers loads.

A checkpoint (weights, optimizer, step, RNG) is written atomically every ``save_every`` steps to
``<out>/checkpoint.pt``; a rerun with the same settings and model resumes from it. It is a lab
checkpoint (:mod:`posenc.runs.checkpoint`): read with ``weights_only=True`` and checked against the
SHA-256 digest stored with it, so a checkpoint from elsewhere can never run code; one of other
settings or another model is refused in one line. :func:`posenc.extend.study.command.pose_model` is the whole fine-tune of
``posenc extend --finetune pose``: under the study folder's lock, and written as a model folder
that appears whole or not at all.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from ...runs.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ...runs.identity import jsonable
from ..model.load import rotated_pairs, trained_length
from .names import Method, as_transformers, resolve

log = logging.getLogger("posenc.extend")

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class FinetuneConfig:
    steps: int
    train_len: int
    target_len: int
    method: str = "yarn"
    lr: float = 2e-5
    seed: int = 0
    save_every: int = 10

    def __post_init__(self) -> None:
        if self.steps < 1 or self.save_every < 1:
            raise ValueError(
                f"steps and save_every must be >= 1, got {self.steps}, {self.save_every}"
            )
        if not 2 <= self.train_len < self.target_len:
            raise ValueError(
                f"PoSE trains at a length below the target: need 2 <= train_len < target_len, got "
                f"{self.train_len} and {self.target_len}"
            )


def pose_example(
    ids: list[int], train_len: int, target_len: int, rng: random.Random
) -> tuple[list[int], list[int]]:
    """``(tokens, positions)`` of one PoSE example from a document's ``ids`` (at least
    ``train_len`` of them): two segments, the second's positions skipped ahead."""
    n = len(ids)
    if n < train_len:
        raise ValueError(f"a PoSE document needs >= {train_len} tokens, got {n}")
    r1 = rng.randint(1, (train_len + 1) // 2)
    r2 = rng.randint(train_len, n)
    l2 = r2 - (train_len - r1)
    tokens = ids[:r1] + ids[l2:r2]
    skip = rng.randint(0, target_len - train_len)
    positions = list(range(r1)) + [r1 + skip + i for i in range(train_len - r1)]
    return tokens, positions


def training_bytes(model: Any, train_len: int) -> int:
    """Peak memory of one training step: weights, gradients and AdamW's two moments in float32,
    the activations kept for backward (every layer at ``train_len`` tokens) and the logits."""
    text = model.config.get_text_config(decoder=True)
    params = sum(p.numel() for p in model.parameters())
    per_layer = train_len * (
        16 * text.hidden_size + 4 * getattr(text, "intermediate_size", 4 * text.hidden_size)
    )
    attention = text.num_attention_heads * train_len * train_len  # eager probabilities, if used
    return int(
        16 * params
        + 4 * (per_layer + attention) * text.num_hidden_layers
        + 12 * train_len * text.vocab_size
    )


def _resume(path: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint at ``path`` if it is a whole lab checkpoint of ``identity``; else
    ValueError, one line (never the file's code: ``weights_only=True``)."""
    hint = f"delete {path.parent} to fine-tune from step 0, or use another --out"
    try:
        return load_checkpoint(path, identity, hint)
    except CheckpointError as e:
        raise ValueError(str(e)) from None


def finetune(
    model: Any,
    tokenizer: Any,
    documents: list[Path],
    cfg: FinetuneConfig,
    out: str | os.PathLike[str],
    *,
    model_id: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model`` in place with PoSE and ``cfg.method``'s scaling (left applied, so the
    caller can evaluate it patched or export it); resumes from ``<out>/checkpoint.pt`` when it
    was written for ``cfg`` and ``model_id`` (what names the model). Returns
    ``{"steps", "losses", "seconds"}``."""
    from ...hf import apply_posenc

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    method = Method(cfg.method)
    config = model.config
    resolved = resolve(method, trained_length(config), cfg.target_len, rotated_pairs(config))
    if resolved.scaling is None:
        raise ValueError(f"PoSE fine-tunes with a RoPE scaling; {cfg.method!r} is none")
    apply_posenc(model, scaling=as_transformers(resolved.scaling, config, resolved.layers))
    texts = [tokenizer(p.read_text(encoding="utf-8", errors="replace"), add_special_tokens=False)["input_ids"][: cfg.target_len]
             for p in documents]  # fmt: skip
    device = next(model.parameters()).device
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
    rng = random.Random(cfg.seed)
    start_step, losses = 0, []
    ckpt = out / CHECKPOINT
    identity = jsonable({"pose": asdict(cfg), "model": model_id})
    if ckpt.exists():
        state = _resume(ckpt, identity)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        version, mt, gauss = state["rng"]
        rng.setstate((version, tuple(mt), gauss))
        start_step, losses = state["step"], state["losses"]
        log.info("resumed PoSE at step %d of %d", start_step, cfg.steps)
    model.train()
    began = time.perf_counter()
    for step in range(start_step, cfg.steps):
        tokens, positions = pose_example(
            texts[step % len(texts)], cfg.train_len, cfg.target_len, rng
        )
        ids = torch.tensor([tokens], device=device)
        loss = model(
            input_ids=ids, position_ids=torch.tensor([positions], device=device), labels=ids
        ).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        log.info("PoSE step %d/%d: loss %.4f", step + 1, cfg.steps, losses[-1])
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(ckpt, {"identity": identity, "model": model.state_dict(),
                                   "optimizer": opt.state_dict(), "rng": rng.getstate(),
                                   "step": step + 1, "losses": losses})  # fmt: skip
    model.eval()
    return {"steps": cfg.steps, "losses": losses, "seconds": time.perf_counter() - began}
