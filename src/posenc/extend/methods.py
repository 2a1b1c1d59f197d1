"""Context-extension methods by name, with options: what ``posenc extend --methods`` reads.

A method is ``name`` or ``name:key=value:key=value`` (values JSON: numbers, lists), several
separated by commas outside brackets::

    none,linear,yarn:factor=2,self_extend:group_size=4:neighbor_window=1024

Names: ``none`` (the model as trained, extrapolating), every RoPE scaling type posenc and
transformers share (``linear``, ``ntk``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``; options
are that type's keys, the factor defaulting to target length / trained length), and the two
attention methods ``self_extend`` and ``dual_chunk`` (:mod:`posenc.hf.extension`; defaults chosen
so the largest position a query sees stays inside the trained length).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..functional.rope_scaling import ROPE_SCALING, extension_scaling
from ..hf.extension import EXTENSION_METHODS, normalize_extension

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
        options[key.strip()] = value
    allowed = method_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"method {name!r} takes {', '.join(allowed) or 'no options'}; unknown: {', '.join(unknown)}"
        )
    return Method(name, options)


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
    """The option names method ``name`` takes."""
    if name == "none":
        return ()
    if name in EXTENSION_METHODS:
        return tuple(EXTENSION_METHODS[name])
    spec = ROPE_SCALING[name]
    return tuple(k for k in (*spec.required, *spec.optional) if k != "rope_type")


@dataclass(frozen=True)
class Resolved:
    """A method made concrete for one model and target length: what ``apply_posenc`` takes."""

    label: str
    scaling: dict[str, Any] | None = None
    extension: dict[str, Any] | None = None

    def settings(self) -> dict[str, Any]:
        return {"scaling": self.scaling, "extension": self.extension}


def resolve(method: Method, trained_len: int, target_len: int, pairs: int) -> Resolved:
    """``method`` for a model trained at ``trained_len`` run at ``target_len`` with ``pairs``
    rotated pairs: the scaling dict or extension dict, defaults filled in."""
    factor = max(1.0, target_len / trained_len)
    opts = dict(method.options)
    if method.name == "none":
        return Resolved(method.label)
    if method.name == "self_extend":
        window = int(opts.pop("neighbor_window", max(1, trained_len // 4)))
        # The smallest group that keeps the largest grouped query position inside training.
        group = int(
            opts.pop(
                "group_size",
                max(2, math.ceil((target_len - window) / max(1, trained_len - window))),
            )
        )
        ext = {"method": "self_extend", "group_size": group, "neighbor_window": window}
        return Resolved(method.label, extension=normalize_extension(ext))
    if method.name == "dual_chunk":
        chunk = int(opts.pop("chunk_size", trained_len * 3 // 4))  # ChunkLlama: 3/4 of training
        local = int(opts.pop("local_size", max(1, chunk // 32)))  # Qwen2.5-1M: 8192 of 262144
        ext = {"method": "dual_chunk", "chunk_size": chunk, "local_size": local}
        return Resolved(method.label, extension=normalize_extension(ext))
    given_factor = opts.pop("factor", None)
    scaling = (
        extension_scaling(method.name, float(given_factor or factor), trained_len, pairs) or {}
    )
    scaling.update(opts)
    return Resolved(method.label, scaling=scaling)


def as_transformers(scaling: dict[str, Any] | None, config: Any) -> dict[str, Any] | None:
    """``scaling`` as transformers' ``rope_parameters`` for ``config`` (None: the model's own).
    posenc's ``ntk`` (static NTK-aware) is no transformers type: it is the default RoPE with the
    base ``theta * factor ** (r / (r - 2))`` (r the rotary dim), written as that."""
    if scaling is None or scaling.get("rope_type") != "ntk":
        return scaling
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    params = getattr(text, "rope_parameters", None) or {}
    r = 2 * (int(head_dim * float(params.get("partial_rotary_factor", 1.0) or 1.0)) // 2)
    theta = float(params.get("rope_theta", getattr(text, "rope_theta", 10000.0)))
    return {"rope_type": "default", "rope_theta": theta * float(scaling["factor"]) ** (r / (r - 2))}
