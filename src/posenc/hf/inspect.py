"""``posenc inspect``: a model's positions, layer by layer, and the config traps that change them.

Pure functions: :func:`inspect_config` returns a JSON-ready report (model fields, one entry per
decoder layer, warnings); :func:`config_warnings` the warnings alone; :func:`report_table` a rich
table of the report with equal layers grouped (``"0-3, 5"``). The command (:func:`inspect_command`)
prints one or the other.

Warnings, each a trap that silently changes what a model does:

* a 4.x ``rope_scaling`` key (transformers 5.x reads it into ``rope_parameters``, and it wins
  over a ``rope_parameters`` given beside it);
* ``type`` instead of ``rope_type``;
* no ``rope_theta`` (the base falls back to the config class's default, or to 10000);
* a YaRN ``factor`` that disagrees with ``max_position_embeddings /
  original_max_position_embeddings`` (transformers' own rule: it warns when that ratio is
  neither the factor nor 1, and uses the factor);
* ``truncate`` given per layer type (transformers reads ``rope_parameters["truncate"]`` only);
* keys transformers would ignore: rope parameters its validation does not know for the rope type
  (left out here too), and position keys whose removal leaves the model unchanged though they
  differ from the class default (``sliding_window`` with ``use_sliding_window: false``, a
  ``sliding_window_pattern`` under explicit ``layer_types``, ...).
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from ..functional.rope_scaling import ORIG, ROPE_SCALING
from .config import (
    _MODULE_KEYS,
    FALLBACK_DEFAULTS,
    _has_rope_keys,
    _nested_keys,
    read_config,
    yarn_factor_mismatch,
)
from .load import resolve_config
from .plan import LayerPositions, PositionPlan, longest_wavelength, plan_of

# Position keys a config may carry that some architectures never read.
POSITION_KEYS = (
    "sliding_window", "use_sliding_window", "max_window_layers", "sliding_window_pattern",
    "layer_types", "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size",
    "attn_temperature_tuning", "floor_scale", "attn_scale", "rope_local_base_freq",
    "rotary_dim", "rope_interleave", "global_head_dim", "original_max_position_embeddings",
)  # fmt: skip


def format_indices(indices: tuple[int, ...] | list[int]) -> str:
    """Runs of consecutive indices: ``(0, 1, 2, 3, 5)`` -> ``"0-3, 5"``.

    >>> format_indices([0, 1, 2, 3, 5, 7, 8])
    '0-3, 5, 7-8'
    """
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _text(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """The dict that holds the decoder's keys (``text_config`` of a multimodal file)."""
    text = raw.get("text_config")
    return text if isinstance(text, Mapping) and not _has_rope_keys(raw) else raw


def _rope_dicts(text: Mapping[str, Any]) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """``(key, [(where, params)])``: the rope parameter dicts of a config, per layer type when
    nested."""
    key = "rope_parameters" if text.get("rope_parameters") is not None else "rope_scaling"
    params = text.get(key)
    if not isinstance(params, Mapping):
        return key, []
    nested = _nested_keys(params, text.get("layer_types"))
    if nested:
        return key, [(f"{key}[{k!r}]", params[k]) for k in nested if isinstance(params[k], dict)]
    return key, [(key, params)]  # type: ignore[list-item]


def _unknown_rope_keys(params: Mapping[str, Any]) -> list[str]:
    rope_type = params.get("rope_type", params.get("type", "default"))
    spec = ROPE_SCALING.get("default" if rope_type == "mrope" else rope_type)
    if spec is None:
        return []
    known = {"rope_type", "type", *spec.required, *spec.optional, *_MODULE_KEYS}
    return sorted(k for k in params if k not in known)


def _class_default_theta(model_type: Any, use_transformers: bool) -> tuple[Any, str]:
    if use_transformers:
        try:
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING

            cls = CONFIG_MAPPING[model_type]
        except (ImportError, KeyError):
            cls = None
        if cls is not None:
            theta = getattr(cls, "default_theta", 10000.0)
            if isinstance(theta, Mapping):
                theta = theta.get("global", theta)
            if theta == 10000.0:
                return theta, "10000, transformers' default"
            return theta, f"{theta:g}, the default of transformers' {cls.__name__}"
    theta = FALLBACK_DEFAULTS.get(str(model_type), {}).get("rope_theta")
    if theta is not None:
        return theta, f"{theta:g}, the default of the {model_type!r} config class"
    return 10000.0, "10000, transformers' default"


def _raw_warnings(raw: Mapping[str, Any], use_transformers: bool) -> list[str]:
    """The warnings read from the file's own keys (before any class defaults)."""
    text = _text(raw)
    out = []
    key, dicts = _rope_dicts(text)
    if text.get("rope_scaling") is not None and text.get("rope_parameters") is not None:
        out.append(
            "config gives 'rope_scaling' (the transformers 4.x key) beside 'rope_parameters': "
            "transformers 5.x reads 'rope_scaling', which replaces the 'rope_parameters' given"
        )
    for where, params in dicts:
        unknown = _unknown_rope_keys(params)
        if unknown:
            rope_type = params.get("rope_type", params.get("type", "default"))
            out.append(
                f"{where} has keys transformers ignores for rope_type {rope_type!r}: "
                f"{unknown} (left out here too)"
            )
        if where != key and "truncate" in params:
            out.append(
                f"{where} sets 'truncate': {params['truncate']!r}, but transformers reads only "
                f"{key}['truncate'] (the top level, default True): the per-type value is ignored"
            )
    has_theta = text.get("rope_theta") is not None or text.get("rotary_emb_base") is not None
    if _has_rope_keys(text) or text.get("model_type"):
        missing = [w for w, p in dicts if p.get("rope_theta") is None]
        if not has_theta and (missing or not dicts):
            _, which = _class_default_theta(text.get("model_type"), use_transformers)
            where = f" (nor in {', '.join(missing)})" if missing else ""
            out.append(f"no rope_theta{where}: the base falls back to {which}")
    return out


def legacy_notes(raw: Mapping[str, Any]) -> list[str]:
    """One brief note naming the transformers 4.x spellings a file uses (``rope_scaling``,
    ``type``), which 5.x reads as ``rope_parameters`` / ``rope_type``; [] for a 5.x file."""
    text = _text(raw)
    old = ["'rope_scaling' (read as rope_parameters)"] if text.get("rope_scaling") else []
    _, dicts = _rope_dicts(text)
    if any("type" in p and "rope_type" not in p for _, p in dicts):
        old.append("'type' (read as rope_type)")
    return [f"transformers 4.x keys, read as 5.x does: {', '.join(old)}"] if old else []


@contextlib.contextmanager
def transformers_messages() -> Iterator[list[str]]:
    """Collect, instead of printing, what transformers logs (its config validators' warnings)
    and the Python warnings raised meanwhile; yields the list they are appended to, deduped."""
    import logging

    try:  # transformers adds its stderr handler on first use: let it, then set it aside
        from transformers.utils import logging as hf_logging

        hf_logging.get_logger("transformers")
    except ImportError:
        pass
    collected: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = " ".join(record.getMessage().split())
            if message not in collected:
                collected.append(message)

    logger = logging.getLogger("transformers")
    handlers, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [_Collect()], False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield collected
        for w in caught:
            message = " ".join(str(w.message).split())
            if message not in collected:
                collected.append(message)
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def _without_unknown_rope_keys(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` without the rope parameters transformers ignores (its validation only warns)."""
    out = copy.deepcopy(dict(raw))
    text = _text(out)
    for _, params in _rope_dicts(text)[1]:
        for k in _unknown_rope_keys(params):
            del params[k]
    return out


def _plan(raw: Any, use_transformers: bool) -> PositionPlan:
    cfg, model_types = read_config(raw, use_transformers)
    return plan_of(cfg, model_types, cache_len=1)


def _fingerprint(plan: PositionPlan) -> Any:
    return (plan.max_position_embeddings, [x.settings() for x in plan.layers])


def _other_value(value: Any) -> Any:
    """A different value of the same kind, or None for kinds not perturbed (lists, strings)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return 2 * value + 1
    if isinstance(value, float):
        return 2 * value + 1.0
    return None


def _ignored_keys(raw: Mapping[str, Any], plan: PositionPlan) -> list[str]:
    """Position keys whose value transformers' model never reads: another value leaves the model
    as it is (needs transformers)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return []
    text = _text(raw)
    if text.get("model_type") not in CONFIG_MAPPING:
        return []
    want = _fingerprint(plan)
    out = []
    for key in POSITION_KEYS:
        other = _other_value(text.get(key))
        if other is None:
            continue
        changed = copy.deepcopy(dict(raw))
        _text(changed)[key] = other  # type: ignore[index]
        try:
            same = _fingerprint(_plan(changed, True)) == want
        except (ValueError, TypeError, KeyError):
            same = False
        if same:
            out.append(f"{key}={text[key]!r}")
    if not out:
        return []
    return [f"keys transformers ignores for this model (another value changes nothing): {out}"]


def _yarn_warnings(plan: PositionPlan) -> list[str]:
    out = []
    seen = set()
    for layer in plan.layers:
        sc = layer.scaling
        if sc is None or sc.get("rope_type") != "yarn" or plan.max_position_embeddings is None:
            continue
        factor, orig = sc.get("factor"), sc.get(ORIG)
        message = yarn_factor_mismatch(plan.max_position_embeddings, factor, orig)
        if message and (factor, orig) not in seen:
            seen.add((factor, orig))
            out.append(message)
    return out


def config_warnings(config: Any, *, use_transformers: bool = True) -> list[str]:
    """The trap warnings of a config (see the module docstring); [] when there are none."""
    return inspect_config(config, use_transformers=use_transformers)["warnings"]


def _span_json(span: Any) -> Any:
    return span if isinstance(span, str) else list(span)


def _effective(layer: LayerPositions) -> int | None:
    sc = layer.scaling or {}
    if sc.get("factor") is None or sc.get(ORIG) is None:
        return None
    return round(sc["factor"] * sc[ORIG])


def _softmax_factor(model_type: Any, scaling: Mapping[str, Any] | None) -> float | None:
    """DeepSeek-V3's MLA softmax scale over ``head_dim ** -0.5`` (``yarn_mscale(factor,
    mscale_all_dim) ** 2``) where its attention reads one from the rope parameters, else None."""
    from .patch import MSCALE_SOFTMAX_MODEL_TYPES, mla_softmax_scale

    if model_type not in MSCALE_SOFTMAX_MODEL_TYPES or scaling is None:
        return None
    factor = mla_softmax_scale(1, scaling)  # head_dim 1: the factor itself
    return None if factor == 1.0 else factor


def _layer_json(layer: LayerPositions, at: int | None, model_type: Any) -> dict[str, Any]:
    t = layer.temperature
    wavelength = None if layer.rope is None else longest_wavelength(layer.rope, at)
    allocation = getattr(layer.rope, "allocation", None)  # M-RoPE: how sections are laid out
    return {
        "index": layer.index,
        "layer_type": layer.layer_type,
        "rope": layer.uses_rope,
        "span": _span_json(layer.span),
        "head_dim": layer.head_dim,
        "rotary_dim": layer.rotary_dim,
        "layout": layer.layout,
        "base": layer.base,
        "scaling": None if layer.scaling is None else dict(layer.scaling),
        "mrope_section": None if layer.mrope_section is None else list(layer.mrope_section),
        "mrope_allocation": allocation if layer.mrope_section is not None else None,
        "temperature": None if t is None else {"kind": t.kind, "beta": t.beta, "length": t.length},
        "softmax_scale_factor": _softmax_factor(model_type, layer.scaling),
        "longest_wavelength": wavelength,
        "effective_context": _effective(layer),
    }


def _length_sources(raw: Any, plan: PositionPlan) -> tuple[str | None, int | None, str | None]:
    """``(where max_position_embeddings comes from, the training length, where that comes
    from)``: a training length only where the config gives ``original_max_position_embeddings``
    (max_position_embeddings is a context limit, often the class default, not one)."""
    if not isinstance(raw, Mapping):
        trained = plan.original_max_position_embeddings
        return "config", trained, None if trained is None else ORIG
    text = _text(raw)
    max_source: str | None = "file"
    if text.get("max_position_embeddings") is None:
        max_source = "class default"
    if plan.max_position_embeddings is None:
        max_source = None
    given = text.get(ORIG) is not None or any(
        p.get(ORIG) is not None for _, p in _rope_dicts(text)[1]
    )
    if not given or plan.original_max_position_embeddings is None:
        return max_source, None, None
    return max_source, plan.original_max_position_embeddings, ORIG


def inspect_config(config: Any, *, use_transformers: bool = True) -> dict[str, Any]:
    """A JSON-ready report of a config's positions: model fields, ``layers`` (one entry per
    decoder layer, as :class:`~posenc.hf.LayerPositions` plus the longest wavelength at
    ``max_position_embeddings`` and the context the scaling targets), ``warnings`` (traps) and
    ``notes`` (4.x spellings, what transformers itself logged while reading the config)."""
    raw = resolve_config(config)
    found: list[str] = []
    with transformers_messages() as said:
        if isinstance(raw, Mapping):
            found += _raw_warnings(raw, use_transformers)
            raw = _without_unknown_rope_keys(raw)
        plan = _plan(raw, use_transformers)
        if isinstance(raw, Mapping) and use_transformers:
            found += _ignored_keys(raw, plan)
        found += _yarn_warnings(plan)
    notes = legacy_notes(raw) if isinstance(raw, Mapping) else []
    notes += [f"transformers: {m}" for m in said if m not in found]
    max_source, trained, trained_source = _length_sources(raw, plan)
    layers = [_layer_json(x, plan.max_position_embeddings, plan.model_type) for x in plan.layers]
    return {
        "model_type": plan.model_type,
        "num_layers": plan.num_layers,
        "max_position_embeddings": plan.max_position_embeddings,
        "max_position_embeddings_source": max_source,
        "original_max_position_embeddings": plan.original_max_position_embeddings,
        "training_length": trained,
        "training_length_source": trained_source,
        "layers": layers,
        "warnings": found,
        "notes": notes,
    }


def _rope_cell(x: Mapping[str, Any]) -> str:
    if not x["rope"]:
        return "NoPE" if x["span"] != "none" else "-"
    mrope = ""
    if x["mrope_section"]:  # Qwen2.5-VL's contiguous T..H..W.. or Qwen3-VL's interleaved THWTHW..
        mrope = f" M-RoPE {x['mrope_section']} {x['mrope_allocation']}"
    return f"{x['layout']} {x['rotary_dim']}/{x['head_dim']} θ={x['base']:g}{mrope}"


def _scaling_cell(x: Mapping[str, Any]) -> str:
    sc = x["scaling"]
    if not sc:
        return "-"
    parts = [sc["rope_type"]]
    if sc.get("factor") is not None:
        parts.append(f"x{sc['factor']:g}")
    if x["effective_context"] is not None:
        parts.append(f"{sc[ORIG]} -> {x['effective_context']}")
    if x["softmax_scale_factor"] is not None:  # DeepSeek-V3's MLA reads the rope parameters
        mscale = f"mscale {sc.get('mscale', 1):g}/mscale_all_dim {sc['mscale_all_dim']:g}"
        parts.append(f"softmax x{x['softmax_scale_factor']:.3g} ({mscale})")
    return " ".join(parts)


def _span_cell(span: Any) -> str:
    return span if isinstance(span, str) else f"{span[0]} {span[1]}"


def _wavelength_cell(x: Mapping[str, Any], trained: int | None) -> str:
    w = x["longest_wavelength"]
    if w is None:
        return "-"
    ratio = f" ({w / trained:.3g} L)" if trained else ""
    return f"{w:.3g}{ratio}" if math.isfinite(w) else "inf"


def report_table(report: Mapping[str, Any]) -> Any:
    """A rich Table of ``report`` (from :func:`inspect_config`), equal layers in one row."""
    from rich.table import Table

    trained = report["training_length"]
    max_pos, source = report["max_position_embeddings"], report["max_position_embeddings_source"]
    length = f"max_position_embeddings {max_pos}" + (f" ({source})" if source else "")
    if trained is not None:
        length += f", trained at L = {trained} ({report['training_length_source']})"
    else:
        length += ", training length not given (L = max_position_embeddings)"
    table = Table(
        "layers", "type", "span", "rotation", "scaling", "temperature", "longest wavelength",
        title=f"{report['model_type']}: {report['num_layers']} layers, {length}",
        caption="rotation: pairing, rotated/head dims, base; longest wavelength "
        "2π/min(inv_freq) at max_position_embeddings, in positions and in L",
    )  # fmt: skip
    trained = trained or max_pos
    groups: dict[str, list[int]] = {}
    first: dict[str, Mapping[str, Any]] = {}
    for x in report["layers"]:
        key = repr({k: v for k, v in x.items() if k != "index"})
        groups.setdefault(key, []).append(x["index"])
        first.setdefault(key, x)
    for key, indices in groups.items():
        x = first[key]
        t = x["temperature"]
        temp = "-" if t is None else f"{t['kind']} beta={t['beta']:g} L={t['length']}"
        table.add_row(
            format_indices(indices), x["layer_type"], _span_cell(x["span"]), _rope_cell(x),
            _scaling_cell(x), temp, _wavelength_cell(x, trained),
        )  # fmt: skip
    return table


def inspect_command(
    config: str,
    as_json: bool = False,
) -> None:
    """Show what each decoder layer of a Hugging Face model does with positions.

    CONFIG: a config.json, a model folder holding one, or a model id ('org/name') already in the
    local Hugging Face cache (never downloaded).
    """
    import json

    from rich.console import Console

    from ..cli_errors import fail

    try:
        report = inspect_config(config)
    except (ValueError, TypeError) as err:
        fail(str(err))
    if as_json:
        print(json.dumps(report))
        return
    console = Console()
    if not console.is_terminal:  # piped: wide enough for one line per group
        console = Console(width=max(console.width, 132))
    console.print(report_table(report))
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    for note in report["notes"]:  # after the traps: spellings and transformers' own words
        console.print(f"[dim]note:[/dim] {note}", highlight=False)
