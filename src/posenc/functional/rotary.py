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

from collections.abc import Callable

import torch

from .._checks import check_choice, check_positions
from ..kernels import rope_qk
from ..kernels.constants import ANGLE_DTYPES, ROTARY_BACKENDS, ROTARY_LAYOUTS
from ..kernels.reference import apply_rotary_reference
from .rope_scaling import (
    ROPE_SCALING,
    ROPE_TYPES,
    ScalingSpec,
    extension_scaling,
    normalize_scaling,
    rope_inv_freq,
    yarn_mscale,
)

__all__ = [
    "ANGLE_DTYPES",
    "ROPE_SCALING",
    "ROPE_TYPES",
    "ROTARY_BACKENDS",
    "ROTARY_LAYOUTS",
    "ScalingSpec",
    "angles_cos_sin",
    "apply_rotary",
    "apply_rotary_qk",
    "extension_scaling",
    "mrope_axis_index",
    "mrope_cos_sin",
    "normalize_scaling",
    "rope_cos_sin",
    "rope_inv_freq",
    "yarn_mscale",
]


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
    return angles_cos_sin(positions[..., None], inv_freq, attention_factor)


def angles_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float | torch.Tensor = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unchecked core of :func:`rope_cos_sin`, for callers that checked their inputs once.

    Shapes: integer ``positions`` broadcastable against ``inv_freq [n]`` (``[*, 1]``, or
    ``[*, n]`` with a position per pair as M-RoPE has) -> float32 ``cos, sin [*, n]``.
    """
    angles = positions.to(inv_freq.dtype) * inv_freq.to(positions.device)  # [*, n]
    cos, sin = angles.cos(), angles.sin()
    # a 0-d tensor factor (chosen on the device: PhiMoE's multipliers) is applied unread
    if isinstance(attention_factor, torch.Tensor) or attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.float(), sin.float()


def _rotary_dim(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int | None
) -> int:
    """Check ``x``, ``cos``, ``sin`` for :func:`apply_rotary` and return ``r``."""
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if not (cos.is_floating_point() and sin.is_floating_point()):
        raise TypeError(f"cos and sin must be floating point, got {cos.dtype} and {sin.dtype}")
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

    This is the reference rotation (:func:`posenc.kernels.apply_rotary_reference`) with its
    inputs checked. The arithmetic runs in float32 (float64 for float64 input): in bf16,
    ``x c - y s`` would round three times. Layouts are drawn in the module docstring.
    """
    check_choice("layout", layout, ROTARY_LAYOUTS)
    r = _rotary_dim(x, cos, sin, rotary_dim)
    return apply_rotary_reference(x, cos, sin, layout, r)


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_q: torch.Tensor,
    sin_q: torch.Tensor,
    cos_k: torch.Tensor | None = None,
    sin_k: torch.Tensor | None = None,
    layout: str = "half",
    rotary_dim: int | None = None,
    *,
    positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate queries and keys: the single rotation path of every rotary module.

    Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]`` (``hk`` may differ from ``h``: GQA/MQA);
    ``cos_q``, ``sin_q`` float32 tables ``[n, r/2]`` or ``[bt, n, r/2]`` (``bt`` 1 or ``b``) and
    likewise ``cos_k``, ``sin_k`` (default: q's table); ``positions [s]`` or ``[b, s]``
    (``k_positions`` with ``t``) are integer row indices into the tables, or None when the
    tables hold one row per token (``n == s``, resp. ``t``). ``rotary_dim`` defaults to
    ``2 * cos_q.shape[-1]``. Returns new ``(q', k')`` with the shapes and dtypes of ``q`` and
    ``k``.

    The positions go to :func:`posenc.kernels.rope_qk`, whose kernels gather the table rows
    themselves; ``backend`` is its choice: ``"auto"`` (the fused kernel that applies, else the
    reference), ``"torch"`` (the pure-PyTorch reference), ``"triton"`` or ``"cpu"`` (that
    kernel, or a ValueError saying why it cannot run).
    """
    check_choice("layout", layout, ROTARY_LAYOUTS)
    return rope_qk(
        q, k, cos_q, sin_q, cos_k=cos_k, sin_k=sin_k, positions=positions,
        k_positions=k_positions, layout=layout, rotary_dim=rotary_dim, backend=backend,
    )  # fmt: skip


def _contiguous_axes(sections: list[int]) -> list[int]:
    return [a for a, count in enumerate(sections) for _ in range(count)]


def _interleaved_axes(sections: list[int]) -> list[int]:
    axis = [
        1 if j % 3 == 1 and j < 3 * sections[1] else 2 if j % 3 == 2 and j < 3 * sections[2] else 0
        for j in range(sum(sections))
    ]
    if axis.count(1) != sections[1] or axis.count(2) != sections[2]:
        raise ValueError(
            f"interleaved mrope_section {sections!r} does not fit {sum(sections)} pairs: H and W "
            "need 3 * section pairs each"
        )
    return axis


def _hw_alternating_axes(sections: list[int]) -> list[int]:
    # ERNIE-4.5-VL: sections are (H, W, T); pairs [H W H W ... H W | T T ...]
    h, w, t = sections
    if h != w:
        raise ValueError(
            f"ERNIE-4.5-VL's mrope_section (H, W, T) alternates H and W pairs, so H must equal W, "
            f"got {sections!r}"
        )
    return [1 if j % 2 == 0 else 2 for j in range(h + w)] + [0] * t


#: How M-RoPE assigns its pairs to the axes (0 temporal, 1 height, 2 width), by name; an
#: ``mrope_section`` of 3 counts in, a list of one axis per pair out.
MROPE_ALLOCATIONS: dict[str, Callable[[list[int]], list[int]]] = {
    "contiguous": _contiguous_axes,  # Qwen2-VL: [T T H W] for [2, 1, 1]
    "interleaved": _interleaved_axes,  # Qwen3-VL: [T H W T] for [2, 1, 1]
    "hw_alternating": _hw_alternating_axes,  # ERNIE-4.5-VL (H, W, T): [H W H W T] for [2, 2, 1]
}


def mrope_allocation(interleaved: bool | str) -> str:
    """The :data:`MROPE_ALLOCATIONS` name of ``interleaved`` (False/True name contiguous and
    interleaved, as Qwen2-VL's and Qwen3-VL's flag does)."""
    if isinstance(interleaved, bool):
        return "interleaved" if interleaved else "contiguous"
    if interleaved not in MROPE_ALLOCATIONS:
        raise ValueError(
            f"M-RoPE allocation must be True, False or one of {sorted(MROPE_ALLOCATIONS)}, "
            f"got {interleaved!r}"
        )
    return interleaved


def mrope_axis_index(
    mrope_section: tuple[int, ...] | list[int], interleaved: bool | str = False
) -> torch.Tensor:
    """Which position axis (0 temporal, 1 height, 2 width) drives each of the ``n`` pairs of M-RoPE.

    ``mrope_section`` gives the number of pairs per axis (sum ``n = head_dim / 2``);
    ``interleaved`` names the allocation (:data:`MROPE_ALLOCATIONS`; False and True are
    ``"contiguous"`` and ``"interleaved"``).

    Qwen2-VL (contiguous sections; ``[2, 1, 1]``)::      pairs  [T T H W]
    Qwen3-VL (``interleaved``; ``[2, 1, 1]``)::          pairs  [T H W T]
    ERNIE-4.5-VL (``"hw_alternating"``; (H, W, T) ``[2, 2, 1]``)::  pairs  [H W H W T]

    In the interleaved layout pair ``j`` takes H when ``j % 3 == 1`` and ``j < 3 * sec[1]``, W
    when ``j % 3 == 2`` and ``j < 3 * sec[2]``, else T.
    """
    allocation = mrope_allocation(interleaved)
    sections = list(mrope_section)
    if len(sections) != 3 or any(
        isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in sections
    ):
        raise ValueError(
            f"mrope_section must be 3 non-negative integers (T, H, W), got {mrope_section!r}"
        )
    if sum(sections) < 1:
        raise ValueError(f"mrope_section must not be all zero, got {mrope_section!r}")
    # Built from Python ints: sizes known to a tracer (no data-dependent repeat_interleave).
    return torch.tensor(MROPE_ALLOCATIONS[allocation](sections), dtype=torch.long)  # [n]


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    mrope_section: tuple[int, ...] | list[int],
    interleaved: bool | str = False,
    attention_factor: float = 1.0,
    *,
    fractional: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal RoPE cos/sin: pair ``j`` turns with the position of its axis (Qwen2-VL/Qwen3-VL).

    Shapes: ``positions [3, *]`` integer (temporal, height, width), ``inv_freq [n]`` with
    ``n = sum(mrope_section)`` -> ``cos, sin [*, n]`` float32. The pairs' axes are those of
    :func:`mrope_axis_index`; text tokens carry the same position on all three axes, which makes
    this plain RoPE. ``fractional=True`` also takes float32 positions as they are (Qwen3-Omni's
    ``get_rope_index`` gives a video's frames fractional temporal positions).
    """
    if not (
        fractional and isinstance(positions, torch.Tensor) and positions.dtype == torch.float32
    ):
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
    return angles_cos_sin(per_pair, inv_freq, attention_factor)
