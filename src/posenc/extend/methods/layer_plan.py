"""What each method does to each layer type of the loaded model, for ``--dry-run`` (issue 53,
item 3): layers with the same kind and the same treatment grouped into one line,

    yarn: layers 0-2,4-6 (sliding, rope θ=10k): yarn factor 4; layer 3 (full, NoPE): untouched

A scaling goes where :func:`~posenc.hf.scaling.scaling_by_layer_type` puts it (the layer types of
a per-type config, every RoPE layer of a one-set config); a key-set method acts where
``apply_posenc`` put it (``model.posenc_patch.layers``, read while the method is applied).
"""

from __future__ import annotations

from typing import Any

from ...hf.plan import position_plan
from ...hf.scaling import is_keyed
from .names import Resolved, as_transformers


def _kind(layer: Any) -> str:
    """``sliding, rope θ=10k`` / ``full, NoPE`` / ``linear, no softmax attention``."""
    kind = layer.layer_type.replace("_attention", "")
    if layer.span == "none":
        return f"{kind}, no softmax attention"
    if not layer.uses_rope:
        return f"{kind}, NoPE"
    base = float(layer.base)
    theta = (
        f"{base / 1e6:g}M" if base >= 1e6 else f"{base / 1e3:g}k" if base >= 1e3 else f"{base:g}"
    )
    part = (
        ""
        if layer.rotary_dim == layer.head_dim
        else f", {layer.rotary_dim} of {layer.head_dim} dims"
    )
    return f"{kind}, rope θ={theta}{part}"


def _scaling_text(scaling: dict[str, Any]) -> str:
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "default" and "rope_theta" in scaling:  # posenc's ntk, written as a base
        return f"base θ={float(scaling['rope_theta']):.4g}"
    factor = scaling.get("factor")
    return f"{rope_type} factor {factor:g}" if isinstance(factor, (int, float)) else str(rope_type)


def layer_treatments(model: Any, resolved: Resolved, applied_lines: tuple[str, ...] = ()) -> list[
    tuple[int, str, str]
]:  # fmt: skip
    """``(layer index, kind, what the method does there)`` for every decoder layer."""
    plan = position_plan(model.config, cache_len=1, tables=True)
    out = []
    keyed = None
    if resolved.scaling is not None:
        keyed = as_transformers(resolved.scaling, model.config, resolved.layers)
    for x in plan.layers:
        kind = _kind(x)
        if resolved.extension is not None:
            line = applied_lines[x.index] if x.index < len(applied_lines) else ""
            what = line.split("): ", 1)[-1] if line else resolved.extension["method"]
        elif keyed is None:
            what = "as trained"
        elif not x.uses_rope:
            what = "untouched (no RoPE)"
        elif is_keyed(keyed):
            own = keyed.get(x.layer_type)
            what = _scaling_text(own) if own else "untouched (its layer type is not scaled)"
        else:
            what = _scaling_text(keyed)
        out.append((x.index, kind, what))
    return out


def _ranges(indices: list[int]) -> str:
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def describe_method(model: Any, resolved: Resolved, applied_lines: tuple[str, ...] = ()) -> str:
    """One line: ``label: layers 0-2,4-6 (kind): what; layer 3 (kind): what``."""
    groups: dict[tuple[str, str], list[int]] = {}
    try:
        treatments = layer_treatments(model, resolved, applied_lines)
    except (ValueError, TypeError, KeyError) as err:  # no RoPE to read (GPT-2's learned table)
        return f"{resolved.label}: the model as loaded (no per-layer plan: {err})"
    for index, kind, what in treatments:
        groups.setdefault((kind, what), []).append(index)
    parts = [
        f"{'layers' if len(ix) > 1 else 'layer'} {_ranges(ix)} ({kind}): {what}"
        for (kind, what), ix in groups.items()
    ]
    return f"{resolved.label}: " + "; ".join(parts)


def config_method_plans(config: Any, methods: str, target: int | None = None) -> list[str]:
    """:func:`describe_method` for each of ``methods`` (``posenc extend --methods`` syntax) on
    the model of ``config`` (a path, model id or dict, :func:`~posenc.hf.resolve_config`), built
    on the meta device (no weights, no memory): what ``posenc inspect --methods`` prints.
    ``target``: the length the methods are set for (default twice the trained length)."""
    import torch
    from transformers.models.auto.configuration_auto import AutoConfig
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    from ...hf.load import resolve_config
    from ..model.load import rotated_pairs, trained_length
    from .apply import with_method
    from .names import parse_methods, resolve

    raw = resolve_config(config)
    if isinstance(raw, dict):
        raw = AutoConfig.for_model(**raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(raw)
    _rotary_on_cpu(model)  # the key-set methods read each rotary's frequencies
    train, pairs = trained_length(model.config), rotated_pairs(model.config)
    out = []
    for method in parse_methods(methods):
        try:  # a method refused on this model is a line of the plan, as posenc extend words it
            r = resolve(method, train, target or 2 * train, pairs)
            undo = with_method(model, r)
        except ValueError as err:
            out.append(f"{method.label}: refused: {err}")
            continue
        try:
            patch = getattr(model, "posenc_patch", None)
            out.append(describe_method(model, r, getattr(patch, "layers", ())))
        finally:
            undo()
    return out


def _rotary_on_cpu(model: Any) -> None:
    """Rebuild each ``*RotaryEmbedding`` of a meta-device model on the CPU from its own config
    (a few frequencies; the weights stay on meta)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            config = getattr(child, "config", None)
            if type(child).__name__.endswith("RotaryEmbedding") and config is not None:
                try:
                    setattr(parent, name, type(child)(config=config))
                except TypeError:  # a constructor of another signature: left on meta
                    continue
