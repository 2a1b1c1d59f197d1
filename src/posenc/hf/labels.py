"""Rope sets a model names by label rather than by layer type, read from transformers' code.

Two kinds of model keep more than one rotation that per-layer-type parameters do not describe:

* **DeepSeek-V4** keys its ``rope_parameters`` by label, ``"main"`` (plain RoPE, ``rope_theta``)
  and ``"compress"`` (``compress_rope_theta``, with the file's YaRN whose ``attention_factor``
  transformers forces to 1.0: the reference does not scale cos/sin). Sliding-window layers read
  ``main``; the compressed layers (CSA, HCA), their compressors and indexers read ``compress``.
  Each head is laid out ``[nope | rope]``: interleaved pairs on the *trailing* rope slice, applied
  to the shared key/value tensor and undone on the attention output (rotation by minus the
  angle): :func:`posenc.rotary.rotate_trailing` does both.
* **DeepSeek-V3.2 / GLM-MoE-DSA sparse-attention indexers** rotate the *leading*
  ``qk_rope_head_dim`` channels of their own ``index_head_dim`` heads (``[rope | nope]``) with the
  main attention's frequencies, but their own pairing: half-split in DeepSeek-V3.2 while its MLA
  is interleaved, interleaved in GLM-MoE-DSA.

Each is an entry of :data:`LABELLED_ROPES`; :func:`~posenc.hf.rope_from_hf` takes the label where
it takes a layer type (``rope_from_hf(config, "compress")``, ``rope_from_hf(config, "indexer")``),
as transformers' own ``DeepseekV4RotaryEmbedding.forward(x, position_ids, layer_type)`` does, and a
DeepSeek-V4 layer type resolves to its label (:data:`LAYER_TYPE_LABELS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RopeLabel:
    """How one labelled rope set differs from a config's plain reading.

    ``params``: the key of the nested ``rope_parameters`` it reads (None: the flat set);
    ``rope_slice``: ``"trailing"`` for heads laid out ``[nope | rope]`` (the module takes the
    whole head and rotates its last ``rotary_dim`` channels), ``"leading"`` otherwise; ``layout``:
    the pairing when it is not the architecture's; ``head_dim_key``: the config key of the head
    it rotates when that is not the attention's (``index_head_dim``).
    """

    params: str | None = None
    rope_slice: str = "leading"
    layout: str | None = None
    head_dim_key: str | None = None

    def apply(self, kw: dict[str, Any], cfg: Any) -> dict[str, Any]:
        """The posenc arguments of this set from those of its parameter set ``kw``."""
        out = {**kw, "rope_slice": self.rope_slice}
        if self.layout is not None:
            out["layout"] = self.layout
        if self.head_dim_key is not None:
            head_dim = cfg.get(self.head_dim_key) if isinstance(cfg, Mapping) else None
            head_dim = getattr(cfg, self.head_dim_key, head_dim)
            if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
                raise ValueError(
                    f"{self.head_dim_key} must be a positive integer, got {head_dim!r}"
                )
            if head_dim < out["rotary_dim"]:
                raise ValueError(
                    f"{self.head_dim_key} ({head_dim}) must be >= the rotary dim "
                    f"({out['rotary_dim']}) it rotates"
                )
            out["head_dim"] = head_dim
        return out


_DS4 = {
    "main": RopeLabel("main", "trailing"),
    "compress": RopeLabel("compress", "trailing"),
    # DeepseekV4Indexer's own rotary: compress, on its index_head_dim heads
    "indexer": RopeLabel("compress", "trailing", head_dim_key="index_head_dim"),
}
#: model_type -> {label: :class:`RopeLabel`}.
LABELLED_ROPES: dict[str, dict[str, RopeLabel]] = {
    "deepseek_v4": _DS4,
    # DeepseekV32Indexer: "NON-interleaved (half-split) RoPE, unlike the main MLA attention"
    "deepseek_v32": {"indexer": RopeLabel(layout="half", head_dim_key="index_head_dim")},
    # GlmMoeDsaIndexer: apply_rotary_pos_emb_interleave, like its MLA
    "glm_moe_dsa": {"indexer": RopeLabel(layout="interleaved", head_dim_key="index_head_dim")},
}
#: model_type -> {layer type: the label its attention reads} (DeepseekV4Attention.rope_layer_type).
LAYER_TYPE_LABELS: dict[str, dict[str, str]] = {
    "deepseek_v4": {
        "sliding_attention": "main",
        "compressed_sparse_attention": "compress",
        "heavily_compressed_attention": "compress",
    },
}


def rope_label(
    model_types: frozenset[str], layer_type: str | None
) -> tuple[RopeLabel | None, str | None]:
    """``(label spec or None, rope-parameter key to read)`` for ``layer_type``, which may be a
    label or a layer type that maps to one; ``(None, layer_type)`` for an ordinary model."""
    for model_type in sorted(model_types & LABELLED_ROPES.keys()):
        labels = LABELLED_ROPES[model_type]
        name = LAYER_TYPE_LABELS.get(model_type, {}).get(layer_type or "", layer_type)
        if name in labels:
            return labels[name], labels[name].params
        if model_type in LAYER_TYPE_LABELS:
            raise ValueError(
                f"model_type {model_type!r} keeps its rope parameters by label: pass one of "
                f"{sorted(labels)} or a layer type of {sorted(LAYER_TYPE_LABELS[model_type])}, "
                f"got {layer_type!r}"
            )
    return None, layer_type


def rope_labels(model_types: frozenset[str]) -> tuple[str, ...]:
    """The labels :func:`~posenc.hf.rope_from_hf` takes for these model types (may be empty)."""
    return tuple(
        sorted({k for t in model_types & LABELLED_ROPES.keys() for k in LABELLED_ROPES[t]})
    )


# --- DeepSeek-V4's config class, for reading a dict without transformers ------------------------

_DS4_COMPRESS_RATIO_TYPES = {
    0: "sliding_attention",
    4: "compressed_sparse_attention",
    128: "heavily_compressed_attention",
}


def deepseek_v4_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """What ``DeepseekV4Config.__post_init__`` derives, on a ``config.json`` dict: the
    ``partial_rotary_factor`` of ``qk_rope_head_dim / head_dim``, the layer types of
    ``compress_ratios`` and the ``main`` / ``compress`` rope sets (YaRN on ``compress`` only, with
    ``attention_factor`` 1.0 unless the file gives one)."""
    cfg = dict(cfg)
    cfg.setdefault("head_dim", 512)
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("compress_rope_theta", 160000.0)
    cfg.setdefault("num_hidden_layers", 43)
    cfg.setdefault("index_head_dim", 128)
    rope_dim = cfg.pop("qk_rope_head_dim", None)  # a legacy key: not MLA's head_dim rule here
    if cfg.get("partial_rotary_factor") is None:
        cfg["partial_rotary_factor"] = 64 / 512 if rope_dim is None else rope_dim / cfg["head_dim"]
    ratios = cfg.get("compress_ratios")
    if cfg.get("layer_types") is None and ratios is not None:
        cfg["layer_types"] = [_DS4_COMPRESS_RATIO_TYPES[r] for r in ratios]
    if cfg.get("layer_types") is not None:  # the class keeps the first num_hidden_layers
        # (the published files list num_hidden_layers + 1 compress_ratios)
        cfg["layer_types"] = list(cfg["layer_types"][: cfg["num_hidden_layers"]])
    given = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if isinstance(given.get("main"), Mapping) and isinstance(given.get("compress"), Mapping):
        sets = {"main": dict(given["main"]), "compress": dict(given["compress"])}
    else:
        partial = cfg["partial_rotary_factor"]
        yarn = {k: v for k, v in given.items() if k not in ("main", "compress")}
        compress = {
            **yarn,
            "rope_theta": cfg["compress_rope_theta"],
            "partial_rotary_factor": partial,
        }
        compress.setdefault("rope_type", compress.get("type", "default"))
        if compress["rope_type"] == "yarn":
            compress.setdefault("attention_factor", 1.0)
        main = {
            "rope_type": "default",
            "rope_theta": cfg["rope_theta"],
            "partial_rotary_factor": partial,
        }
        sets = {"main": main, "compress": compress}
    cfg["rope_parameters"] = sets
    cfg.pop("rope_scaling", None)
    return cfg


#: model_type -> the config class's derivations on a dict (the reader without transformers).
LABELLED_DEFAULTS = {"deepseek_v4": deepseek_v4_defaults}
