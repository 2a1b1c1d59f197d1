"""PhiMoE's LongRoPE, as transformers computes it: a cos/sin multiplier switched by length.

``PhimoeConfig`` requires ``short_mscale`` and ``long_mscale`` in LongRoPE rope parameters
(Phi-3.5-MoE ships 1.243 for both), and ``PhimoeRotaryEmbedding.forward`` (transformers 5.x)

* multiplies cos/sin by ``long_mscale`` when ``max(position_ids) + 1`` exceeds
  ``original_max_position_embeddings`` and by ``short_mscale`` otherwise, in place of LongRoPE's
  attention factor;
* takes its frequencies from ``rope_init_fn(config)``, called without a length, so the
  *short* factors serve every length (the ``long_inv_freq`` its ``dynamic_rope_update`` wrapper
  switches to is never read by that forward).

:class:`MscaleLongRoPE` is posenc's rotary module with those two rules: its two frequency sets
(``"base"`` within the original length, ``"long"`` past it) share the short frequencies and
differ in their multiplier. :func:`split_mscales` takes the two keys out of a PhiMoE layer's
rope parameters, which the plain LongRoPE scaling does not take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..functional.rope_scaling import longrope_is_long
from ..rotary import RotaryEmbedding

#: Model types whose rotary module multiplies LongRoPE's cos/sin by the switched mscales.
MSCALE_LONGROPE_MODEL_TYPES = frozenset({"phimoe"})
MSCALE_KEYS = ("short_mscale", "long_mscale")


def split_mscales(
    params: Mapping[str, Any], model_types: frozenset[str], rope_type: str
) -> tuple[dict[str, Any], tuple[float, float] | None]:
    """``(params without the mscale keys, (short_mscale, long_mscale))`` for a LongRoPE layer of
    :data:`MSCALE_LONGROPE_MODEL_TYPES`; ``(params, None)`` otherwise (another model's mscale
    keys stay, and the scaling's own check refuses them by name)."""
    if rope_type != "longrope" or not model_types & MSCALE_LONGROPE_MODEL_TYPES:
        return dict(params), None
    values = []
    for key in MSCALE_KEYS:
        value = params.get(key)
        # transformers' PhimoeConfig.validate_rope: a number each (its forward reads both)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise ValueError(
                f"PhiMoE's longrope rope parameters need {key} (a number, the cos/sin "
                f"multiplier transformers' PhimoeRotaryEmbedding uses), got {value!r}"
            )
        values.append(float(value))
    rest = {k: v for k, v in params.items() if k not in MSCALE_KEYS}
    return rest, (values[0], values[1])


class MscaleLongRoPE(RotaryEmbedding):
    """:class:`~posenc.rotary.RotaryEmbedding` with LongRoPE's short frequencies at every length
    and cos/sin times ``mscales[0]`` within ``original_max_position_embeddings``, ``mscales[1]``
    past it (module docstring). Arguments as the parent's, ``scaling`` of rope type
    ``"longrope"`` (:func:`~posenc.hf.config.rope_module` builds it for no other), plus
    ``mscales = (short_mscale, long_mscale)``. :meth:`with_scaling` gives a plain module: a new
    scaling has none of PhiMoE's multipliers."""

    def __init__(self, *args: Any, mscales: tuple[float, float], **kwargs: Any) -> None:
        self.mscales = (float(mscales[0]), float(mscales[1]))  # read by reset_parameters
        super().__init__(*args, **kwargs)

    def reset_parameters(self) -> None:
        super().reset_parameters()  # empties the caches; its LongRoPE sets are replaced here
        with torch.device("cpu"):  # as the parent's: exact frequencies even under meta
            long_len = self._original_len() + 1
            self._sets = {"base": self._compute(None), "long": self._compute(long_len)}
        self.attention_factor = self.mscales[0]

    def _compute(
        self, seq_len: int | torch.Tensor | None, device: Any = None
    ) -> tuple[torch.Tensor, float]:
        """The short factors' frequencies whatever ``seq_len`` (a host length, or None: within
        the original length), with the multiplier of that length."""
        inv_freq, _ = super()._compute(None, device)  # transformers: rope_init_fn(config)
        long = seq_len is not None and bool(longrope_is_long(seq_len, self._original_len()))
        return inv_freq, self.mscales[1] if long else self.mscales[0]

    def _traced_frequencies(
        self, positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """Positions not readable on the host: the one frequency set, and the multiplier chosen
        on the device (a 0-d tensor where the two differ; equal ones, as shipped, stay a float
        and the call stays free of host reads)."""
        inv_freq, short = super()._traced_frequencies(positions, k_positions)
        long = self.mscales[1]
        if long == short or positions.numel() + k_positions.numel() == 0:
            return inv_freq, short
        tops = [p.max() for p in (positions, k_positions) if p.numel()]
        top = tops[0] if len(tops) == 1 else torch.maximum(*tops)  # 0-d, stays on the device
        is_long = longrope_is_long(top + 1, self._original_len())
        factor: Any = torch.where(is_long, long, short)  # cos/sin are multiplied by it
        return inv_freq, factor

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mscales={self.mscales}"
