"""``posenc lab extend``: context extension by a short fine-tune, the PI and YaRN papers' setting.

Take the finished cells of a grid (a results store and its checkpoints), and for every cell of
an extendable encoding fine-tune a copy at the target length ``T`` (default ``4L``):

* RoPE cells (``rope``, with any options) once per method of :data:`ROPE_METHODS` (``none``: RoPE unchanged;
  ``linear``: position interpolation; ``ntk``; ``yarn``; ``longrope`` with per-frequency
  factors; ``dynamic``: dynamic NTK with the factor a user sets, ``T / L``, not ``eval / L``),
  the scaling dict from the one scaling table (:func:`~posenc.functional.rope_scaling.extension_scaling`);
* bias cells (ALiBi, T5, KERPLE, FIRE, Sandwich) once, unchanged: their extension is the
  fine-tune alone.

Other encodings are refused (:func:`extendable`): learned tables are sized to ``L``, and xPos
and the relative family have no rescaling here.

Each fine-tune starts from the cell's weights, uses the grid's batch size and the grid's final
learning rate (``lr * min_lr_ratio``), constant after a linear warmup over 2% of the steps (one
step, so none, below 75 steps; runs that share the warmup agree step for step, so the model after
``k`` steps of a 50-step run is the 10-step run's at ``k <= 10``), and is evaluated at every eval
length at step 0 (zero-shot: the rescaling alone) and at the end, and at ``T`` at the steps of
the curve between. A model of the same shape trained at ``T`` from scratch (``reference``) is
the bar: the grid's training with the same steps and the same tokens per step, in
``batch * L / T`` sequences of ``T`` (the grid's token budget in longer sequences). The report
gives the fine-tune steps after which a method's loss at ``T`` is within a tolerance (0.02
bits) of it, and its gap to it after the last step. Both other ways to train "the same" at ``T`` make
no bar (measured on cpu-small, bits at 4L): the grid's steps and batch give ``T / L`` times the
tokens (2.26, better than every fine-tune by 0.4 bits or more: more data, not a longer
context); the grid's batch with ``L / T`` of its steps leaves the model undertrained (3.76).

Every evaluation is one row in the grid's results store (``kind`` ``"extend"`` or
``"extend-reference"``, keyed by a hash of what it measures and its table, :func:`extend_group`),
written as soon as it is measured; fine-tunes checkpoint at every curve step, before the row, so a
run killed at any moment loses at most the steps since the last checkpoint and, with ``--resume``,
writes every missing row once (rows already stored are never written again). Checkpoints live
under ``<out>/extend/``, each run's ``metrics.jsonl`` beside them (:mod:`posenc.runs.metrics`;
with ``RunOptions(report_to="tensorboard")`` a TensorBoard event file too).
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from ...model import ModelConfig, TransformerLM
from ...runs.checkpoint import FINAL, load_checkpoint
from ...runs.identity import stable_hash
from ...runs.metrics import MetricsLog, logged_steps
from ...runs.progress import step_task
from ...runs.store import RESULTS_FILE
from ..cells.config import DataConfig, EvalConfig, TrainConfig
from ..evaluation.evaluate import evaluate_model
from ..grid.run import RunContext, RunOptions, cell_dir, check_run, make_log, open_run, versions
from ..reports.results import load_rows
from ..reports.rows import REFERENCE, ExtendRow, ExtendRuntime, GridRow, runtime_dict
from ..training.data import LabData, corpus_note, load_data
from ..training.dist import init_distributed
from ..training.train import Interrupted, train_model
from .plan import (
    EXTEND_DIR,
    BaseCell,
    ExtendConfig,
    ExtendJob,
    base_cells,
    extend_group,
    jobs,
    resolve,
    target_len,
)


@dataclass
class ExtendSummary:
    group: str
    written: int = 0
    skipped: int = 0
    wall_seconds: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)


def _data_of(row: GridRow) -> tuple[DataConfig, LabData]:
    """The grid's data, as it was when its cells were trained (else ValueError)."""
    ident = dict(row.identity["train"]["data"])
    fingerprint = ident.pop("fingerprint")
    cfg = DataConfig(**ident)
    data = load_data(cfg)
    if data.fingerprint != fingerprint:
        raise ValueError(
            f"the grid's data has changed since its cells were trained (fingerprint "
            f"{fingerprint}, now {data.fingerprint}): rerun the grid first"
        )
    return cfg, data


@dataclass
class _Extend:
    """What every job of one :func:`run_extend` call shares."""

    cfg: ExtendConfig
    data: LabData
    group: str
    ctx: RunContext
    summary: ExtendSummary

    @property
    def store(self) -> Any:
        return self.ctx.store

    def eval_config(self, base: BaseCell) -> EvalConfig:
        """The grid's evaluation without its inference-time variants (the fine-tuned model is
        evaluated as it is). The grid's eval identity may hold more than EvalConfig's fields
        (the passkey task's heatmap settings): those enter :meth:`key_hash`, not the config."""
        ident = base.row.identity["eval"]
        ev = EvalConfig(**{f.name: ident[f.name] for f in fields(EvalConfig) if f.name in ident})
        return replace(ev, lengths=tuple(ev.lengths), rope_scalings=(), learned_interp=False)

    def key_hash(self, job: ExtendJob, step: int, lengths: list[int]) -> str:
        """The row key of ``job`` after ``step`` steps at ``lengths``: what it measures, and
        the group (the table) it belongs to, so a reference shared by two tables is a row of
        each."""
        extra = {k: v for k, v in job.base.row.identity["eval"].items()
                 if k not in {f.name for f in fields(EvalConfig)}}  # fmt: skip
        return stable_hash({"job": job.identity, "step": step, "lengths": lengths,
                            "group": self.group,
                            "eval": asdict(self.eval_config(job.base)),
                            **({"eval_extra": extra} if extra else {})})  # fmt: skip

    def measure(self, job: ExtendJob, step: int, model: Any, lengths: list[int], t0: float) -> None:
        """Evaluate ``model`` (``job`` after ``step`` steps) at ``lengths``; one stored row."""
        config_hash = self.key_hash(job, step, lengths)
        if self.store.has(job.base.label, job.base.seed, config_hash):
            return
        ev = replace(self.eval_config(job.base), lengths=tuple(lengths))
        t_eval = time.perf_counter()
        evaluation = evaluate_model(
            model, self.data, job.base.train_len, lengths, ev, self.ctx.dist
        )
        results = evaluation["variants"]["base"]["results"]
        bits = [(n, results[str(n)]["bits"]) for n in lengths]
        shown = "  ".join(f"{n}:{b:.3f}" if b is not None else f"{n}:n/a" for n, b in bits)
        self.ctx.log(f"{job.label} (seed {job.base.seed}) step {step}: {shown}")
        row = self.row(job, step, config_hash, evaluation, time.perf_counter() - t_eval, t0)
        if self.ctx.dist.main and self.store.append(row):
            self.summary.written += 1
            self.summary.rows.append(row)
        self.ctx.dist.barrier()

    def row(
        self,
        job: ExtendJob,
        step: int,
        config_hash: str,
        evaluation: dict[str, Any],
        eval_seconds: float,
        t0: float,
    ) -> dict[str, Any]:
        """The stored row of ``job`` after ``step`` steps (:class:`~posenc.lab.reports.rows.ExtendRow`)."""
        base, dist = job.base, self.ctx.dist
        runtime = ExtendRuntime(eval_seconds, time.perf_counter() - t0, str(dist.device),
                                torch.get_num_threads())  # fmt: skip
        return ExtendRow(
            schema=base.row.schema,
            kind=job.kind,
            encoding=base.label,
            encoding_name=base.model.encoding,
            family=base.row.family,
            method=job.method,
            label=job.label,
            seed=base.seed,
            config_hash=config_hash,
            job_hash=job.hash,
            group=self.group,
            base_group=base.row.group,
            base_config_hash=base.row.config_hash,
            preset=base.row.preset,
            train_len=base.train_len,
            target_len=job.model.max_len,
            step=step,
            steps=job.train.steps,
            tokens_per_step=job.train.batch_size * job.model.max_len,
            identity=job.identity,
            data=base.row.data,
            eval=evaluation,
            runtime=runtime_dict(runtime),
            versions=versions(),
            finished_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        ).to_dict()

    def run(self, job: ExtendJob) -> None:
        """Zero-shot row, the fine-tune with its curve rows, the final row (each once)."""
        t0 = time.perf_counter()
        lengths = sorted({int(n) for n in job.base.row.eval["lengths"]})
        target = [job.model.max_len]
        curve = (self.cfg.curve or ()) if job.init else ()
        done = self.store.has(
            job.base.label, job.base.seed, self.key_hash(job, job.train.steps, lengths)
        )
        missing = [c for c in curve if not self.store.has(job.base.label, job.base.seed,
                                                          self.key_hash(job, c, target))]  # fmt: skip
        if done and not missing:
            self.summary.skipped += 1
            self.ctx.log(f"skip {job.label} (seed {job.base.seed}): finished already")
            return
        if done:  # finished with another curve: train again (deterministic) for the new points
            self.ctx.log(
                f"{job.label} (seed {job.base.seed}): fine-tuning again for curve {missing}"
            )
        init = None
        if job.init:
            init = self.base_weights(job.base)
            if not self.store.has(job.base.label, job.base.seed, self.key_hash(job, 0, lengths)):
                model = _model_with(job.model, init, self.ctx.dist.device)
                self.measure(job, 0, model, lengths, t0)

        def hook(step: int, model: Any) -> None:
            self.measure(job, step, model, target, t0)

        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{job.kind}-{job.base.label}-{job.method}")
        ckpt_dir = self.ctx.opts.out / EXTEND_DIR / f"{safe}-s{job.base.seed}-{job.hash}"
        on_step, finish = step_task(
            self.ctx.progress, f"{job.label} s{job.base.seed}", job.train.steps
        )
        metrics = MetricsLog(ckpt_dir, logged_steps(job.train.steps), self.ctx.opts.report_to)
        result = train_model(
            job.model,
            job.train,
            self.data,
            seed=job.base.seed,
            identity=job.identity,
            # A rerun for new curve points leaves the finished run's folder alone (and its metrics).
            ckpt_dir=None if done else ckpt_dir,
            ckpt_every=job.train.steps if job.init else 100,
            resume=self.ctx.opts.resume,
            restart=self.ctx.opts.restart,
            dist=self.ctx.dist,
            progress=on_step,
            stop=self.ctx.stop,
            init=init,
            hook=hook if job.init else None,
            hook_steps=curve,
            metrics=None if done else metrics,
        )
        finish()
        self.measure(job, job.train.steps, result.model, lengths, t0)

    def base_weights(self, base: BaseCell) -> dict[str, torch.Tensor]:
        path = cell_dir(self.ctx.opts.out, base.label, base.seed, base.row.train_hash) / FINAL
        if not path.exists():
            raise FileNotFoundError(
                f"{path}: the trained weights of {base.label} (seed {base.seed}) are missing; "
                "`posenc lab` with the grid's options writes them"
            )
        ckpt = load_checkpoint(path, base.row.identity["train"])
        return ckpt["model"]


def _model_with(cfg: ModelConfig, state: dict[str, torch.Tensor], device: torch.device) -> Any:
    with torch.random.fork_rng(devices=[]):  # the init draws leave the RNG as it was
        model = TransformerLM(cfg)
    model.load_state_dict(state)
    return model.to(device)


def _bases(
    cfg: ExtendConfig, opts: RunOptions, group: str | None
) -> tuple[ExtendConfig, list[BaseCell]]:
    """``cfg`` resolved against the grid's training, and the grid's cells to extend; the grid's
    thread count (its first row's) unless ``opts`` sets one."""
    rows = load_rows(opts.out, group)  # the grid rows of the group (newest grid by default)
    threads = rows[0].get("runtime", {}).get("threads") if rows else None
    if opts.threads is None and isinstance(threads, int) and threads >= 1:
        torch.set_num_threads(threads)
    cfg = resolve(cfg, TrainConfig(**rows[0]["identity"]["train"]["train"])) if rows else cfg
    bases = base_cells(rows, cfg.encodings)
    if not bases:
        raise ValueError(
            f"no finished cell of {', '.join(cfg.encodings)} in {opts.out / RESULTS_FILE}"
            + (f" (group {group})" if group else "")
            + "; run `posenc lab` first"
        )
    return cfg, bases


def run_extend(
    cfg: ExtendConfig,
    opts: RunOptions,
    *,
    group: str | None = None,
    print_fn: Callable[[str], None] | None = None,
) -> ExtendSummary:
    """Extend the finished cells of grid ``group`` (default: the newest) in ``opts.out``.

    Raises ValueError when the store has no extendable cell, ``FileNotFoundError`` when a
    cell's weights are missing, and the grid's :class:`~posenc.lab.training.train.Interrupted` /
    ``ResumeRequired`` / ``CheckpointError`` / ``FolderLocked`` as ``posenc lab`` does.
    """
    t_start = time.perf_counter()
    check_run(opts)
    if opts.threads is not None:
        torch.set_num_threads(opts.threads)
    dist = init_distributed(opts.device)
    if dist.enabled:
        raise ValueError("posenc lab extend runs in one process (not under torchrun)")
    log = make_log(dist, opts.quiet, print_fn)
    cfg, bases = _bases(cfg, opts, group)
    todo = jobs(bases, cfg)
    trained = {j.base.label for j in todo if j.kind == REFERENCE}
    for name in cfg.reference:
        if name not in trained:
            log(f"warning: no reference {name!r}: the grid has no plain {name!r} cell")
    ext_group = extend_group(bases[0].row.group, cfg)
    summary = ExtendSummary(group=ext_group)
    log(
        f"extend: {len(bases)} cell(s) of group {bases[0].row.group} to "
        f"{target_len(bases[0], cfg)} tokens, {cfg.steps} fine-tune steps (lr {cfg.lr:g}, "
        f"curve {list(cfg.curve or ())}), {len(todo)} run(s), group {ext_group}"
    )
    with open_run(opts, dist, log) as run:
        data_cfg, data = _data_of(bases[0].row)
        ext = _Extend(cfg, data, ext_group, run, summary)
        note = corpus_note(data_cfg, data, ext.eval_config(bases[0]).tokens)
        if note is not None:
            log(note)
        for job in todo:
            if run.stop.signum is not None:
                raise Interrupted(run.stop.signum)
            ext.run(job)
    summary.wall_seconds = time.perf_counter() - t_start
    log(f"extend done in {summary.wall_seconds:.1f} s: {summary.written} row(s) written")
    return summary
