"""The scalings the registry sweep (:mod:`posenc.testing.coverage`) checks, and the config a
reference model is rebuilt from: :data:`SCALINGS` on every family, and LongRoPE
(:data:`FALLBACK`, :func:`fallback_scaling`) where transformers' config class takes none of
them (Phi-3, PhiMoE, Phi-4-multimodal), sized from the config's rotary dim.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The scalings each family is checked under (factor 2 over a trained length of 64).
SCALINGS: dict[str, dict[str, Any]] = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}  # fmt: skip
#: The scaling checked in their place where transformers' config class refuses all of
#: :data:`SCALINGS` (:func:`fallback_scaling`): LongRoPE, the one Phi-3's and PhiMoE's take.
FALLBACK = "longrope"
#: LongRoPE's original length in that check: below the 24-token prefill (long factors) and equal
#: to the 23-token one (short factors), so one decode step reads a cache the short ones rotated.
LONGROPE_ORIGINAL = 23
#: PhiMoE's cos/sin multipliers (its config class requires both; Phi-3.5-MoE ships 1.243 twice):
#: two values, so that taking one for the other shows.
LONGROPE_MSCALES = {"short_mscale": 1.1, "long_mscale": 1.3}


def scaled_config(config: Any, scaling: dict[str, Any]) -> Any:
    """``config`` rebuilt by its own class with ``scaling`` as its rope parameters (as
    :func:`scaled_reference` takes them); the class's validation raises where it refuses them."""
    from ..hf.scaling import scaling_by_layer_type

    # and an attention temperature's parameters (Ministral-3's: its beta, and the original
    # length a scaling without one leaves as it was), as a user rescaling it keeps them
    keep: tuple[str, ...] = ("rope_theta", "partial_rotary_factor", "mrope_section",
                             "mrope_interleaved", "llama_4_scaling_beta")  # fmt: skip
    params = copy.deepcopy(dict(config.rope_parameters or {}))
    if params.get("llama_4_scaling_beta") and "original_max_position_embeddings" not in scaling:
        keep += ("original_max_position_embeddings",)
    keyed = scaling_by_layer_type(config, scaling)
    nested = (
        keyed is not None
        and all(isinstance(v, dict) for v in keyed.values())
        and any(isinstance(v, dict) for v in params.values())
    )
    if nested:
        for t, new in (keyed or {}).items():
            params[t] = {**{k: v for k, v in params[t].items() if k in keep}, **new}
    else:
        params = {**{k: v for k, v in params.items() if k in keep}, **scaling}
    return type(config).from_dict({**config.to_dict(), "rope_parameters": params})


def _config_takes(config: Any, scaling: dict[str, Any]) -> bool:
    """Whether transformers' config class of ``config`` builds a config with ``scaling``."""
    try:
        scaled_config(config, scaling)
    except Exception:  # its validation: ValueError, TypeError, strict-dataclass errors
        return False
    return True


def _rotary_pairs(config: Any) -> int:
    """The rotated pairs of ``config``'s heads, as transformers' LongRoPE sizes its factor lists
    (``int(head_dim * partial_rotary_factor) // 2``)."""
    params = getattr(config, "rope_parameters", None) or {}  # GPT-J's class keeps none
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(head_dim * params.get("partial_rotary_factor", 1.0)) // 2


def longrope_scaling(config: Any) -> dict[str, Any]:
    """LongRoPE's parameters for ``config``'s rotary dim, with an original length of
    :data:`LONGROPE_ORIGINAL` and no ``factor`` (transformers derives it, and the attention
    factor, from ``max_position_embeddings``, as Phi-3's checkpoints leave it). The factors rise
    over the pairs as shipped ones do, short ``1 .. 2`` linearly and long ``2 .. 8``
    quadratically, and differ at every pair, the fast ones too: over 24 positions only those
    turn far enough for a swap or a missed branch to show in the logits."""
    n = _rotary_pairs(config)
    ramp = [i / max(n - 1, 1) for i in range(n)]
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + r for r in ramp],
        "long_factor": [2.0 + 6.0 * r * r for r in ramp],
        "original_max_position_embeddings": LONGROPE_ORIGINAL,
    }


def fallback_scaling(config: Any) -> dict[str, Any] | None:
    """The :data:`FALLBACK` scaling to check where transformers' config class refuses every one
    of :data:`SCALINGS` (None where it takes one of them, or takes no LongRoPE either): the
    plain :func:`longrope_scaling`, or with :data:`LONGROPE_MSCALES` where the class refuses it
    without them (PhiMoE)."""
    if any(_config_takes(config, s) for s in SCALINGS.values()):
        return None
    plain = longrope_scaling(config)
    with original_length(config):
        for scaling in (plain, {**plain, **LONGROPE_MSCALES}):
            if _config_takes(config, scaling):
                return scaling
    return None


@contextmanager
def original_length(config: Any) -> Iterator[None]:
    """Within: ``config``'s config-level ``original_max_position_embeddings`` is
    :data:`LONGROPE_ORIGINAL` where it keeps one. Phi-3's class puts that one in the rope
    parameters over theirs (its 128k checkpoints hold the same value in both), and the tiny
    model keeps the class default 4096, past any length the sweep runs; the patched model and
    the reference both read it from here."""
    old = getattr(config, "original_max_position_embeddings", None)
    if old is None:  # PhiMoE: the rope parameters' own, which the class copies up
        yield
        return
    config.original_max_position_embeddings = LONGROPE_ORIGINAL
    try:
        yield
    finally:
        config.original_max_position_embeddings = old
