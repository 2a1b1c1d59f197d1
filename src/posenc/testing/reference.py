"""The oracle of :func:`posenc.testing.check_rope`: posenc's reading of a config, three ways.

* **exact**: :func:`posenc.hf.rope_from_hf` with ``angle_dtype=float64``; cos/sin kept in
  float64 and the rotation run in float64 (:func:`posenc.kernels.apply_rotary_reference`). The
  answer every implementation is measured against.
* **float32** (transformers' arithmetic): ``rope_from_hf`` with float32 angles (its cos/sin equal
  transformers' bit for bit), rotated in float32. Its error against *exact* is the float32
  budget's unit: at position ``p`` a float32 angle is off by about ``p * 6e-8`` rad, which no
  float32 implementation avoids.
* **low precision** (bf16, fp16): the float32 cos/sin cast to the dtype and
  ``x * cos + rotate(x) * sin`` evaluated in that dtype, as transformers' ``apply_rotary_pos_emb``
  does. Its error against *exact* is the budget's unit in that dtype.

Shapes: ``position_ids [b, s]`` (``[3, b, s]`` for M-RoPE), cos/sin ``[b, s, n]`` with
``n = span / 2`` pairs, ``x [b, h, s, d]``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..functional.rotary import angles_cos_sin, mrope_axis_index
from ..hf import rope_from_hf
from ..kernels.reference import apply_rotary_reference, rotate_half, rotate_interleaved
from ..rotary import MRoPE, RotaryEmbedding


class Reference:
    """posenc's rotation of one layer type of ``config``, exact and at transformers' precision.

    ``layout`` overrides the pairing the architecture implies (``rope_from_hf(layout=)``).
    """

    def __init__(self, config: Any, layer_type: str | None, layout: str | None = None) -> None:
        self.exact: RotaryEmbedding = rope_from_hf(
            config, layer_type, layout=layout, angle_dtype=torch.float64
        )
        self.f32: RotaryEmbedding = rope_from_hf(config, layer_type, layout=layout)
        self.head_dim, self.span = self.exact.head_dim, self.exact.span
        self.layout = "half" if isinstance(self.exact, MRoPE) else self.exact.layout
        self.mrope = isinstance(self.exact, MRoPE)
        self.attention_factor = self.exact.attention_factor

    def _per_pair(self, position_ids: torch.Tensor) -> torch.Tensor:
        """Each pair's position: ``[b, s, 1]``, or ``[b, s, n]`` for M-RoPE (its axis's)."""
        if not self.mrope:
            return position_ids[..., None]  # [b, s, 1]
        module = self.exact
        assert isinstance(module, MRoPE)
        axis = mrope_axis_index(module.mrope_section, module.allocation)  # [n]
        return position_ids.movedim(0, -1)[..., axis]  # [3, b, s] -> [b, s, 3] -> [b, s, n]

    def cos_sin(
        self, position_ids: torch.Tensor, exact: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[b, s, n]`` (attention factor included) for the call's length
        ``max(position_ids) + 1``: float64 from float64 angles, or transformers' float32."""
        seq_len = int(position_ids.max()) + 1
        per_pair = self._per_pair(position_ids)
        if not exact:
            inv_freq, factor = self.f32.frequencies(seq_len)
            return angles_cos_sin(per_pair, inv_freq, factor)  # float32
        inv_freq, factor = self.exact.frequencies(seq_len)  # float64
        # angles_cos_sin returns float32 by contract; the oracle keeps float64 to the end.
        angles = per_pair.to(torch.float64) * inv_freq  # [b, s, n]
        return angles.cos() * factor, angles.sin() * factor

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x [b, h, s, d]`` rotated by ``cos, sin [b, s, n]`` in ``promote(x, cos, float32)``
        (float64 for float64 tables), returned in ``x``'s dtype."""
        return apply_rotary_reference(x, cos[:, None], sin[:, None], self.layout, self.span)

    def rotate_in_dtype(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """transformers' ``x * cos + rotate(x) * sin`` with every product and sum rounded to
        ``x``'s dtype (cos/sin cast to it first); channels past the span pass through."""
        c, s = self.expand(cos.to(x.dtype))[:, None], self.expand(sin.to(x.dtype))[:, None]
        rot = x[..., : self.span]  # [b, h, s, span]
        turned = rotate_half(rot) if self.layout == "half" else rotate_interleaved(rot)
        out = rot * c + turned * s
        return torch.cat((out, x[..., self.span :]), dim=-1)  # [b, h, s, d]

    def expand(self, t: torch.Tensor) -> torch.Tensor:
        """``[..., n]`` -> ``[..., span]`` in the layout's order: ``[c0 c1 | c0 c1]`` (half) or
        ``[c0 c0 c1 c1]`` (interleaved), transformers' ``cat((f, f))`` / ``repeat_interleave``."""
        if self.layout == "half":
            return torch.cat((t, t), dim=-1)
        return t.repeat_interleave(2, dim=-1)

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`expand` on an implementation's table: ``[..., span]`` ->
        ``[..., n]`` (the first half, or every other entry)."""
        n = self.span // 2
        return t[..., :n] if self.layout == "half" else t[..., 0::2]
