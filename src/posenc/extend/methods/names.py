"""Context-extension methods by name, with options: what ``posenc extend --methods`` reads.

A method is ``name`` or ``name:key=value:key=value`` (values JSON: numbers, lists), several
separated by commas outside brackets::

    none,linear,yarn:factor=2,self_extend:group_size=4:neighbor_window=1024

Names: ``none`` (the model as trained, extrapolating), every RoPE scaling type posenc and
transformers share (``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``; options
are that type's keys, the factor defaulting to target length / trained length), and the attention
methods over key sets ``self_extend``, ``dual_chunk``, ``string``, ``rerope``, ``leaky_rerope``
and ``logn`` (:mod:`posenc.hf.extension`; defaults in
:data:`~posenc.extend.methods.keysets.DEFAULTS`: the authors' where they give one, else chosen so
the largest position a query sees stays inside the trained length).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..._ints import check_int_in
from ...functional.rope_scaling import KEY_CHECKS, ROPE_SCALING, extension_scaling
from ...hf.extension import EXTENSION_METHODS, MAX_INT, extension_option, normalize_extension
from ...hf.scaling import check_layers, is_keyed, scaling_by_layer_type
from .keysets import DEFAULTS

#: Beside a scaling whose every length is within the trained length: its factor is 1, so it is
#: the model as trained (the same numbers as ``none``, not a measurement of the method).
IDENTITY_NOTE = " (= none: within the trained length)"

#: The RoPE scaling types a method may name (``default`` is ``none``; ``proportional`` keeps
#: the trained length by construction and extends nothing).
SCALING_METHODS: tuple[str, ...] = ("linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
METHOD_NAMES: tuple[str, ...] = ("none", *SCALING_METHODS, *EXTENSION_METHODS)


@dataclass(frozen=True)
class Method:
    """A method as the user named it: ``name`` and the options given (not yet resolved)."""

    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``name`` or ``name:key=value:...`` as it was written (the row's ``method``)."""
        extra = "".join(
            f":{k}={json.dumps(v, separators=(',', ':'))}" for k, v in self.options.items()
        )
        return self.name + extra


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def parse_method(text: str) -> Method:
    """One method from ``name[:key=value...]``; an unknown name or a bad option is one line."""
    name, *pairs = text.strip().split(":")
    name = name.strip()
    if name not in METHOD_NAMES:
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(METHOD_NAMES)}")
    options: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"method option {pair!r} of {name!r} must be key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw.strip()
        if key.strip() in options:  # the later would win unchecked: yarn:factor=0:factor=4
            raise ValueError(f"method option {key.strip()!r} of {name!r} is given twice "
                             f"({text.strip()!r}); give each option once")  # fmt: skip
        options[key.strip()] = value
    allowed = method_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"method {name!r} takes {', '.join(allowed) or 'no options'}; unknown: {', '.join(unknown)}"
        )
    for key, value in options.items():
        check_option(name, key, value)
    return Method(name, options)


def check_option(name: str, key: str, value: Any) -> None:
    """Option ``key`` of method ``name`` as given, checked strictly before anything loads: an
    attention method's options integers at or above their bounds, a scaling's numbers finite and
    in range (its ``factor`` >= 1, lengths integers), ``layers`` a known placement. A bool, a
    float where an integer goes, a list where a number goes, 0, inf or NaN: one line naming the
    option and what it allows."""
    if key == "layers":
        check_layers(value)
    elif name in EXTENSION_METHODS:
        extension_option(name, key, value)
    elif key == "original_max_position_embeddings":
        try:  # a length: an integer a position tensor holds
            check_int_in(key, value, 1, MAX_INT)
        except ValueError as err:
            raise ValueError(f"method {name!r}: {err}") from None
    else:
        try:
            KEY_CHECKS[key](key, value, name)
        except ValueError as err:
            raise ValueError(f"method {name!r}: {err}") from None


def parse_methods(text: str) -> list[Method]:
    """Methods separated by commas (outside brackets); each label at most once."""
    methods = [parse_method(part) for part in _split_top(text)]
    if not methods:
        raise ValueError("no method given; allowed: " + ", ".join(METHOD_NAMES))
    labels = [m.label for m in methods]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"method named twice: {', '.join(twice)}")
    return methods


def method_options(name: str) -> tuple[str, ...]:
    """The option names method ``name`` takes (a scaling's ``layers``: where it goes on a model
    with rope parameters per layer type, :mod:`posenc.hf.scaling`)."""
    if name == "none":
        return ()
    if name in EXTENSION_METHODS:
        return tuple(EXTENSION_METHODS[name])
    spec = ROPE_SCALING[name]
    return (*(k for k in (*spec.required, *spec.optional) if k != "rope_type"), "layers")


@dataclass(frozen=True)
class Resolved:
    """A method made concrete for one model and target length: what ``apply_posenc`` takes."""

    label: str
    scaling: dict[str, Any] | None = None
    extension: dict[str, Any] | None = None
    layers: str = "auto"  # where a flat scaling goes (posenc.hf.scaling)
    identity: bool = False  # a scaling of factor 1: the target is within the trained length

    def settings(self) -> dict[str, Any]:
        out: dict[str, Any] = {"scaling": self.scaling, "extension": self.extension}
        if self.layers != "auto":  # rows written before layers existed keep their identity
            out["layers"] = self.layers
        return out


def resolve(method: Method, trained_len: int, target_len: int, pairs: int) -> Resolved:
    """``method`` for a model trained at ``trained_len`` run at ``target_len`` with ``pairs``
    rotated pairs: the scaling dict or extension dict, defaults filled in."""
    factor = max(1.0, target_len / trained_len)
    opts = dict(method.options)
    if method.name == "none":
        return Resolved(method.label)
    if method.name in DEFAULTS:
        for key, value in opts.items():  # as given (never rounded), before defaults read them
            check_option(method.name, key, value)
        ext = {**opts, **DEFAULTS[method.name](opts, trained_len, target_len)}
        return Resolved(method.label, extension=normalize_extension({"method": method.name, **ext}))
    layers = check_layers(opts.pop("layers", "auto"))
    given_factor = opts.pop("factor", None)
    used = factor if given_factor is None else float(given_factor)  # 0 is refused, not replaced
    scaling = extension_scaling(method.name, used, trained_len, pairs) or {}
    scaling.update(opts)
    identity = given_factor is None and used == 1.0 and method.name != "longrope"
    return Resolved(method.label, scaling=scaling, layers=layers, identity=identity)


def as_transformers(
    scaling: dict[str, Any] | None, config: Any, layers: str = "auto"
) -> dict[str, Any] | None:
    """``scaling`` as transformers' ``rope_parameters`` for ``config`` (None: the model's own):
    on a model with rope parameters per layer type, a dict keyed by the layer types ``layers``
    names (:func:`~posenc.hf.scaling.scaling_by_layer_type`: Gemma-3's full-attention layers by
    default). posenc's ``ntk`` (static NTK-aware) is no transformers type: it is the default RoPE
    with the base ``theta * factor ** (r / (r - 2))``, ``theta`` and ``r`` (the rotary dim) each
    layer type's own, written as that."""
    keyed = scaling_by_layer_type(config, scaling, layers)
    if scaling is None or keyed is None or scaling.get("rope_type") != "ntk":
        return keyed
    own = _rope_of_types(config)
    if not is_keyed(keyed):
        return _ntk_default(scaling, *own[None])
    return {t: _ntk_default(scaling, *own[t]) for t in keyed}


def _ntk_default(scaling: dict[str, Any], theta: float, r: int) -> dict[str, Any]:
    return {"rope_type": "default", "rope_theta": theta * float(scaling["factor"]) ** (r / (r - 2))}


def _rope_of_types(config: Any) -> dict[str | None, tuple[float, int]]:
    """``layer type -> (rope_theta, rotary dim)`` as posenc reads the config (the key None: the
    first layer with RoPE, for a config with one set of rope parameters)."""
    from ...hf.plan import position_plan

    plan = position_plan(config, cache_len=1, tables=True)
    own: dict[str | None, tuple[float, int]] = {}
    for layer in plan.layers:
        if layer.base is not None and layer.rotary_dim is not None:
            own.setdefault(layer.layer_type, (float(layer.base), int(layer.rotary_dim)))
            own.setdefault(None, (float(layer.base), int(layer.rotary_dim)))
    if not own:
        raise ValueError(f"this {plan.model_type} has no layer with RoPE: nothing to scale")
    return own
