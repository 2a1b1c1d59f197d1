"""Position-dependent attention temperature: the query scale of Llama-4 and Ministral-3.

Long-context models that extend RoPE sometimes also sharpen attention far from the start of the
sequence by multiplying each query by a scale that grows with the log of its position::

    llama4_scaling      1 + beta * log(1 + floor(p / L))          Ministral-3 (``llama_4_scaling_beta``,
                                                                   ``L = original_max_position_embeddings``)
    llama4_temperature  log1p(floor((p + 1) / L)) * beta + 1      Llama-4 NoPE layers
                                                                   (``attn_scale``, ``L = floor_scale``)
    logn                max(1, log(p + 1) / log(L))               Su's log n (inference-time,
                                                                   ``L`` the trained length)

Both are 1 for the first ``L`` positions (resp. ``L - 1``), then step up by ``beta * log(k + 1)``
every ``L`` positions; ``logn`` is 1 up to ``p = L - 1`` and grows as ``log_L(p + 1)`` past it
(a query at ``p`` attends to ``p + 1`` keys: its logits are sharpened by the log of that count
relative to the trained one, which keeps the attention's entropy near what training saw; Su
Jianlin, kexue.fm 8823 and 9706 "log n†", as bojone/rerope's patches apply it:
``q *= ((position_ids + 1).log() / log(training_length)).clip(1)``). They act on the queries only, after the rotation (Ministral-3, every layer)
or instead of it (Llama-4: the layers without RoPE). The two are kept as separate formulas because
transformers evaluates them in different operation orders (``log(1 + x)`` vs ``log1p(x)``, scale
cast before vs after the product), which differ in the last float32 ulp.

:func:`posenc.hf.attention_temperature_from_hf` reads a :class:`QueryTemperature` from a config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._checks import check_positions, default_positions
from .._context import ScoreContext

TEMPERATURE_KINDS = ("llama4_scaling", "llama4_temperature", "logn")


def llama4_scaling_scale(positions: torch.Tensor, beta: float, length: int) -> torch.Tensor:
    """Ministral-3's query scale ``1 + beta * log(1 + floor(p / length))``, float32.

    Shapes: ``positions [*]`` integer -> ``[*]``. Same operations, in the same order, as
    transformers' ``get_llama_4_attn_scale`` (``ministral3``).
    """
    return _llama4_scaling_scale(check_positions(positions), beta, length)


def _llama4_scaling_scale(positions: torch.Tensor, beta: float, length: int) -> torch.Tensor:
    # int64 / int is a float32 true division in torch, as in transformers.
    return 1 + beta * torch.log(1 + torch.floor(positions / length))


def llama4_temperature_scale(positions: torch.Tensor, beta: float, length: int) -> torch.Tensor:
    """Llama-4's NoPE-layer query scale ``log1p(floor((p + 1) / length)) * beta + 1``, float32.

    Shapes: ``positions [*]`` integer -> ``[*]``. ``beta`` is transformers' ``attn_scale`` and
    ``length`` its ``floor_scale`` (``Llama4TextAttention`` with ``attn_temperature_tuning``).
    """
    return _llama4_temperature_scale(check_positions(positions), beta, length)


def _llama4_temperature_scale(positions: torch.Tensor, beta: float, length: int) -> torch.Tensor:
    return torch.log1p(torch.floor((positions.float() + 1.0) / length)) * beta + 1.0


def logn_scale(positions: torch.Tensor, length: int) -> torch.Tensor:
    """Su's log-n query scale ``max(1, ln(p + 1) / ln(length))``, float32.

    Shapes: ``positions [*]`` integer (``position_ids``) -> ``[*]``. The operations of
    bojone/rerope's ``rerope_patch.py``: the log of ``p + 1`` in float32, divided by the
    double ``log(length)``, clipped at 1.
    """
    return _logn_scale(check_positions(positions), length)


def _logn_scale(positions: torch.Tensor, length: int) -> torch.Tensor:
    return (torch.log((positions + 1).float()) / math.log(length)).clamp(min=1.0)


@dataclass(frozen=True)
class QueryTemperature:
    """A per-position query scale and the layers it applies to.

    Attributes:
        kind: ``"llama4_scaling"`` (Ministral-3), ``"llama4_temperature"`` (Llama-4) or
            ``"logn"`` (Su's log n), see the module docstring for the formulas.
        beta: the log slope (``llama_4_scaling_beta`` or ``attn_scale``; ``logn`` has none:
            1.0).
        length: the step length ``L`` in positions (``original_max_position_embeddings`` or
            ``floor_scale``; for ``logn`` the trained length, at least 2).
        layers: indices of the decoder layers that scale their queries, or None for every layer.

    Which positions: Ministral-3 uses the tokens' ``position_ids`` (left padding shifts them);
    Llama-4 uses the absolute index in the KV cache (``arange(s) + past_length``), whatever the
    ``position_ids``.
    """

    kind: str
    beta: float
    length: int
    layers: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in TEMPERATURE_KINDS:
            raise ValueError(f"kind must be one of {TEMPERATURE_KINDS}, got {self.kind!r}")
        beta = self.beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta):
            raise ValueError(f"beta must be a finite number, got {beta!r}")
        if isinstance(self.length, bool) or not isinstance(self.length, int) or self.length < 1:
            raise ValueError(f"length must be a positive integer, got {self.length!r}")
        if self.kind == "logn" and (self.beta != 1.0 or self.length < 2):
            raise ValueError(
                f"logn takes no slope (beta 1.0) and a trained length >= 2, got beta "
                f"{self.beta!r} and length {self.length!r}"
            )

    def applies_to(self, layer_idx: int) -> bool:
        """Whether decoder layer ``layer_idx`` scales its queries."""
        return self.layers is None or layer_idx in self.layers

    def scale(self, positions: torch.Tensor) -> torch.Tensor:
        """The float32 query scale of integer ``positions``: ``[*]`` -> ``[*]``."""
        return self._scale(check_positions(positions))

    def _scale(self, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`scale` of checked positions."""
        if self.kind == "llama4_scaling":
            return _llama4_scaling_scale(positions, self.beta, self.length)
        if self.kind == "logn":
            return _logn_scale(positions, self.length)
        return _llama4_temperature_scale(positions, self.beta, self.length)

    def forward(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Scale queries ``q [b, h, s, d]`` by the scale of ``positions [s]`` or ``[b, s]``.

        Returns a new tensor of ``q``'s dtype. The cast follows transformers: Ministral-3 (and ``logn``,
        as its authors) casts the scale to ``q.dtype`` before the product, Llama-4 multiplies in float32 and casts after.
        """
        if q.dim() != 4:
            raise ValueError(f"q must be 4-D [b, h, s, d], got shape {tuple(q.shape)}")
        positions = check_positions(positions, ranks=(1, 2), device=q.device)
        if positions.shape[-1] != q.shape[2]:
            raise ValueError(
                f"positions must end in the query length {q.shape[2]}, got {tuple(positions.shape)}"
            )
        return self._scaled(q, positions)

    def _scaled(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` of checked ``positions [s]|[b, s]`` (ending in ``q``'s length)."""
        scale = self._scale(positions)  # [s] or [b, s]
        scale = scale[:, None] if scale.dim() == 1 else scale[:, None, :, None]  # [s,1]|[b,1,s,1]
        if self.kind != "llama4_temperature":
            return q * scale.to(q.dtype)
        return (q * scale).to(q.dtype)

    __call__ = forward

    def scale_queries(self, q: torch.Tensor, call: ScoreContext) -> torch.Tensor:
        """:class:`~posenc.attention.Attention`'s query hook: scale ``q [b, h, s, d]`` after any
        rotation and the KV cache update (which holds keys only), before the scores. Llama-4
        evaluates its scale at the queries' indices in the KV cache (``past + arange(s)``,
        whatever the positions), Ministral-3 at the positions ``call.positions``."""
        if self.kind == "llama4_temperature":
            s, t = q.shape[2], call.k_positions.shape[-1]
            where = default_positions(s, q.device, offset=t - s)  # [s]
        else:
            where = call.positions  # [s] or [b, s], checked by the context
        return self._scaled(q, where)
