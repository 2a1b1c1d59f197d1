"""Which of transformers' rotary decoders :func:`~posenc.hf.apply_posenc` takes, generated from
transformers' own registry (no hand list), each checked on a tiny random model.

:func:`rotary_families` reads ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and keeps every model type
whose modeling file defines a ``*RotaryEmbedding`` class; a multimodal type counts as the family
of its text config (``gemma3`` is ``gemma3_text``). :func:`tiny_config` shrinks the type's own
default config (hidden 64, 4 query / 2 key heads of 16, vocabulary 128, 4 MoE experts, windows
and chunks of 8) to enough layers to hold every layer type of its pattern. :func:`sweep_family`
then checks, in float32 on the CPU:

* ``none``: ``apply_posenc(model)`` gives the stock model's logits (a 24-token prefill, and a
  23-token prefill then one decode step through transformers' KV cache);
* ``linear``, ``yarn``, ``llama3`` (factor 2): ``apply_posenc(model, scaling=...)`` gives the
  logits of transformers' own model built with the same ``rope_parameters`` (per layer type where
  transformers puts a flat scaling) and the same weights;
* ``self_extend``, ``dual_chunk``: where a naive reference is given (``tests/_keyset_naive.py``,
  transformers' forward with the method's full-matrix attention), ``apply_posenc(extension=)``
  equals it, prefill and decode;
* ``export``: the folder ``posenc extend export`` writes for :data:`EXPORTED` at twice the
  trained length, loaded by stock transformers, gives the logits of the model as ``posenc
  extend`` patches it.

Each check is ``exact``, ``refused: <why>`` (apply_posenc's own one-line ValueError/RuntimeError
before anything runs) or ``failed: <what>`` (silently wrong or a crash: a bug). A family whose
tiny model cannot be built generically is ``unbuilt: <why>``. ``python -m posenc.testing.coverage
--write docs/model.md`` runs the sweep and rewrites the table between the markers
(:data:`BEGIN`, :data:`END`) and the results file :data:`RESULTS`.

Shapes: ``ids [1, 24]``, logits ``[1, 24, vocab]``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

#: The scalings each family is checked under (factor 2 over a trained length of 64).
SCALINGS: dict[str, dict[str, Any]] = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}  # fmt: skip
#: The key-set methods checked against the naive reference (windows well inside 24 tokens).
EXTENSIONS: dict[str, dict[str, Any]] = {
    "self_extend": {"method": "self_extend", "group_size": 3, "neighbor_window": 4},
    "dual_chunk": {"method": "dual_chunk", "chunk_size": 10, "local_size": 3},
}
#: The export check: ``posenc extend export``'s folder of the model under this method (for twice
#: the trained length), loaded by stock transformers, gives the patched model's logits.
EXPORTED = "yarn"
CHECKS = ("none", *SCALINGS, *EXTENSIONS, "export")
TOL = 1e-4  # float32 logits of a tiny model; a wrong rotation moves them by 1e-2 and more
BEGIN, END = "<!-- coverage:begin -->", "<!-- coverage:end -->"
RESULTS = Path("docs/results/coverage.json")

#: The tiny model's sizes, on the keys the type's config has.
SIZES: dict[str, int] = {
    "vocab_size": 128, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64,
}  # fmt: skip
#: Other integer keys shrunk wherever a config has them (name pattern -> value).
_SHRINK: list[tuple[re.Pattern[str], int]] = [
    (re.compile(k), v)
    for k, v in {
        r"^(moe_|shared_expert_|expert_|ffn_|dense_)?intermediate_size(_mlp)?$": 64,
        r"^moe_intermediate_size$": 32,
        r"^(num_experts|n_routed_experts|num_local_experts|n_experts|moe_num_experts)$": 4,
        r"^(num_experts_per_tok|moe_k|moe_topk|n_activated_experts|num_experts_per_token)$": 2,
        r"^(n_shared_experts|num_shared_experts)$": 1,
        r"^(n_group|topk_group|num_expert_group)$": 1,
        r"^q_lora_rank$": 32, r"^kv_lora_rank$": 16, r"^qk_rope_head_dim$": 8,
        r"^qk_nope_head_dim$": 8, r"^v_head_dim$": 16, r"^rotary_dim$": 8,
        r"^(linear_key_head_dim|linear_value_head_dim)$": 16, r"^linear_num_key_heads$": 2,
        r"^linear_num_value_heads$": 4, r"^sliding_window$": 8, r"^attention_chunk_size$": 8,
        r"^vocab_size_per_layer_input$": 128, r"^hidden_size_per_layer_input$": 16,
        r"^laurel_rank$": 8, r"^num_kv_shared_layers$": 0, r"^index_(n|num)_heads$": 2,
        r"^index_head_dim$": 16, r"^index_topk$": 4, r"^first_k_dense_replace$": 1,
    }.items()
]  # fmt: skip
#: Shrunk keys never raised past the type's own value (ZAYA routes to exactly one expert).
_NO_GROWTH = frozenset({"num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token"})
_EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts", "n_experts",
                  "moe_num_experts")  # fmt: skip
_MAX_PARAMETERS = 25_000_000  # a generic shrink that leaves more missed a size key: not tiny


@dataclass
class Outcome:
    """One family: its registry types, its tiny model's layer types, and each check's verdict."""

    family: str
    types: list[str]
    layers: str = ""
    checks: dict[str, str] = field(default_factory=dict)
    unbuilt: str = ""

    def verdict(self, check: str) -> str:
        return self.checks.get(check, "").split(":")[0]


# --- the registry ---------------------------------------------------------------------------------


def rotary_families() -> dict[str, list[str]]:
    """``family -> registry model types``: every causal-LM type of the installed transformers whose
    modeling file defines a ``*RotaryEmbedding`` class, grouped by its text config's type."""
    from transformers.models.auto.configuration_auto import (
        CONFIG_MAPPING,
        model_type_to_module_name,
    )
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    families: dict[str, list[str]] = {}
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        name = model_type_to_module_name(model_type)
        spec = importlib.util.find_spec(f"transformers.models.{name}")
        folder = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
        path = folder / f"modeling_{name}.py" if folder else None
        if path is None or not path.is_file():
            continue
        if not re.search(r"^class \w*RotaryEmbedding\(", path.read_text(), re.M):
            continue
        # the text config's class, read without building a config (a multimodal type's family)
        text = getattr(CONFIG_MAPPING[model_type], "sub_configs", {}).get("text_config")
        family = getattr(text, "model_type", None) or model_type
        families.setdefault(family, []).append(model_type)
    return dict(sorted(families.items()))


def _layer_count(layer_types: list[str] | None, low: int = 4, high: int = 12) -> int:
    """The fewest layers (at least ``low``) whose prefix of ``layer_types`` holds every type."""
    if not layer_types:
        return low
    kinds = set(layer_types)
    for n in range(low, min(high, len(layer_types)) + 1):
        if set(layer_types[:n]) == kinds:
            return n
    return max(low, min(high, len(layer_types)))


def tiny_config(model_type: str, layers: int | None = None) -> Any:
    """``model_type``'s text config, shrunk (module docstring), eager attention."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = CONFIG_MAPPING[model_type]().get_text_config(decoder=True)
    own = text.to_dict()
    aliases = getattr(type(text), "attribute_map", {})
    kw: dict[str, Any] = {}
    for key, value in own.items():
        if isinstance(value, int) and not isinstance(value, bool):
            for pattern, v in _SHRINK:
                if pattern.match(key):
                    kw[key] = min(v, value) if key in _NO_GROWTH else v
    kw.update({k: v for k, v in SIZES.items() if k in own or k in aliases})
    if "qk_rope_head_dim" in kw and "head_dim" in own:  # MLA: head_dim is the rope part
        kw["head_dim"] = kw["qk_rope_head_dim"]
    if "kv_lora_rank" in kw and "num_key_value_heads" in kw:  # MLA: one key head per query head
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    mamba_inner = "mamba_d_head" in own and "mamba_d_ssm" not in own  # (Falcon-H1: d_ssm)
    if mamba_inner and isinstance(own.get("mamba_expand"), int):  # heads x dim = expand x hidden
        if "mamba_n_heads" in own:
            kw["mamba_n_heads"] = 4
        kw["mamba_d_head"] = (
            own["mamba_expand"] * SIZES["hidden_size"] // kw.get("mamba_n_heads", 4)
        )
    for key in _NO_GROWTH & own.keys():  # a router left unset (DeepSeek-V2's own default)
        if own[key] is None and any(isinstance(own.get(k), int) for k in _EXPERT_COUNTS):
            kw[key] = 2
    kinds = own.get("layer_types") if isinstance(own.get("layer_types"), list) else None
    n = layers or _layer_count(kinds)
    kw["num_hidden_layers"] = n
    depth = own.get("num_hidden_layers")
    for key, value in own.items():  # per-layer lists follow the layer count
        if isinstance(value, list) and value and (key == "layer_types" or len(value) == depth):
            kw[key] = (value * n)[:n]
        elif _is_layer_index_list(key, value, depth):  # indices of layers: those kept
            kw[key] = [i for i in value if i < n]
    _fit_layer_blocks(own, kw, n)
    _one_attention_layer(own, kw, n)
    _fit_per_layer(own, kw, n)
    _fit_rotary(model_type, own, kw)
    kw.update(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config = type(text)(**{**own, **kw})
    config._attn_implementation = "eager"
    return config


def _is_layer_index_list(key: str, value: Any, depth: Any) -> bool:
    """Whether ``value`` names layers by index (Kolibri's ``index_layers``)."""
    return (
        isinstance(value, list) and bool(value) and isinstance(depth, int)
        and key.endswith(("_layers", "_idxs", "_indices"))
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < depth for i in value)
    )  # fmt: skip


def _fit_layer_blocks(own: dict[str, Any], kw: dict[str, Any], n: int) -> None:
    """Dory's input, looped and output blocks, whose layer counts must add up to the depth:
    a third each at the ends, the rest looped."""
    keys = ("n_input_layers", "n_recurrent_layers", "n_output_layers")
    if all(isinstance(own.get(k), int) for k in keys):
        end = max(1, n // 3)
        kw.update(n_input_layers=end, n_recurrent_layers=n - 2 * end, n_output_layers=end)


def _one_attention_layer(own: dict[str, Any], kw: dict[str, Any], n: int) -> None:
    """A hybrid whose default config has no attention layer (Bamba's ``attn_layer_indices``
    unset, Granite-4.0-H's ``layer_types`` all Mamba; their checkpoints interleave them) gets
    its last layer as one: without it there are no positions to check."""
    kinds = kw.get("layer_types")
    if isinstance(kinds, list) and kinds and set(kinds) == {"linear_attention"}:
        kw["layer_types"] = [*kinds[:-1], "full_attention"]
    elif "attn_layer_indices" in own and not own["attn_layer_indices"]:
        kw["attn_layer_indices"] = [n - 1]


def _fit_per_layer(own: dict[str, Any], kw: dict[str, Any], n: int) -> None:
    """A per-layer override table (Gemma-4's ``per_layer_config``, keyed by layer index) kept for
    the ``n`` layers left, its head sizes shrunk by the same ratio as the model's."""
    table = own.get("per_layer_config")
    if not isinstance(table, dict):
        return
    ratio = kw.get("head_dim", 0) / own["head_dim"] if own.get("head_dim") else None
    kept: dict[str, Any] = {}
    for key, entry in table.items():
        if not (str(key).isdigit() and int(key) < n):
            continue
        entry = dict(entry) if isinstance(entry, dict) else entry
        if isinstance(entry, dict) and ratio and isinstance(entry.get("head_dim"), int):
            entry["head_dim"] = max(2, round(entry["head_dim"] * ratio))
        kept[key] = entry
    kw["per_layer_config"] = kept


def _fit_rotary(model_type: str, own: dict[str, Any], kw: dict[str, Any]) -> None:
    """A head size whose rotary part (``int(head_dim * partial_rotary_factor)``, as transformers
    rounds it) is even and holds at least three pairs, and an M-RoPE split of those pairs in
    the proportions of the type's own sections: the shrink must not make a config no real model
    has (an odd rotary part, sections summing past it)."""
    from ..hf.architectures import MROPE_MODEL_TYPES

    params = own.get("rope_parameters")
    groups = [params] if isinstance(params, dict) and "rope_type" in params else (
        [v for v in params.values() if isinstance(v, dict)] if isinstance(params, dict) else []
    )  # fmt: skip
    factors = {float(g.get("partial_rotary_factor", 1.0)) for g in groups}
    if isinstance(own.get("partial_rotary_factor"), float):
        factors.add(own["partial_rotary_factor"])
    if "head_dim" in kw and factors != {1.0}:
        kw["head_dim"] = next(
            (d for d in (16, 24, 32, 48, 64)
             if all(int(d * f) % 2 == 0 and int(d * f) >= 6 for f in factors)),
            kw["head_dim"],
        )  # fmt: skip
    sections = [g.get("mrope_section") for g in groups if g.get("mrope_section")]
    default = MROPE_MODEL_TYPES.get(model_type)
    if not (sections or default) or len(groups) != 1:
        return
    section = list(sections[0] if sections else default)  # type: ignore[arg-type]
    pairs = int(kw.get("head_dim", own.get("head_dim") or 0) * min(factors)) // 2
    total = sum(section)
    split = [s * pairs // total for s in section]
    for i in sorted(range(len(split)), key=lambda i: -(section[i] * pairs % total))[
        : pairs - sum(split)
    ]:
        split[i] += 1  # largest remainders first: the split sums to the pairs
    kw["rope_parameters"] = {**groups[0], "mrope_section": split}


def tiny_model(model_type: str) -> Any:
    """A random causal LM of :func:`tiny_config` (seed 0) in eval mode; ValueError naming why
    where none builds (too large after the generic shrink, or the config refuses it)."""
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    errors = []
    for layers in (None, 0):  # 0: the type's own depth, for per-layer tables keyed by index
        try:
            config = tiny_config(model_type, layers or None)
            if layers == 0:
                config = tiny_config(model_type, min(int(_own_depth(model_type)), 64))
            with torch.device("meta"):
                meta = AutoModelForCausalLM.from_config(config)
            count = sum(p.numel() for p in meta.parameters())
            if count > _MAX_PARAMETERS:
                raise ValueError(f"{count / 1e6:.1f}M parameters after the generic shrink")
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config).eval()
            with torch.no_grad():
                model(torch.arange(3, 11)[None])  # it runs
            return model
        except Exception as e:  # any reason is the family's verdict
            errors.append(_line(e))
    raise ValueError(
        errors[0] if errors[0] == errors[-1] else f"{errors[0]}; at full depth: {errors[-1]}"
    )


def _own_depth(model_type: str) -> int:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return int(CONFIG_MAPPING[model_type]().get_text_config(decoder=True).num_hidden_layers)


def _line(e: BaseException, width: int = 160) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= width else text[: width - 3] + "..."


def layer_summary(model: Any) -> str:
    """The tiny model's layer types in order, runs collapsed (``sliding x5, full``)."""
    text = model.config.get_text_config(decoder=True)
    kinds = list(getattr(text, "layer_types", None) or ["full_attention"])
    runs: list[list[Any]] = []
    for k in kinds:
        short = k.replace("_attention", "")
        if runs and runs[-1][0] == short:
            runs[-1][1] += 1
        else:
            runs.append([short, 1])
    return ", ".join(f"{k} x{n}" if n > 1 else k for k, n in runs)


# --- the checks -----------------------------------------------------------------------------------


def prefill_and_decode(model: Any, ids: torch.Tensor) -> torch.Tensor:
    """``[1, s + 1, vocab]``: the whole prefill's logits, then the last token's logits from a
    prefill of ``s - 1`` tokens and one decode step through the KV cache."""
    with torch.no_grad():
        whole = model(ids).logits
        out = model(ids[:, :-1], use_cache=True)
        step = model(ids[:, -1:], past_key_values=out.past_key_values, use_cache=True).logits
    return torch.cat([whole, step], 1)


def _compare(got: torch.Tensor, want: torch.Tensor, decode_slack: float = 0.0) -> str:
    """``exact`` where the prefill's logits agree within :data:`TOL` and the decode step's within
    ``TOL + decode_slack``."""
    diff = (got.float() - want.float()).abs()
    prefill, step = float(diff[:, :-1].max()), float(diff[:, -1].max())
    if prefill <= TOL and step <= TOL + decode_slack:
        return "exact"
    return f"failed: logits differ by {max(prefill, step):.2e}"


class Refused(Exception):
    """apply_posenc refused the model before anything ran (its ValueError or RuntimeError)."""


class Unchecked(Exception):
    """The reference cannot be built or run for this family (transformers or the naive one)."""


def _guarded(run: Callable[[], str]) -> str:
    """``run()``'s verdict: apply_posenc's own refusal as ``refused``, a reference that does not
    run as ``unchecked``, anything else raised (a crash in the patched forward) as ``failed``."""
    try:
        return run()
    except Refused as e:
        return f"refused: {_line(e.__cause__ or e)}"
    except Unchecked as e:
        return f"unchecked: {e}"
    except Exception as e:  # a crash is a bug: the sweep says so
        return f"failed: {type(e).__name__}: {_line(e)}"


def scaled_reference(model: Any, scaling: dict[str, Any]) -> Any:
    """transformers' own model of ``model``'s config with ``scaling`` as its ``rope_parameters``
    (per layer type where transformers puts a flat scaling; each type keeps its ``rope_theta``
    and rotary fraction) and ``model``'s weights."""
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    from ..hf.scaling import scaling_by_layer_type

    config = model.config
    keep = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
    params = copy.deepcopy(dict(config.rope_parameters or {}))
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
    new_config = type(config).from_dict({**config.to_dict(), "rope_parameters": params})
    new_config._attn_implementation = "eager"
    reference = AutoModelForCausalLM.from_config(new_config).eval()
    reference.load_state_dict(model.state_dict())
    return reference


def sweep_family(
    family: str,
    types: list[str],
    reference: Callable[..., torch.Tensor] | None = None,
    checks: tuple[str, ...] = CHECKS,
) -> Outcome:
    """The ``checks`` (default every one of :data:`CHECKS`) on ``family``'s tiny model (module
    docstring). ``reference``: ``(model, ids, method, options) -> logits [1, s, vocab]``, the
    naive key-set reference (without it the key-set checks are left out)."""
    from ..hf import apply_posenc, remove_posenc

    outcome = Outcome(family, types)
    try:
        model = tiny_model(family)
    except ValueError as e:
        outcome.unbuilt = str(e)
        return outcome
    outcome.layers = layer_summary(model)
    ids = torch.randint(3, 128, (1, 24), generator=torch.Generator().manual_seed(1))
    try:
        stock = prefill_and_decode(model, ids)
    except Exception as e:  # transformers' own model does not run this way
        outcome.unbuilt = (
            f"the stock model does not run a prefill and a cached decode step: {_line(e)}"
        )
        return outcome

    def patched(**kw: Any) -> torch.Tensor:
        try:
            apply_posenc(model, **kw)
        except (ValueError, RuntimeError, TypeError) as e:  # the one-line refusal, before a row
            raise Refused() from e
        try:
            return prefill_and_decode(model, ids)
        finally:
            remove_posenc(model)

    if "none" in checks:
        outcome.checks["none"] = _guarded(lambda: _compare(patched(), stock))
    for name, scaling in SCALINGS.items():
        if name in checks:
            outcome.checks[name] = _guarded(partial(_scaled, model, ids, scaling, patched))
    for name, extension in EXTENSIONS.items():
        if reference is None or name not in checks:
            continue
        outcome.checks[name] = _guarded(
            partial(_extended, model, ids, extension, patched, reference, stock)
        )
    if "export" in checks:
        outcome.checks["export"] = _guarded(partial(_exported, model, ids))
    return outcome


def _scaled(model: Any, ids: torch.Tensor, scaling: dict[str, Any], patched: Any) -> str:
    got = patched(scaling=scaling)  # refused here first: the reference is not built
    try:
        reference = scaled_reference(model, scaling)
    except Exception as e:  # transformers refuses these rope parameters
        raise Unchecked(f"transformers builds no model with them ({_line(e, 80)})") from e
    return _compare(got, prefill_and_decode(reference, ids))


def _extended(
    model: Any,
    ids: torch.Tensor,
    extension: dict[str, Any],
    patched: Any,
    reference: Any,
    stock: torch.Tensor,
) -> str:
    """The method against the naive reference, a prefill: its last position stands for the
    decode step, which may differ from it by as much as the stock model's own decode step differs
    from its prefill (Bamba's Mamba layers: 8e-4 by their step update against their chunked
    scan), and no more."""
    got = patched(extension=extension)
    options = {k: v for k, v in extension.items() if k != "method"}
    try:
        want = reference(model, ids, extension["method"], options)
    except Exception as e:  # the test's reference does not model this family
        raise Unchecked(f"the naive reference does not run here ({_line(e, 80)})") from e
    want = torch.cat([want, want[:, -1:]], 1)  # the decode step's position, as laid out
    own = float((stock[:, -1] - stock[:, -2]).abs().max())  # the stock decode against prefill
    return _compare(got, want, decode_slack=own)


def _exported(model: Any, ids: torch.Tensor) -> str:
    """:data:`EXPORTED` as ``posenc extend`` applies it (refused there: ``refused``), against
    the folder ``posenc extend export`` writes, loaded by stock transformers."""
    import tempfile

    from transformers.models.auto.modeling_auto import AutoModelForCausalLM

    from ..extend.methods.apply import with_method
    from ..extend.methods.export import export_model
    from ..extend.methods.names import parse_method, resolve
    from ..extend.model.load import rotated_pairs, trained_length

    method, train = parse_method(EXPORTED), trained_length(model.config)
    try:
        undo = with_method(model, resolve(method, train, 2 * train, rotated_pairs(model.config)))
    except (ValueError, RuntimeError, TypeError) as e:
        raise Refused() from e
    try:
        got = prefill_and_decode(model, ids)
    finally:
        undo()
    with tempfile.TemporaryDirectory() as folder:
        try:
            out = export_model(model, None, method, 2 * train, Path(folder) / "export")
        except ValueError as e:
            raise Refused() from e
        loaded = AutoModelForCausalLM.from_pretrained(
            out, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        return _compare(got, prefill_and_decode(loaded, ids))


def sweep(
    reference: Callable[..., torch.Tensor] | None = None,
    only: list[str] | None = None,
    checks: tuple[str, ...] = CHECKS,
) -> list[Outcome]:
    """:func:`sweep_family` over :func:`rotary_families` (``only``: those families)."""
    import transformers

    transformers.logging.set_verbosity_error()
    out, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and fair to neighbours
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for family, types in rotary_families().items():
                if only is None or family in only:
                    out.append(sweep_family(family, types, reference, checks))
    finally:
        torch.set_num_threads(threads)
    return out


# --- the table ------------------------------------------------------------------------------------


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """Families found, built, exact under ``none`` and every scaling, refused, failed."""
    built = [o for o in outcomes if not o.unbuilt]
    scaled = ("none", *SCALINGS)
    return {
        "families": len(outcomes),
        "built": len(built),
        "exact": sum(all(o.verdict(c) == "exact" for c in scaled) for o in built),
        "none_exact": sum(o.verdict("none") == "exact" for o in built),
        "refused": sum(o.verdict("none") == "refused" for o in built),
        "failed": sum(any(o.verdict(c) == "failed" for c in o.checks) for o in built),
    }


def _cell(verdict: str) -> str:
    return {"exact": "exact", "refused": "refused", "failed": "**FAILED**",
            "unchecked": "-"}.get(verdict.split(":")[0], "-")  # fmt: skip


def render(outcomes: list[Outcome]) -> str:
    """The Markdown block between :data:`BEGIN` and :data:`END`: counts, one row per family,
    then every refusal and failure with its reason."""
    c = counts(outcomes)
    head = ["family", "registry types", "layer types (tiny model)", *CHECKS]
    lines = [
        BEGIN,
        f"{c['families']} rotary decoder families in transformers' registry; {c['built']} build "
        f"a tiny model generically; {c['exact']} exact under `none` and every scaling "
        f"({', '.join(SCALINGS)}); {c['refused']} refused by name; {c['failed']} failed.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for o in outcomes:
        cells = ["-"] * len(CHECKS) if o.unbuilt else [_cell(o.checks.get(k, "")) for k in CHECKS]
        layers = "(no tiny model)" if o.unbuilt else o.layers
        lines.append(
            f"| {o.family} | {', '.join(o.types)} | {layers} | " + " | ".join(cells) + " |"
        )
    reasons = []
    for o in outcomes:  # one line per family and reason, naming the checks it covers
        why: dict[str, list[str]] = {}
        for k, v in o.checks.items():
            if v.split(":")[0] in ("refused", "failed", "unchecked"):
                why.setdefault(v, []).append(k)
        reasons += [f"- {o.family} ({', '.join(ks)}): {v}" for v, ks in why.items()]
        if o.unbuilt:
            reasons.append(f"- {o.family}: no tiny model: {o.unbuilt}")
    if reasons:
        lines += ["", "Refused, unchecked and failed, each with its reason:", "", *reasons]
    return "\n".join([*lines, END])


def write_block(path: Path, block: str) -> None:
    """Replace the text between :data:`BEGIN` and :data:`END` in ``path`` by ``block``."""
    text = path.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {BEGIN} ... {END} markers")
    path.write_text(text[:start] + block + text[end + len(END) :])


def save(outcomes: list[Outcome], path: Path = RESULTS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(o) for o in outcomes], indent=1) + "\n")


def load(path: Path = RESULTS) -> list[Outcome]:
    return [Outcome(**row) for row in json.loads(path.read_text())]


def main(argv: list[str] | None = None) -> None:
    """``python -m posenc.testing.coverage [--write docs/model.md] [--reference tests]``: run
    the sweep (with the naive key-set reference of ``tests/_keyset_naive.py`` when that folder
    is given), save :data:`RESULTS` and rewrite the table in the Markdown file."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m posenc.testing.coverage")
    p.add_argument("--write", help="Markdown file whose coverage block is rewritten")
    p.add_argument("--reference", help="the tests folder holding _keyset_naive.py")
    args = p.parse_args(argv)
    reference = None
    if args.reference:
        sys.path.insert(0, args.reference)
        from _keyset_naive import sweep_reference  # type: ignore[import-not-found]

        reference = sweep_reference
    outcomes = sweep(reference)
    save(outcomes)
    if args.write:
        write_block(Path(args.write), render(outcomes))
    print(json.dumps(counts(outcomes)))


if __name__ == "__main__":
    main()
