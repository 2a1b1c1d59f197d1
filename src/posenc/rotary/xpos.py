"""xPos (Sun et al., 2022, "A Length-Extrapolatable Transformer"): RoPE with an exponential decay.

Pair ``i`` of a query at position ``n`` is rotated by ``n f_i`` and scaled by ``zeta_i ** (n / B)``;
pair ``i`` of a key at position ``m`` is rotated by ``m f_i`` and scaled by ``zeta_i ** (-m / B)``,
with ``zeta_i = (2i / d + gamma) / (1 + gamma)`` (``gamma = 0.4``) and ``B = scale_base = 512``.
The score then carries ``zeta_i ** ((n - m) / B)``: a decay in the distance only, which keeps
RoPE's relative property (torchscale's ``XPOS``).

Folding the scale into the tables (``cos * zeta**e``, ``sin * zeta**e``, one scale per pair)
makes xPos one more caller of the common rotation path, with different tables for q and k.

The scales grow like ``zeta_min ** (-|p - center| / B)`` with ``zeta_min = gamma / (1 + gamma)``:
float32 (and bf16) overflow past ``|p - center| ~ 36_000``, float16 past ``~4_500``. Set
``center`` near the middle of the positions in use; it is fixed, so cached keys stay valid.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import nn

from .._checks import check_choice, check_even, check_positions
from ..attention import DeviceConstants
from ..functional.rotary import ROTARY_BACKENDS, ROTARY_LAYOUTS, apply_rotary_qk, rope_inv_freq
from .embedding import check_qk, resolve_angle_dtype, resolve_qk_positions


def xpos_zeta(
    head_dim: int, gamma: float = 0.4, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Per-pair decay bases ``zeta_i = (2i + gamma d) / ((1 + gamma) d)``, ``[d/2]``."""
    check_even("head_dim", head_dim, "xPos")
    return (torch.arange(0, head_dim, 2, dtype=dtype) + gamma * head_dim) / ((1 + gamma) * head_dim)


class XPos(nn.Module):
    """xPos: RoPE whose queries are scaled by ``zeta ** (n / B)`` and keys by ``zeta ** (-m / B)``.

    Args:
        head_dim: ``d``, even.
        base: RoPE frequency base.
        scale_base: ``B`` (512 in the paper).
        gamma: ``zeta_i = (2i/d + gamma) / (1 + gamma)`` (0.4 in the paper).
        layout: ``"interleaved"`` (torchscale's, default) or ``"half"``.
        center: position whose scale is 1 (module docstring: overflow).
        angle_dtype: float64 (default) or float32 for the angles; scales are computed in float64.
    """

    family: ClassVar[str] = "rotary"

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        scale_base: float = 512.0,
        gamma: float = 0.4,
        layout: str = "interleaved",
        center: int = 0,
        *,
        angle_dtype: torch.dtype | str = torch.float64,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_even("head_dim", head_dim, "xPos")
        check_choice("layout", layout, ROTARY_LAYOUTS)
        check_choice("backend", backend, ROTARY_BACKENDS)
        if not scale_base > 0 or math.isinf(scale_base):
            raise ValueError(f"scale_base must be a positive number, got {scale_base!r}")
        if not gamma > 0 or math.isinf(gamma):
            raise ValueError(f"gamma must be a positive number, got {gamma!r}")
        if isinstance(center, bool) or not isinstance(center, int):
            raise TypeError(f"center must be an integer position, got {center!r}")
        self.head_dim, self.base, self.scale_base, self.gamma = (
            head_dim,
            float(base),
            float(scale_base),
            float(gamma),
        )
        self.layout, self.center, self.backend = layout, center, backend
        self.angle_dtype = resolve_angle_dtype(angle_dtype)
        inv_freq, _ = rope_inv_freq(head_dim, base, dtype=self.angle_dtype)  # [d/2]
        # Buffers that move with the module and are never cast (module.to(bfloat16) would round
        # them); not in state_dict.
        self.constants = DeviceConstants(
            inv_freq=inv_freq.cpu(),
            log_zeta=xpos_zeta(head_dim, gamma).log(),  # [d/2] each
        )

    def cos_sin(
        self, positions: torch.Tensor, downscale: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``cos * scale``, ``sin * scale`` with ``scale = zeta ** (+-(p - center) / B)``.

        Shapes: ``positions [*]`` -> ``[*, d/2]``. ``downscale`` (keys) uses the negative exponent.
        """
        positions = check_positions(positions)
        dev = positions.device
        inv_freq = self.constants.get("inv_freq", dev)  # [d/2]
        angles = positions.to(self.angle_dtype)[..., None] * inv_freq  # [*, d/2]
        exponent = (positions.to(torch.float64) - self.center)[
            ..., None
        ] / self.scale_base  # [*, 1]
        if downscale:
            exponent = -exponent
        scale = torch.exp(self.constants.get("log_zeta", dev) * exponent)  # [*, d/2] float64
        return (angles.cos() * scale).float(), (angles.sin() * scale).float()

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Shapes: ``q [b, h, s, d]``, ``k [b, hk, t, d]``; ``positions [s]``/``[b, s]``,
        ``k_positions [t]``/``[b, t]`` (defaults as :class:`RotaryEmbedding`).
        Returns ``(q', k')``."""
        check_qk(q, k, self.head_dim)
        positions, k_positions = resolve_qk_positions(q, k, positions, k_positions)
        cos_q, sin_q = self.cos_sin(positions)  # [(b,) s, d/2], scaled up
        cos_k, sin_k = self.cos_sin(k_positions, downscale=True)  # [(b,) t, d/2], scaled down
        return apply_rotary_qk(
            q, k, cos_q, sin_q, cos_k, sin_k, self.layout, self.head_dim, backend=self.backend
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.base}, scale_base={self.scale_base}, "
            f"gamma={self.gamma}, layout={self.layout!r}, center={self.center}"
        )
