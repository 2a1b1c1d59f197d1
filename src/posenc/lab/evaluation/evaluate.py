"""Evaluation: bits per byte (or per answer token) at the train length and beyond, per-position
loss curves, and inference-time variants that need no retraining.

Variants of one trained model:

* ``base``: the model as trained. A learned table asked for positions past its length is
  reported as not applicable (with the reason), never crashed on.
* ``interp``: a learned table linearly interpolated to the eval length (labelled; the model
  never saw the interpolated rows).
* RoPE rescalings (``linear`` = position interpolation, ``ntk`` = static NTK-aware,
  ``dynamic`` = dynamic NTK, ``yarn``): every rotary encoding that offers
  ``with_scaling(dict)`` is swapped for its rescaled copy with
  ``factor = eval length / train length`` (and ``original_max_position_embeddings = train
  length`` where the type takes it; Hugging Face key names, :func:`rope_scaling`). At the train length the factor is 1, the identity, so the
  base number stands for every variant there.

The metric is the mean next-token cross-entropy over scored targets divided by ``ln 2``: with a
byte vocabulary that is bits per byte.

A data source with ``eval_depths`` (the passkey task, :mod:`posenc.lab.evaluation.tasks`) also gets a
length x depth heatmap per variant, from the forward passes that score it: ``"passkey":
{"depths", "lengths", "acc", "exact", "sequences"}`` beside the variant's ``"results"``, each
``[length][depth]``; ``acc`` is answer-token accuracy, ``exact`` the fraction of keys right in
every digit (under teacher forcing that is greedy decoding's exact match), None where a length
is not applicable. The evaluation sequences come from a fixed seed, so every cell sees the same
(at each length the token budget's sequences, and at least ``PASSKEY_MIN_PER_DEPTH`` per depth).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...functional.rope_scaling import ROPE_SCALING, extension_scaling
from ..cells.presets import EvalConfig
from ..training.data import IGNORE, LabData
from ..training.train import Dist

#: Table labels of the RoPE rescalings, from the one scaling table.
ROPE_LABELS = {name: spec.label for name, spec in ROPE_SCALING.items()}


def _batches(
    windows: Iterator[tuple[torch.Tensor, torch.Tensor]], rows: int, dist: Dist
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Regroup windows into batches of ``rows``; window ``i`` goes to rank ``i % world``."""
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    i = 0
    for x, y in windows:
        for r in range(x.shape[0]):
            if i % dist.world == dist.rank:
                xs.append(x[r])
                ys.append(y[r])
                if len(xs) == rows:
                    yield torch.stack(xs), torch.stack(ys)  # [rows, s]
                    xs, ys = [], []
            i += 1
    if xs:
        yield torch.stack(xs), torch.stack(ys)


@torch.no_grad()
def score(
    model: nn.Module,
    data: LabData,
    seq_len: int,
    cfg: EvalConfig,
    dist: Dist | None = None,
) -> dict[str, Any]:
    """Score the test split at ``seq_len``: ``{"bits", "acc", "tokens", "curve"}``.

    ``curve`` (non-overlapping windows only) is the per-position loss in bits, averaged over
    windows and then over at most ``cfg.curve_points`` log-spaced bins of positions
    (:func:`bin_curve`). Data with ``eval_depths`` (passkey) adds ``"passkey": {"acc",
    "exact", "sequences"}``, one entry per depth (rows binned by ``data.depth_index(x)``).
    """
    dist = dist or Dist()
    model.eval()
    depths = getattr(data, "eval_depths", None)
    tally = _Tally.zeros(seq_len, len(depths or ()), dist.device)
    rows = max(1, cfg.batch_tokens // seq_len)
    for x, y in _batches(data.eval_windows(seq_len, cfg.tokens, cfg.stride), rows, dist):
        tally.add(model, x.to(dist.device), y.to(dist.device), data if depths is not None else None)
    for t in (tally.by_depth, tally.total, tally.pos_sum, tally.pos_cnt):
        dist.sum_(t)
    total = tally.total
    n = float(total[1])
    if n == 0:
        raise ValueError(f"no scored targets at eval length {seq_len}")
    out: dict[str, Any] = {
        "bits": float(total[0]) / n / math.log(2),
        "acc": float(total[2]) / n,
        "tokens": int(n),
        "curve": None,
    }
    if cfg.stride is None:
        out["curve"] = bin_curve(tally.pos_sum.cpu(), tally.pos_cnt.cpu(), cfg.curve_points)
    if depths is not None:
        hits, asked, exact, seqs = tally.by_depth.cpu().tolist()
        out["passkey"] = {
            "acc": [h / a if a else None for h, a in zip(hits, asked, strict=True)],
            "exact": [e / c if c else None for e, c in zip(exact, seqs, strict=True)],
            "sequences": [int(c) for c in seqs],
        }
    return out


@dataclass
class _Tally:
    """What :func:`score` sums over batches, in float64 (sums of ~1e5 losses in float32 would
    lose the last digits): ``total`` (loss sum, targets, correct), per-position loss sums and
    target counts ``[s]``, and per passkey depth ``[4, depths]`` (correct answer tokens, answer
    tokens, keys right in every digit, sequences)."""

    total: torch.Tensor
    pos_sum: torch.Tensor
    pos_cnt: torch.Tensor
    by_depth: torch.Tensor

    @classmethod
    def zeros(cls, seq_len: int, depths: int, device: torch.device) -> _Tally:
        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=device)

        return cls(z(3), z(seq_len), z(seq_len), z(4, depths))

    def add(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, depth_of: Any) -> None:
        """Score one batch ``x, y [b, s]`` (``depth_of``: passkey data, binning rows by depth)."""
        autocast = x.device.type == "cuda"
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)  # [b, s, vocab]
        logits = logits.float()
        losses = F.cross_entropy(
            logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="none"
        ).view_as(y)  # [b, s]
        mask = y != IGNORE
        self.total[0] += losses.double().sum()
        self.total[1] += mask.sum()
        right = (logits.argmax(-1) == y) & mask  # [b, s]
        self.total[2] += right.sum()
        self.pos_sum += losses.double().sum(0)
        self.pos_cnt += mask.sum(0)
        if depth_of is not None:
            at = depth_of.depth_index(x)  # [b] depth of each row
            hits, asked = right.sum(1), mask.sum(1)  # [b]
            per_row = torch.stack([hits, asked, hits == asked, torch.ones_like(hits)])  # [4, b]
            self.by_depth.index_add_(1, at, per_row.double())


def bin_curve(loss_sum: torch.Tensor, count: torch.Tensor, points: int) -> dict[str, list[Any]]:
    """Per-position sums ``[s]`` -> mean bits in at most ``points`` bins of positions.

    Bins are log-spaced (one position each at the start, wider further on) so a log-position
    plot has even resolution and the long tail is averaged over enough targets to be readable;
    with ``points >= s`` every position is its own bin. Returns ``{"pos": first position,
    "end": one past the last position, "bits": mean bits}`` per bin.
    """
    s = loss_sum.shape[0]
    if points >= s:
        edges = list(range(s + 1))
    else:
        geo = torch.logspace(0, math.log10(s), points, dtype=torch.float64).round().long()
        edges = sorted({0, s, *geo.tolist()})
    pos, end, bits = [], [], []
    for a, b in itertools.pairwise(edges):
        c = float(count[a:b].sum())
        if b > a and c > 0:
            pos.append(a)
            end.append(b)
            bits.append(float(loss_sum[a:b].sum()) / c / math.log(2))
    return {"pos": pos, "end": end, "bits": bits}


# --- variants ------------------------------------------------------------------------------


@contextmanager
def swapped_inner_encodings(
    model: nn.Module, make: Callable[[nn.Module], nn.Module]
) -> Iterator[None]:
    """Replace each block's attention encoding by ``make(encoding)`` for the ``with`` body.

    A shared encoding (one module serving every layer) is rebuilt once and stays shared.
    """
    blocks = list(model.blocks)  # type: ignore[attr-defined, arg-type]
    originals = [b.attn.encoding for b in blocks]
    memo: dict[int, nn.Module | None] = {}
    try:
        for b, enc in zip(blocks, originals, strict=True):
            if id(enc) not in memo:
                # A layer without an encoding (nope_every) stays without one.
                memo[id(enc)] = None if enc is None else make(enc)
            b.attn.encoding = memo[id(enc)]
        yield
    finally:
        for b, enc in zip(blocks, originals, strict=True):
            b.attn.encoding = enc


@contextmanager
def swapped_absolute(model: nn.Module, new: nn.Module) -> Iterator[None]:
    old = model.absolute
    model.absolute = new
    try:
        yield
    finally:
        model.absolute = old


def rotary_encodings(model: nn.Module) -> list[Any]:
    """The distinct rotary encodings inside the model's attention layers."""
    seen: dict[int, Any] = {}
    for b in model.blocks:  # type: ignore[attr-defined, union-attr]
        enc = b.attn.encoding
        if enc is not None and getattr(enc, "family", None) == "rotary":
            seen.setdefault(id(enc), enc)
    return list(seen.values())


def rope_scaling(method: str, eval_len: int, train_len: int, pairs: int = 0) -> dict[str, Any]:
    """The Hugging Face style scaling dict for evaluating at ``eval_len`` a model trained at
    ``train_len``: ``factor = eval_len / train_len``, built by the scaling table's
    ``extension`` of ``method`` (``pairs``: rotated pairs, for LongRoPE's per-pair lists).

    For ``dynamic`` that is the factor of transformers' formula, which rescales by
    ``factor * seq_len / L - (factor - 1)``: on full windows of ``eval_len`` tokens that is
    ``f^2 - f + 1`` with ``f = eval_len / L``, more than static NTK's ``f``; this is what a user
    setting ``{"rope_type": "dynamic", "factor": f}`` gets.
    """
    out = extension_scaling(method, eval_len / train_len, train_len, pairs)
    if out is None:
        raise ValueError(f"rope_scaling needs a scaling method, got {method!r}")
    return out


def learned_limit(model: nn.Module) -> int | None:
    """The number of positions of the model's absolute table, if it has a finite one."""
    absolute = getattr(model, "absolute", None)
    limit = getattr(absolute, "max_positions", None)
    return int(limit) if isinstance(limit, int) else None


@dataclass
class _Evaluation:
    """One :func:`evaluate_model` call: what every variant is scored with, and what it found."""

    model: nn.Module
    data: LabData
    train_len: int
    lengths: list[int]
    cfg: EvalConfig
    dist: Dist
    log: Callable[[str], None] | None
    variants: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def run(
        self,
        name: str,
        label: str,
        prepare: Callable[[int], Any] | None,
        base: dict[str, Any] | None,
    ) -> None:
        """Score variant ``name`` at every length; ``prepare(n)`` gives the context that makes
        the variant (None: the model as is; a string: not applicable, why)."""
        t0 = time.perf_counter()
        results: dict[str, Any] = {}
        heat: dict[int, Any] = {}  # passkey rows by length
        base_heat = self.variants.get("base", {}).get("passkey")
        for n in self.lengths:
            if base is not None and n <= self.train_len:
                # factor <= 1: the variant is the model as trained.
                results[str(n)] = {**base[str(n)], "note": "same as base (factor <= 1)"}
                if base_heat is not None:
                    i = base_heat["lengths"].index(n)
                    heat[n] = {k: base_heat[k][i] for k in ("acc", "exact", "sequences")}
                continue
            results[str(n)] = _score_one(
                self.model, self.data, n, self.train_len, self.cfg, self.dist, prepare
            )
            heat[n] = results[str(n)].pop("passkey", None)
        self.variants[name] = {
            "label": label,
            "results": results,
            "seconds": time.perf_counter() - t0,
        }
        depths = getattr(self.data, "eval_depths", None)
        if depths is not None:
            self.variants[name]["passkey"] = pk = _heatmap(depths, self.lengths, heat)
        if self.log:
            self.log(f"  {name:<8s} " + "  ".join(_fmt(n, results[str(n)]) for n in self.lengths))
            if depths is not None:
                means = [_mean_or_none(row) for row in pk["acc"]]
                self.log(
                    f"  {'':<8s} passkey acc (mean over depths) "
                    + "  ".join(
                        f"{n}:{m:.2f}" if m is not None else f"{n}:n/a"
                        for n, m in zip(self.lengths, means, strict=True)
                    )
                )


def _heatmap(depths: Any, lengths: list[int], heat: dict[int, Any]) -> dict[str, Any]:
    """Per-length passkey rows -> ``{"depths", "lengths", "acc", "exact", "sequences"}``, each
    metric ``[length][depth]`` (None for a length that was not applicable)."""
    out: dict[str, Any] = {"depths": list(depths), "lengths": list(lengths)}
    for k in ("acc", "exact", "sequences"):
        out[k] = [heat[n][k] if heat.get(n) is not None else None for n in lengths]
    return out


def _run_interp(ev: _Evaluation, limit: int | None, base_results: dict[str, Any]) -> None:
    """The ``interp`` variant, where the model has a learned table that can be resized."""
    model, dist = ev.model, ev.dist
    absolute: Any = getattr(model, "absolute", None)
    if ev.cfg.learned_interp and limit is not None and hasattr(absolute, "resized"):
        assert absolute is not None

        def interp_prepare(n: int) -> Any:
            return swapped_absolute(model, absolute.resized(n).to(dist.device))

        ev.run("interp", "interp", interp_prepare, base_results)


def _run_rope_scalings(ev: _Evaluation, base_results: dict[str, Any]) -> None:
    """One variant per RoPE rescaling of ``ev.cfg`` that every rotary encoding accepts (the
    others are recorded in ``ev.skipped`` with the reason)."""
    model, train_len, dist = ev.model, ev.train_len, ev.dist
    rotary = rotary_encodings(model)
    longest = max(ev.lengths)
    if not rotary or longest <= train_len:
        return
    for method in ev.cfg.rope_scalings:
        pairs = getattr(rotary[0], "rotary_dim", 0) // 2
        probe = rope_scaling(method, longest, train_len, pairs)
        if not all(hasattr(enc, "with_scaling") for enc in rotary):
            ev.skipped[method] = f"{type(rotary[0]).__name__} has no with_scaling()"
            continue
        try:
            for enc in rotary:
                enc.with_scaling(probe)
        except (ValueError, TypeError, NotImplementedError, KeyError) as e:
            ev.skipped[method] = f"with_scaling({probe}) failed: {e}"
            continue

        def rope_prepare(n: int, method: str = method, pairs: int = pairs) -> Any:
            scaling = rope_scaling(method, n, train_len, pairs)
            return swapped_inner_encodings(model, lambda e: _rescaled(e, scaling, dist))

        ev.run(method, ROPE_LABELS.get(method, method), rope_prepare, base_results)


def evaluate_model(
    model: nn.Module,
    data: LabData,
    train_len: int,
    lengths: list[int],
    cfg: EvalConfig,
    dist: Dist | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every variant of ``model`` at every length.

    Returns ``{"mode", "unit", "train_len", "lengths", "variants": {name: {"label",
    "results": {str(length): {"bits", "acc", "tokens", "curve", "note"}}, "seconds"}},
    "skipped": {name: reason}}``; ``bits`` is None where a length does not apply, with the
    reason in ``note``. Passkey data: each variant also has ``"passkey"`` (module docstring).
    """
    ev = _Evaluation(model, data, train_len, lengths, cfg, dist or Dist(), log)
    limit = learned_limit(model)

    def base_prepare(n: int) -> Any:
        if limit is not None and n > limit:
            return f"n/a: the learned table has {limit} positions"
        return None

    ev.run("base", "", base_prepare, None)
    base_results = ev.variants["base"]["results"]
    _run_interp(ev, limit, base_results)
    _run_rope_scalings(ev, base_results)
    return {
        "mode": "nonoverlap" if cfg.stride is None else f"sliding:{cfg.stride}",
        "unit": data.unit,
        "train_len": train_len,
        "lengths": lengths,
        "variants": ev.variants,
        "skipped": ev.skipped,
    }


def _rescaled(enc: Any, scaling: dict[str, Any], dist: Dist) -> nn.Module:
    """``enc.with_scaling(scaling)`` on this process's device."""
    out: nn.Module = enc.with_scaling(scaling)
    return out.to(dist.device)


def _score_one(
    model: nn.Module,
    data: LabData,
    n: int,
    train_len: int,
    cfg: EvalConfig,
    dist: Dist,
    prepare: Callable[[int], Any] | None,
) -> dict[str, Any]:
    ctx = prepare(n) if prepare is not None else None
    if isinstance(ctx, str):  # not applicable, with the reason
        return {"bits": None, "acc": None, "tokens": 0, "curve": None, "note": ctx}
    try:
        if ctx is None:
            out = score(model, data, n, cfg, dist)
        else:
            with ctx:
                out = score(model, data, n, cfg, dist)
    except (ValueError, RuntimeError, IndexError) as e:
        if n <= train_len or dist.enabled:
            raise  # at the train length a failure is a bug, not a finding
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return {"bits": None, "acc": None, "tokens": 0, "curve": None, "note": f"n/a: {reason}"}
    return {**out, "note": None}


def _mean_or_none(row: list[float | None] | None) -> float | None:
    vals = [v for v in row or () if v is not None]
    return sum(vals) / len(vals) if vals else None


def _fmt(n: int, r: dict[str, Any]) -> str:
    return f"{n}:{r['bits']:.3f}" if r["bits"] is not None else f"{n}:n/a"
