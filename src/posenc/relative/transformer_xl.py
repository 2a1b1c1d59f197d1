"""Transformer-XL's relative attention (Dai et al., 2019): sinusoidal R, biases u and v, rel-shift."""

from __future__ import annotations

import math

import torch
from torch import nn

from .._checks import check_positive_int, resolve_head_dim
from ..attention import repeat_kv
from ..functional.bias import relative_position_matrix
from ..functional.relative import rel_shift
from ..functional.sinusoidal import sinusoidal_inv_freq
from .common import RelativeEncoding, batch_heads, check_attend_inputs, softmax_probs


class TransformerXLRelative(RelativeEncoding):
    """``A_ij = (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}``, times ``scale``.

    ``R_r = [sin(r f) | cos(r f)]`` is the sinusoidal embedding (width ``dim``, Transformer-XL's
    concatenated layout) of the distance ``r = i - j`` between query and key *positions*; ``W_R``
    (``r_net``) projects it per head; ``u`` (``r_w_bias``) and ``v`` (``r_r_bias``) are per-head
    global content and position biases. One instance per layer (Transformer-XL's ``untie_r``).

    Segment recurrence is in :class:`~posenc.attention.Attention`: ``memory`` (the previous
    segment's layer input) is prepended to the keys and values, detached.

    The position term is computed once per distance, ``(q + v) . W_R R`` for every distance,
    ``[b, h, s, L]``, and moved into place with the rel-shift trick
    (:func:`~posenc.functional.relative.rel_shift`) when positions are contiguous (the usual
    case, with or without memory or cache); other positions (``[b, s]``, packing, gaps) take
    a gather over the same per-distance scores. A causal module only computes the distances
    ``>= 0`` that its mask keeps.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int | None = None,
        base: float = 10000.0,
        init_std: float = 0.02,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.head_dim = head_dim = resolve_head_dim(dim, num_heads, head_dim)
        if dim % 2:
            raise ValueError(f"dim must be even for the sinusoidal R ([sin | cos]), got {dim}")
        self.base = float(base)
        kw = {"device": device, "dtype": dtype}
        self.r_net = nn.Linear(dim, num_heads * head_dim, bias=False, **kw)  # type: ignore[arg-type]
        self.r_w_bias = nn.Parameter(torch.randn(num_heads, head_dim, **kw) * init_std)  # type: ignore[arg-type]
        self.r_r_bias = nn.Parameter(torch.randn(num_heads, head_dim, **kw) * init_std)  # type: ignore[arg-type]

    def sinusoid(self, distances: torch.Tensor) -> torch.Tensor:
        """Shapes: ``distances [L]`` (integer, any sign) -> ``R [L, dim]`` ``[sin | cos]``.

        Angles in float64, rounded once to the projection's dtype. The ``dim / 2`` frequencies
        are recomputed per call rather than kept in a buffer, which ``module.to(bfloat16)`` would
        round.
        """
        inv_freq = sinusoidal_inv_freq(self.dim, self.base, "concat").to(distances.device)
        angles = distances.to(torch.float64)[:, None] * inv_freq  # [L, dim/2]
        return torch.cat((angles.sin(), angles.cos()), dim=-1).to(
            self.r_net.weight.dtype
        )  # [L, dim]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        scale: float | None = None,
        dropout_p: float = 0.0,
        attention: nn.Module | None = None,
    ) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k, v [b, hk, t, d]`` -> ``[b, h, s, d]``.

        ``attention.causal`` (if given and True) promises that ``mask`` hides keys after the
        query by index; only then are negative distances skipped.
        """
        qp, kp = check_attend_inputs(q, k, v, q_positions, k_positions)
        b, h, s, d = q.shape
        if (h, d) != (self.num_heads, self.head_dim):
            raise ValueError(
                f"q must have {self.num_heads} heads of {self.head_dim}, got {h} of {d}"
            )
        t = k.shape[2]
        scale = 1.0 / math.sqrt(d) if scale is None else scale
        k, v = repeat_kv(k, h), repeat_kv(v, h)  # [b, h, t, d]
        causal = bool(getattr(attention, "causal", False)) and mask is not None

        contiguous = _contiguous(qp, kp)
        if contiguous:
            # Distances t-1 down to 1-s (or to 0 when causal): column c is distance t - 1 - c.
            last = 0 if causal else 1 - s
            distances = torch.arange(t - 1, last - 1, -1, device=q.device)  # [L]
        else:
            rel = -relative_position_matrix(qp, kp)  # [(b,) s, t]: i - j
            lo, hi = (int(x) for x in torch.stack((rel.min(), rel.max())).tolist())
            distances = torch.arange(hi, lo - 1, -1, device=q.device)  # [L], column c = hi - c
        r = self.r_net(self.sinusoid(distances))  # [L, h*d]
        r = r.view(-1, h, d).transpose(0, 1)  # [h, L, d]

        content = (q + self.r_w_bias[:, None, :]) @ k.transpose(-1, -2)  # [b, h, s, t]
        by_distance = (q + self.r_r_bias[:, None, :]) @ r.transpose(-1, -2)  # [b, h, s, L]
        if contiguous:
            position = rel_shift(by_distance, t)  # [b, h, s, t]
        else:
            position = by_distance.gather(-1, batch_heads(hi - rel, b, h))  # [b, h, s, t]
        probs = softmax_probs((content + position) * scale, mask, dropout_p)
        return probs @ v  # [b, h, s, d]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, base={self.base}"


def _contiguous(qp: torch.Tensor, kp: torch.Tensor) -> bool:
    """True when keys are ``k0, k0 + 1, ..., k0 + t - 1`` and queries are the last ``s`` keys.

    That is the layout the rel-shift trick assumes (query ``i`` at key index ``t - s + i``).
    One host sync for the check; the alternative, a gather, needs one too (the distance range).
    """
    qp = qp[0] if qp.dim() == 2 and qp.shape[0] == 1 else qp
    kp = kp[0] if kp.dim() == 2 and kp.shape[0] == 1 else kp
    s, t = qp.shape[-1], kp.shape[-1]
    if qp.dim() != 1 or kp.dim() != 1 or s > t or t == 0:
        return False
    expected = kp[:1] + torch.arange(t, device=kp.device)  # [t]
    return bool(((kp == expected).all() & (qp == kp[t - s :]).all()).item())
