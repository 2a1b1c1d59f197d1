"""Where a RoPE scaling goes in a model whose layer types rotate differently.

A hybrid model (Gemma-3, OLMo-3: sliding-window layers beside full-attention layers) keeps one set
of rope parameters per layer type. A *flat* scaling (``{"rope_type": "yarn", "factor": 4.0}``)
then has to be put somewhere, and transformers decides where when it reads a config's
``rope_scaling``: Gemma-3's ``convert_rope_params_to_dict`` updates
``rope_parameters["full_attention"]`` only, and Google's own Gemma-3 4B-27B configs scale only
the global layers. A sliding layer never sees a distance past its window (512 tokens on
Gemma-3-270M), so scaling it only blurs the positions it was trained on.

:func:`scaling_layer_types` is that one rule, read by ``apply_posenc(scaling=)``, the drop-in
:class:`~posenc.hf.HFRotaryEmbedding`, ``posenc extend`` and its export:

* ``layers="auto"`` (default): transformers' rule for the model type
  (:data:`FLAT_SCALING_LAYER_TYPES`); a per-type model whose config class has no rule of its own
  (the newer ones take only ``rope_parameters``) gets the full-attention layers, as Gemma-3.
* ``layers="full"``: the full-attention layer types; ``layers="all"``: every type with RoPE.

Every derived value then comes from each layer type's own parameters: its ``rope_theta`` and
rotary dim (posenc's static ``ntk``, :func:`ntk_parameters`), its YaRN band (computed by the
rotary module from that type's base).

A model with *one* set of rope parameters (Gemma-2, gpt-oss, Cohere2, a Mistral with a
``sliding_window``) rotates every layer by it, in transformers as here: a scaling goes to every
layer, and ``layers="full"`` is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .config import _get, _nested_keys

#: transformers' ``convert_rope_params_to_dict``: the layer types a flat ``rope_scaling`` updates
#: on a config whose rope parameters are per layer type (tests/test_hf_scaling_layers.py builds
#: each class with a ``rope_scaling`` and reads where it went).
FLAT_SCALING_LAYER_TYPES: dict[str, tuple[str, ...]] = {
    "gemma3_text": ("full_attention",),
    "gemma3n_text": ("full_attention",),
    "olmo3": ("full_attention",),
    "t5gemma2_text": ("full_attention",),
    "t5gemma2_decoder": ("full_attention",),
    "modernbert": ("full_attention", "sliding_attention"),
    "modernbert-decoder": ("full_attention", "sliding_attention"),
    "dots3_note_text": ("sliding_attention", "indexed_attention"),
    "ergo": ("sliding_attention",),
}

LAYER_CHOICES = ("auto", "full", "all")

#: Layer types that attend to every earlier key (the types a long context stretches): ZAYA's,
#: Inkling's and Falcon-H1's ``hybrid`` is attention beside a recurrent mixer, over every
#: earlier key (their windowed kind is ``hybrid_sliding``).
FULL_LAYER_TYPES = frozenset({"full_attention", "hybrid"})


class NoFullRopeLayerError(ValueError):
    """A flat scaling refused because the model has no full-attention layer type with RoPE (it
    names the types a scaling keyed by layer type would take): a type of its own so that a caller
    that can key the scaling (the coverage sweep) tells this refusal from the others without
    reading its text."""


def _text(config: Any) -> Any:
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def rope_layer_types(config: Any) -> list[str]:
    """The layer types of ``config`` with rope parameters of their own, in the config's order
    (empty for a config with one set of rope parameters)."""
    text = _text(config)
    params = _get(text, "rope_parameters") or {}
    if not isinstance(params, Mapping):
        return []
    nested = _nested_keys(params, _get(text, "_rope_type_labels") or _get(text, "layer_types"))
    return [k for k in nested if params.get(k) is not None]


def check_layers(layers: Any) -> str:
    if layers not in LAYER_CHOICES:
        raise ValueError(f"layers must be one of {', '.join(LAYER_CHOICES)}, got {layers!r}")
    return str(layers)


def scaling_layer_types(config: Any, layers: str = "auto") -> tuple[str, ...] | None:
    """The layer types a flat scaling goes to under ``layers`` (see the module docstring), or
    None for a config with one set of rope parameters (every layer, the only choice)."""
    check_layers(layers)
    text = _text(config)
    nested = rope_layer_types(text)
    model_type = _get(text, "model_type")
    if not nested:
        if layers == "full" and _has_window(text):
            raise ValueError(
                f"this {model_type} rotates every layer type with one set of rope parameters: "
                "layers='full' needs rope parameters per layer type (Gemma-3, OLMo-3); use "
                "layers='auto' or 'all' (every layer)"
            )
        return None
    if layers == "all":
        return tuple(nested)
    if layers == "auto" and model_type in FLAT_SCALING_LAYER_TYPES:
        rule = FLAT_SCALING_LAYER_TYPES[model_type]
        chosen = tuple(t for t in nested if t in rule)
        if not chosen:  # e.g. a Gemma-3 whose layers are all sliding: the rule finds none
            raise ValueError(
                f"a flat scaling on this {model_type} goes to its {'/'.join(rule)} layers, and it "
                f"has none (its layer types with RoPE: {nested}): name the types in a scaling "
                "keyed by layer type, or layers='all'"
            )
        return chosen
    full = tuple(t for t in nested if t in FULL_LAYER_TYPES)
    if not full:
        raise NoFullRopeLayerError(
            f"this {model_type} has no full-attention layer type with RoPE (it has "
            f"{nested}): name the types in a scaling keyed by layer type, or layers='all'"
        )
    return full


def _has_window(text: Any) -> bool:
    types = set(_get(text, "layer_types") or ())
    return bool(_get(text, "sliding_window")) or "sliding_attention" in types


def scaling_by_layer_type(
    config: Any, scaling: Mapping[str, Any] | None, layers: str = "auto"
) -> dict[str, Any] | None:
    """``scaling`` as this config means it: a flat dict on a per-type config becomes a dict keyed
    by the layer types of :func:`scaling_layer_types`; a keyed dict, a flat dict on a one-set
    config, and None come back as they are (``layers`` is checked all the same).

    >>> cfg = {"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"],
    ...        "rope_parameters": {"sliding_attention": {"rope_theta": 1e4},
    ...                            "full_attention": {"rope_theta": 1e6}}}
    >>> scaling_by_layer_type(cfg, {"rope_type": "linear", "factor": 2.0})
    {'full_attention': {'rope_type': 'linear', 'factor': 2.0}}
    """
    check_layers(layers)
    if scaling is None or is_keyed(scaling):
        return None if scaling is None else dict(scaling)
    types = scaling_layer_types(config, layers)
    if types is None:
        return dict(scaling)
    return {t: dict(scaling) for t in types}


def is_keyed(scaling: Mapping[str, Any]) -> bool:
    """A scaling keyed by layer type (every value a dict), as ``with_rope_parameters`` reads it."""
    return bool(scaling) and all(isinstance(v, Mapping) for v in scaling.values())


# --- what apply_posenc(scaling=) checks before it swaps a model's rotary modules -------------------


#: The rope parameters an attention temperature reads (Ministral-3, Mistral-4's queries scaled
#: by ``1 + beta * log(1 + floor(position / original_max_position_embeddings))``).
TEMPERATURE_KEYS = ("llama_4_scaling_beta", "original_max_position_embeddings")


def temperature_parameters(model: Any, scaling: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The rope parameters the attention temperature of ``model`` reads under ``scaling``: its
    own, with the scaling's ``llama_4_scaling_beta`` and ``original_max_position_embeddings``
    where it gives them, as transformers reads them from a config holding that scaling; None
    where the model has no such temperature (or no scaling is given). One-line refusal where
    its rope parameters are per layer type (no model has both today)."""
    config = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or {}
    sets = [v for v in params.values() if isinstance(v, Mapping)] or [params]
    if scaling is None or not any(p.get("llama_4_scaling_beta") for p in sets):
        return None
    if sets != [params] or not all(k in params for k in TEMPERATURE_KEYS):
        raise ValueError(
            f"scaling= on this {getattr(text, 'model_type', '')}: its attention temperature "
            "(llama_4_scaling_beta) needs one set of rope parameters holding "
            f"{' and '.join(TEMPERATURE_KEYS)}; give the scaling in the config"
        )
    return {**params, **{k: scaling[k] for k in TEMPERATURE_KEYS if k in scaling}}


class _RopeParametersView:
    """The model's config as one attention layer reads it: its own ``rope_parameters``, every
    other attribute the live shared config's (a later ``set_attn_implementation`` reaches the
    layer as it reaches the others)."""

    def __init__(self, config: Any, rope_parameters: dict[str, Any]) -> None:
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "rope_parameters", rope_parameters)

    def __getattr__(self, name: str) -> Any:
        if name == "_config":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self._config, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._config, name, value)


def with_temperature(attention: list[Any], params: dict[str, Any] | None) -> list[tuple[Any, Any]]:
    """Give each of ``attention``'s layers a view of its config whose rope parameters are
    ``params`` (:func:`temperature_parameters`; None: nothing to do), the model's config left
    as it is -> ``(layer, its config before)`` to restore. Refused before any layer changes
    where one has no config to read them from."""
    if params is None:
        return []
    bare = [type(m).__name__ for m in attention if not hasattr(m, "config")]
    if bare:
        raise ValueError(f"{bare[0]} has no config for its attention temperature to read")
    saved = [(module, module.config) for module in attention]
    for module, config in saved:
        module.config = _RopeParametersView(config, params)
    return saved


def check_tables(old: Any, new: Any, name: str) -> None:
    """Refuse a swap whose cos/sin differ in shape from the stock module's (LFM-3's
    ``proportional`` RoPE keeps full-width tables for a partial rotation): at 3 positions, per
    layer type, where the stock module runs on ``(x, position_ids[, layer_type])``."""
    x, pos = torch.zeros(1, 1, 1), torch.arange(3)[None]
    for layer_type in new.layer_types or (None,):
        args = (x, pos) if layer_type is None else (x, pos, layer_type)
        try:
            want = old(*args)
        except Exception:  # a signature this probe does not know: not compared
            continue
        if not isinstance(want, tuple) or not all(isinstance(w, torch.Tensor) for w in want):
            continue
        got = new(*args)
        if [tuple(w.shape) for w in want] != [tuple(g.shape) for g in got]:
            raise ValueError(
                f"scaling= cannot replace {name}{f' ({layer_type})' if layer_type else ''}: it "
                f"builds cos/sin of shape {tuple(want[0].shape)} and posenc's reading of the "
                f"config {tuple(got[0].shape)} (a rope type whose tables posenc does not build)"
            )
