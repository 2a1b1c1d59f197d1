"""FoPE: Fourier position embedding (Hua et al. 2024, arXiv:2412.17739), as Intern-S1-Pro ships it.

FoPE keeps RoPE's rotation form ``[x1 c - x2 s | x2 c + x1 s]`` (half pairing) but each pair's
cos and sin become a learned mix of the plain RoPE waves: with ``f`` the RoPE frequencies whose
wavelength fits the training length (``f > 2 pi / max_position_embeddings``, or the first
``num_inv_freq``), ``m`` of them,

    c[p] = cos(p f) @ C,   s[p] = sin(p f) @ S          (C, S: learned [m, m], one per KV head)

and the ``d/2 - m`` pairs whose frequency was dropped get ``c = s = 1`` (the released code pads
with ones)::

    pairs:  0 .. m-1                 m .. d/2-1
    cos:    cos(p f) @ C             1
    sin:    sin(p f) @ S             1

With ``sep_head`` (Intern-S1-Pro) each KV head has its own ``C``, ``S``; query head ``j`` uses
those of KV head ``j // (h / hk)`` (transformers' ``repeat_kv`` grouping). The rotation is
posenc's one reference rotation on these tables (:func:`posenc.kernels.apply_rotary_reference`);
``C = S = I`` is RoPE on the kept frequencies. :func:`posenc.hf.fope_from_hf` builds the module
from an Intern-S1-Pro config; its ``cos_coef`` / ``sin_coef`` are the checkpoint's
``rotary_emb.cos_coef`` / ``rotary_emb.sin_coef``.

Shapes: ``b`` batch, ``h`` query heads, ``hk`` KV heads, ``s`` length, ``d`` head_dim, ``m`` kept
frequencies.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_even, check_positions, check_positive_int
from ..functional.rope_scaling import rope_inv_freq
from ..kernels.reference import apply_rotary_reference
from .base import RotaryEncoding


def fope_inv_freq(
    head_dim: int, base: float, max_position_embeddings: int, num_inv_freq: int | None = None
) -> torch.Tensor:
    """The ``m`` float32 RoPE frequencies FoPE keeps: the first ``num_inv_freq``, or (None) those
    with ``f > 2 pi / max_position_embeddings`` (a wavelength shorter than the training length)."""
    check_positive_int("max_position_embeddings", max_position_embeddings)
    inv_freq, _ = rope_inv_freq(head_dim, base, dtype=torch.float32)  # [d/2], decreasing
    if num_inv_freq is not None:
        check_positive_int("num_inv_freq", num_inv_freq)
        if num_inv_freq > inv_freq.numel():
            raise ValueError(
                f"num_inv_freq must be <= head_dim / 2 = {inv_freq.numel()}, got {num_inv_freq}"
            )
        return inv_freq[:num_inv_freq]
    kept = inv_freq[inv_freq > 2.0 * math.pi / max_position_embeddings]  # [m]
    if kept.numel() == 0:
        raise ValueError(
            f"no RoPE frequency of head_dim {head_dim}, base {base} has a wavelength below "
            f"max_position_embeddings={max_position_embeddings}: FoPE would keep none"
        )
    return kept


def apply_fope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cos: torch.Tensor | None = None,
    k_sin: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q [b, h, s, d]``, ``k [b, hk, t, d]`` by per-KV-head tables ``cos``, ``sin``
    ``[b, hk or 1, s, d/2]`` (the queries'; the keys' ``k_cos``, ``k_sin`` ``[b, hk or 1, t, d/2]``,
    default the same, ``t == s``) in the half pairing: query head ``j`` takes KV head
    ``j // (h / hk)``'s rows (``repeat_kv``). Returns new ``(q', k')``."""
    k_cos, k_sin = (cos, sin) if k_cos is None or k_sin is None else (k_cos, k_sin)
    for c, s_, who in ((cos, sin, "cos and sin"), (k_cos, k_sin, "k_cos and k_sin")):
        if c.dim() != 4 or c.shape != s_.shape or c.shape[-1] * 2 != q.shape[-1]:
            raise ValueError(
                f"{who} must be [b, hk, s, d/2] with d/2 = {q.shape[-1] // 2}, got "
                f"{tuple(c.shape)} and {tuple(s_.shape)}"
            )
    h, hk = q.shape[1], cos.shape[1]
    if h % hk:
        raise ValueError(f"query heads ({h}) must be a multiple of the tables' KV heads ({hk})")
    cos_q = cos.repeat_interleave(h // hk, dim=1)  # [b, h, s, d/2]: head j <- KV head j // (h/hk)
    sin_q = sin.repeat_interleave(h // hk, dim=1)
    return apply_rotary_reference(q, cos_q, sin_q, "half"), apply_rotary_reference(
        k, k_cos, k_sin, "half"
    )


class FoPE(RotaryEncoding):
    """Fourier position embedding of queries and keys (see the module docstring).

    Args:
        head_dim: ``d``, even; every channel takes part (dropped frequencies get ``c = s = 1``).
        num_kv_heads: ``hk``, the number of coefficient sets when ``sep_head``.
        base: RoPE's ``theta``.
        max_position_embeddings: the training length that selects the kept frequencies.
        num_inv_freq: keep the first ``num_inv_freq`` frequencies instead.
        sep_head: one ``C``, ``S`` per KV head (Intern-S1-Pro) or one shared pair.
        init_factor: the gain of the Xavier-normal noise added to the identity at initialization
            (the paper's and the released init; 0 gives plain RoPE on the kept frequencies).

    ``cos_coef``, ``sin_coef`` (``[hk, m, m]``, or ``[m, m]``) are learned parameters, the names
    of the released checkpoint's buffers.

    ``forward(q, k, positions=None, k_positions=None)`` is every rotary module's
    (:meth:`RotaryEncoding.forward`): positions ``[s]|[b, s]`` and ``[t]|[b, t]``, defaults
    ``arange`` with the queries at the last ``s`` keys, so that a KV cache or Transformer-XL
    memory ahead of the queries rotates by its own positions.
    """

    def __init__(
        self,
        head_dim: int,
        num_kv_heads: int,
        base: float = 10000.0,
        max_position_embeddings: int = 4096,
        *,
        num_inv_freq: int | None = None,
        sep_head: bool = True,
        init_factor: float = 0.0,
    ) -> None:
        super().__init__()
        check_even("head_dim", head_dim, "FoPE")
        check_positive_int("num_kv_heads", num_kv_heads)
        self.head_dim, self.num_kv_heads, self.sep_head = head_dim, num_kv_heads, bool(sep_head)
        self.base, self.init_factor = float(base), float(init_factor)
        self.max_position_embeddings = max_position_embeddings
        with torch.device("cpu"):
            self.inv_freq = fope_inv_freq(head_dim, base, max_position_embeddings, num_inv_freq)
        m = self.inv_freq.numel()
        shape = (num_kv_heads, m, m) if self.sep_head else (m, m)
        self.cos_coef = nn.Parameter(torch.empty(shape))
        self.sin_coef = nn.Parameter(torch.empty(shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``I + xavier_normal(gain=init_factor)`` for both coefficient sets."""
        with torch.no_grad():
            for coef in (self.cos_coef, self.sin_coef):
                nn.init.xavier_normal_(coef, gain=self.init_factor)
                coef.add_(torch.eye(coef.shape[-1], dtype=coef.dtype, device=coef.device))

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 tables ``[b, hk, s, d/2]`` (``[b, 1, s, d/2]`` without ``sep_head``) of integer
        ``positions [s]`` or ``[b, s]``."""
        positions = check_positions(positions, ranks=(1, 2))
        positions = positions if positions.dim() == 2 else positions[None]  # [b, s]
        inv_freq = self.inv_freq.to(positions.device)
        angles = positions.float()[..., None] * inv_freq  # [b, s, m], float32 as released
        cos_c, sin_c = self.cos_coef.float(), self.sin_coef.float()
        if self.sep_head:
            b, s, m = angles.shape
            waves = angles[:, None].expand(b, self.num_kv_heads, s, m)  # [b, hk, s, m]
            cos = torch.einsum("bhtD, hDd -> bhtd", waves.cos(), cos_c)  # [b, hk, s, m]
            sin = torch.einsum("bhtD, hDd -> bhtd", waves.sin(), sin_c)
        else:
            cos = torch.einsum("btD, Dd -> btd", angles.cos(), cos_c)[:, None]  # [b, 1, s, m]
            sin = torch.einsum("btD, Dd -> btd", angles.sin(), sin_c)[:, None]
        pad = (0, self.head_dim // 2 - cos.shape[-1])  # dropped frequencies: c = s = 1
        return F.pad(cos, pad, value=1.0), F.pad(sin, pad, value=1.0)  # [b, hk|1, s, d/2]

    # Attention's hook runs forward per layer, with its checks (k's KV heads).
    prepare = RotaryEncoding.prepare_by_forward

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """``q [b, h, s, d]`` and ``k [b, hk, t, d]``, ``hk`` this FoPE's KV heads with
        ``sep_head``."""
        if (
            q.dim() != 4
            or k.dim() != 4
            or q.shape[-1] != self.head_dim
            or k.shape[-1] != self.head_dim
        ):
            raise ValueError(
                f"q and k must be [b, h, s, {self.head_dim}] and [b, hk, t, {self.head_dim}], got "
                f"{tuple(q.shape)} and {tuple(k.shape)}"
            )
        if self.sep_head and k.shape[1] != self.num_kv_heads:
            raise ValueError(
                f"k must have this FoPE's {self.num_kv_heads} KV heads (one coefficient set "
                f"each), got {k.shape[1]}"
            )

    def tables(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The queries' and keys' tables ``[b, hk|1, s, d/2]``, ``[b, hk|1, t, d/2]`` (the keys'
        None when they share the queries' positions)."""
        k_cos, k_sin = self.cos_sin(k_positions)  # [b, hk|1, t, d/2]
        if k_positions is positions:
            return k_cos, k_sin, None, None
        cos, sin = self.cos_sin(positions)  # [b, hk|1, s, d/2]
        return cos, sin, k_cos, k_sin

    def apply_tables(
        self, q: torch.Tensor, k: torch.Tensor, tables: tuple
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [b, h, s, d]`` and ``k [b, hk, t, d]`` (:func:`apply_fope`)."""
        return apply_fope(q, k, *tables)

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, num_kv_heads={self.num_kv_heads}, base={self.base}, "
            f"kept={self.inv_freq.numel()}, sep_head={self.sep_head}"
        )
