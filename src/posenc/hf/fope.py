"""FoPE from a Hugging Face config: :func:`fope_from_hf` (Intern-S1-Pro's ``config.json``).

Intern-S1-Pro (``model_type`` ``interns1_pro``, text ``interns1_pro_text``; remote code, not in
transformers) marks FoPE in its ``rope_scaling``: ``{"rope_type": "default", "fope_init_factor":
0.5, "fope_sep_head": true, "num_inv_freq": null}``. Its cos/sin mix learned coefficients, so
:func:`~posenc.hf.rope_from_hf` refuses these configs (no rotary module reproduces them without
the weights) and :func:`fope_from_hf` builds the :class:`~posenc.rotary.fope.FoPE` whose
``cos_coef`` / ``sin_coef`` take the checkpoint's ``...rotary_emb.cos_coef`` / ``sin_coef``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..rotary.fope import FoPE
from .load import resolve_config

#: The ``rope_scaling`` keys that turn FoPE on in the released modeling code.
FOPE_KEYS = ("fope_init_factor", "fope_sep_head", "num_inv_freq")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)


def _text(config: Any) -> Any:
    text = _get(config, "text_config")
    return config if text is None else text


def uses_fope(config: Any) -> bool:
    """Whether a config's ``rope_scaling`` (or ``rope_parameters``) carries FoPE's keys."""
    text = _text(resolve_config(config))
    rope = _get(text, "rope_scaling") or _get(text, "rope_parameters") or {}
    return isinstance(rope, Mapping) and any(rope.get(k) is not None for k in FOPE_KEYS)


def fope_from_hf(config: Any) -> FoPE:
    """The FoPE of an Intern-S1-Pro config (a ``config.json`` dict, its ``text_config``, a config
    object, or a path / model id as :func:`~posenc.hf.load.resolve_config` takes).

    Reads ``head_dim`` (else ``hidden_size / num_attention_heads``), ``num_key_value_heads``,
    ``rope_theta``, ``max_position_embeddings`` and the FoPE keys of ``rope_scaling``. The
    released code filters the frequencies only for ``rope_type`` ``"default"`` and initializes
    with ``fope_init_factor``, so both are required.

    >>> from posenc.hf import fope_from_hf
    >>> fope = fope_from_hf({"head_dim": 128, "num_attention_heads": 64, "num_key_value_heads": 4,
    ...     "rope_theta": 5000000, "max_position_embeddings": 262144, "rope_scaling": {
    ...     "rope_type": "default", "fope_init_factor": 0.5, "fope_sep_head": True,
    ...     "num_inv_freq": None}})
    >>> tuple(fope.cos_coef.shape)
    (4, 45, 45)
    """
    text = _text(resolve_config(config))
    rope = _get(text, "rope_scaling") or _get(text, "rope_parameters") or {}
    if not isinstance(rope, Mapping) or not any(rope.get(k) is not None for k in FOPE_KEYS):
        raise ValueError(f"config has no FoPE: its rope_scaling sets none of {list(FOPE_KEYS)}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(
            f"FoPE is reproduced for rope_type 'default' (Intern-S1-Pro's), got {rope_type!r}"
        )
    factor = rope.get("fope_init_factor")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ValueError(f"rope_scaling['fope_init_factor'] must be a number, got {factor!r}")
    head_dim = _get(text, "head_dim")
    if head_dim is None:
        head_dim = _get(text, "hidden_size") // _get(text, "num_attention_heads")
    return FoPE(
        head_dim,
        _get(text, "num_key_value_heads") or _get(text, "num_attention_heads"),
        _get(text, "rope_theta", 10000.0),
        _get(text, "max_position_embeddings"),
        num_inv_freq=rope.get("num_inv_freq"),
        sep_head=bool(rope.get("fope_sep_head", False)),
        init_factor=float(factor),
    )
