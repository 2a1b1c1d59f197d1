"""One call puts posenc's fused rotation into a loaded transformers model, and one takes it out.

:func:`apply_posenc` patches the *instances* of one model: each attention layer gets its own copy
of its class's ``forward`` whose ``apply_rotary_pos_emb`` (the function every supported modeling
module calls by name) is posenc's fused kernel with that module's exact semantics. Nothing global
changes (other models of the same class are untouched), no weight and no ``state_dict`` entry
changes, and :func:`remove_posenc` restores the model as it was. ``scaling=`` also replaces the
model's rotary modules by :class:`~posenc.hf.rotary.HFRotaryEmbedding` with the given RoPE
scaling: context extension, equal to transformers built with the same ``rope_parameters``.

Each supported architecture is an entry of :data:`SUPPORTED`: its modeling module and, for each
rotation function it calls, how that function rotates (pairing, cos/sin table layout, output
order). At patch time each entry is checked against the installed transformers: the stock
function and posenc's are run on the same random inputs, so a transformers release that changes
a rotation is refused instead of silently patched. DeepSeek-V4 is an entry too: its one-tensor
rotation of each head's trailing rope slice (queries, the shared key/value head, compressed keys,
and the attention output's rotation by minus the angle), with its rotary modules replaced by
posenc's for both labelled rope sets (:data:`LABELLED_ROTARY_MODEL_TYPES`).
"""

from __future__ import annotations

import importlib
import inspect
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from .._checks import check_choice
from ..kernels.constants import ROTARY_BACKENDS
from .checks import check_scaling_argument
from .config import HF_ROPE_TYPES
from .detect import detected_entry
from .extension import (
    extension_layout,
    extension_overrides,
    extension_states,
    normalize_extension,
)
from .one_tensor import one_tensor_forms, one_tensor_rotation, optional_k_rotation
from .rotary import (
    ComplexRotaryEmbedding,
    HFRotaryEmbedding,
    apply_rotary_pos_emb,
)
from .scaling import check_layers, check_tables, temperature_parameters, with_temperature
from .shadow import PatchedForward, code_names, plain_function, shadow_module
from .supported import (  # noqa: F401 - SUPPORTED and the rotations are read from here too
    COHERE,
    DEEPSEEK_INTERLEAVE,
    DEEPSEEK_V4,
    GLM,
    GLM4V,
    GPT_OSS,
    HALF,
    HALF_PARTIAL,
    LABELLED_ROTARY_MODEL_TYPES,
    MSCALE_SOFTMAX_MODEL_TYPES,
    SUPPORTED,
    Rotation,
    mla_softmax_scale,
    supported_model_types,
)


def fused_rotation(
    rotation: Rotation, stock: Callable[..., Any], backend: str = "auto"
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """posenc's stand-in for the transformers function ``stock`` that rotates as ``rotation``
    says: the same signature (``q, k, cos, sin`` then ``stock``'s own optional arguments), the
    same result, computed by :func:`posenc.hf.apply_rotary_pos_emb`."""
    stock = plain_function(stock)  # transformers >= 5.25 with kernels: a module wrapping it
    if rotation.optional_k:  # Qwen4-exp: q and k, or one tensor (.optional_k)
        pair = fused_rotation(replace(rotation, optional_k=False), stock, backend)
        return _named(optional_k_rotation(rotation, stock, pair, backend), stock)  # type: ignore[no-any-return]
    if rotation.trailing or rotation.single:
        return _named(one_tensor_rotation(rotation, backend), stock)  # type: ignore[no-any-return]
    if rotation.freqs_cis:
        return _freqs_cis_rotation(rotation, stock, backend)
    extra = list(inspect.signature(stock).parameters)[4:]  # e.g. ["unsqueeze_dim"]

    def rotate(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *args: Any,
        **kw: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        unsqueeze_dim = kw.get("unsqueeze_dim", 1)
        if "unsqueeze_dim" in extra and extra.index("unsqueeze_dim") < len(args):
            unsqueeze_dim = args[extra.index("unsqueeze_dim")]
        if rotation.clockwise:
            sin = -sin
        q, k = apply_rotary_pos_emb(
            q,
            k,
            cos,
            sin,
            unsqueeze_dim,
            interleaved=rotation.interleaved,
            table_layout=rotation.table_layout,
            backend=backend,
        )
        if rotation.deinterleave:
            r = cos.shape[-1]  # [x0' x1' x2' x3' ..] -> [x0' x2' .. | x1' x3' ..]
            q = torch.cat((q[..., 0:r:2], q[..., 1:r:2], q[..., r:]), dim=-1)
            k = torch.cat((k[..., 0:r:2], k[..., 1:r:2], k[..., r:]), dim=-1)
        return q, k

    return _named(rotate, stock)


def _named(rotate: Any, stock: Callable[..., Any]) -> Any:
    """``rotate`` named and documented as posenc's stand-in for ``stock``."""
    rotate.__name__ = rotate.__qualname__ = f"posenc_{stock.__name__}"
    rotate.__doc__ = (
        f"posenc's fused stand-in for transformers' {stock.__module__}.{stock.__name__}."
    )
    return rotate


def _freqs_cis_rotation(
    rotation: Rotation, stock: Callable[..., Any], backend: str
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """posenc's stand-in for Llama-4's ``stock(xq, xk, freqs_cis)``: ``[b, s, h, d]`` tensors,
    ``freqs_cis [b, s, r/2]`` complex, whose real and imaginary parts are the cos and sin of
    each pair (times the rotary's attention scaling)."""

    seq_dim = 1 if rotation.heads_first else 2  # where the table's head axis goes

    def rotate(
        xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary_pos_emb(
            xq, xk, freqs_cis.real, freqs_cis.imag, seq_dim, interleaved=rotation.interleaved,
            table_layout="half", backend=backend,
        )  # fmt: skip

    return _named(rotate, stock)


def _probe_tables(
    rotation: Rotation, n: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random per-token cos/sin ``[2, 5, w]`` of ``n`` pairs in ``rotation``'s table layout."""
    angle = torch.randn(2, 5, n, generator=g, device="cpu") * 3  # [b, s, n], per token and pair
    if rotation.table_layout == "cat":
        angle = torch.cat((angle, angle), dim=-1)
    elif rotation.table_layout == "repeat":
        angle = angle.repeat_interleave(2, dim=-1)
    return angle.cos(), angle.sin()


def check_rotation(stock: Callable[..., Any], rotation: Rotation, where: str) -> None:
    """Run ``stock`` and posenc's stand-in on the same random inputs; raise if they differ
    (with a partial cos width too where the function passes channels through)."""
    # On the CPU whatever the ambient device (a model built under ``with torch.device("meta")``).
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=g, device="cpu")
    k = torch.randn(2, 1, 5, 8, generator=g, device="cpu")
    for n in (4, 2) if rotation.partial or rotation.trailing else (4,):  # dim 8 of 8, 4 of 8
        cos, sin = _probe_tables(rotation, n, g)
        ours: Callable[..., Any] = fused_rotation(rotation, stock, "torch")
        want: tuple[torch.Tensor, ...]
        got: tuple[torch.Tensor, ...]
        if rotation.trailing or rotation.single:  # one tensor (DeepSeek-V4 also calls -sin)
            want = (stock(q, cos, sin), stock(k, cos, -sin))
            got = (ours(q, cos, sin), ours(k, cos, -sin))
        elif rotation.freqs_cis:  # [b, s, h, d] (or [b, h, s, d]) and a complex table [b, s, r/2]
            table = torch.complex(cos, sin)
            qk = (q, k) if rotation.heads_first else (q.transpose(1, 2), k.transpose(1, 2))
            want, got = stock(*qk, table), ours(*qk, table)
        else:
            want, got = stock(q, k, cos, sin), ours(q, k, cos, sin)
        if rotation.optional_k:  # and each one-tensor form its callers use
            want = (*want, *one_tensor_forms(stock, q, cos, sin))
            got = (*got, *one_tensor_forms(ours, q, cos, sin))
        worst = max(float((w - o).abs().max()) for w, o in zip(want, got, strict=True))
        if worst > 1e-5:
            raise RuntimeError(
                f"{where} no longer rotates as posenc expects ({rotation}; max difference "
                f"{worst:.3g} on a random probe of rotary dim {2 * n} of 8): this transformers "
                "version is not supported by apply_posenc"
            )


# --- apply / remove -----------------------------------------------------------------------------


@dataclass
class PosencPatch:
    """What :func:`apply_posenc` changed on a model (kept on it as ``model.posenc_patch``)."""

    model_type: str
    backend: str
    scaling: Mapping[str, Any] | None
    extension: Mapping[str, Any] | None = None
    attention: list[nn.Module] = field(default_factory=list)
    # (layer, attribute, what it held): the layer's own forward attribute, or accelerate's
    # ``_old_forward`` under its device hook; None where the class's forward served.
    forwards: list[tuple[nn.Module, str, Any]] = field(default_factory=list)
    rotary: list[tuple[nn.Module, str, nn.Module]] = field(default_factory=list)
    softmax_scale: list[tuple[nn.Module, float]] = field(default_factory=list)
    # (attention layer, its own config): a layer given a config of its own whose rope
    # parameters its temperature reads (Ministral-3's llama_4_scaling_beta under scaling=)
    configs: list[tuple[nn.Module, Any]] = field(default_factory=list)
    # With an extension: one line per decoder layer, what the method does there (or why not).
    layers: tuple[str, ...] = ()


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if config is None or not isinstance(model, nn.Module):
        raise TypeError(
            f"apply_posenc takes a transformers model (an nn.Module with .config), got "
            f"{type(model).__name__}"
        )
    model_type = getattr(config, "model_type", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    for t in (model_type, getattr(text, "model_type", None)):
        if t in SUPPORTED:
            return t
    why = []
    for t in dict.fromkeys((getattr(text, "model_type", None), model_type)):
        entry, reason = detected_entry(t, check_rotation) if isinstance(t, str) else (None, "")
        if entry is not None:
            return t  # type: ignore[return-value]
        why.append(reason)
    reason = next((w for w in why if w), "")
    raise ValueError(
        f"apply_posenc does not support model_type {model_type!r}"
        f"{f' ({reason})' if reason else ''}; supported by name: "
        f"{', '.join(supported_model_types())}, and types whose apply_rotary_pos_emb rotates as "
        f"one of these{_what_still_works(config)}"
    )


def _what_still_works(config: Any) -> str:
    """The refusal's tail naming what posenc still does for a config it cannot patch: its
    RoPE read (``rope_from_hf``), checked (``check_rope``) and inspected, when it reads."""
    from .plan import position_plan

    try:
        position_plan(config, cache_len=1)
    except (ValueError, TypeError, KeyError, RuntimeError):
        return ""
    return (
        ". Its positions still read: posenc.hf.rope_from_hf(model.config) builds its RoPE, "
        "posenc.testing.check_rope(your_rope, model.config) checks one, and `posenc inspect` "
        "on its config.json shows every layer"
    )


def apply_posenc(
    model: nn.Module,
    *,
    scaling: Mapping[str, Any] | None = None,
    extension: Mapping[str, Any] | None = None,
    backend: str = "auto",
    scaling_layers: str = "auto",
) -> nn.Module:
    """Put posenc's fused RoPE into every attention layer of a loaded transformers model.

    Args:
        model: a transformers model (4.56+ or 5.x) of a type in :func:`supported_model_types`
            (``LlamaForCausalLM``, ``Qwen2Model``, ...). Patched in place and returned.
        scaling: None (the model's own RoPE), or rope parameters (transformers' names:
            ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}``)
            that replace the config's scaling (where ``scaling_layers`` says on a hybrid), or
            a dict of them keyed by layer type (``{"full_attention": {...}}``): context
            extension, equal to transformers built with the same ``rope_parameters``.
        extension: None, or a training-free method over key sets for the full-attention RoPE
            layers (:mod:`posenc.hf.extension`: ``{"method": "self_extend", "group_size": G,
            "neighbor_window": W}``, ``dual_chunk``, ``string``, ``rerope``, ``leaky_rerope``,
            ``logn``; not with ``scaling``; ``model.posenc_patch.layers`` says where it acts).
        backend: the kernel, as :func:`posenc.kernels.rope_qk` takes it (``"auto"``: Triton on
            GPU, the native kernel on CPU, PyTorch otherwise).
        scaling_layers: ``"auto"`` (where transformers puts a flat ``rope_scaling``: Gemma-3's
            full-attention layers), ``"full"`` or ``"all"`` (:mod:`posenc.hf.scaling`).

    DeepSeek-V4's rotary modules become posenc's too. No weight or ``state_dict`` entry changes;
    other models are untouched; :func:`remove_posenc` undoes it. Works with ``generate()``, the KV
    cache, left padding, batched ``position_ids``, float32/bfloat16, ``torch.compile`` and a
    model built on the meta device then loaded.

    >>> import torch, transformers
    >>> from posenc.hf import apply_posenc, remove_posenc
    >>> cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
    ...                                num_hidden_layers=1, num_attention_heads=2)
    >>> model = apply_posenc(transformers.LlamaForCausalLM(cfg))
    >>> model.posenc_patch.model_type, len(model.posenc_patch.attention)
    ('llama', 1)
    >>> model = remove_posenc(model)
    """
    _check_arguments(backend, scaling, scaling_layers)
    if getattr(model, "posenc_patch", None) is not None:
        raise ValueError("this model already has posenc applied: call remove_posenc(model) first")
    model_type = _model_type(model)
    modeling, rotations = _modeling(model_type)
    for name, rotation in rotations.items():  # each call: the installed transformers is checked
        check_rotation(_stock(modeling, name, model_type), rotation, f"{modeling.__name__}.{name}")
    if extension is not None:
        return _apply_extension(model, model_type, modeling, rotations, scaling, extension, backend)
    patch = PosencPatch(model_type, backend, None if scaling is None else dict(scaling))
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    if scaling is not None or model_type in LABELLED_ROTARY_MODEL_TYPES:
        swaps = _rotary_swaps(model, modeling, scaling, rotations, scaling_layers)  # no change yet
    layers = _attention_layers(model, modeling, set(rotations))
    _check_forwards(layers)
    _install(model, patch, layers, shadow_for)
    if swaps:
        _rescale(model, patch, swaps, scaling)
    return model


def _check_arguments(backend: str, scaling: Any, scaling_layers: str) -> None:
    check_choice("backend", backend, ROTARY_BACKENDS)
    check_scaling_argument(scaling, HF_ROPE_TYPES)
    check_layers(scaling_layers)


def _apply_extension(
    model: nn.Module,
    model_type: str,
    modeling: types.ModuleType,
    rotations: Mapping[str, Rotation],
    scaling: Mapping[str, Any] | None,
    extension: Mapping[str, Any],
    backend: str,
) -> nn.Module:
    """apply_posenc with ``extension=``: every check first, then the layers' forwards."""
    ext = normalize_extension(extension)
    if scaling is not None:
        raise ValueError(
            f"extension {ext['method']!r} keeps the model's own RoPE: pass scaling or extension, "
            "not both"
        )
    config: Any = model.config
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "kv_lora_rank", None):  # MLA (DeepSeek-V2/V3, MiniCPM3, GLM-4.7-Flash)
        raise ValueError(
            f"extension {ext['method']!r} on {model_type}: its multi-head latent attention "
            "(kv_lora_rank) has key and value heads of other sizes than posenc's key-set "
            "attention takes"
        )
    layout = extension_layout(rotations)
    if layout is None:
        raise ValueError(
            f"extension {ext['method']!r} supports half-split RoPE models and Llama-4's "
            f"interleaved pairs ({', '.join(extension_model_types())}); {model_type} rotates "
            "otherwise"
        )
    # the full-attention RoPE layers' own states, and a line per layer
    states, lines = extension_states(model, modeling, ext, layout)
    every = _attention_layers(model, modeling, set(rotations), strict=True)
    if any(not isinstance(getattr(x, "layer_idx", None), int) for x in every):
        raise ValueError(f"extension {ext['method']!r}: {model_type}'s layers carry no layer_idx")
    # Sliding-window and NoPE layers keep the forward they have (their window, their positions).
    layers = [x for x in every if x.layer_idx in states]
    for layer in layers:
        names = code_names(type(layer).forward)
        if not names & {"ALL_ATTENTION_FUNCTIONS", "eager_attention_forward"}:
            raise ValueError(
                f"extension {ext['method']!r}: {type(layer).__name__} does not call transformers' "
                "attention functions"
            )
    _check_forwards(layers)
    patch = PosencPatch(model_type, backend, None, ext, layers=lines)
    _install(model, patch, layers, extension_shadow_for)
    for layer in layers:
        layer.posenc_extension = states[layer.layer_idx]  # type: ignore[assignment,index]
    return model


def _stock(modeling: types.ModuleType, name: str, model_type: str) -> Callable[..., Any]:
    """``modeling.name``, the rotation posenc replaces; refused where this transformers has none
    (4.x's Qwen2-VL, Qwen2.5-VL and GLM-4V call apply_multimodal_rotary_pos_emb instead)."""
    stock = plain_function(getattr(modeling, name, None))
    if not callable(stock):
        raise RuntimeError(
            f"{modeling.__name__} has no {name}: this transformers version is not supported by "
            f"apply_posenc for model_type {model_type!r}"
        )
    return stock


def _check_forwards(layers: list[nn.Module]) -> None:
    """Refuse layers whose forward another patch or hook replaced (accelerate's is kept)."""
    for layer in layers:
        if "forward" in layer.__dict__ and "_old_forward" not in layer.__dict__:
            raise ValueError(
                f"{type(layer).__name__} of this model already has a forward of its own (another "
                "patch or hook): apply posenc first, or remove that patch"
            )


def _install(
    model: nn.Module,
    patch: PosencPatch,
    layers: list[nn.Module],
    factory: Callable[[str, str], types.ModuleType],
) -> None:
    """Give each layer a :class:`PatchedForward` reading ``factory``'s shadow (under
    accelerate's device hook, its ``_old_forward``), recorded on ``patch`` for undoing."""
    for layer in layers:
        attr = "_old_forward" if "_old_forward" in layer.__dict__ else "forward"
        patch.forwards.append((layer, attr, layer.__dict__.get(attr)))
        setattr(layer, attr, PatchedForward(layer, patch.model_type, patch.backend, factory))
        patch.attention.append(layer)
    model.posenc_patch = patch  # type: ignore[assignment]


def extension_model_types() -> list[str]:
    """The ``model_type`` values ``apply_posenc(extension=...)`` can take (one rotation, of
    half-split pairs or Llama-4's interleaved ones: :func:`~posenc.hf.extension.extension_layout`)."""
    return sorted(t for t, (_, rotations) in SUPPORTED.items() if extension_layout(rotations))


def extension_shadow_for(model_type: str, backend: str) -> types.ModuleType:
    """The shadow of ``model_type``'s modeling module for an extended model: no rotation before
    the cache, and posenc's extension attention (:mod:`posenc.hf.extension`)."""
    modeling, rotations = _modeling(model_type)
    overrides = {k: v for k, v in extension_overrides(rotations).items() if hasattr(modeling, k)}
    return shadow_module(modeling, f"{backend}_extension", overrides)


def _modeling(model_type: str) -> tuple[types.ModuleType, dict[str, Rotation]]:
    entry = SUPPORTED.get(model_type) or detected_entry(model_type, check_rotation)[0]
    if entry is None:
        raise ValueError(f"apply_posenc does not support model_type {model_type!r}")
    module_name, rotations = entry
    modeling = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    return modeling, rotations


def shadow_for(model_type: str, backend: str) -> types.ModuleType:
    """The shadow of ``model_type``'s modeling module whose rotation functions are posenc's."""
    modeling, rotations = _modeling(model_type)
    overrides = {
        name: fused_rotation(rotation, _stock(modeling, name, model_type), backend)
        for name, rotation in rotations.items()
    }
    return shadow_module(modeling, backend, overrides)


def _modeling_class(cls: type, modeling: Any) -> type | None:
    """The first class of ``cls``'s MRO defined in ``modeling`` (``cls`` itself, or the
    transformers class a user's subclass derives from), None without one or for vision towers."""
    base = next((c for c in cls.__mro__ if c.__module__ == modeling.__name__), None)
    return None if base is None or "Vision" in base.__name__ else base


def _attention_layers(
    model: nn.Module, modeling: Any, names: set[str], strict: bool = False
) -> list[nn.Module]:
    """The layers of ``modeling``'s classes (and of subclasses that inherit their forward) whose
    forward calls one of ``names``. A subclass with a forward of its own is left as it is, with
    a warning naming it (an error when ``strict``): posenc rewrites only transformers' forwards."""
    layers, own = [], set()
    for m in model.modules():
        base = _modeling_class(type(m), modeling)
        forward = getattr(base, "forward", None)
        if base is None or not code_names(forward) & names:
            continue
        if type(m).forward is forward:  # the class's or an inherited forward
            layers.append(m)
        else:
            own.add(type(m).__qualname__)
    if own and strict:
        raise ValueError(
            f"{sorted(own)} define their own forward, which posenc does not rewrite: an "
            "extension needs every attention layer patched; inherit the transformers forward"
        )
    if own:
        warnings.warn(
            f"apply_posenc left the layers of {sorted(own)} unpatched: each defines its own "
            "forward, which posenc does not rewrite (those layers keep transformers' rotation); "
            "inherit the transformers class's forward to have them patched",
            stacklevel=3,
        )
    if not layers:
        raise RuntimeError(
            f"found no attention layer of {modeling.__name__} that calls {sorted(names)} in "
            f"this {type(model).__name__}"
        )
    return layers


def _rescale(
    model: nn.Module,
    patch: PosencPatch,
    swaps: list[tuple[nn.Module, str, nn.Module]],
    scaling: Mapping[str, Any] | None,
) -> None:
    """Swap in the rescaled rotary modules (and DeepSeek-V3's softmax scale, Ministral-3's
    query temperature), keeping the old."""
    for parent, attr, new in swaps:
        patch.rotary.append((parent, attr, getattr(parent, attr)))
        setattr(parent, attr, new)
    patch.configs += with_temperature(patch.attention, temperature_parameters(model, scaling))
    if scaling is not None and patch.model_type in MSCALE_SOFTMAX_MODEL_TYPES:
        for module in patch.attention:
            if not hasattr(module, "qk_head_dim"):
                continue  # a DSA indexer: its own softmax scale reads no rope parameter
            patch.softmax_scale.append((module, float(module.scaling)))  # type: ignore[arg-type]
            scale = mla_softmax_scale(int(module.qk_head_dim), scaling)  # type: ignore[arg-type]
            setattr(module, "scaling", scale)  # noqa: B010 - a plain float attribute


# transformers 4.x's Gemma-3: a rotary module per layer type, each called without one
_LEGACY_ROTARY_TYPES = {"rotary_emb": "full_attention", "rotary_emb_local": "sliding_attention"}


def _rotary_swaps(
    model: nn.Module,
    modeling: Any,
    scaling: Mapping[str, Any] | None,
    rotations: Mapping[str, Rotation],
    scaling_layers: str = "auto",
) -> list[tuple[nn.Module, str, nn.Module]]:
    """``(parent, attribute, posenc module)`` for each text rotary module of the model (with
    the config's own scaling where ``scaling`` is None)."""
    temperature_parameters(model, scaling)  # its refusal, before anything is swapped
    table_layout = next(iter(rotations.values())).table_layout
    complex_table = any(r.freqs_cis for r in rotations.values())  # Llama-4's freqs_cis
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in model.modules():
        for attr, child in parent.named_children():
            cls = type(child)
            if (
                cls.__module__ == modeling.__name__
                and cls.__name__.endswith("RotaryEmbedding")
                and "Vision" not in cls.__name__
            ):
                config = getattr(child, "config", None) or model.config
                legacy = getattr(config, "rope_parameters", None) is None  # transformers 4.x
                layer_type = _LEGACY_ROTARY_TYPES.get(attr) if legacy else None
                new: nn.Module = HFRotaryEmbedding(
                    config, scaling, table_layout=table_layout, layer_type=layer_type,
                    scaling_layers=scaling_layers,
                )  # fmt: skip
                check_tables(child, new, cls.__name__)
                if complex_table:
                    new = ComplexRotaryEmbedding(new)  # type: ignore[arg-type]
                swaps.append((parent, attr, new))
    if not swaps:
        raise RuntimeError(f"found no rotary module of {modeling.__name__} to rescale")
    return swaps


def remove_posenc(model: nn.Module) -> nn.Module:
    """Undo :func:`apply_posenc`: the model's own forwards and rotary modules come back."""
    patch = getattr(model, "posenc_patch", None)
    if not isinstance(patch, PosencPatch):
        raise ValueError("this model has no posenc applied (apply_posenc was not called on it)")
    for layer, attr, before in patch.forwards:
        if before is None:
            layer.__dict__.pop(attr, None)
        else:
            setattr(layer, attr, before)
    for parent, attr, original in patch.rotary:
        setattr(parent, attr, original)
    for module, scale in patch.softmax_scale:
        setattr(module, "scaling", scale)  # noqa: B010 - a plain float attribute
    for module, config in patch.configs:
        module.config = config
    for layer in patch.attention:
        layer.__dict__.pop("posenc_extension", None)
    del model.posenc_patch
    return model
