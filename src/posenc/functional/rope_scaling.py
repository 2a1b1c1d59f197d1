"""RoPE scaling types: one table, ``rope_type -> ScalingSpec``, the pattern of transformers'
``ROPE_INIT_FUNCTIONS``. The module, :mod:`posenc.hf`, the lab's rescaling sweep and the
wavelength plot all read it; a new type is one entry here.

Each spec gives the type's keys (Hugging Face names; required and optional, each with its check),
its inverse-frequency function, whether the frequencies depend on the current length, and how to
build the scaling dict that extends a model trained at ``L`` by ``factor``. Bad values raise a
``ValueError`` naming the key and what is allowed; nothing is silently replaced.

Frequencies by ``rope_type`` (``f_i = base ** (-2i / r)``, ``L`` the original length)::

    default       f_i
    linear        f_i / factor                                    (position interpolation)
    ntk           base' = base * factor ** (r / (r - 2))           (static NTK-aware)
    dynamic       base' = base * (factor * seq_len / L - (factor - 1)) ** (r / (r - 2)) once
                  seq_len > L (dynamic NTK), plain below
    yarn          f_i for pairs turning more than beta_fast (32) times within L, f_i / factor
                  for those turning fewer than beta_slow (1) times, a linear ramp between;
                  cos/sin times 0.1 ln(factor) + 1 (or mscale(factor, mscale) /
                  mscale(factor, mscale_all_dim), or attention_factor)
    longrope      f_i / short_factor[i], or f_i / long_factor[i] once seq_len > L; cos/sin
                  times sqrt(1 + ln(factor) / ln(L))
    llama3        f_i / factor for wavelengths > L / low_freq_factor, f_i below
                  L / high_freq_factor, smooth interpolation between
    proportional  base ** (-2i / head_dim) / factor for i < r/2, then 0 up to head_dim/2
                  (Gemma-4): the rotation spans the whole head and the pairs past r/2 have
                  frequency 0 (cos 1, sin 0)

Arithmetic follows transformers' operation order, so ``dtype=float32`` reproduces its
frequencies bit for bit and ``dtype=float64`` keeps angles exact at large positions.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .._checks import check_choice, check_even
from ..kernels.constants import ANGLE_DTYPES

# --- value checks: each returns the value or raises, naming the key ----------------------------


def _bad(key: str, rope_type: str, allowed: str, value: object) -> ValueError:
    return ValueError(
        f"scaling[{key!r}] must be {allowed} for rope_type {rope_type!r}, got {value!r}"
    )


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _at_least_one(key: str, value: Any, rope_type: str) -> float:
    if not _number(value) or not value >= 1:
        raise _bad(key, rope_type, "a finite number >= 1 (a context extension)", value)
    return value


def _positive(key: str, value: Any, rope_type: str) -> float:
    if not _number(value) or not value > 0:
        raise _bad(key, rope_type, "a finite number > 0", value)
    return value


def _non_negative(key: str, value: Any, rope_type: str) -> float:
    if not _number(value) or not value >= 0:
        raise _bad(key, rope_type, "a finite number >= 0", value)
    return value


def _length(key: str, value: Any, rope_type: str) -> int:
    if not _number(value) or value != int(value) or not value >= 1:
        raise _bad(key, rope_type, "a positive integer (a length in tokens)", value)
    return int(value)


def _flag(key: str, value: Any, rope_type: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(key, rope_type, "True or False", value)
    return value


def _factors(key: str, value: Any, rope_type: str) -> list[float]:
    if not isinstance(value, (list, tuple)) or not all(_number(v) and v > 0 for v in value):
        raise _bad(key, rope_type, "a list of finite numbers > 0 (one per rotated pair)", value)
    return [float(v) for v in value]


#: The largest dynamic NTK ``factor``: far above any real extension, far below an overflow.
MAX_DYNAMIC_FACTOR = 1e6

#: Every scaling key and its check. ``None`` is accepted for optional keys (the type's default).
KEY_CHECKS: dict[str, Callable[[str, Any, str], Any]] = {
    "factor": _at_least_one,
    "original_max_position_embeddings": _length,
    "attention_factor": _positive,
    "beta_fast": _positive,
    "beta_slow": _positive,
    "mscale": _non_negative,
    "mscale_all_dim": _non_negative,
    "truncate": _flag,
    "short_factor": _factors,
    "long_factor": _factors,
    "low_freq_factor": _positive,
    "high_freq_factor": _positive,
}

# --- inverse frequencies -----------------------------------------------------------------------

Length = int | torch.Tensor | None  # the current length: an int, a 0-d tensor (traced), or None
Device = torch.device | str | None


def _exponents(num: int, denom: int, dtype: torch.dtype, device: Device = None) -> torch.Tensor:
    """``[0, 2, 4, .., num-2] / denom`` in ``dtype``: the ``2i/d`` of ``base ** (-2i/d)``."""
    return torch.arange(0, num, 2, dtype=torch.int64, device=device).to(dtype) / denom  # [num/2]


def _plain(
    base: float | torch.Tensor, dim: int, dtype: torch.dtype, device: Device = None
) -> torch.Tensor:
    """``1 / base ** (2i/dim)``, the operation order of transformers' default RoPE."""
    return 1.0 / (base ** _exponents(dim, dim, dtype, device))


@dataclass(frozen=True)
class Ctx:
    """What a frequency function reads besides the scaling dict."""

    base: float
    dim: int  # rotary_dim r
    head_dim: int  # d (only ``proportional`` spreads its pairs over it)
    seq_len: Length
    dtype: torch.dtype
    device: Device = None  # where the tensors are built (a traced length's device)


def _default(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    return _plain(c.base, c.dim, c.dtype, c.device), 1.0


def _linear(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    return _plain(c.base, c.dim, c.dtype, c.device) / sc["factor"], 1.0


def _ntk(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    return _plain(c.base * sc["factor"] ** (c.dim / (c.dim - 2)), c.dim, c.dtype, c.device), 1.0


def _dynamic(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    factor, orig, dim = sc["factor"], sc["original_max_position_embeddings"], c.dim
    plain = _plain(
        c.base * ((factor * orig / orig) - (factor - 1)) ** (dim / (dim - 2)),
        dim,
        c.dtype,
        c.device,
    )
    if c.seq_len is None or (isinstance(c.seq_len, int) and c.seq_len <= orig):
        return plain, 1.0
    # transformers recomputes the base from a tensor length, so its arithmetic runs in the
    # tensor's dtype (float32 there); doing the same keeps the frequencies bit-identical.
    length = torch.as_tensor(c.seq_len, device=c.device).to(c.dtype)
    grown = _plain(
        c.base * ((factor * length / orig) - (factor - 1)) ** (dim / (dim - 2)),
        dim,
        c.dtype,
        c.device,
    )
    if isinstance(c.seq_len, int):
        return grown, 1.0
    return torch.where(length > orig, grown, plain), 1.0  # a traced length: no host read


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(factor) + 1`` (1 when ``factor <= 1``)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def _yarn_factor(sc: dict[str, Any]) -> float:
    if sc.get("attention_factor") is not None:
        return float(sc["attention_factor"])
    factor, mscale, mscale_all_dim = sc["factor"], sc.get("mscale"), sc.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def _yarn(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    factor, orig, dim, base = sc["factor"], sc["original_max_position_embeddings"], c.dim, c.base

    def correction_dim(num_rotations: float) -> float:
        # The pair index whose wavelength fits ``num_rotations`` times into the original length.
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = correction_dim(sc.get("beta_fast") or 32)
    high = correction_dim(sc.get("beta_slow") or 1)
    if sc.get("truncate", True) is not False:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp

    pos_freqs = base ** _exponents(dim, dim, c.dtype, c.device)  # [n]
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp(
        (torch.arange(dim // 2, dtype=c.dtype, device=c.device) - low) / (high - low), 0, 1
    )  # [n]
    extrapolation = 1 - ramp  # 1 for high-frequency pairs (kept), 0 for low ones (interpolated)
    inv_freq = inv_freq_interpolation * (1 - extrapolation) + inv_freq_extrapolation * extrapolation
    return inv_freq, _yarn_factor(sc)


def longrope_is_long(seq_len: Any, orig: int) -> Any:
    """LongRoPE's switch, the one rule every caller uses: the long factors once the length
    (``max position + 1``; an int or a 0-d tensor) exceeds ``original_max_position_embeddings``,
    as transformers' ``seq_len > original_max_position_embeddings``."""
    return seq_len > orig


def _longrope(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    orig, dim = sc["original_max_position_embeddings"], c.dim
    for key in ("short_factor", "long_factor"):
        if len(sc[key]) != dim // 2:
            raise ValueError(
                f"scaling[{key!r}] must hold rotary_dim/2={dim // 2} numbers for rope_type "
                f"'longrope', got {len(sc[key])}"
            )
    attention_factor = sc.get("attention_factor")
    if attention_factor is None:
        factor = sc["factor"]
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        )

    def inv(key: str) -> torch.Tensor:
        ext = torch.tensor(sc[key], dtype=c.dtype, device=c.device)  # [n]
        return 1.0 / (ext * base_pow)

    base_pow = c.base ** _exponents(dim, dim, c.dtype, c.device)
    if c.seq_len is None or isinstance(c.seq_len, int):
        long = c.seq_len is not None and longrope_is_long(c.seq_len, orig)
        return inv("long_factor" if long else "short_factor"), float(attention_factor)
    # A traced length (a tensor): choose on the device, as transformers does, without a host read.
    is_long = longrope_is_long(c.seq_len, orig)
    return torch.where(is_long, inv("long_factor"), inv("short_factor")), float(attention_factor)


def _llama3(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    inv_freq = _plain(c.base, c.dim, c.dtype, c.device)  # [n]
    factor = sc["factor"]
    low_freq_factor, high_freq_factor = sc["low_freq_factor"], sc["high_freq_factor"]
    old_context_len = sc["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are interpolated, short ones kept, the middle smoothed.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # With high_freq_factor == low_freq_factor this is x / 0 (inf or NaN), and the band it would
    # fill (wavelen == L exactly) is empty: torch.where below never selects it, as transformers.
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama), 1.0


def _proportional(sc: dict[str, Any], c: Ctx) -> tuple[torch.Tensor, float]:
    rotated = 1.0 / (c.base ** _exponents(c.dim, c.head_dim, c.dtype, c.device))  # [r/2]
    zeros = torch.zeros(c.head_dim // 2 - c.dim // 2, dtype=c.dtype, device=c.device)  # [(d - r)/2]
    return torch.cat((rotated, zeros)) / sc.get("factor", 1.0), 1.0  # [d/2]


# --- the table ---------------------------------------------------------------------------------

ORIG = "original_max_position_embeddings"
Extension = Callable[[float, int, int], dict[str, Any]]


def _longrope_demo_factors(n: int, factor: float) -> list[float]:
    """An illustrative LongRoPE ``long_factor``: ``1 + (factor - 1) (i / (n - 1))^2`` for pair ``i``.

    Real models ship per-pair factors found by search (Phi-3's are in its config); this smooth
    ramp has their shape (high-frequency pairs near 1, low-frequency ones near ``factor``). Not a
    geometric ramp: that would be NTK-aware scaling exactly (pair ``i`` stretched by
    ``factor ** (i / (n - 1))``).
    """
    return [1.0 + (factor - 1.0) * (i / max(n - 1, 1)) ** 2 for i in range(n)]


@dataclass(frozen=True)
class ScalingSpec:
    """One RoPE scaling type.

    ``required``/``optional``: its scaling keys (posenc form: ``original_max_position_embeddings``
    is explicit wherever the formula reads it). ``derived``: required keys that a Hugging Face
    config may leave out because transformers derives them from the model config
    (``original_max_position_embeddings`` from ``max_position_embeddings``, then ``factor`` as
    the ratio of the two). ``original_is_max_position``: the type always takes
    ``max_position_embeddings`` as its original length (transformers' dynamic NTK).
    ``in_transformers``: a Hugging Face config may name the type (``ntk`` is posenc's own).
    ``inv_freq(sc, ctx) -> (inv_freq [n], attention_factor)``. ``length_dependent``: the
    frequencies change with the current length. ``label``: short name for tables and legends.
    ``extension(factor, L, n)``: the scaling dict that extends a model trained at ``L`` by
    ``factor`` (the lab's sweep and the wavelength plot), ``n`` rotated pairs.
    """

    rope_type: str
    inv_freq: Callable[[dict[str, Any], Ctx], tuple[torch.Tensor, float]]
    label: str
    extension: Extension
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    derived: tuple[str, ...] = ()
    length_dependent: bool = False
    min_rotary_dim: int = 2
    original_is_max_position: bool = False
    in_transformers: bool = True

    def __reduce__(self) -> str | tuple[Any, ...]:
        # A registered type pickles by its name (its functions include closures, which pickle
        # cannot write): torch.save of a whole model whose rotary module holds its spec.
        if ROPE_SCALING.get(self.rope_type) is self:
            return (scaling_spec, (self.rope_type,))
        return super().__reduce__()


def scaling_spec(rope_type: str) -> ScalingSpec:
    """The registered :class:`ScalingSpec` of ``rope_type`` (what a pickled one loads as)."""
    return ROPE_SCALING[rope_type]


def _with_factor(rope_type: str, orig: bool = False) -> Extension:
    def build(factor: float, train_len: int, n: int) -> dict[str, Any]:
        return {"rope_type": rope_type, "factor": factor, **({ORIG: train_len} if orig else {})}

    return build


def _llama3_extension(factor: float, train_len: int, n: int) -> dict[str, Any]:
    # Llama-3.1's published band edges.
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        ORIG: train_len,
    }


def _longrope_extension(factor: float, train_len: int, n: int) -> dict[str, Any]:
    return {
        "rope_type": "longrope",
        "factor": factor,
        "short_factor": [1.0] * n,
        "long_factor": _longrope_demo_factors(n, factor),
        ORIG: train_len,
    }


ROPE_SCALING: dict[str, ScalingSpec] = {
    spec.rope_type: spec
    for spec in (
        ScalingSpec("default", _default, "RoPE", lambda f, L, n: {"rope_type": "default"}),
        ScalingSpec("linear", _linear, "PI", _with_factor("linear"), ("factor",)),
        ScalingSpec(
            "ntk", _ntk, "NTK", _with_factor("ntk"), ("factor",), min_rotary_dim=4,
            in_transformers=False,
        ),
        ScalingSpec(
            "dynamic", _dynamic, "dyn-NTK", _with_factor("dynamic", orig=True), ("factor", ORIG),
            derived=(ORIG,), length_dependent=True, min_rotary_dim=4,
            original_is_max_position=True,
        ),
        ScalingSpec(
            "yarn", _yarn, "YaRN", _with_factor("yarn", orig=True), ("factor", ORIG),
            ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
            derived=(ORIG, "factor"),
        ),
        ScalingSpec(
            "longrope", _longrope, "LongRoPE", _longrope_extension,
            ("short_factor", "long_factor", ORIG), ("factor", "attention_factor"),
            derived=(ORIG, "factor"), length_dependent=True,
        ),
        ScalingSpec(
            "llama3", _llama3, "Llama-3", _llama3_extension,
            ("factor", "low_freq_factor", "high_freq_factor", ORIG), derived=(ORIG,),
        ),
        ScalingSpec(
            "proportional", _proportional, "proportional", _with_factor("proportional"),
            optional=("factor",),
        ),
    )
}  # fmt: skip
ROPE_TYPES: tuple[str, ...] = tuple(ROPE_SCALING)

# Keys that belong to the module, not to the scaling dict.
_MODULE_KEYS = {
    "rope_theta": "pass base= instead",
    "partial_rotary_factor": "pass rotary_dim=int(head_dim * partial_rotary_factor) instead",
    "mrope_section": "use posenc.rotary.MRoPE(mrope_section=...)",
    "mrope_interleaved": "use posenc.rotary.MRoPE(interleaved=...)",
}


def _check_relations(rope_type: str, out: dict[str, Any]) -> None:
    """Checks between keys (each key alone is checked by ``KEY_CHECKS``)."""
    # Equal factors (Llama-4-Scout's 1.0 and 1.0) leave the smoothing band empty: transformers
    # reads them (its where-masking never selects the 0/0 smoothing), and so does _llama3. With
    # high < low the band is empty too (L / high > L / low): transformers warns and divides the
    # wavelengths above L / low by factor, keeping the others; _llama3 does the same.
    if rope_type == "llama3" and out["high_freq_factor"] < out["low_freq_factor"]:
        warnings.warn(
            f"scaling['high_freq_factor'] ({out['high_freq_factor']}) is below "
            f"scaling['low_freq_factor'] ({out['low_freq_factor']}) for rope_type 'llama3': no "
            "frequency is smoothed; those with wavelengths above original_max_position_embeddings"
            " / low_freq_factor are divided by factor, the others kept (as transformers)",
            stacklevel=3,
        )
    if rope_type == "dynamic" and out["factor"] > MAX_DYNAMIC_FACTOR:
        # base * (factor * s / L - (factor - 1)) ** (r / (r - 2)) overflows float64 to inf/NaN
        raise ValueError(
            f"scaling['factor'] must be <= {MAX_DYNAMIC_FACTOR:g} for rope_type 'dynamic' (the "
            f"grown base overflows past it), got {out['factor']}"
        )
    if rope_type == "yarn":
        fast, slow = out.get("beta_fast") or 32, out.get("beta_slow") or 1
        if not fast > slow:
            raise ValueError(
                "scaling['beta_fast'] must be greater than scaling['beta_slow'] for rope_type "
                f"'yarn' (the ramp runs from fast-turning to slow-turning pairs), got {fast} and {slow}"
            )
    if (
        rope_type == "longrope"
        and out.get("factor") is None
        and out.get("attention_factor") is None
    ):
        raise ValueError(
            "scaling for rope_type 'longrope' needs 'factor' (the context extension ratio) "
            "or an explicit 'attention_factor'"
        )


def normalize_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Check a ``scaling`` dict and return a copy keyed by ``rope_type`` (None for plain RoPE).

    Accepts ``type`` as an alias of ``rope_type`` (transformers 4.x). Raises ``ValueError`` naming
    the rope type and the missing, unknown or bad key(s).

    >>> normalize_scaling({"type": "linear", "factor": 2.0})
    {'rope_type': 'linear', 'factor': 2.0}
    """
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
    out = dict(scaling)
    rope_type = out.pop("rope_type", None)
    alias = out.pop("type", None)
    rope_type = rope_type if rope_type is not None else alias
    if rope_type is None:
        raise ValueError(
            f"scaling needs a 'rope_type' (or 'type') key, one of {ROPE_TYPES}; "
            f"got keys {sorted(scaling)}"
        )
    check_choice("scaling['rope_type']", rope_type, ROPE_TYPES)
    spec = ROPE_SCALING[rope_type]
    for key, hint in _MODULE_KEYS.items():
        if key in out:
            raise ValueError(
                f"scaling key {key!r} is not a scaling option (rope_type {rope_type!r}): {hint}"
            )
    missing = [k for k in spec.required if out.get(k) is None]
    if missing:
        raise ValueError(
            f"scaling for rope_type {rope_type!r} is missing required key(s) {missing}"
        )
    allowed = set(spec.required) | set(spec.optional)
    unknown = sorted(set(out) - allowed)
    if unknown:
        raise ValueError(
            f"unknown scaling key(s) {unknown} for rope_type {rope_type!r}; "
            f"allowed: {sorted(allowed) or 'none'}"
        )
    for key, value in out.items():
        if value is not None:
            out[key] = KEY_CHECKS[key](key, value, rope_type)
    _check_relations(rope_type, out)
    if rope_type == "default":
        return None
    return {"rope_type": rope_type, **out}


def check_base(base: object) -> float:
    """RoPE's ``theta``: a finite number > 1 (``f_i = base ** (-2i/r)`` must fall with ``i``)."""
    if not _number(base) or not base > 1:  # type: ignore[operator]
        raise ValueError(f"base (rope_theta) must be a finite number > 1, got {base!r}")
    return float(base)  # type: ignore[arg-type]


def rope_inv_freq(
    rotary_dim: int,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    head_dim: int | None = None,
    *,
    seq_len: Length = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of RoPE and the cos/sin multiplier: ``(inv_freq [n], attention_factor)``.

    ``n = rotary_dim / 2``, except for ``proportional`` where ``n = head_dim / 2``. ``scaling`` is
    a dict with Hugging Face key names (:func:`normalize_scaling`; types and formulas in the
    module docstring); ``seq_len`` is the current length ``max(position) + 1`` for the
    length-dependent types (an int, or a 0-d tensor to choose on the device without a host
    read); ``dtype`` is float32 (transformers' arithmetic, bit for bit) or float64 (exact angles
    at large positions).
    """
    check_even("rotary_dim", rotary_dim, "RoPE")
    base = check_base(base)
    if dtype not in ANGLE_DTYPES:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if head_dim is not None:
        check_even("head_dim", head_dim, "RoPE")
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
    sc = normalize_scaling(scaling)
    spec = ROPE_SCALING["default" if sc is None else sc["rope_type"]]
    if rotary_dim < spec.min_rotary_dim:
        raise ValueError(
            f"rotary_dim must be >= {spec.min_rotary_dim} for rope_type {spec.rope_type!r} "
            f"(exponent d / (d - 2)), got {rotary_dim}"
        )
    ctx = Ctx(base, rotary_dim, rotary_dim if head_dim is None else head_dim, seq_len, dtype)
    inv_freq, attention_factor = spec.inv_freq(sc or {}, ctx)
    return inv_freq.to(device), float(attention_factor)


def scaled_inv_freq(
    spec: ScalingSpec, scaling: dict[str, Any] | None, ctx: Ctx
) -> tuple[torch.Tensor, float]:
    """:func:`rope_inv_freq` without its checks, for a module that checked its arguments once at
    construction and recomputes length-dependent frequencies in ``forward`` (traceable: the
    checks read Python values that a compiled graph cannot guard cheaply)."""
    return spec.inv_freq(scaling or {}, ctx)


def extension_scaling(
    rope_type: str, factor: float, train_len: int, n: int
) -> dict[str, Any] | None:
    """The scaling dict that extends a model trained at ``train_len`` by ``factor`` with
    ``rope_type`` (None for ``default``); ``n`` is the number of rotated pairs (LongRoPE's lists).

    >>> extension_scaling("yarn", 4.0, 64, 8)
    {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 64}
    """
    if rope_type not in ROPE_SCALING:
        raise ValueError(f"unknown rope_type {rope_type!r}; allowed: {', '.join(ROPE_TYPES)}")
    return normalize_scaling(ROPE_SCALING[rope_type].extension(factor, train_len, n))
