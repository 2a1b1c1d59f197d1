"""Training-free long-context methods inside a loaded transformers model: attention over key sets.

``apply_posenc(model, extension={...})`` gives each full-attention RoPE layer a forward whose
modeling globals are a shadow (:mod:`.shadow`) in which

* the rotation function (``apply_rotary_pos_emb``, Llama-4's ``apply_rotary_emb``) leaves
  queries and keys unrotated, so the KV cache holds unrotated keys (a method rotates a key
  differently for different queries), and
* the attention function (``ALL_ATTENTION_FUNCTIONS`` / ``eager_attention_forward``, whichever
  the class reads) is :func:`extension_attention`, which rotates by the method's positions and
  attends over its key sets (:mod:`posenc.extend.methods.keysets` defines them;
  :mod:`posenc.extend.methods.fused` runs them, or the explicit
  :mod:`posenc.extend.methods.explicit` where the fused calls do not apply), with the layer's
  learned attention sinks (gpt-oss's ``s_aux``) and soft cap (Gemma-2) in the one softmax.

The method's settings and the model's RoPE frequencies live on each layer as
``layer.posenc_extension`` (a plain attribute: no ``state_dict`` entry). Methods
(:data:`EXTENSION_METHODS`; every one but ``logn`` also takes ``logn=L``, Su's log-length query
scale for a trained length ``L``):

* ``{"method": "self_extend", "group_size": G, "neighbor_window": W}``
* ``{"method": "dual_chunk", "chunk_size": C, "local_size": S}`` (Qwen2.5-1M's
  ``dual_chunk_attention_config`` reads as this: :func:`extension_from_config`).
* ``{"method": "string", "shifted_offset": S, "local_window": W}`` (and ``attention_factor``)
* ``{"method": "rerope", "window": w}``
* ``{"method": "leaky_rerope", "window": w, "k": k}``
* ``{"method": "logn", "length": L}``: RoPE attention with the log-length query scale alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..extend.methods.fused import keyset
from ..extend.methods.keysets import key_sets
from .supported import Rotation


@dataclass(frozen=True)
class Option:
    """An option of an extension method: an integer at least ``low`` (``real``: a finite number
    above ``low``), ``required`` or else left out (then the method does without it)."""

    low: int
    real: bool = False
    required: bool = True

    def describe(self) -> str:
        return f"a number > {self.low}" if self.real else f"an integer in [{self.low}, {MAX_INT}]"


#: The largest integer option: positions and their groups are int64 tensors in the forward, and
#: no length a model runs at comes near 2**31 (10**30 would overflow there, not here).
MAX_INT = 2**31 - 1


_LOGN = Option(2, required=False)  # Su's log-length query scale: the trained length

#: method -> its options.
EXTENSION_METHODS: dict[str, dict[str, Option]] = {
    "self_extend": {"group_size": Option(1), "neighbor_window": Option(1), "logn": _LOGN},
    "dual_chunk": {"chunk_size": Option(2), "local_size": Option(0), "logn": _LOGN},
    "string": {
        "shifted_offset": Option(1),
        "local_window": Option(0),
        "attention_factor": Option(0, real=True, required=False),
        "logn": _LOGN,
    },
    "rerope": {"window": Option(1), "logn": _LOGN},
    "leaky_rerope": {"window": Option(1), "k": Option(1), "logn": _LOGN},
    "logn": {"length": Option(2)},
}

# RoPE types whose frequencies change with the sequence length: the methods rotate by the
# frequencies read once at patch time, which these types do not have.
_LENGTH_DEPENDENT = ("dynamic", "longrope")


@dataclass(frozen=True)
class ExtensionState:
    """What one patched layer's attention needs: the method, its options, the model's RoPE."""

    method: str
    options: Mapping[str, int | float]
    inv_freq: torch.Tensor  # [r/2] float32: the model's frequencies
    attention_scaling: float  # the model's cos/sin factor (1.0 but for YaRN-like types)
    layout: str = "half"


def normalize_extension(extension: Mapping[str, Any]) -> dict[str, Any]:
    """Check an ``extension=`` dict and return it with plain ints; one-line errors.

    >>> normalize_extension({"method": "self_extend", "group_size": 4, "neighbor_window": 64})
    {'method': 'self_extend', 'group_size': 4, 'neighbor_window': 64}
    >>> normalize_extension({"method": "leaky_rerope", "window": 512, "k": 16})
    {'method': 'leaky_rerope', 'window': 512, 'k': 16}
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
    missing = sorted(n for n, o in wanted.items() if o.required and n not in extension)
    if unknown or missing:
        takes = [n if o.required else f"{n} (optional)" for n, o in wanted.items()]
        raise ValueError(
            f"extension {method!r} takes {', '.join(takes)}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
            + (f"; missing: {', '.join(missing)}" if missing else "")
        )
    out: dict[str, Any] = {"method": method}
    for name in wanted:
        if name in extension:
            out[name] = extension_option(method, name, extension[name])
    _cross_check(out)
    return out


def _cross_check(ext: dict[str, Any]) -> None:
    """The checks between one method's options (each alone is checked already)."""
    method = ext["method"]
    if method == "dual_chunk" and ext["local_size"] >= ext["chunk_size"] - 1:
        raise ValueError(
            f"dual_chunk local_size ({ext['local_size']}) must be below chunk_size - 1 "
            f"({ext['chunk_size'] - 1}): the chunk length is chunk_size - local_size"
        )
    if method == "string" and ext["local_window"] >= ext["shifted_offset"]:
        raise ValueError(
            f"string local_window ({ext['local_window']}) must be below shifted_offset "
            f"({ext['shifted_offset']}): a far key (d >= shifted_offset) is seen at d - "
            "shifted_offset + local_window, which must be nearer than d (equal: plain RoPE)"
        )


def extension_option(method: str, name: str, value: Any) -> int | float:
    """``value`` as option ``name`` of ``method`` takes it: an integer at or above its bound (a
    bool, a float such as 2.7 or 2.0, a string or a list is refused, naming the option), or for
    a real option a finite number above its bound (inf, NaN refused)."""
    option = EXTENSION_METHODS[method][name]
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if option.real and number and math.isfinite(value) and value > option.low:
        return float(value)
    if not option.real and number and isinstance(value, int) and option.low <= value <= MAX_INT:
        return int(value)
    raise ValueError(f"{method} {name} must be {option.describe()}, got {value!r}")


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
    sinks = kwargs.get("s_aux")  # gpt-oss's learned sinks, one logit per head
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
        "sinks": sinks,
    }
    # fused attention calls merged by their log-sum-exp where they apply, else the explicit path
    sets = key_sets(state.method, state.options)
    out = keyset(query, key, value, q_pos, sets=sets, **common)  # [b, h, s, d]
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
    q: torch.Tensor, k: torch.Tensor, *a: Any, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rotary_pos_emb`` (or Llama-4's ``apply_rotary_emb``) of an extended layer: the
    rotation waits for the attention."""
    return q, k


def unrotated_one(x: torch.Tensor, *a: Any, **kw: Any) -> torch.Tensor:
    """A one-tensor rotation (Gemma-3n's) of an extended layer: the rotation waits too."""
    return x


ATTENTION_OVERRIDES: dict[str, Any] = {
    "ALL_ATTENTION_FUNCTIONS": _Attentions(),
    "eager_attention_forward": extension_attention,
}


def extension_layout(rotations: Mapping[str, Rotation]) -> str | None:
    """The pairs an extended model's rotation turns (``"half"``: ``(x[i], x[i + r/2])``,
    ``"interleaved"``: ``(x[2i], x[2i+1])``, pair ``i`` at frequency ``i``), or None for a
    rotation the methods do not reproduce (several functions; trailing, de-interleaved, or
    repeated-table interleaved pairs)."""
    if len(rotations) != 1:
        return None
    (rotation,) = rotations.values()
    if rotation.trailing or rotation.deinterleave or rotation.clockwise:
        return None
    if not rotation.interleaved:
        return "half"
    return "interleaved" if rotation.freqs_cis else None


def extension_overrides(rotations: Mapping[str, Rotation]) -> dict[str, Any]:
    """The shadow's names for an extended layer: each rotation the identity of its form, and the
    attention functions :func:`extension_attention`."""
    same = {n: unrotated_one if r.single else unrotated for n, r in rotations.items()}
    return {**same, **ATTENTION_OVERRIDES}


#: Layer types whose attention reads only the keys an indexer picks (Kolibri's, Dots-3's
#: ``indexed_attention``; DeepSeek-V4's and MiniMax-M3's compressed sparse layers): the key-set
#: methods, which attend over every key, are refused there.
SPARSE_LAYER_TYPES = frozenset({"indexed_attention", "compressed_sparse_attention",
                                "heavily_compressed_attention", "minimax_m3_sparse"})  # fmt: skip


def extension_states(
    model: nn.Module, modeling: Any, extension: dict[str, Any], layout: str = "half"
) -> tuple[dict[int, ExtensionState], tuple[str, ...]]:
    """``({layer index: ExtensionState}, one line per layer)`` for the layers the method acts
    on, or a one-line refusal of what in this model it cannot apply to.

    The method acts on the **full-attention layers with RoPE** (:func:`~posenc.hf.position_plan`
    reads them, as transformers builds them): a sliding-window or chunked layer never sees a
    distance past its window (its own mask stays, exactly as transformers has it), a NoPE layer
    has no positions (Llama-4's keep their query temperature), a linear-attention layer
    (Qwen3-Next's Gated DeltaNet) no softmax over keys; they keep their own attention, and the
    lines (:func:`describe_layers`) say so per layer. Each acted-on layer rotates by its own layer
    type's frequencies, read from the model's rotary module (``inv_freq``, or Gemma-3's
    ``full_attention_inv_freq``), in the pairs ``layout`` names."""
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
    sparse = sorted({x.layer_type for x in targets} & SPARSE_LAYER_TYPES)
    if sparse:
        raise ValueError(
            f"{method} on {model_type}: its {', '.join(sparse)} layers attend to the keys a learned "
            f"indexer selects; {method}'s key sets over every key would replace that selection"
        )
    rotary = _text_rotary(model, modeling, method, model_type)
    options = {k: v for k, v in extension.items() if k != "method"}
    states: dict[int, ExtensionState] = {}
    for layer in targets:
        per_type = isinstance(getattr(rotary, "rope_type", None), dict)
        prefix = f"{layer.layer_type}_" if per_type else ""
        rope_type = rotary.rope_type[layer.layer_type] if per_type else rotary.rope_type  # type: ignore[index]
        if rope_type in _LENGTH_DEPENDENT:
            raise ValueError(
                f"{method} rotates by fixed frequencies; this model's rope_type {rope_type!r} "
                "changes them with the length"
            )
        inv_freq = _frequencies(rotary, prefix, method, model_type)
        scaling = float(getattr(rotary, f"{prefix}attention_scaling", 1.0))
        states[layer.index] = ExtensionState(method, options, inv_freq, scaling, layout)
    return states, describe_layers(plan, method, set(states))


def _text_rotary(model: nn.Module, modeling: Any, method: str, model_type: str) -> nn.Module:
    """The one text rotary module of ``model`` (a refusal where there is none, or several)."""
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
    return rotaries[0]


def _frequencies(rotary: nn.Module, prefix: str, method: str, model_type: str) -> torch.Tensor:
    """The rotary module's ``{prefix}inv_freq`` as float32 (a refusal where it has none)."""
    inv_freq = getattr(rotary, f"{prefix}inv_freq", None)
    if not isinstance(inv_freq, torch.Tensor):
        raise ValueError(
            f"{method} needs the rotary module's {prefix}inv_freq; this {model_type}'s "
            f"{type(rotary).__name__} has none"
        )
    if inv_freq.device.type == "meta":
        raise ValueError(f"{method} needs the model's weights loaded (its inv_freq is on meta)")
    return inv_freq.detach().to(torch.float32)


def describe_layers(plan: Any, method: str, acted: set[int]) -> tuple[str, ...]:
    """One line per layer of ``plan``: the method where it acts (``acted``), else why the layer
    keeps its own attention.

    >>> from posenc.hf import position_plan
    >>> plan = position_plan({"model_type": "qwen3_next", "num_hidden_layers": 2, "hidden_size": 64,
    ...                       "num_attention_heads": 4, "head_dim": 16,
    ...                       "layer_types": ["linear_attention", "full_attention"]})
    >>> describe_layers(plan, "string", {1})[0]
    'layer 0 (linear_attention): untouched: it attends to no keys by softmax'
    """
    lines = []
    for x in plan.layers:
        head = f"layer {x.index} ({x.layer_type}): "
        if x.index in acted:
            lines.append(head + f"{method} (full attention with RoPE)")
        elif x.span == "none":
            lines.append(head + "untouched: it attends to no keys by softmax")
        elif not x.uses_rope:
            extra = ", its query temperature kept" if x.temperature is not None else ""
            lines.append(head + f"untouched: no RoPE, no positions to change{extra}")
        else:
            lines.append(head + f"untouched: its {_describe(x)} never sees a longer distance")
    return tuple(lines)


def _describe(layer: Any) -> str:
    """A layer's kind as a refusal names it."""
    if isinstance(layer.span, tuple):
        kind = f"{layer.span[0]} window {layer.span[1]}"
    else:
        kind = {"full": "full attention", "none": "no attention"}[layer.span]
    return kind + ("" if layer.uses_rope else " without RoPE")
