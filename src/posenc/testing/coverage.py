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
  transformers puts a flat scaling) and the same weights; where apply_posenc refuses a flat
  scaling because no layer type with RoPE is a full-attention one (Beam: sliding RoPE layers
  beside NoPE full ones; DeepSeek-V4: rope sets by label), the scaling keyed by the model's own
  RoPE layer types, as that refusal tells a user to pass it (:data:`KEYED_WHEN`; the verdict says
  so);
* ``longrope`` (:data:`FALLBACK`), only where transformers' config class refuses every one of
  those three and takes LongRoPE (Phi-3, PhiMoE, Phi-4-multimodal: their long-context
  checkpoints ship it): the same check with :func:`longrope_scaling`'s parameters (short and
  long factor lists of the rotary dim, PhiMoE's mscales where the config class asks for them)
  and an original length of :data:`LONGROPE_ORIGINAL`, the model's config-level one too (Phi-3
  reads that one), so the long factors serve the 24-token prefill and the decode step and the
  short ones the 23-token prefill whose cache that step reads;
* ``self_extend``, ``dual_chunk``: where a naive reference is given (``tests/_keyset_naive.py``,
  transformers' forward with the method's full-matrix attention), ``apply_posenc(extension=)``
  equals it, prefill and decode;
* ``export``: the folder ``posenc extend export`` writes for :data:`EXPORTED` at twice the
  trained length, loaded by stock transformers, gives the logits of the model as ``posenc
  extend`` patches it.

Each check is ``exact``, ``refused: <why>`` (apply_posenc's own one-line ValueError/RuntimeError
before anything runs) or ``failed: <what>`` (silently wrong or a crash: a bug). A family whose
tiny model cannot be built generically is ``unbuilt: <why>``. :func:`counts` counts a family
exact when it is exact under ``none`` and under every scaling its transformers config takes
(:func:`required_checks`): the three of :data:`SCALINGS`, or ``longrope`` where it takes only
that (so at least one scaling is always checked). ``python -m posenc.testing.coverage --write
docs/model.md`` runs the sweep and rewrites the table between the markers (:data:`BEGIN`,
:data:`END`) and the results file :data:`RESULTS`.

Shapes: ``ids [1, 24]``, logits ``[1, 24, vocab]``.
"""

from __future__ import annotations

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

from ..hf.scaling import NoFullRopeLayerError

# re-exported: the scalings checked (built there) and the tiny model of a type
from .scalings import (  # noqa: F401
    FALLBACK,
    LONGROPE_MSCALES,
    LONGROPE_ORIGINAL,
    SCALINGS,
    fallback_scaling,
    longrope_scaling,
    original_length,
    scaled_config,
)
from .tiny_configs import causal_lm_class, one_line, tiny_config, tiny_model  # noqa: F401

#: The key-set methods checked against the naive reference (windows well inside 24 tokens).
EXTENSIONS: dict[str, dict[str, Any]] = {
    "self_extend": {"method": "self_extend", "group_size": 3, "neighbor_window": 4},
    "dual_chunk": {"method": "dual_chunk", "chunk_size": 10, "local_size": 3},
}
#: The export check: ``posenc extend export``'s folder of the model under this method (for twice
#: the trained length), loaded by stock transformers, gives the patched model's logits.
EXPORTED = "yarn"
CHECKS = ("none", *SCALINGS, FALLBACK, *EXTENSIONS, "export")
TOL = 1e-4  # float32 logits of a tiny model; a wrong rotation moves them by 1e-2 and more
BEGIN, END = "<!-- coverage:begin -->", "<!-- coverage:end -->"
RESULTS = Path("docs/results/coverage.json")


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
        return f"refused: {one_line(e.__cause__ or e)}"
    except Unchecked as e:
        return f"unchecked: {e}"
    except Exception as e:  # a crash is a bug: the sweep says so
        return f"failed: {type(e).__name__}: {one_line(e)}"


def scaled_reference(model: Any, scaling: dict[str, Any]) -> Any:
    """transformers' own model of ``model``'s config with ``scaling`` as its ``rope_parameters``
    (per layer type where transformers puts a flat scaling; each type keeps its ``rope_theta``
    and rotary fraction) and ``model``'s weights."""
    new_config = scaled_config(model.config, scaling)
    new_config._attn_implementation = "eager"
    reference = causal_lm_class(new_config)._from_config(new_config).eval()
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
            f"the stock model does not run a prefill and a cached decode step: {one_line(e)}"
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
            outcome.checks[name] = _guarded(partial(_scaled_or_keyed, model, ids, scaling, patched))
    try:
        fallback = fallback_scaling(model.config) if FALLBACK in checks else None
    except Exception as e:  # a config the sizing cannot read: a verdict, not a stopped sweep
        outcome.checks[FALLBACK] = f"failed: {type(e).__name__}: {one_line(e)}"
        fallback = None
    if fallback is not None:  # only where the config class refused every one of SCALINGS
        outcome.checks[FALLBACK] = _guarded(partial(_fallback, model, ids, fallback, patched))
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
        raise Unchecked(f"transformers builds no model with them ({one_line(e, 80)})") from e
    return _compare(got, prefill_and_decode(reference, ids))


#: apply_posenc's refusal of a flat scaling that no layer type takes by default: the scaling
#: keyed by the model's RoPE layer types is what it asks for (:func:`_scaled_or_keyed`).
KEYED_WHEN = NoFullRopeLayerError


def rope_layer_types(model: Any) -> list[str]:
    """The layer types of ``model``'s per-type rope parameters (``[]``: one set for all)."""
    params = model.config.get_text_config(decoder=True).rope_parameters or {}
    return [t for t, v in params.items() if isinstance(v, dict)]


def _scaled_or_keyed(model: Any, ids: torch.Tensor, scaling: dict[str, Any], patched: Any) -> str:
    """:func:`_scaled`; where the flat scaling is refused with :data:`KEYED_WHEN`, the same
    scaling keyed by every RoPE layer type of the model, checked the same way."""
    try:
        return _scaled(model, ids, scaling, patched)
    except Refused as e:
        if not isinstance(e.__cause__, KEYED_WHEN) or not rope_layer_types(model):
            raise
    keyed = {t: dict(scaling) for t in rope_layer_types(model)}
    verdict = _scaled(model, ids, keyed, patched)
    return f"{verdict}: keyed by layer type ({', '.join(keyed)})" if verdict == "exact" else verdict


def _fallback(model: Any, ids: torch.Tensor, scaling: dict[str, Any], patched: Any) -> str:
    """:func:`_scaled` with :data:`FALLBACK`'s scaling, the model's config-level original
    length set as the scaling's (:func:`original_length`) for both sides."""
    with original_length(model.config):
        return _scaled(model, ids, scaling, patched)


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
        raise Unchecked(f"the naive reference does not run here ({one_line(e, 80)})") from e
    want = torch.cat([want, want[:, -1:]], 1)  # the decode step's position, as laid out
    own = float((stock[:, -1] - stock[:, -2]).abs().max())  # the stock decode against prefill
    return _compare(got, want, decode_slack=own)


def _exported(model: Any, ids: torch.Tensor) -> str:
    """:data:`EXPORTED` as ``posenc extend`` applies it (refused there: ``refused``), against
    the folder ``posenc extend export`` writes, loaded by stock transformers."""
    import tempfile

    from transformers.models.auto.configuration_auto import AutoConfig

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
        config = AutoConfig.from_pretrained(out)
        loaded = (
            causal_lm_class(config)
            .from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
            .eval()
        )
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


def required_checks(outcome: Outcome) -> tuple[str, ...]:
    """The checks ``outcome``'s family must pass to count exact: ``none`` and every scaling its
    transformers config takes, which are :data:`SCALINGS` or, where the sweep checked
    :data:`FALLBACK` (it does only where the config class refuses all of them), that one."""
    if FALLBACK in outcome.checks:
        return ("none", FALLBACK)
    return ("none", *SCALINGS)


def _exact(o: Outcome) -> bool:
    """Every required check exact, and no check of the family failed (a failure is a bug,
    whichever check it is in)."""
    required = all(o.verdict(c) == "exact" for c in required_checks(o))
    return required and not any(o.verdict(c) == "failed" for c in o.checks)


def counts(outcomes: list[Outcome]) -> dict[str, int]:
    """Families found, built, exact under ``none`` and every scaling their transformers config
    takes (:func:`required_checks`), refused, failed."""
    built = [o for o in outcomes if not o.unbuilt]
    return {
        "families": len(outcomes),
        "built": len(built),
        "exact": sum(_exact(o) for o in built),
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
        f"a tiny model generically; {c['exact']} exact under `none` and every scaling their "
        f"transformers config takes ({', '.join(SCALINGS)}, keyed by layer type where no "
        f"full-attention layer has RoPE; {FALLBACK} for the families whose config takes only "
        f"it); {c['refused']} refused by name; {c['failed']} failed.",
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
        why = _by_verdict(o, ("refused", "failed", "unchecked"))
        reasons += [f"- {o.family} ({', '.join(ks)}): {v}" for v, ks in why.items()]
        if o.unbuilt:
            reasons.append(f"- {o.family}: no tiny model: {o.unbuilt}")
    keyed = [f"- {o.family} ({', '.join(ks)}): {v.split(': ', 1)[1]}" for o in outcomes
             for v, ks in _by_verdict(o, ("exact",)).items() if ": " in v]  # fmt: skip
    if keyed:
        lines += ["", "Exact with the scaling keyed by layer type (a flat one is refused: no "
                  "full-attention layer type has RoPE):", "", *keyed]  # fmt: skip
    if reasons:
        lines += ["", "Refused, unchecked and failed, each with its reason:", "", *reasons]
    return "\n".join([*lines, END])


def _by_verdict(o: Outcome, kinds: tuple[str, ...]) -> dict[str, list[str]]:
    """``o``'s checks of verdict kinds ``kinds``, grouped by their whole verdict text."""
    out: dict[str, list[str]] = {}
    for k, v in o.checks.items():
        if v.split(":")[0] in kinds:
            out.setdefault(v, []).append(k)
    return out


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
