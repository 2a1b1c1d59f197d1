"""``check_rope(impl, config)``: any RoPE implementation against posenc's reading of a config.

The rules, in one place (docs/testing.md explains them with an example):

* **Inputs.** ``q [b, h, s, d]`` and ``k [b, hk, s, d]`` with every head vector of unit norm
  (random, seeded), cast to the probe's dtype; ``position_ids [b, s]`` int64, ``[3, b, s]`` for
  M-RoPE configs (Qwen2-VL/2.5-VL/3-VL, Qwen3.5). ``d`` is the reference module's ``head_dim``:
  the whole head for partial rotary (channels past ``rotary_dim`` must pass through), the rope
  part ``qk_rope_head_dim`` for MLA (DeepSeek), the layer type's own head dim (Gemma-4).
* **The reference** is :func:`posenc.hf.rope_from_hf` with float64 angles, applied in float64 to
  the inputs as the implementation received them (so the cast of the inputs is not counted), at
  the length ``max(position_ids) + 1`` (transformers' rule for dynamic NTK and LongRoPE).
* **Errors**: worst absolute difference of the implementation's ``q'``, ``k'`` (in float64)
  from the reference, per probe.
* **Thresholds**, per probe: ``max(floor, slack * own)`` (``slack`` 4 in float32, 2 in bf16 and
  fp16: :data:`SLACK`), where ``own`` is the worst error of
  posenc's reference evaluated the way transformers evaluates it in that dtype (float32: float32
  angles and a float32 rotation; bf16/fp16: the float32 cos/sin cast to the dtype and
  ``x * cos + rotate(x) * sin`` in the dtype), against float64, on the same inputs. ``floor``:
  ``1e-6`` in float32 (an absolute error on unit-norm inputs), one ulp of the largest reference
  value in bf16/fp16. Below a few thousand positions the float32 threshold is the floor; far
  out it is set by the ``p * 6e-8`` rad of a float32 angle, which no float32 implementation
  avoids. A NoPE layer type (rope parameters ``None``) must return ``q``, ``k`` bit for bit.
* **cos/sin implementations** (``kind="cos_sin"``, or detected: a pair of ``[b, s, w]``/
  ``[s, w]`` tensors or one complex ``e^{i angle}`` tensor): the tables are compared with the
  reference's in the architecture's layout (``w = r``: ``cat(c, c)`` for half pairs,
  ``repeat_interleave(c, 2)`` for interleaved ones; ``w = r / 2``: one entry per pair), with the
  same rule (float32 cos/sin cast to the dtype as ``own``), and the rotation by those tables
  (posenc's, in float64) is judged as above.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_int_at_most, check_positive_int
from ..hf.config import _get, _head_dim, _nested_keys, read_config
from ..hf.load import resolve_config
from .diagnose import Diagnosis, diagnose
from .probes import Probe, rope_probes
from .reference import Reference
from .report import Position, ProbeResult, RopeReport
from .timeout import ImplTimeout, call_with_timeout

Impl = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, str | None], Any]
KINDS = ("auto", "qk", "cos_sin")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FLOAT32_FLOOR = 1e-6
#: The default factor on the reference's own error, per dtype. float32: a float32 implementation
#: whose frequencies are ``exp(-ln(base) 2i / d)`` instead of transformers' ``1 / base ** (2i / d)``
#: reaches 2.4x the reference's float32 error at 4x max (plain RoPE, theta 10000); bf16: rounding
#: dominates, and an implementation that rotates in float32 and casts once sits at 0.5-0.6x.
SLACK = {torch.float32: 4.0, torch.bfloat16: 2.0, torch.float16: 2.0}


def _read(config: Any) -> tuple[Any, frozenset[str]]:
    """``(decoder config, model types)`` as :func:`posenc.hf.rope_from_hf` reads them."""
    return read_config(resolve_config(config), True)


def rope_layer_types(config: Any) -> list[tuple[str | None, bool]]:
    """``[(layer_type, uses_rope)]`` of a config: the keys its rope parameters are nested under
    (``uses_rope`` False where they are None: NoPE), or ``[(None, True)]`` for one set."""
    cfg, _ = _read(config)
    params = _get(cfg, "rope_parameters") or {}
    nested = _nested_keys(params, _get(cfg, "_rope_type_labels") or _get(cfg, "layer_types"))
    if not nested:
        return [(None, True)]
    return [(key, params[key] is not None) for key in nested]


def _describe(config: Any) -> tuple[str, int | None]:
    """``(model_type or "config", max_position_embeddings)`` of the decoder config."""
    cfg, model_types = _read(config)
    label = _get(config, "model_type") or min(model_types, default=None) or "config"
    return str(label), _get(cfg, "max_position_embeddings")


def _unit(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64)  # [b, h, s, d]
    return x / x.norm(dim=-1, keepdim=True)


def _floor(dtype: torch.dtype, ref: torch.Tensor) -> float:
    if dtype == torch.float32:
        return FLOAT32_FLOOR
    top = float(ref.abs().max())
    return torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(top)) if top > 0 else 0.0


def _token_err(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``[b, s]``: the worst error of each token over heads and channels (NaN counts as inf)."""
    diff = (out.to(torch.float64) - ref).abs().nan_to_num(nan=math.inf)  # [b, h, s, d]
    return diff.amax(dim=(1, 3))


def _as_tables(out: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """An implementation's cos/sin as ``[b|1, s, w]``, or None if ``out`` is not cos/sin."""
    if isinstance(out, torch.Tensor) and out.is_complex():
        out = (out.real, out.imag)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return None
    cos, sin = out
    if not all(isinstance(t, torch.Tensor) and t.dim() in (2, 3) for t in (cos, sin)):
        return None
    return (cos[None], sin[None]) if cos.dim() == 2 else (cos, sin)


class _Case:
    """One probe in one dtype: inputs, the reference and the threshold."""

    def __init__(
        self, ref: Reference, probe: Probe, dtype: torch.dtype, heads: int, kv_heads: int, seed: int
    ) -> None:
        self.ref, self.probe, self.dtype = ref, probe, dtype
        pos = probe.position_ids
        b, s = pos.shape[-2], pos.shape[-1]
        gen = torch.Generator().manual_seed(seed)
        self.q = _unit((b, heads, s, ref.head_dim), gen).to(dtype)  # [b, h, s, d]
        self.k = _unit((b, kv_heads, s, ref.head_dim), gen).to(dtype)  # [b, hk, s, d]
        self.cos, self.sin = ref.cos_sin(pos)  # float64 [b, s, n]
        self.ref_q = ref.rotate(self.q.double(), self.cos, self.sin)
        self.ref_k = ref.rotate(self.k.double(), self.cos, self.sin)
        cos32, sin32 = ref.cos_sin(pos, exact=False)
        if dtype == torch.float32:
            own = [ref.rotate(x, cos32, sin32) for x in (self.q, self.k)]
            own_cs = max(_max(cos32 - self.cos), _max(sin32 - self.sin))
        else:
            own = [ref.rotate_in_dtype(x, cos32, sin32) for x in (self.q, self.k)]
            own_cs = max(_max(cos32.to(dtype) - self.cos), _max(sin32.to(dtype) - self.sin))
        self.own = max(_max(own[0] - self.ref_q), _max(own[1] - self.ref_k))
        self.own_cos_sin = own_cs

    def thresholds(self, slack: float) -> tuple[float, float]:
        """``(rotation threshold, cos/sin threshold)``."""
        rot = max(_floor(self.dtype, self.ref_q), slack * self.own)
        return rot, max(_floor(self.dtype, self.cos), slack * self.own_cos_sin)


def _max(t: torch.Tensor) -> float:
    return float(t.to(torch.float64).abs().nan_to_num(nan=math.inf).max())


def _first(bad: torch.Tensor, pos: torch.Tensor) -> Position | None:
    """The position id of the first ``True`` of ``bad [b, s]`` in row-major order."""
    hits = bad.flatten().nonzero()
    if not len(hits):
        return None
    row, col = divmod(int(hits[0]), bad.shape[1])
    if pos.dim() == 3:  # M-RoPE: (t, h, w)
        return tuple(int(v) for v in pos[:, row, col])
    return int(pos[row, col])


def _result(case: _Case, layer_type: str | None, **kw: Any) -> ProbeResult:
    return ProbeResult(layer_type, str(case.dtype).removeprefix("torch."), case.probe.name, **kw)


def _failed(case: _Case, layer_type: str | None, threshold: float, note: str) -> ProbeResult:
    inf = math.inf
    return _result(
        case, layer_type, q_err=inf, k_err=inf, threshold=threshold, passed=False, note=note
    )


#: What one call gave: ``((q', k'), cos/sin error [b, s] or None, worst cos/sin error or None)``.
Outputs = tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor | None, float | None]


def _outputs(
    impl: Impl, case: _Case, layer_type: str | None, kind: str, nope: bool, timeout: float | None
) -> Outputs | str:
    """Call ``impl`` on the case's inputs: its ``(q', k')`` (rotated by its cos/sin if it gave
    tables), or why it cannot be judged. :class:`ImplTimeout` passes through."""
    pos = case.probe.position_ids
    q_in, k_in, pos_in = case.q.clone(), case.k.clone(), pos.clone()
    try:
        out = call_with_timeout(lambda: impl(q_in, k_in, pos_in, layer_type), timeout)
    except Exception as err:  # a conformance check reports what the implementation did
        return f"raised {type(err).__name__}: {err}"
    if not (torch.equal(q_in, case.q) and torch.equal(k_in, case.k) and torch.equal(pos_in, pos)):
        return "modified its inputs in place"
    tables = _as_tables(out) if kind != "qk" else None
    if tables is not None:
        if nope:
            return "returned cos/sin for a NoPE layer type"
        return _check_tables(case, tables)
    if kind == "cos_sin":
        return "did not return cos, sin [b, s, w] tensors"
    note = _check_qk(case, out)
    return note or ((out[0], out[1]), None, None)


def _nan_note(out: tuple[torch.Tensor, torch.Tensor]) -> str:
    """``"NaN in q' (3 of 512 values)..."`` where the outputs (for cos/sin: the rotation by
    them) hold NaN, counted as an infinite error: a NaN never passes. Or ``""``."""
    parts = [
        f"{name} ({n} of {t.numel()} values)"
        for name, t in (("q'", out[0]), ("k'", out[1]))
        if (n := int(t.isnan().sum()))
    ]
    return "NaN in " + ", ".join(parts) if parts else ""


def _judge(
    impl: Impl,
    case: _Case,
    layer_type: str | None,
    kind: str,
    slack: float,
    nope: bool,
    timeout: float | None = None,
) -> ProbeResult:
    pos = case.probe.position_ids
    threshold, cs_threshold = (0.0, 0.0) if nope else case.thresholds(slack)
    got = _outputs(impl, case, layer_type, kind, nope, timeout)
    if isinstance(got, str):
        return _failed(case, layer_type, threshold, got)
    out, cs_tok, cos_sin_err = got
    ref_q, ref_k = (case.q.double(), case.k.double()) if nope else (case.ref_q, case.ref_k)
    q_tok, k_tok = _token_err(out[0], ref_q), _token_err(out[1], ref_k)
    bad = (q_tok > threshold) | (k_tok > threshold)
    if cs_tok is not None:
        bad |= cs_tok > cs_threshold
    note = _nan_note(out)
    if nope and not note:
        note = "NoPE: q, k unchanged"
    return _result(
        case, layer_type, q_err=float(q_tok.max()), k_err=float(k_tok.max()), threshold=threshold,
        passed=not bool(bad.any()), first_failing_position=_first(bad, pos),
        cos_sin_err=cos_sin_err, cos_sin_threshold=None if cos_sin_err is None else cs_threshold,
        note=note,
    )  # fmt: skip


def _check_qk(case: _Case, out: Any) -> str:
    """Why ``out`` is not a valid ``(q', k')``, or ``""``."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return f"returned {type(out).__name__}, not (q', k') or (cos, sin)"
    for name, got, want in (("q'", out[0], case.q), ("k'", out[1], case.k)):
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            return f"{name} has shape {shape}, expected {tuple(want.shape)}"
        if got.dtype != want.dtype:
            return f"{name} is {got.dtype} for {want.dtype} inputs"
    return ""


def _check_tables(
    case: _Case, tables: tuple[torch.Tensor, torch.Tensor]
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, float] | str:
    """``((q', k') rotated by the tables, cos/sin error [b, s], worst cos/sin error)``, or why
    the tables cannot be compared."""
    ref, (cos, sin) = case.ref, tables
    b, s, n = case.cos.shape
    width = cos.shape[-1]
    if cos.shape != sin.shape or cos.shape[-2] != s or cos.shape[0] not in (1, b):
        return f"cos/sin have shapes {tuple(cos.shape)}, {tuple(sin.shape)}; expected [{b}, {s}, w]"
    if width not in (n, ref.span):
        return f"cos/sin end in {width}; expected {ref.span} (rotary dim) or {n} (one per pair)"
    full = width == ref.span and width != n
    want_cos = ref.expand(case.cos) if full else case.cos  # [b, s, w]
    want_sin = ref.expand(case.sin) if full else case.sin
    diff = torch.maximum(
        (cos.to(torch.float64) - want_cos).abs(), (sin.to(torch.float64) - want_sin).abs()
    ).nan_to_num(nan=math.inf)  # [b, s, w]
    tok = diff.amax(dim=-1).expand(b, s)  # [b, s]
    c, s_ = (ref.reduce(cos), ref.reduce(sin)) if full else (cos, sin)
    c, s_ = c.to(torch.float64).expand(b, -1, -1), s_.to(torch.float64).expand(b, -1, -1)
    q = ref.rotate(case.q.double(), c, s_)
    k = ref.rotate(case.k.double(), c, s_)
    return (q, k), tok, float(tok.max())


def check_rope(
    impl: Impl,
    config: Any,
    *,
    layer_types: Sequence[str | None] | None = None,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.bfloat16),
    batch: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    seed: int = 0,
    kind: str = "auto",
    layout: str | None = None,
    max_position: int | None = None,
    dense_limit: int = 8192,
    probes: Collection[str] | None = None,
    slack: float | None = None,
    timeout: float | None = 60.0,
) -> RopeReport:
    """Check a RoPE implementation against posenc's reading of a Hugging Face config.

    ``impl(q, k, position_ids, layer_type)`` returns ``(q', k')`` (``q [b, h, s, d]``,
    ``k [b, hk, s, d]``, ``position_ids [b, s]`` int64, ``[3, b, s]`` for M-RoPE; ``layer_type``
    a key of the config's per-layer-type rope parameters, or None) or the ``(cos, sin)`` it would
    rotate with (``[b, s, r]`` in the architecture's layout, or ``[b, s, r / 2]``; one complex
    tensor is read as ``cos + i sin``). ``config``: anything :func:`posenc.hf.rope_from_hf` takes.

    ``layer_types``: which to check (default every one the config has). ``kind``: ``"auto"``
    (from what ``impl`` returns), ``"qk"`` or ``"cos_sin"``. ``layout``: override the pairing
    of the architecture. ``max_position``: the largest position probed (default
    ``4 * max_position_embeddings - 1``; a model with a fixed table, such as GPT-J's, needs
    ``max_position_embeddings - 1``). ``probes``: run only these probe names. ``slack``: the
    factor on the reference's own error in the thresholds (default :data:`SLACK`: 4 in float32,
    2 in bf16/fp16). ``timeout``: seconds one call of ``impl`` may take (None: no bound); the
    probe that runs past it fails, named, and nothing is called after it (how a hang is stopped:
    :mod:`posenc.testing.timeout`). Rules: the module docstring; probes: :mod:`posenc.testing.probes`.
    """
    _check_options(kind, dtypes, slack, timeout)
    _check_sizes(batch=batch, heads=heads, kv_heads=kv_heads, dense_limit=dense_limit)
    config = resolve_config(config)  # a path or model id is read once
    label, max_pos = _describe(config)
    if max_pos is None:
        raise ValueError("config has no max_position_embeddings: the probes are placed by it")
    run = _Run(impl, kind, tuple(dtypes), heads, kv_heads, seed, probes, slack, timeout)
    report = RopeReport(label, kind)
    for layer_type, uses_rope in _chosen_layer_types(config, layer_types):
        if not uses_rope and kind == "cos_sin":
            report.skipped.append(f"layer type {layer_type!r}: NoPE, no cos/sin to compare")
            continue
        ref = _layer_reference(config, layer_type, uses_rope, layout)
        found, skipped = rope_probes(
            max_pos, ref.exact.scaling if uses_rope else None, batch=batch,
            mrope=uses_rope and ref.mrope, max_position=max_position, dense_limit=dense_limit,
            seed=seed,
        )  # fmt: skip
        report.skipped += [f"{layer_type or ''} {s}".strip() for s in skipped]
        report.results += run.judge_all(ref, found, layer_type, nope=not uses_rope)
        if run.hung is not None:
            report.skipped.append(f"every probe after {run.hung}: the implementation hung there")
            break
    return _finish(report, run, config, layout)


def _finish(report: RopeReport, run: _Run, config: Any, layout: str | None) -> RopeReport:
    """The likely cause of a failure, and for ``kind="auto"`` what the implementation returned."""
    if not report.ok:
        report.diagnosis = _diagnosis(run, config, report, layout)
    if run.kind == "auto" and report.results:
        tables = any(r.cos_sin_err is not None for r in report.results)
        report.kind = "cos_sin" if tables else "qk"
    return report


def _diagnosis(run: _Run, config: Any, report: RopeReport, layout: str | None) -> Diagnosis | None:
    """:func:`~posenc.testing.diagnose.diagnose` on the layer type of the first failure whose
    error is a number (not a call that raised, hung, or gave NaN or a wrong shape)."""
    first = next((r for r in report.failures if r.note == "" and math.isfinite(r.q_err)), None)
    if first is None or run.hung is not None:
        return None
    layer_type = first.layer_type
    ref = Reference(config, layer_type, layout)
    slack = SLACK[torch.float32] if run.slack is None else float(run.slack)

    def outputs(position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        probe = Probe("diagnosis", position_ids, "arange(64)")
        case = _Case(ref, probe, torch.float32, run.heads, run.kv_heads, run.seed)
        try:
            got = _outputs(run.impl, case, layer_type, run.kind, False, run.timeout)
        except ImplTimeout:
            return None
        if isinstance(got, str):
            return None
        return case.q.double(), got[0][0].double(), case.thresholds(slack)[0]

    return diagnose(ref, outputs)


def _check_options(
    kind: str, dtypes: Sequence[torch.dtype], slack: float | None, timeout: float | None
) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    for dtype in dtypes:
        if dtype not in DTYPES:
            raise ValueError(f"dtypes must be among {DTYPES}, got {dtype}")
    if slack is not None and not (isinstance(slack, (int, float)) and slack >= 1):
        raise ValueError(f"slack must be a number >= 1 (or None: SLACK per dtype), got {slack!r}")
    if timeout is not None and not (
        isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < 1e6
    ):
        raise ValueError(f"timeout must be seconds > 0 (or None: no bound), got {timeout!r}")


#: The largest ``batch``, ``heads`` and ``kv_heads``: each probe builds ``[b, h, s, d]`` inputs.
MAX_ROWS = 1024


def _check_sizes(**sizes: object) -> None:
    """Each size a positive integer (``batch``, ``heads``, ``kv_heads`` at most :data:`MAX_ROWS`)."""
    for name, value in sizes.items():
        if name == "dense_limit":
            check_positive_int(name, value)
        else:
            check_int_at_most(name, value, MAX_ROWS, "each probe builds [b, h, s, d] inputs")


def _chosen_layer_types(
    config: Any, layer_types: Sequence[str | None] | None
) -> list[tuple[str | None, bool]]:
    """The config's ``[(layer_type, uses_rope)]``, only those in ``layer_types`` if given."""
    every = rope_layer_types(config)
    if layer_types is None:
        return every
    known = [lt for lt, _ in every]
    unknown = [lt for lt in layer_types if lt not in known]
    if unknown:
        raise ValueError(f"layer_types {unknown} are not in the config; it has {known}")
    return [(lt, rope) for lt, rope in every if lt in layer_types]


def _layer_reference(
    config: Any, layer_type: str | None, uses_rope: bool, layout: str | None
) -> Reference:
    """The reference of one layer type; for a NoPE one, only its inputs' shape matters."""
    if uses_rope:
        return Reference(config, layer_type, layout)
    head_dim = _head_dim(_read(config)[0], layer_type)  # inputs only: no rotation
    return Reference({"rope_theta": 10000.0, "head_dim": head_dim}, None)


@dataclass
class _Run:
    """What :func:`check_rope` holds fixed over its probes; ``hung``: the probe whose call ran
    past ``timeout`` (nothing is called after it)."""

    impl: Impl
    kind: str
    dtypes: tuple[torch.dtype, ...]
    heads: int
    kv_heads: int
    seed: int
    probes: Collection[str] | None
    slack: float | None
    timeout: float | None = None
    hung: str | None = None

    def judge_all(
        self, ref: Reference, found: list[Probe], layer_type: str | None, nope: bool
    ) -> list[ProbeResult]:
        """Each probe of ``found`` (those named in ``probes``) in each dtype, up to a hang."""
        out: list[ProbeResult] = []
        for dtype in self.dtypes:
            for probe in found:
                if self.hung is not None:
                    return out
                if self.probes is not None and probe.name not in self.probes:
                    continue
                key = f"{self.seed}/{layer_type}/{dtype}/{probe.name}"
                case = _Case(ref, probe, dtype, self.heads, self.kv_heads, zlib.crc32(key.encode()))
                factor = SLACK[dtype] if self.slack is None else float(self.slack)
                try:
                    out.append(
                        _judge(self.impl, case, layer_type, self.kind, factor, nope, self.timeout)
                    )
                except ImplTimeout:
                    out.append(self._hang(case, layer_type))
        return out

    def _hang(self, case: _Case, layer_type: str | None) -> ProbeResult:
        note = f"did not return within timeout={self.timeout:g} s; no probe was run after it"
        failed = _failed(case, layer_type, math.inf, note)
        self.hung = failed.where
        return failed
