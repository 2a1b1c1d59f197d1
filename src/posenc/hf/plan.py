"""What a Hugging Face model does with positions, layer by layer: :func:`position_plan`.

A decoder's layers need not treat positions alike. transformers builds, from one config:

* **NoPE layers** (no rotation at all): SmolLM3's ``no_rope_layers`` (``1`` = *uses* RoPE, the
  name is inverted) and Llama-4's (a NoPE layer every ``no_rope_layer_interval``); Cohere2 rotates
  on its sliding-window layers only; EXAONE-4 likewise when it has a ``sliding_window``.
* **Per-layer-type rotations** (Gemma-3/3n/4, OLMo-3: a local base, or YaRN on the full layers
  only, Gemma-4's ``global_head_dim`` and proportional partial rotary on the full layers).
* **Spans**: sliding windows on ``"sliding_attention"`` layers (Gemma-2/3, gpt-oss, Qwen2/3 with
  ``use_sliding_window`` from ``max_window_layers`` on, Qwen2-MoE's even-indexed layers below it,
  SmolLM3 with ``use_sliding_window``), on every layer (Mistral, Mixtral, Phi-3, Starcoder2 with
  a ``sliding_window``, Qwen3-MoE with ``use_sliding_window``), and Llama-4's
  chunked attention (``attention_chunk_size``) on its RoPE layers.
* **Query temperatures** (Llama-4's on its NoPE layers, Ministral-3's on every layer).

:func:`position_plan` reads all of it into a frozen :class:`PositionPlan`, one
:class:`LayerPositions` per decoder layer; each layer's ``rope`` is the module
:func:`~posenc.hf.rope_from_hf` builds for its layer type (one module shared by the layers of a
type) and its ``temperature`` that of :func:`~posenc.hf.attention_temperature_from_hf`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..rotary import RotaryEmbedding
from ..rotary.temperature import QueryTemperature
from .checks import check_layer_count, check_layer_types
from .config import (
    _get,
    _nested_keys,
    _positive_int,
    needs_transformers_hint,
    read_config,
    rope_kwargs,
    rope_module,
)
from .defaults import FULL_EVERY_LAYER_TYPES
from .labels import rope_label
from .load import resolve_config
from .temperature import temperature_of

Span = str | tuple[str, int]

# --- which layers rotate, and what they attend to (read from transformers' modeling code) -------

# ``self.use_rope = config.no_rope_layers[layer_idx]``: 1 means the layer *uses* RoPE.
NO_ROPE_LIST_MODEL_TYPES = frozenset(
    {"smollm3", "llama4", "llama4_text", "mistral_large4", "mistral_large4_text"}
)
# Rotate only where the layer has a sliding window (``if self.sliding_window is not None``).
ROPE_ON_SLIDING_MODEL_TYPES = frozenset({"cohere2", "dory", "flint"})
# Rotate unless the model has a window and the layer is global
# (``if self.sliding_window is None or self.is_sliding``).
ROPE_UNLESS_GLOBAL_MODEL_TYPES = frozenset(
    {"exaone4", "exaone_moe", "kolibri1", "exaone4_5", "exaone4_5_text"}
)
# No layer_types: ``config.sliding_window`` (when set) applies to every layer.
WINDOW_ON_EVERY_LAYER_MODEL_TYPES = frozenset(
    {"mistral", "mixtral", "phi3", "starcoder2", "ministral3", "olmoe", "phimoe", "qwen3_moe"}
)
# Old layer-type names a config class renames on load (transformers' _LEGACY_LAYER_TYPE_REMAP, in
# PreTrainedConfig's post-init), applied here to a raw dict's list as well.
LEGACY_LAYER_TYPES = {
    "mamba": "linear_attention",
    "attention": "full_attention",
    "deepseek_sparse_attention": "indexed_attention",
    "qwen_sparse_attention": "indexed_attention",
}
# The window counts only with ``use_sliding_window`` (Qwen2's config drops it, SmolLM3's attention).
USE_SLIDING_WINDOW_MODEL_TYPES = frozenset(
    {"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3", "qwen2_vl", "qwen2_vl_text",
     "qwen2_5_vl", "qwen2_5_vl_text"}
)  # fmt: skip
# Layers that do not attend (recurrent / linear attention, convolutions): no positions to encode.
NON_ATTENTION_LAYER_TYPES = frozenset({"linear_attention", "conv", "moe"})
# Architectures whose per-layer rule posenc has not reproduced yet.
PLAN_UNSUPPORTED_MODEL_TYPES = {
    "cohere2_moe": "its dense prefix layers may force RoPE on global layers (force_rope)",
}


def _pattern(every: int, n: int, last: str = "full_attention") -> list[str]:
    """``sliding_attention`` except every ``every``-th layer (1-based), as the config classes."""
    return ["sliding_attention" if (i + 1) % every else last for i in range(n)]


def _fallback_layer_types(cfg: Mapping[str, Any], model_type: str, n: int) -> list[str] | None:
    """The ``layer_types`` a config class derives in ``__post_init__`` when the file has none
    (for reading a dict without transformers); None when the class has no layer types."""
    window = cfg.get("sliding_window")
    if model_type in FULL_EVERY_LAYER_TYPES:
        every, first = FULL_EVERY_LAYER_TYPES[model_type]
        full = [(i == 0 and first) or (i + 1) % every == 0 for i in range(n)]
        return ["full_attention" if f else "sliding_attention" for f in full]
    if model_type in ("gemma2", "gpt_oss"):
        return _pattern(2, n)
    if model_type == "gemma3_text":
        return _pattern(cfg.get("sliding_window_pattern") or 6, n)
    if model_type in ("cohere2", "olmo3"):
        return _pattern(cfg.get("sliding_window_pattern") or 4, n)
    if model_type in ("exaone4", "exaone4_5_text"):
        if window is None:
            return ["full_attention"] * n
        return _pattern(cfg.get("sliding_window_pattern") or 4, n)
    if model_type in ("qwen2", "qwen3"):  # windows from max_window_layers on
        start = cfg.get("max_window_layers", 28)
        on = cfg.get("use_sliding_window", False) and window is not None
        return ["sliding_attention" if on and i >= start else "full_attention" for i in range(n)]
    if model_type == "qwen2_moe":  # windows on the even-indexed layers below max_window_layers
        stop = cfg.get("max_window_layers", 28)
        on = bool(cfg.get("use_sliding_window", False))
        return [
            "sliding_attention" if on and (i + 1) % 2 and i < stop else "full_attention"
            for i in range(n)
        ]
    if model_type == "smollm3":
        rope = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n)]
        on = cfg.get("use_sliding_window", False) and window is not None
        return ["sliding_attention" if on and not r else "full_attention" for r in rope]
    if model_type == "llama4_text":
        chunked = cfg.get("attention_chunk_size", 8192) is not None
        return ["chunked_attention" if r and chunked else "full_attention" for r in _no_rope(cfg)]
    if model_type in ("deepseek_v32", "glm_moe_dsa"):  # the sparse-attention indexer on every layer
        return ["indexed_attention"] * n
    return None


def _no_rope(cfg: Any) -> list[int]:
    no_rope = _get(cfg, "no_rope_layers")
    if isinstance(cfg, Mapping) and not no_rope:  # the classes' default: NoPE every 4th layer
        interval = cfg.get("no_rope_layer_interval", 4)
        no_rope = [int((i + 1) % interval != 0) for i in range(cfg["num_hidden_layers"])]
    return list(no_rope or [])


# --- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPositions:
    """What one decoder layer does with positions.

    Attributes:
        index: the layer's index.
        layer_type: transformers' name (``"full_attention"``, ``"sliding_attention"``,
            ``"chunked_attention"``, ``"linear_attention"``, ...); for models without
            ``layer_types``, ``"sliding_attention"`` where a window applies, else
            ``"full_attention"``.
        rope: the posenc rotary module (:func:`~posenc.hf.rope_from_hf` for this layer type), or
            None for a layer that rotates nothing (NoPE, or a layer that does not attend).
        head_dim, rotary_dim, layout, base, scaling, mrope_section: the rotation's arguments
            (None without one).
        temperature: the :class:`~posenc.rotary.temperature.QueryTemperature` scaling this
            layer's queries, or None.
        span: ``"full"``, ``("sliding", window)`` (the query and its ``window - 1`` predecessors),
            ``("chunk", size)`` (keys of the query's chunk of ``size`` positions), or ``"none"``
            for a layer that does not attend.
    """

    index: int
    layer_type: str
    rope: RotaryEmbedding | None = field(compare=False, repr=False)
    head_dim: int | None
    rotary_dim: int | None
    layout: str | None
    base: float | None
    scaling: Mapping[str, Any] | None
    mrope_section: tuple[int, ...] | None
    temperature: QueryTemperature | None
    span: Span

    @property
    def uses_rope(self) -> bool:
        return self.rope is not None

    def settings(self) -> tuple[Any, ...]:
        """Everything but the index: equal for layers that treat positions alike."""
        scaling = None if self.scaling is None else repr(sorted(self.scaling.items()))
        return (
            self.layer_type, self.uses_rope, self.head_dim, self.rotary_dim, self.layout,
            self.base, scaling, self.mrope_section, self.temperature, self.span,
        )  # fmt: skip


@dataclass(frozen=True)
class PositionPlan:
    """A decoder's positions, layer by layer (:func:`position_plan`).

    Attributes:
        model_type: the decoder config's ``model_type`` (``"gemma3_text"`` for Gemma-3).
        max_position_embeddings: the config's (None when it has none).
        original_max_position_embeddings: the pretraining length a scaling extends from (the
            first one among the layers' scalings), else None.
        layers: one :class:`LayerPositions` per decoder layer.
    """

    model_type: str | None
    max_position_embeddings: int | None
    original_max_position_embeddings: int | None
    layers: tuple[LayerPositions, ...]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def groups(self) -> list[tuple[tuple[int, ...], LayerPositions]]:
        """Layers with equal :meth:`LayerPositions.settings`: ``(indices, first layer)``, in the
        order of their first layer."""
        found: dict[tuple[Any, ...], list[LayerPositions]] = {}
        for layer in self.layers:
            found.setdefault(layer.settings(), []).append(layer)
        return [(tuple(x.index for x in group), group[0]) for group in found.values()]


def _layer_types(cfg: Any, model_types: frozenset[str], model_type: str, n: int) -> list[str]:
    given = _get(cfg, "layer_types")
    if given is None and isinstance(cfg, Mapping):
        given = _fallback_layer_types(cfg, model_type, n)
    if given is None:
        window = _window(cfg, model_types)
        if model_types & WINDOW_ON_EVERY_LAYER_MODEL_TYPES and window is not None:
            return ["sliding_attention"] * n
        return ["full_attention"] * n
    given = [LEGACY_LAYER_TYPES.get(t, t) for t in given]
    check_layer_types(given)
    if len(given) != n:
        raise ValueError(
            f"layer_types has {len(given)} entries but num_hidden_layers is {n}: they must be equal"
        )
    return given


def _window(cfg: Any, model_types: frozenset[str]) -> int | None:
    window = _get(cfg, "sliding_window")
    if model_types & USE_SLIDING_WINDOW_MODEL_TYPES and not _get(cfg, "use_sliding_window", False):
        return None
    return None if window is None else _positive_int(window, "sliding_window")


def _span(cfg: Any, model_types: frozenset[str], layer_type: str) -> Span:
    if layer_type in NON_ATTENTION_LAYER_TYPES:
        return "none"
    if layer_type == "chunked_attention":
        return ("chunk", _positive_int(_get(cfg, "attention_chunk_size"), "attention_chunk_size"))
    window = _window(cfg, model_types)
    if window is not None and (
        layer_type == "sliding_attention" or model_types & WINDOW_ON_EVERY_LAYER_MODEL_TYPES
    ):
        return ("sliding", window)
    return "full"


def _uses_rope(cfg: Any, model_types: frozenset[str], i: int, layer_type: str, span: Span) -> bool:
    if span == "none":
        return False
    if model_types & NO_ROPE_LIST_MODEL_TYPES:
        return bool(_no_rope(cfg)[i])
    sliding = isinstance(span, tuple) and span[0] == "sliding"
    if model_types & ROPE_ON_SLIDING_MODEL_TYPES:
        return sliding
    if model_types & ROPE_UNLESS_GLOBAL_MODEL_TYPES:
        return _get(cfg, "sliding_window") is None or sliding
    params = _get(cfg, "rope_parameters") or {}
    nested = _nested_keys(params, _get(cfg, "_rope_type_labels") or _get(cfg, "layer_types"))
    key = rope_label(model_types, layer_type)[1]  # DeepSeek-V4: the label the layer type reads
    return not nested or params.get(key) is not None


def _num_layers(cfg: Any) -> int:
    n = _get(cfg, "num_hidden_layers")
    if n is None:
        raise ValueError(
            "config has no num_hidden_layers" + needs_transformers_hint(cfg, "num_hidden_layers")
        )
    n = _positive_int(n, "num_hidden_layers")
    check_layer_count(n)  # before anything is built per layer
    return n


def plan_of(
    cfg: Any,
    model_types: frozenset[str],
    angle_dtype: torch.dtype | str = torch.float32,
    cache_len: int = 4096,
    backend: str = "auto",
) -> PositionPlan:
    """:func:`position_plan` of a config already read by :func:`~posenc.hf.config.read_config`."""
    for model_type in sorted(model_types & PLAN_UNSUPPORTED_MODEL_TYPES.keys()):
        raise ValueError(
            f"posenc cannot give the per-layer positions of model_type {model_type!r}: "
            f"{PLAN_UNSUPPORTED_MODEL_TYPES[model_type]}"
        )
    model_type = _get(cfg, "model_type")
    n = _num_layers(cfg)
    types = _layer_types(cfg, model_types, str(model_type or ""), n)
    temperature = temperature_of(cfg, model_types)
    ropes: dict[str, tuple[dict[str, Any], RotaryEmbedding]] = {}
    layers = []
    for i, layer_type in enumerate(types):
        span = _span(cfg, model_types, layer_type)
        kw: dict[str, Any] = {}
        rope = None
        if _uses_rope(cfg, model_types, i, layer_type, span):
            if layer_type not in ropes:
                kw = rope_kwargs(cfg, model_types, layer_type)
                ropes[layer_type] = kw, rope_module(kw, None, angle_dtype, cache_len, backend)
            kw, rope = ropes[layer_type]
        section = kw.get("mrope_section")
        layers.append(
            LayerPositions(
                index=i,
                layer_type=layer_type,
                rope=rope,
                head_dim=kw.get("head_dim"),
                rotary_dim=kw.get("rotary_dim"),
                layout=kw.get("layout"),
                base=kw.get("base"),
                scaling=kw.get("scaling"),
                mrope_section=None if section is None else tuple(section),
                temperature=temperature if temperature and temperature.applies_to(i) else None,
                span=span,
            )
        )
    origs = [
        x.scaling.get("original_max_position_embeddings") for x in layers if x.scaling is not None
    ]
    max_pos = _get(cfg, "max_position_embeddings")
    if max_pos is not None:
        max_pos = _positive_int(max_pos, "max_position_embeddings")
    return PositionPlan(
        model_type=model_type,
        max_position_embeddings=max_pos,
        original_max_position_embeddings=next((int(o) for o in origs if o is not None), None),
        layers=tuple(layers),
    )


def position_plan(
    config: Any,
    *,
    angle_dtype: torch.dtype | str = torch.float32,
    cache_len: int = 4096,
    backend: str = "auto",
    use_transformers: bool = True,
    tables: bool = False,
) -> PositionPlan:
    """What each decoder layer of a Hugging Face model does with positions.

    ``config``: a ``config.json`` dict, a transformers config object, a path to a
    ``config.json`` or a model folder, or a model id in the local Hugging Face cache (see
    :func:`~posenc.hf.load.resolve_config`). The other arguments go to each layer's rotary
    module (as :func:`~posenc.hf.rope_from_hf`); ``tables=True`` also reads a model whose
    rotation or angle arithmetic only :class:`~posenc.hf.HFRotaryEmbedding` reproduces (NanoChat,
    Ergo), for a plan of its layers.

    >>> plan = position_plan({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    ...                       "num_attention_heads": 4, "max_position_embeddings": 2048})
    >>> [(x.index, x.span, x.rotary_dim) for x in plan.layers]
    [(0, 'full', 16), (1, 'full', 16)]
    """
    cfg, model_types = read_config(resolve_config(config), use_transformers, tables=tables)
    return plan_of(cfg, model_types, angle_dtype, cache_len, backend)


def longest_wavelength(rope: RotaryEmbedding, seq_len: int | None = None) -> float:
    """``2π / min(inv_freq)`` in positions, with the frequencies in effect at ``seq_len``; the
    unrotated pairs of a proportional (p-RoPE) layer (``inv_freq`` 0) do not count, and a rope
    whose every pair is unrotated has an infinite wavelength."""
    inv_freq, _ = rope.frequencies(seq_len)
    rotated = inv_freq.double()[inv_freq > 0]
    return 2 * math.pi / float(rotated.min()) if rotated.numel() else math.inf
