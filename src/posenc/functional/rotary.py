"""Rotary position embedding (RoPE, Su et al. 2021) and its scaling variants, as pure functions.

Three steps, each a parity point:

1. :func:`rope_inv_freq` -> the ``n`` angular frequencies of the rotated pairs and the cos/sin
   multiplier (``attention_factor``). Every scaling variant (PI, NTK, dynamic NTK, YaRN, LongRoPE,
   Llama-3, proportional) is a transform of these frequencies and nothing else.
2. :func:`rope_cos_sin` -> ``cos``, ``sin`` of ``position * inv_freq`` in float32, ``[*, n]``.
3. :func:`apply_rotary` / :func:`apply_rotary_qk` -> the rotation, one path for every variant.

Shapes: ``b`` batch, ``h`` query heads, ``hk`` key heads, ``s`` query length, ``t`` key length,
``d`` head_dim, ``r`` rotary_dim (the rotated channels, ``r <= d``, even), ``n = r/2`` angles.

Layouts (``c_i``, ``s_i`` the cos and sin of angle ``i``)::

    half         pairs x[i] with x[i + r/2] (GPT-NeoX, LLaMA, Qwen, Mistral, Gemma):
                 [x0 x1 | x2 x3] -> [x0 c0 - x2 s0, x1 c1 - x3 s1 | x2 c0 + x0 s0, x3 c1 + x1 s1]
    interleaved  pairs x[2i] with x[2i + 1] (GPT-J, GLM, Cohere, Meta's complex form):
                 [x0 x1 x2 x3] -> [x0 c0 - x1 s0, x1 c0 + x0 s0, x2 c1 - x3 s1, x3 c1 + x2 s1]

Channels ``r..d-1`` (partial rotary) pass through untouched.

Precision. Angles are ``position * inv_freq`` computed in the dtype of ``inv_freq``, from integer
positions. In float32 the angle carries a relative error of ~6e-8, i.e. ``position * 6e-8`` rad:
harmless at a few thousand positions, 0.06 rad at 1e6. So :func:`rope_inv_freq` computes in either
dtype with the same formulas and the same operation order as transformers: ``dtype=float32``
reproduces transformers (and the reference implementations it mirrors) bit for bit, and
``dtype=float64`` keeps angles exact at any position. cos/sin are returned in float32 either way
and the rotation runs in float32 (float64 for float64 inputs); only the result is cast back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from .._checks import check_choice, check_even, check_positions, check_positive_int
from ..kernels import rope_qk as _fused_rope_qk
from ..kernels import select_backend as _select_rope_backend

ROTARY_LAYOUTS = ("half", "interleaved")
ROPE_TYPES = ("default", "linear", "dynamic", "ntk", "yarn", "longrope", "llama3", "proportional")
ROTARY_BACKENDS = ("auto", "torch", "triton", "cpu")
ANGLE_DTYPES = (torch.float32, torch.float64)

# Keys of a ``scaling`` dict (Hugging Face names), by rope type. ``rope_type`` (alias ``type``) is
# always required. ``original_max_position_embeddings`` is the training length: transformers takes
# it from the model config for ``dynamic`` (``max_position_embeddings``); here it is explicit.
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "ntk": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "proportional": (),
}
_OPTIONAL_KEYS: dict[str, tuple[str, ...]] = {
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("factor", "attention_factor"),
    "proportional": ("factor",),
}
# Keys that belong to the module, not to the scaling dict.
_MODULE_KEYS = {
    "rope_theta": "pass base= instead",
    "partial_rotary_factor": "pass rotary_dim=int(head_dim * partial_rotary_factor) instead",
    "mrope_section": "use posenc.rotary.MRoPE(mrope_section=...)",
    "mrope_interleaved": "use posenc.rotary.MRoPE(interleaved=...)",
}


def normalize_scaling(scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Check a ``scaling`` dict and return a copy keyed by ``rope_type`` (None for plain RoPE).

    Accepts ``type`` as an alias of ``rope_type`` (transformers 4.x). Raises ``ValueError`` naming
    the rope type and the missing or unknown key(s).

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
    for key, hint in _MODULE_KEYS.items():
        if key in out:
            raise ValueError(
                f"scaling key {key!r} is not a scaling option (rope_type {rope_type!r}): {hint}"
            )
    required = _REQUIRED_KEYS[rope_type]
    allowed = set(required) | set(_OPTIONAL_KEYS.get(rope_type, ()))
    missing = [k for k in required if k not in out]
    if missing:
        raise ValueError(
            f"scaling for rope_type {rope_type!r} is missing required key(s) {missing}"
        )
    unknown = sorted(set(out) - allowed)
    if unknown:
        raise ValueError(
            f"unknown scaling key(s) {unknown} for rope_type {rope_type!r}; "
            f"allowed: {sorted(allowed) or 'none'}"
        )
    for key in ("factor", "low_freq_factor", "high_freq_factor", "attention_factor"):
        value = out.get(key)
        if value is None and key in required:
            raise ValueError(
                f"scaling[{key!r}] must be a positive number for rope_type {rope_type!r}, got None"
            )
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not value > 0
            or math.isinf(value)
        ):
            raise ValueError(
                f"scaling[{key!r}] must be a positive number for rope_type {rope_type!r}, "
                f"got {value!r}"
            )
    if "original_max_position_embeddings" in out:
        check_positive_int(
            "scaling['original_max_position_embeddings']", out["original_max_position_embeddings"]
        )
    if rope_type == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise ValueError(
            "scaling['high_freq_factor'] must be greater than scaling['low_freq_factor'] "
            f"for rope_type 'llama3', got {out['high_freq_factor']} and {out['low_freq_factor']}"
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
    if rope_type == "default":
        return None
    return {"rope_type": rope_type, **out}


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(factor) + 1`` (1 when ``factor <= 1``)."""
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


def _exponents(num: int, denom: int, dtype: torch.dtype) -> torch.Tensor:
    """``[0, 2, 4, .., num-2] / denom`` in ``dtype``: the ``2i/d`` of ``base ** (-2i/d)``."""
    return torch.arange(0, num, 2, dtype=torch.int64).to(dtype) / denom  # [num/2]


def _plain(base: float | torch.Tensor, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``1 / base ** (2i/dim)``, the operation order of transformers' default RoPE."""
    return 1.0 / (base ** _exponents(dim, dim, dtype))


def rope_inv_freq(
    rotary_dim: int,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    head_dim: int | None = None,
    *,
    seq_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies of RoPE and the cos/sin multiplier: ``(inv_freq [n], attention_factor)``.

    ``n = rotary_dim / 2``, except for ``proportional`` where ``n = head_dim / 2`` (below).
    ``scaling`` is a dict with Hugging Face key names (:func:`normalize_scaling`); ``seq_len`` is
    the current length ``max(position) + 1`` for the length-dependent types; ``dtype`` is float32
    (transformers' arithmetic, bit for bit) or float64 (exact angles at large positions).

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
    """
    check_even("rotary_dim", rotary_dim, "RoPE")
    if (
        isinstance(base, bool)
        or not isinstance(base, (int, float))
        or not base > 1
        or math.isinf(base)
    ):
        raise ValueError(f"base must be a finite number > 1, got {base!r}")
    if dtype not in ANGLE_DTYPES:
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    if head_dim is not None:
        check_even("head_dim", head_dim, "RoPE")
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
    sc = normalize_scaling(scaling)
    rope_type = "default" if sc is None else sc["rope_type"]
    dim = rotary_dim
    attention_factor = 1.0

    if sc is None:
        inv_freq = _plain(base, dim, dtype)
    elif rope_type == "linear":
        inv_freq = _plain(base, dim, dtype) / sc["factor"]
    elif rope_type == "ntk":
        if dim < 4:
            raise ValueError(
                f"rotary_dim must be >= 4 for NTK scaling (exponent d / (d - 2)), got {dim}"
            )
        inv_freq = _plain(base * sc["factor"] ** (dim / (dim - 2)), dim, dtype)
    elif rope_type == "dynamic":
        inv_freq = _dynamic(base, dim, sc, seq_len, dtype)
    elif rope_type == "yarn":
        inv_freq, attention_factor = _yarn(base, dim, sc, dtype)
    elif rope_type == "longrope":
        inv_freq, attention_factor = _longrope(base, dim, sc, seq_len, dtype)
    elif rope_type == "llama3":
        inv_freq = _llama3(base, dim, sc, dtype)
    else:  # proportional
        full = dim if head_dim is None else head_dim
        rotated = 1.0 / (base ** _exponents(dim, full, dtype))  # [r/2]
        zeros = torch.zeros(full // 2 - dim // 2, dtype=dtype)  # [(d - r)/2]
        inv_freq = torch.cat((rotated, zeros)) / sc.get("factor", 1.0)  # [d/2]
    return inv_freq.to(device), float(attention_factor)


def _dynamic(
    base: float, dim: int, sc: dict[str, Any], seq_len: int | None, dtype: torch.dtype
) -> torch.Tensor:
    if dim < 4:
        raise ValueError(
            f"rotary_dim must be >= 4 for dynamic NTK scaling (exponent d / (d - 2)), got {dim}"
        )
    factor, orig = sc["factor"], sc["original_max_position_embeddings"]
    if seq_len is not None and seq_len > orig:
        # transformers recomputes the base from a tensor length, so its arithmetic runs in the
        # tensor's dtype (float32 there); doing the same keeps the frequencies bit-identical.
        length = torch.tensor(float(seq_len), dtype=dtype)
        new_base: float | torch.Tensor = base * ((factor * length / orig) - (factor - 1)) ** (
            dim / (dim - 2)
        )
    else:
        new_base = base * ((factor * orig / orig) - (factor - 1)) ** (dim / (dim - 2))
    return _plain(new_base, dim, dtype)


def _yarn(
    base: float, dim: int, sc: dict[str, Any], dtype: torch.dtype
) -> tuple[torch.Tensor, float]:
    factor, orig = sc["factor"], sc["original_max_position_embeddings"]
    attention_factor = sc.get("attention_factor")
    mscale, mscale_all_dim = sc.get("mscale"), sc.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = sc.get("beta_fast") or 32
    beta_slow = sc.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        # The pair index whose wavelength fits ``num_rotations`` times into the original length.
        return (dim * math.log(orig / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp

    pos_freqs = base ** _exponents(dim, dim, dtype)  # [n]
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)  # [n]
    extrapolation = 1 - ramp  # 1 for high-frequency pairs (kept), 0 for low ones (interpolated)
    inv_freq = inv_freq_interpolation * (1 - extrapolation) + inv_freq_extrapolation * extrapolation
    return inv_freq, float(attention_factor)


def _longrope(
    base: float, dim: int, sc: dict[str, Any], seq_len: int | None, dtype: torch.dtype
) -> tuple[torch.Tensor, float]:
    orig = sc["original_max_position_embeddings"]
    for key in ("short_factor", "long_factor"):
        value = sc[key]
        if not isinstance(value, (list, tuple)) or len(value) != dim // 2:
            raise ValueError(
                f"scaling[{key!r}] must be a list of rotary_dim/2={dim // 2} numbers for rope_type "
                f"'longrope', got {value!r:.80}"
            )
    attention_factor = sc.get("attention_factor")
    if attention_factor is None:
        factor = sc["factor"]
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        )
    use_long = seq_len is not None and seq_len > orig
    ext = torch.tensor(sc["long_factor"] if use_long else sc["short_factor"], dtype=dtype)  # [n]
    inv_freq = 1.0 / (ext * base ** _exponents(dim, dim, dtype))
    return inv_freq, float(attention_factor)


def _llama3(base: float, dim: int, sc: dict[str, Any], dtype: torch.dtype) -> torch.Tensor:
    inv_freq = _plain(base, dim, dtype)  # [n]
    factor = sc["factor"]
    low_freq_factor, high_freq_factor = sc["low_freq_factor"], sc["high_freq_factor"]
    old_context_len = sc["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths (low frequencies) are interpolated, short ones kept, the middle smoothed.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_factor * cos(p f)``, ``attention_factor * sin(p f)`` in float32.

    Shapes: ``positions [*]`` integer (any shape), ``inv_freq [n]`` -> ``cos, sin [*, n]``.
    The angle is computed in ``inv_freq``'s dtype (float32 or float64) from the integer position,
    never in the input's dtype: a bf16 position is off by up to 2048 at 1e6.
    """
    positions = check_positions(positions)
    if inv_freq.dim() != 1 or inv_freq.dtype not in ANGLE_DTYPES:
        raise ValueError(
            "inv_freq must be a 1-D float32 or float64 tensor, "
            f"got {inv_freq.dtype} {tuple(inv_freq.shape)}"
        )
    angles = positions.to(inv_freq.dtype)[..., None] * inv_freq.to(positions.device)  # [*, n]
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.float(), sin.float()


def _check_layout_dims(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int | None
) -> int:
    d = x.shape[-1]
    r = 2 * cos.shape[-1] if rotary_dim is None else rotary_dim
    if isinstance(r, bool) or not isinstance(r, int) or r < 2 or r % 2:
        raise ValueError(f"rotary_dim must be a positive even integer, got {r!r}")
    if r > d:
        raise ValueError(f"rotary_dim ({r}) must be <= head_dim ({d})")
    if cos.shape[-1] != r // 2 or sin.shape[-1] != r // 2:
        raise ValueError(
            f"cos and sin must end in rotary_dim/2={r // 2}, "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    return r


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str = "half",
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of ``x`` by the angles whose cos/sin are given.

    Shapes: ``x [..., d]``; ``cos``, ``sin [..., r/2]`` broadcastable against ``x[..., :r/2]``
    (``[s, r/2]`` or ``[b, 1, s, r/2]`` for ``x [b, h, s, d]``). ``rotary_dim`` defaults to
    ``2 * cos.shape[-1]``. Returns a new tensor of ``x``'s shape and dtype; ``x`` is not modified.

    The arithmetic runs in float32 (float64 for float64 input): in bf16, ``x c - y s`` would round
    three times. Layouts are drawn in the module docstring.
    """
    check_choice("layout", layout, ROTARY_LAYOUTS)
    r = _check_layout_dims(x, cos, sin, rotary_dim)
    math_dtype = torch.promote_types(x.dtype, torch.float32)
    c, s = cos.to(math_dtype), sin.to(math_dtype)  # [..., r/2]
    rot = x[..., :r].to(math_dtype)  # [..., r]
    if layout == "half":
        x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]  # [..., r/2] each: [x0 x1 | x2 x3]
        # [x0 x1 | x2 x3] -> [x0 c0 - x2 s0, x1 c1 - x3 s1 | x2 c0 + x0 s0, x3 c1 + x1 s1]
        out = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)  # [..., r]
    else:
        pairs = rot.unflatten(-1, (r // 2, 2))  # [..., r/2, 2]: (x0 x1) (x2 x3)
        x1, x2 = pairs[..., 0], pairs[..., 1]  # [..., r/2]: x0 x2 / x1 x3
        # [x0 x1 x2 x3] -> [x0 c0 - x1 s0, x1 c0 + x0 s0, x2 c1 - x3 s1, x3 c1 + x2 s1]
        out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)  # [..., r]
    out = out.to(x.dtype)
    if r == x.shape[-1]:
        return out
    return torch.cat((out, x[..., r:]), dim=-1)  # [..., d]: rotated channels, untouched tail


def _rows(
    table: torch.Tensor, positions: torch.Tensor | None, length: int, name: str
) -> torch.Tensor:
    """Per-token rows of a cos/sin table, shaped to broadcast against ``[b, h, length, r/2]``.

    ``table [n, r/2]`` or ``[bt, n, r/2]``; ``positions [length]`` or ``[bp, length]`` rows, or
    None (row ``i`` is token ``i``). Returns ``[length, r/2]`` or ``[b', 1, length, r/2]``.
    """
    if table.dim() not in (2, 3):
        raise ValueError(f"{name} must be [n, r/2] or [b, n, r/2], got shape {tuple(table.shape)}")
    if positions is None:
        if table.shape[-2] != length:
            raise ValueError(
                f"{name} must have one row per token ({length}) when no positions are given, "
                f"got shape {tuple(table.shape)}"
            )
        rows = table  # [length, r/2] or [bt, length, r/2]
    else:
        positions = check_positions(positions, f"positions for {name}", ranks=(1, 2))
        if positions.shape[-1] != length:
            raise ValueError(
                f"positions for {name} must end in {length}, got {tuple(positions.shape)}"
            )
        if positions.numel() and int(positions.max()) >= table.shape[-2]:
            raise ValueError(
                f"positions for {name} index rows up to {int(positions.max())} of a table with "
                f"{table.shape[-2]} rows"
            )
        if table.dim() == 2:
            rows = table[positions]  # [length, r/2] or [bp, length, r/2]
        else:
            batch = torch.arange(table.shape[0], device=table.device)[:, None]  # [bt, 1]
            rows = table[batch, positions]  # [max(bt, bp), length, r/2]
    return rows if rows.dim() == 2 else rows.unsqueeze(1)  # [length, r/2] or [b', 1, length, r/2]


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_q: torch.Tensor,
    sin_q: torch.Tensor,
    cos_k: torch.Tensor,
    sin_k: torch.Tensor,
    layout: str = "half",
    rotary_dim: int | None = None,
    *,
    positions_q: torch.Tensor | None = None,
    positions_k: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys: the single rotation path of every rotary module.

    Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]`` (``hk`` may differ from ``h``: GQA/MQA);
    ``cos_q``, ``sin_q`` float32 tables ``[n, r/2]`` or ``[bt, n, r/2]`` (``bt`` 1 or ``b``) and
    likewise ``cos_k``, ``sin_k``; ``positions_q [s]`` or ``[bp, s]`` (``positions_k`` with ``t``)
    are int64 row indices into the tables, or None when the tables hold one row per token
    (``n == s``, resp. ``t``). ``rotary_dim`` defaults to ``2 * cos_q.shape[-1]``. Returns new
    ``(q', k')`` with the shapes and dtypes of ``q`` and ``k``.

    ``backend``: ``"torch"`` is the pure-PyTorch reference below; ``"auto"`` picks the fastest
    correct implementation available: the fused kernels of :mod:`posenc.kernels` (Triton on
    GPU tensors, the native CPU kernel for float32/bfloat16 CPU tensors) where they apply, else
    the reference; ``"triton"`` and ``"cpu"`` ask for one kernel (ValueError when it cannot run).
    """
    check_choice("backend", backend, ROTARY_BACKENDS)
    check_choice("layout", layout, ROTARY_LAYOUTS)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            "q and k must be 4-D [b, h, s, d] and [b, hk, t, d], "
            f"got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q and k must have the same batch size, got {q.shape[0]} and {k.shape[0]}"
        )
    for name, table in (("cos_q", cos_q), ("sin_q", sin_q), ("cos_k", cos_k), ("sin_k", sin_k)):
        if table.dim() == 3 and table.shape[0] not in (1, q.shape[0]):
            raise ValueError(
                f"{name} batch must be 1 or {q.shape[0]}, got shape {tuple(table.shape)}"
            )
    _check_layout_dims(q, cos_q, sin_q, rotary_dim)
    r = _check_layout_dims(k, cos_k, sin_k, rotary_dim)
    # backend "auto": the fused kernels of posenc.kernels dispatch here; "torch" is the reference.
    cq = _rows(cos_q, positions_q, q.shape[2], "cos_q")  # [s, r/2] or [b', 1, s, r/2]
    sq = _rows(sin_q, positions_q, q.shape[2], "sin_q")
    if (
        cos_k is cos_q
        and sin_k is sin_q
        and positions_k is positions_q
        and k.shape[2] == q.shape[2]
    ):
        ck, sk = cq, sq  # self-attention without a cache: k's rows are q's
    else:
        ck = _rows(cos_k, positions_k, k.shape[2], "cos_k")  # [t, r/2] or [b', 1, t, r/2]
        sk = _rows(sin_k, positions_k, k.shape[2], "sin_k")
    if backend != "torch" and q.dtype == k.dtype and q.device == k.device:
        # One fused pass over q and k on the per-token rows (validated above).
        rows = tuple(t if t.dim() == 2 else t.squeeze(1) for t in (cq, sq, ck, sk))  # [.., n, r/2]
        chosen = _select_rope_backend(backend, q, rows)
        if chosen != "torch":
            cq, sq, ck, sk = rows
            return _fused_rope_qk(
                q, k, cq, sq, cos_k=ck, sin_k=sk, layout=layout, rotary_dim=r, backend=chosen
            )
    return apply_rotary(q, cq, sq, layout, r), apply_rotary(k, ck, sk, layout, r)


def mrope_axis_index(
    mrope_section: tuple[int, ...] | list[int], interleaved: bool = False
) -> torch.Tensor:
    """Which position axis (0 temporal, 1 height, 2 width) drives each of the ``n`` pairs of M-RoPE.

    ``mrope_section`` gives the number of pairs per axis (sum ``n = head_dim / 2``).

    Qwen2-VL (contiguous sections; ``[2, 1, 1]``)::      pairs  [T T H W]
    Qwen3-VL (``interleaved``; ``[2, 1, 1]``)::          pairs  [T H W T]

    In the interleaved layout pair ``j`` takes H when ``j % 3 == 1`` and ``j < 3 * sec[1]``, W
    when ``j % 3 == 2`` and ``j < 3 * sec[2]``, else T.
    """
    sections = list(mrope_section)
    if len(sections) != 3 or any(
        isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sections
    ):
        raise ValueError(
            f"mrope_section must be 3 non-negative integers (T, H, W), got {mrope_section!r}"
        )
    n = sum(sections)
    if n < 1:
        raise ValueError(f"mrope_section must not be all zero, got {mrope_section!r}")
    if not interleaved:
        return torch.repeat_interleave(torch.arange(3), torch.tensor(sections))  # [n]
    j = torch.arange(n)
    axis = torch.zeros(n, dtype=torch.long)
    axis[(j % 3 == 1) & (j < 3 * sections[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * sections[2])] = 2
    if int((axis == 1).sum()) != sections[1] or int((axis == 2).sum()) != sections[2]:
        raise ValueError(
            f"interleaved mrope_section {mrope_section!r} does not fit {n} pairs: H and W need "
            "3 * section pairs each"
        )
    return axis


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    mrope_section: tuple[int, ...] | list[int],
    interleaved: bool = False,
    attention_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal RoPE cos/sin: pair ``j`` turns with the position of its axis (Qwen2-VL/Qwen3-VL).

    Shapes: ``positions [3, *]`` integer (temporal, height, width), ``inv_freq [n]`` with
    ``n = sum(mrope_section)`` -> ``cos, sin [*, n]`` float32. The pairs' axes are those of
    :func:`mrope_axis_index`; text tokens carry the same position on all three axes, which makes
    this plain RoPE.
    """
    positions = check_positions(positions)
    if positions.dim() < 2 or positions.shape[0] != 3:
        raise ValueError(
            f"M-RoPE positions must be [3, ...] (T, H, W), got shape {tuple(positions.shape)}"
        )
    axis = mrope_axis_index(mrope_section, interleaved).to(positions.device)  # [n]
    if inv_freq.dim() != 1 or inv_freq.shape[0] != axis.shape[0]:
        raise ValueError(
            f"inv_freq must have sum(mrope_section)={axis.shape[0]} entries, "
            f"got shape {tuple(inv_freq.shape)}"
        )
    if inv_freq.dtype not in ANGLE_DTYPES:
        raise ValueError(f"inv_freq must be float32 or float64, got {inv_freq.dtype}")
    per_pair = positions.movedim(0, -1)[..., axis]  # [*, 3] -> [*, n]: each pair's own axis
    angles = per_pair.to(inv_freq.dtype) * inv_freq.to(positions.device)  # [*, n]
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.float(), sin.float()
