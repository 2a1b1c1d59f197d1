"""Self-Extend and Dual Chunk Attention inside a loaded transformers model.

``apply_posenc(model, extension={...})`` gives each attention layer a forward whose modeling
globals are a shadow (:mod:`.shadow`) in which

* ``apply_rotary_pos_emb`` leaves queries and keys unrotated, so the KV cache holds unrotated
  keys (both methods rotate a key differently for different queries), and
* the attention function (``ALL_ATTENTION_FUNCTIONS`` / ``eager_attention_forward``, whichever
  the class reads) is :func:`extension_attention`, which rotates by the method's positions and
  attends over its key sets (:mod:`posenc.extend.methods.fused`, or the explicit
  :mod:`posenc.extend.methods.explicit` where the fused calls do not apply).

The method's settings and the model's RoPE frequencies live on each layer as
``layer.posenc_extension`` (a plain attribute: no ``state_dict`` entry). Methods:

* ``{"method": "self_extend", "group_size": G, "neighbor_window": W}``
* ``{"method": "dual_chunk", "chunk_size": C, "local_size": S}`` (Qwen2.5-1M's
  ``dual_chunk_attention_config`` reads as this: :func:`extension_from_config`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..extend.methods.fused import dual_chunk, self_extend

#: method -> (required integer options, their lower bounds).
EXTENSION_METHODS: dict[str, dict[str, int]] = {
    "self_extend": {"group_size": 1, "neighbor_window": 1},
    "dual_chunk": {"chunk_size": 2, "local_size": 0},
}

# RoPE types whose frequencies change with the sequence length: the methods rotate by the
# frequencies read once at patch time, which these types do not have.
_LENGTH_DEPENDENT = ("dynamic", "longrope")


@dataclass(frozen=True)
class ExtensionState:
    """What one patched layer's attention needs: the method, its options, the model's RoPE."""

    method: str
    options: Mapping[str, int]
    inv_freq: torch.Tensor  # [r/2] float32: the model's frequencies
    attention_scaling: float  # the model's cos/sin factor (1.0 but for YaRN-like types)
    layout: str = "half"


def normalize_extension(extension: Mapping[str, Any]) -> dict[str, Any]:
    """Check an ``extension=`` dict and return it with plain ints; one-line errors.

    >>> normalize_extension({"method": "self_extend", "group_size": 4, "neighbor_window": 64})
    {'method': 'self_extend', 'group_size': 4, 'neighbor_window': 64}
    """
    if not isinstance(extension, Mapping):
        raise TypeError(f"extension must be a dict with a 'method', got {type(extension).__name__}")
    method = extension.get("method")
    if method not in EXTENSION_METHODS:
        raise ValueError(
            f"extension method must be one of {', '.join(map(repr, EXTENSION_METHODS))}, "
            f"got {method!r}"
        )
    wanted = EXTENSION_METHODS[method]
    unknown = sorted(set(extension) - {"method", *wanted})
    missing = sorted(set(wanted) - set(extension))
    if unknown or missing:
        raise ValueError(
            f"extension {method!r} takes {', '.join(wanted)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    out: dict[str, Any] = {"method": method}
    for name in wanted:
        out[name] = extension_option(method, name, extension[name])
    if method == "dual_chunk" and out["local_size"] >= out["chunk_size"] - 1:
        raise ValueError(
            f"dual_chunk local_size ({out['local_size']}) must be below chunk_size - 1 "
            f"({out['chunk_size'] - 1}): the chunk length is chunk_size - local_size"
        )
    return out


def extension_option(method: str, name: str, value: Any) -> int:
    """``value`` as option ``name`` of ``method`` takes it: an integer at or above its bound (a
    bool, a float such as 2.7 or 2.0, a string or a list is refused, naming the option)."""
    low = EXTENSION_METHODS[method][name]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{method} {name} must be an integer >= {low}, got {value!r}")
    return int(value)


def extension_from_config(config: Any) -> dict[str, Any] | None:
    """The ``dual_chunk`` extension a config ships (``dual_chunk_attention_config``, as
    Qwen2.5-7B-Instruct-1M's ``config.json``), or None."""
    get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
    dca = get("dual_chunk_attention_config", None)
    if not dca:  # absent, null, false or {}: the model ships none
        return None
    if not isinstance(dca, Mapping) or not {"chunk_size", "local_size"} <= set(dca):
        raise ValueError(
            "dual_chunk_attention_config must be a dict with chunk_size and local_size (integers),"
            f" got {dca!r}"
        )
    return normalize_extension(
        {"method": "dual_chunk", "chunk_size": dca["chunk_size"], "local_size": dca["local_size"]}
    )


def _keep_mask(mask: torch.Tensor | None, t: int) -> torch.Tensor | None:
    """transformers' attention mask as bool ``[b, 1, s | 1, t]`` (True: attend), or None."""
    if mask is None:
        return None
    if mask.dim() == 2:  # [b, t'] padding mask (flash-attention implementations)
        return mask[:, None, None, :t].bool()
    m = mask[..., :t]  # [b, 1, s, t]: a static cache's mask may be longer than the keys
    if m.dtype == torch.bool:
        return m
    return m > torch.finfo(m.dtype).min / 2  # additive: 0 kept, the dtype's lowest masked


def extension_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over unrotated ``query [b, h, s, d]``,
    ``key, value [b, hk, t, d]`` -> ``([b, s, h, d], None)``."""
    state: ExtensionState = module.posenc_extension  # type: ignore[assignment]
    if kwargs.get("sliding_window") is not None:  # sliding layers are never patched
        raise ValueError(f"{state.method} does not apply to sliding-window attention")
    if dropout and module.training:
        raise ValueError(f"{state.method} is for inference: call model.eval() first")
    b, _, s, _ = query.shape
    t = key.shape[2]
    q_pos = kwargs.get("position_ids")
    if q_pos is None:  # no positions given: the queries are the cache's last s slots
        q_pos = torch.arange(t - s, t, device=query.device)[None]
    q_pos = q_pos.to(torch.long).expand(b, s)  # [b, s]
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    common: dict[str, Any] = {
        "inv_freq": state.inv_freq,
        "scale": scale,
        "keep": _keep_mask(attention_mask, t),
        "attention_scaling": state.attention_scaling,
        "layout": state.layout,
        "softcap": kwargs.get("softcap"),  # Gemma-2's attn_logit_softcapping
    }
    # fused attention calls merged by their log-sum-exp where they apply, else the explicit path
    run: Callable[..., torch.Tensor] = self_extend if state.method == "self_extend" else dual_chunk
    out = run(query, key, value, q_pos, **state.options, **common)  # [b, h, s, d]
    return out.transpose(1, 2).contiguous(), None


class _Attentions:
    """Stands in for ``ALL_ATTENTION_FUNCTIONS`` in a shadow: every implementation is ours."""

    def get_interface(self, attn_implementation: str, default: Callable[..., Any]) -> Any:
        return extension_attention

    def __getitem__(self, key: str) -> Any:
        return extension_attention

    def get(self, key: str, default: Any = None) -> Any:
        return extension_attention


def unrotated(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *a: Any, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rotary_pos_emb`` of an extended layer: the rotation waits for the attention."""
    return q, k


EXTENSION_OVERRIDES: dict[str, Any] = {
    "apply_rotary_pos_emb": unrotated,
    "ALL_ATTENTION_FUNCTIONS": _Attentions(),
    "eager_attention_forward": extension_attention,
}


def extension_states(
    model: nn.Module, modeling: Any, extension: dict[str, Any]
) -> dict[int, ExtensionState]:
    """``{layer index: ExtensionState}`` for the layers the method acts on, or a one-line refusal
    of what in this model it cannot apply to.

    The method acts on the **full-attention layers with RoPE** (:func:`~posenc.hf.position_plan`
    reads them, as transformers builds them): a sliding-window or chunked layer never sees a
    distance past its window, and a NoPE layer has no positions; they keep their own attention.
    Each acted-on layer rotates by its own layer type's frequencies, read from the model's
    rotary module (``inv_freq``, or Gemma-3's ``full_attention_inv_freq``)."""
    from .plan import position_plan

    text = model.config.get_text_config(decoder=True)  # type: ignore[union-attr,operator]
    model_type = getattr(text, "model_type", "?")
    method = extension["method"]
    plan = position_plan(text, cache_len=1)
    targets = [x for x in plan.layers if x.span == "full" and x.uses_rope]
    if not targets:
        kinds = sorted({_describe(x) for x in plan.layers})
        raise ValueError(
            f"{method} acts on full-attention layers with RoPE, and this {model_type} has none "
            f"({', '.join(kinds)}): no layer sees positions past what it was trained on"
        )
    rotaries = [
        m
        for m in model.modules()
        if type(m).__module__ == modeling.__name__
        and type(m).__name__.endswith("RotaryEmbedding")
        and "Vision" not in type(m).__name__
    ]
    if len(rotaries) != 1:
        raise ValueError(
            f"{method} needs one text rotary module; this {model_type} has {len(rotaries)}"
        )
    rotary = rotaries[0]
    options = {k: v for k, v in extension.items() if k != "method"}
    states: dict[int, ExtensionState] = {}
    for layer in targets:
        per_type = isinstance(getattr(rotary, "rope_type", None), dict)
        prefix = f"{layer.layer_type}_" if per_type else ""
        inv_freq = getattr(rotary, f"{prefix}inv_freq", None)
        if not isinstance(inv_freq, torch.Tensor):
            raise ValueError(
                f"{method} needs the rotary module's {prefix}inv_freq; this {model_type}'s "
                f"{type(rotary).__name__} has none"
            )
        rope_type = rotary.rope_type[layer.layer_type] if per_type else rotary.rope_type  # type: ignore[index]
        if rope_type in _LENGTH_DEPENDENT:
            raise ValueError(
                f"{method} rotates by fixed frequencies; this model's rope_type {rope_type!r} "
                "changes them with the length"
            )
        inv_freq = inv_freq.detach().to(torch.float32)
        if inv_freq.device.type == "meta":
            raise ValueError(f"{method} needs the model's weights loaded (its inv_freq is on meta)")
        scaling = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        states[layer.index] = ExtensionState(method, options, inv_freq, scaling)
    return states


def _describe(layer: Any) -> str:
    """A layer's kind as a refusal names it."""
    if isinstance(layer.span, tuple):
        kind = f"{layer.span[0]} window {layer.span[1]}"
    else:
        kind = {"full": "full attention", "none": "no attention"}[layer.span]
    return kind + ("" if layer.uses_rope else " without RoPE")
