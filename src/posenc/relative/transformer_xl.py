"""Transformer-XL's relative attention (Dai et al., 2019): sinusoidal R, biases u and v, rel-shift."""

from __future__ import annotations

import torch
from torch import nn

from .._checks import INIT_STD_MAX, check_number
from .._constants import DeviceConstants
from .._context import ScoreContext
from ..bias.common import reference_position
from ..functional.relative import rel_shift
from ..functional.sinusoidal import sinusoidal_inv_freq
from .common import RelativeEncoding, checked_sizes


class TransformerXLRelative(RelativeEncoding):
    """``A_ij = (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}``, times ``scale``.

    ``R_r = [sin(r f) | cos(r f)]`` is the sinusoidal embedding (width ``dim``, Transformer-XL's
    concatenated layout) of the distance ``r = i - j`` between query and key *positions*; ``W_R``
    (``r_net``) projects it per head; ``u`` (``r_w_bias``) and ``v`` (``r_r_bias``) are per-head
    global content and position biases. One instance per layer (Transformer-XL's ``untie_r``).

    Segment recurrence is in :class:`~posenc.attention.Attention`: ``memory`` (the previous
    segment's layer input) is prepended to the keys and values, detached.

    The position term ``(q_i + v) . W_R R_{i-j}`` is computed one of two ways, both exact and
    neither reading position values (so one traced graph and CUDA-graph capture serve any
    positions), with costs that follow ``s`` and ``t`` only:

    * **rel-shift** (the paper's), for the index layout (``index_layout=True`` or no
      positions: keys ``c .. c + t - 1``, queries the last ``s``): ``(q + v) . W_R R`` for each
      of the ``L``
      distances (``L = s + t - 1``, or ``t`` when causal: only distances ``>= 0`` are kept),
      ``[b, h, s, L]``, moved into place by
      :func:`~posenc.functional.relative.rel_shift`. Costs ``L dim^2 + b h s L d``.
    * **angle addition**, for any positions: ``sin((p_i - p_j) f)`` and ``cos((p_i - p_j) f)``
      expand into products of ``sin``/``cos`` of ``p_i f`` and ``p_j f``, so the term is a
      product ``[b, h, s, dim] @ [dim, t]`` (:meth:`position_scores`). Costs
      ``b h s t dim``; cheaper for decoding (``s = 1``), where rel-shift projects all ``t``
      distances per step.

    The index layout takes whichever costs less (a rule on shapes, :func:`rel_shift_is_cheaper`).
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
        self.dim, self.num_heads, self.head_dim = checked_sizes(dim, num_heads, head_dim)
        head_dim = self.head_dim
        if dim % 2:
            raise ValueError(f"dim must be even for the sinusoidal R ([sin | cos]), got {dim}")
        self.base = check_number("base", base, low=1.0, low_open=True)
        init_std = check_number("init_std", init_std, low=0.0, high=INIT_STD_MAX)
        kw = {"device": device, "dtype": dtype}
        self.init_std = init_std
        self.r_net = nn.Linear(dim, num_heads * head_dim, bias=False, **kw)  # type: ignore[arg-type]
        self.r_w_bias = nn.Parameter(torch.empty(num_heads, head_dim, **kw))  # type: ignore[arg-type]
        self.r_r_bias = nn.Parameter(torch.empty(num_heads, head_dim, **kw))  # type: ignore[arg-type]
        self._reset_biases()
        # The dim/2 frequencies of R, float64: moves with the module, never cast.
        self.constants = DeviceConstants(inv_freq=self._inv_freq()).to(device)

    def _inv_freq(self) -> torch.Tensor:
        return sinusoidal_inv_freq(self.dim, self.base, "concat")  # [dim/2]

    def _reset_biases(self) -> None:
        for bias in (self.r_w_bias, self.r_r_bias):
            nn.init.normal_(bias, std=self.init_std)  # the values of randn(h, d) * init_std

    def reset_parameters(self) -> None:
        """Redraw ``W_R`` as ``nn.Linear`` does, ``u`` and ``v`` from ``N(0, init_std**2)``,
        and recompute the frequencies of ``R``."""
        self.r_net.reset_parameters()
        self._reset_biases()
        self.constants.reset_(inv_freq=self._inv_freq())

    def _angles(self, positions: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[*]`` integer -> ``r f [*, dim/2]`` float64."""
        inv_freq = self.constants.get("inv_freq", positions.device)  # [dim/2]
        return positions.to(torch.float64)[..., None] * inv_freq  # [*, dim/2]

    def sinusoid(self, distances: torch.Tensor) -> torch.Tensor:
        """Shapes: ``distances [L]`` (integer, any sign) -> ``R [L, dim]`` ``[sin | cos]``.

        Angles in float64, rounded once to the projection's dtype.
        """
        angles = self._angles(distances)  # [L, dim/2]
        return torch.cat((angles.sin(), angles.cos()), dim=-1).to(self.r_net.weight.dtype)

    def position_scores(
        self, qv: torch.Tensor, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor:
        """``(q_i + v) . W_R R_{p_i - p_j}`` for any positions, by angle addition.

        Shapes: ``qv = q + v [b, h, s, d]``, ``positions [s]|[b, s]``, ``k_positions [t]|[b, t]``
        -> ``[b, h, s, t]``. With ``[a | c] = (q + v) W_R`` (the coefficients of ``sin`` and
        ``cos`` in ``R``), ``a sin(x - y) + c cos(x - y) = cos y (a sin x + c cos x)
        + sin y (c sin x - a cos x)``: a product of a query side and a key side. Both sides
        measure positions from the call's first query position
        (:func:`~posenc.bias.common.reference_position`): ``x - y`` is unchanged, and the
        angles stay as small as the call's span, so far positions lose no precision.
        """
        ref = reference_position(positions, k_positions)  # [(b,) 1]
        positions, k_positions = positions.long() - ref, k_positions.long() - ref  # offsets
        h, d = self.num_heads, self.head_dim
        dtype = self.r_net.weight.dtype
        w = self.r_net.weight.view(h, d, self.dim)  # [h, d, dim]
        a, c = (qv @ w).chunk(2, dim=-1)  # [b, h, s, d] @ [h, d, dim] -> 2 x [b, h, s, dim/2]
        ang_q = self._angles(positions)  # [(b,) s, dim/2]
        ang_q = ang_q[:, None] if ang_q.dim() == 3 else ang_q  # [b, 1, s, dim/2] or [s, dim/2]
        cos_q, sin_q = ang_q.cos().to(dtype), ang_q.sin().to(dtype)
        query = torch.cat((a * sin_q + c * cos_q, c * sin_q - a * cos_q), dim=-1)  # [b, h, s, dim]
        ang_k = self._angles(k_positions)  # [(b,) t, dim/2]
        ang_k = ang_k[:, None] if ang_k.dim() == 3 else ang_k  # [b, 1, t, dim/2] or [t, dim/2]
        key = torch.cat((ang_k.cos(), ang_k.sin()), dim=-1).to(dtype)  # [(b, 1,) t, dim]
        return query @ key.transpose(-1, -2)  # [b, h, s, t]

    def rel_shift_scores(self, qv: torch.Tensor, t: int, causal: bool) -> torch.Tensor:
        """``(q_i + v) . W_R R_{i-j}`` for the index layout, by rel-shift.

        Shapes: ``qv = q + v [b, h, s, d]`` -> ``[b, h, s, t]``; query ``i`` sits at key index
        ``t - s + i``. ``causal``: entries above the causal diagonal are garbage (masked).
        """
        s, h, d = qv.shape[2], self.num_heads, self.head_dim
        # Distances t-1 down to 1-s (or to 0 when causal): column c is distance t - 1 - c.
        last = 0 if causal else 1 - s
        distances = torch.arange(t - 1, last - 1, -1, device=qv.device)  # [L]
        r = self.r_net(self.sinusoid(distances))  # [L, h*d]
        r = r.view(-1, h, d).transpose(0, 1)  # [h, L, d]
        return rel_shift(qv @ r.transpose(-1, -2), t)  # [b, h, s, L] -> [b, h, s, t]

    def check_heads(self, q: torch.Tensor) -> None:
        h, d = q.shape[1], q.shape[3]
        if (h, d) != (self.num_heads, self.head_dim):
            raise ValueError(
                f"q must have {self.num_heads} heads of {self.head_dim}, got {h} of {d}"
            )

    def implied_index_layout(
        self, index_layout: bool, positions: torch.Tensor | None, k_positions: torch.Tensor | None
    ) -> bool:
        """``attend`` without positions is the index layout too (rel-shift applies)."""
        return index_layout or (positions is None and k_positions is None)

    def scores(self, q: torch.Tensor, k: torch.Tensor, call: ScoreContext) -> torch.Tensor:
        """Shapes: ``q [b, h, s, d]``, ``k [b, h, t, d]`` -> ``[b, h, s, t]``.

        ``call.index_layout``: the index layout, module docstring of :mod:`posenc.relative`
        (rel-shift when cheaper). ``call.causal`` promises that ``call.mask`` hides keys after
        the query by index; only then are negative distances skipped.
        """
        self.check_heads(q)
        b, h, s, d = q.shape
        t = k.shape[2]
        causal = call.causal and call.mask is not None
        content = (q + self.r_w_bias[:, None, :]) @ k.transpose(-1, -2)  # [b, h, s, t]
        qv = q + self.r_r_bias[:, None, :]  # [b, h, s, d]
        if call.index_layout and s and t and rel_shift_is_cheaper(b, h, s, t, d, self.dim, causal):
            position = self.rel_shift_scores(qv, t, causal)  # [b, h, s, t]
        else:
            position = self.position_scores(qv, call.positions, call.k_positions)  # [b, h, s, t]
        return (content + position) * call.scale

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, base={self.base}"


def rel_shift_is_cheaper(b: int, h: int, s: int, t: int, d: int, dim: int, causal: bool) -> bool:
    """Whether rel-shift costs no more multiply-adds than angle addition for this shape.

    Rel-shift: ``L dim (h d)`` to project ``L`` distances, ``b h s L d`` to score them.
    Angle addition: ``b h s d dim`` for the query side, ``b h s t dim`` for the product. With
    ``s = t`` (training, prefill) rel-shift is never dearer; for one decoded token it is, unless
    the batch is large. A rule on shapes alone, so it never reads a tensor.
    """
    length = t if causal else s + t - 1
    rel_shift_cost = length * dim * h * d + b * h * s * length * d
    angle_cost = b * h * s * d * dim + b * h * s * t * dim
    return rel_shift_cost <= angle_cost
