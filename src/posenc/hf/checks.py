"""Checks of what a caller hands :mod:`posenc.hf`, made before transformers sees it (a leaf
module: :mod:`.config`, :mod:`.plan`, :mod:`.patch` and :mod:`.rotary` read it).

Each check raises a one-line ``ValueError`` (``TypeError`` for a wrong kind of object) that names
the key and says what is allowed, so that transformers' own validators (whose messages name
their internals) never speak first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: The most decoder layers a config may declare. Published decoders have fewer than 200; a plan
#: holds one entry per layer, so ``num_hidden_layers: 10**9`` would allocate until killed.
MAX_LAYERS = 10_000

# Keys whose values must be numbers wherever they appear (top level, rope dicts, text_config):
# checked before transformers sees the dict, so a string fails naming its key.
NUMERIC_KEYS = frozenset(
    {"rope_theta", "rotary_emb_base", "partial_rotary_factor", "rotary_pct", "rotary_dim",
     "head_dim", "hidden_size", "num_attention_heads", "max_position_embeddings",
     "original_max_position_embeddings", "qk_rope_head_dim", "factor", "attention_factor",
     "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "low_freq_factor",
     "high_freq_factor", "llama_4_scaling_beta", "rope_local_base_freq",
     "num_hidden_layers", "n_layer"}
)  # fmt: skip
_LAYER_KEYS = ("num_hidden_layers", "n_layer")


def is_real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_layer_count(value: Any, where: str = "num_hidden_layers") -> None:
    """Refuse a layer count above :data:`MAX_LAYERS` (before anything allocates per layer)."""
    if is_real(value) and math.isfinite(value) and value > MAX_LAYERS:
        raise ValueError(
            f"{where} is {value!r}: posenc reads configs of at most {MAX_LAYERS} decoder layers "
            "(published models have fewer than 200)"
        )


def check_types(raw: Mapping[str, Any], where: str = "config") -> None:
    """Numbers where numbers go, in ``raw`` and the rope and text dicts nested in it, and a
    plausible layer count."""
    for key, value in raw.items():
        if isinstance(value, Mapping) and key in ("rope_parameters", "rope_scaling", "text_config"):
            check_types(value, f"{where}[{key!r}]")
        elif isinstance(value, Mapping) and where.endswith(
            ("['rope_parameters']", "['rope_scaling']")
        ):
            check_types(value, f"{where}[{key!r}]")  # per-layer-type rope parameters
        elif key in NUMERIC_KEYS and value is not None and not is_real(value):
            raise ValueError(f"{where}[{key!r}] must be a number, got {value!r}")
        elif key in _LAYER_KEYS:
            check_layer_count(value, f"{where}[{key!r}]")


def check_scaling_argument(scaling: Any, rope_types: tuple[str, ...]) -> None:
    """``apply_posenc``'s / ``HFRotaryEmbedding``'s ``scaling=``: None, a dict of rope parameters,
    or a dict of them keyed by layer type, with numbers where numbers go."""
    if scaling is None:
        return
    if not isinstance(scaling, Mapping):
        raise TypeError(
            "scaling must be a dict of rope parameters, e.g. {'rope_type': 'yarn', 'factor': 4.0, "
            "'original_max_position_embeddings': 4096} (or such dicts keyed by layer type), "
            f"with rope_type one of {', '.join(rope_types)}; got {type(scaling).__name__} "
            f"{scaling!r}"
        )
    keyed = bool(scaling) and all(isinstance(v, Mapping) for v in scaling.values())
    for name, params in scaling.items() if keyed else [(None, scaling)]:
        where = "scaling" if name is None else f"scaling[{name!r}]"
        for key, value in params.items():
            if key in NUMERIC_KEYS and value is not None and not is_real(value):
                raise ValueError(f"{where}[{key!r}] must be a number, got {value!r}")


# transformers' ALLOWED_ATTN_LAYER_TYPES (configuration_utils: what a config's ``layer_types``
# may name), for reading a dict without it.
LAYER_TYPES = (
    "full_attention", "sliding_attention", "chunked_attention", "window_attention",
    "indexed_attention", "compressed_sparse_attention", "heavily_compressed_attention",
    "minimax_m3_sparse", "conv", "moe", "hybrid", "hybrid_sliding",
    "reference_sliding_attention", "linear_attention",
)  # fmt: skip


def allowed_layer_types() -> tuple[str, ...]:
    """The layer types a config may name: the installed transformers' list, else
    :data:`LAYER_TYPES`."""
    try:  # transformers is optional
        from transformers.configuration_utils import ALLOWED_ATTN_LAYER_TYPES
    except ImportError:
        return LAYER_TYPES
    return tuple(ALLOWED_ATTN_LAYER_TYPES)


def check_layer_types(layer_types: list[str]) -> None:
    allowed = allowed_layer_types()
    for i, name in enumerate(layer_types):
        if name not in allowed:
            raise ValueError(
                f"layer_types[{i}] is {name!r}, not a layer type transformers knows; allowed: "
                f"{', '.join(allowed)}"
            )
