"""Published model configs against transformers' own rotary classes.

Each file of ``tests/data/hf_configs`` is a verbatim copy of a published ``config.json``;
``SOURCES.jsonl`` there names its Hub repository and the public copy it was taken from. Files posenc
refuses live in ``refused/`` (``tests/test_hf_corpus_files.py``). The reconstructed fixtures of
``tests/data/hf_configs_rebuilt`` (dicts and presets, not published files; their ``_source``,
``_via``, ``_notes`` keys are stripped) run here too, as ``rebuilt/<name>``: they keep their cases
covered, but they are fixtures, not evidence. For every file, in both forms (the raw dict and the
config object transformers builds from it), and for every rope layer type,
:func:`posenc.hf.rope_from_hf` must give:

* the cos/sin of the model's ``*RotaryEmbedding`` class (float32, <= 1e-6 times the attention
  factor), at sampled positions up to 4x ``max_position_embeddings`` and at every switch point
  (``original_max_position_embeddings`` +-1, where LongRoPE changes factors);
* the rotation of the model's own ``apply_rotary_pos_emb`` (float32), and in bfloat16 an error
  against transformers' float32 result no larger than transformers' own bfloat16 error.

Rope sets are read as transformers keys them: each layer type with its own parameters and each
nested set that is not a layer type (DeepSeek-V4's ``main`` and ``compress``), plus the labels
posenc reads from one of those (DeepSeek-V4's ``indexer``, :func:`posenc.hf.labels.rope_labels`).
Where a label rotates the *trailing* rope slice of each head (``rope_slice == "trailing"``,
DeepSeek-V4's ``[nope | rope]``), q and k are as wide as the text head and posenc's tables rotate
them (:func:`posenc.rotary.rotate_trailing` and the fused
:func:`posenc.hf.rotary.apply_rotary_trailing`) against the model type's own one-tensor
``apply_rotary_pos_emb``, by the angle and by minus it (``cos, -sin``: how the attention output's
rotation is undone).

The negative controls at the end show that a wrong base, swapped YaRN betas, swapped Llama-3
smoothing factors, a LongRoPE switch moved by one position and DeepSeek-V4's leading slice rotated
in place of its trailing one are each caught.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.configuration_auto import model_type_to_module_name  # noqa: E402

from _hf_corpus_paths import CORPUS, PREFIX, REBUILT, config_path  # noqa: E402
from posenc.hf import ROPE_INTERLEAVE_MODEL_TYPES, hf_rope_kwargs, rope_from_hf  # noqa: E402
from posenc.hf.labels import LABELLED_ROPES, rope_labels  # noqa: E402
from posenc.hf.rotary import apply_rotary_trailing  # noqa: E402
from posenc.hf.shadow import plain_function  # noqa: E402
from posenc.rotary import rotate_trailing  # noqa: E402

METADATA = ("_source", "_via", "_notes")
# pending/: published files that other tests' harnesses do not handle yet (kept out of their globs)
PUBLISHED = sorted(p.stem for p in CORPUS.glob("*.json")) + sorted(
    f"pending/{p.stem}" for p in CORPUS.glob("pending/*.json")
)
# the reconstructed fixtures (not evidence)
FIXTURES = sorted(f"{PREFIX}{p.stem}" for p in REBUILT.glob("*.json"))
NAMES = PUBLISHED + FIXTURES
TOL = 1e-6  # float32, cos/sin (times the attention factor) and rotated q, k


# --- the corpus and transformers' side ---------------------------------------------------------


def load(name: str) -> dict[str, Any]:
    """The config of corpus file (or ``rebuilt/`` fixture) ``name``, without provenance keys."""
    raw = json.loads(config_path(name).read_text())
    return {k: v for k, v in raw.items() if k not in METADATA}


def hf_text_config(raw: dict[str, Any]) -> Any:
    """The decoder config transformers builds from ``raw`` (its class defaults filled in)."""
    config = CONFIG_MAPPING[raw["model_type"]].from_dict(copy.deepcopy(raw))
    return config.get_text_config(decoder=True)


def modeling(text: Any) -> Any:
    name = model_type_to_module_name(text.model_type)
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def rotary_class(module: Any) -> type:
    """The module's text ``*RotaryEmbedding`` class (not a vision or audio one)."""
    found = [
        obj
        for n, obj in vars(module).items()
        if n.endswith("RotaryEmbedding")
        and isinstance(obj, type)
        and obj.__module__ == module.__name__
        and not any(s in n for s in ("Vision", "Audio", "Vit", "Patch"))
    ]
    if len(found) > 1:
        found = [c for c in found if "Text" in c.__name__] or found
    assert len(found) == 1, [c.__name__ for c in found]
    return found[0]


def rope_keys(text: Any) -> list[str | None]:
    """The rope sets to read: the layer types with their own rope parameters and the nested sets
    that are not layer types (transformers' rule, DeepSeek-V4's ``main`` / ``compress``), plus
    the labels posenc reads from one of those sets (DeepSeek-V4's ``indexer``); ``[None]`` for
    one flat set."""
    params = getattr(text, "rope_parameters", None) or {}
    layer_types = set(getattr(text, "layer_types", None) or ())
    keys = [k for k, v in params.items() if k in layer_types or isinstance(v, Mapping)]
    labels = LABELLED_ROPES.get(text.model_type, {})
    keys += [k for k in rope_labels(frozenset({text.model_type})) if labels[k].params in keys]
    return list(dict.fromkeys(keys)) or [None]


def transformers_key(text: Any, key: str | None) -> tuple[str, ...]:
    """The ``layer_type`` argument of transformers' rotary class for posenc's ``key`` (a label
    reads the nested set it names: DeepSeek-V4's ``indexer`` reads ``compress``)."""
    if key is None:
        return ()
    label = LABELLED_ROPES.get(text.model_type, {}).get(key)
    return (label.params,) if label is not None and label.params is not None else (key,)


def _attention_always_interleaves(module: Any) -> bool:
    """The module's attention calls ``apply_rotary_pos_emb_interleave`` whatever the config says
    (DeepSeek-V3.2: its sparse-attention indexer alone keeps ``apply_rotary_pos_emb``)."""
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and name.endswith("Attention") and "forward" in vars(obj)):
            continue
        source = inspect.getsource(obj.forward)
        if "apply_rotary_pos_emb_interleave(" in source and "rope_interleave" not in source:
            return True
    return False


def is_flagged_interleave(text: Any) -> bool:
    """DeepSeek-V3 style: interleaved pairs, written back de-interleaved by transformers (the
    types posenc flags, and those whose attention uses only the interleaving apply, e.g. GLM-5,
    DeepSeek-V3.2)."""
    if text.model_type in ROPE_INTERLEAVE_MODEL_TYPES:
        return bool(getattr(text, "rope_interleave", False))
    module = modeling(text)
    if not hasattr(module, "apply_rotary_pos_emb_interleave"):
        return False
    return not hasattr(module, "apply_rotary_pos_emb") or _attention_always_interleaves(module)


def reference_cos_sin(out: Any, model_type: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary output as cos, sin ``[b, s, n]`` (one entry per rotated pair)."""
    if isinstance(out, torch.Tensor) and out.is_complex():  # DeepSeek-V2, Llama-4: e^{i angle}
        return out.real, out.imag
    cos, sin = out
    if model_type in ("gptj", "codegen"):
        cos, sin = sin, cos  # GPT-J returns (sin, cos)
    if cos.shape[-1] == n:
        return cos, sin
    assert cos.shape[-1] == 2 * n, (cos.shape, n)
    if torch.equal(cos[..., :n], cos[..., n:]):  # cat(c, c): half layout
        return cos[..., :n], sin[..., :n]
    assert torch.equal(cos[..., ::2], cos[..., 1::2])  # repeat_interleave: interleaved layout
    return cos[..., ::2], sin[..., ::2]


def reference_rotation(
    module: Any, text: Any, r: int, q: torch.Tensor, k: torch.Tensor, out: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own apply function on ``q [b, h, s, d]``, ``k`` (first ``r`` channels)."""
    mt = text.model_type
    if isinstance(out, torch.Tensor) and out.is_complex():
        if mt.startswith("llama4"):  # Llama-4 rotates [b, s, h, d]
            qr, kr = module.apply_rotary_emb(q.transpose(1, 2), k.transpose(1, 2), out)
            return qr.transpose(1, 2), kr.transpose(1, 2)
        return module.apply_rotary_emb(q, k, out)
    if mt in ("gptj", "codegen"):  # one tensor [b, s, h, r] at a time, (sin, cos)
        sin, cos = out

        def one(x: torch.Tensor) -> torch.Tensor:
            rot = module.apply_rotary_pos_emb(x[..., :r].transpose(1, 2), sin, cos)
            return torch.cat((rot.transpose(1, 2), x[..., r:]), -1)

        return one(q), one(k)
    cos, sin = out
    apply = plain_function(
        module.apply_rotary_pos_emb_interleave
        if is_flagged_interleave(text)
        else module.apply_rotary_pos_emb
    )
    if "k" not in inspect.signature(apply).parameters:  # Gemma-4: one tensor at a time
        qr, kr = apply(q[..., :r], cos, sin), apply(k[..., :r], cos, sin)
    else:
        qr, kr = apply(q[..., :r], k[..., :r], cos, sin)
    return torch.cat((qr, q[..., r:]), -1), torch.cat((kr, k[..., r:]), -1)


def in_reference_layout(text: Any, r: int, x: torch.Tensor) -> torch.Tensor:
    """posenc's rotated ``x`` with the rotated channels ordered as transformers writes them."""
    if not is_flagged_interleave(text):
        return x
    rot = x[..., :r]  # [x0' x1' x2' x3'] -> [x0' x2' | x1' x3']
    return torch.cat((rot[..., 0::2], rot[..., 1::2], x[..., r:]), -1)


def position_batches(text: Any, kw: dict[str, Any], name: str) -> list[torch.Tensor]:
    """``[1, s]`` position batches: samples up to 4x max_position_embeddings, each batch ending
    at a switch point (its maximum picks LongRoPE's and dynamic NTK's frequencies)."""
    length = text.max_position_embeddings
    orig = (kw["scaling"] or {}).get("original_max_position_embeddings")
    # GPT-J's sin/cos table has max_position_embeddings rows: nothing exists past it.
    top = length if text.model_type in ("gptj", "codegen") else 4 * length
    rng = random.Random(name.removeprefix(PREFIX))  # a fixture samples as it did before its move
    sample = {0, 1, 2, 3, 7, 31, 100, 1023, length // 2, length - 1, length, length + 1}
    sample |= {2 * length, 3 * length + 7, 4 * length - 1} | {rng.randrange(top) for _ in range(16)}
    ends = {top - 1, length - 1, length}
    if orig:
        sample |= {orig - 2, orig - 1, orig, orig + 1, 2 * orig}
        ends |= {orig - 2, orig - 1, orig, orig + 1}
    points = sorted(p for p in sample if 0 <= p < top)
    return [torch.tensor([[p for p in points if p < e] + [e]]) for e in sorted(ends) if e < top]


# --- the comparison ----------------------------------------------------------------------------


def compare(
    name: str,
    mutate: Callable[[dict[str, Any]], None] | None = None,
    seq_shift: int = 0,
    forms: tuple[str, ...] = ("dict", "object"),
    rope_slice: str | None = None,
) -> dict[str, float]:
    """Max errors of posenc against transformers over one corpus file.

    ``mutate`` edits posenc's copy of the config (transformers keeps the published one) and
    ``seq_shift`` moves the length posenc picks its frequencies for, ``rope_slice="leading"``
    rotates a trailing-slice model's leading channels: the negative controls.
    Returns ``{"cos_sin": .., "rotation": .., "bf16_ours": .., "bf16_transformers": ..}``.
    """
    raw = load(name)
    text = hf_text_config(raw)
    module, rotary = modeling(text), rotary_class(modeling(text))
    ours_raw = copy.deepcopy(raw)
    if mutate is not None:
        mutate(ours_raw)
    errors = dict.fromkeys(("cos_sin", "rotation", "bf16_ours", "bf16_transformers"), 0.0)
    torch.manual_seed(0)
    for layer_type in rope_keys(text):
        kw = hf_rope_kwargs(raw, layer_type)
        extra = transformers_key(text, layer_type)
        for form in forms:
            src = ours_raw if form == "dict" else hf_text_config(ours_raw)
            rope = rope_from_hf(src, layer_type)
            for positions in position_batches(text, kw, name):
                ref = rotary(text)(torch.zeros(1), positions, *extra)
                cos_ref, sin_ref = reference_cos_sin(ref, text.model_type, rope.span // 2)
                top = int(positions.max()) + 1 + seq_shift
                cos, sin = rope.cos_sin(positions, seq_len=top)
                scale = max(1.0, rope.attention_factor)
                err = max((cos - cos_ref).abs().max().item(), (sin - sin_ref).abs().max().item())
                errors["cos_sin"] = max(errors["cos_sin"], err / scale)
                _rotations(
                    errors, rope, module, text, kw, positions, ref, rotary, extra, rope_slice
                )
    return errors


def _rotations(errors, rope, module, text, kw, positions, ref, rotary, extra, slice_=None) -> None:
    if kw.get("rope_slice") == "trailing":  # [nope | rope] heads (DeepSeek-V4)
        _trailing_rotations(errors, rope, module, text, positions, ref, rotary, extra, slice_)
        return
    # the rotated span: rotary_dim, or the whole head where a proportional RoPE pads it
    s, d, r = positions.shape[-1], kw["head_dim"], rope.span
    q, k = torch.randn(1, 2, s, d), torch.randn(1, 1, s, d)
    ref_q, ref_k = reference_rotation(module, text, r, q, k, ref)
    ours = rope(q, k, positions)
    for o, x in zip(ours, (ref_q, ref_k), strict=True):
        err = (in_reference_layout(text, r, o) - x).abs().max().item()
        errors["rotation"] = max(errors["rotation"], err)
    ref16 = rotary(text)(torch.zeros(1, dtype=torch.bfloat16), positions, *extra)
    tf16 = reference_rotation(module, text, r, q.bfloat16(), k.bfloat16(), ref16)
    ours16 = rope(q.bfloat16(), k.bfloat16(), positions)
    for o, t, x in zip(ours16, tf16, (ref_q, ref_k), strict=True):
        errors["bf16_ours"] = max(
            errors["bf16_ours"], (in_reference_layout(text, r, o).float() - x).abs().max().item()
        )
        errors["bf16_transformers"] = max(
            errors["bf16_transformers"], (t.float() - x).abs().max().item()
        )


def _trailing_rotations(errors, rope, module, text, positions, ref, rotary, extra, slice_) -> None:
    """Heads laid out ``[nope | rope]`` (DeepSeek-V4): q, k as wide as the text head, posenc's
    tables rotating the trailing slice against the type's own one-tensor apply function, and the
    rotation by minus the angle (``cos, -sin``, the attention output's undo) against
    ``conj=True``. ``slice_="leading"`` rotates the leading slice instead (the planted fault)."""
    s, d, layout = positions.shape[-1], text.head_dim, rope.layout
    cos, sin = rope.cos_sin(positions)  # [1, s, r/2], float32
    c, sn = cos[:, None], sin[:, None]  # [1, 1, s, r/2]
    r = 2 * cos.shape[-1]

    def ours(x: torch.Tensor, conj: bool = False) -> list[torch.Tensor]:
        if slice_ == "leading":  # the fault: a [rope | nope] head's rotation
            lead = rotate_trailing(x[..., :r], c, sn, layout, conj=conj)
            return [torch.cat((lead, x[..., r:]), -1)]
        fused = apply_rotary_trailing(x, cos, -sin if conj else sin, 1,
                                      interleaved=layout == "interleaved")  # fmt: skip
        return [rotate_trailing(x, c, sn, layout, conj=conj), fused]

    q, k = torch.randn(1, 2, s, d), torch.randn(1, 1, s, d)
    cos_t, sin_t = ref
    for x in (q, k):
        for conj, want in ((False, module.apply_rotary_pos_emb(x, cos_t, sin_t)),
                           (True, module.apply_rotary_pos_emb(x, cos_t, -sin_t))):  # fmt: skip
            for o in ours(x, conj):
                errors["rotation"] = max(errors["rotation"], (o - want).abs().max().item())
    cos16, sin16 = rotary(text)(torch.zeros(1, dtype=torch.bfloat16), positions, *extra)
    for x in (q, k):
        want = module.apply_rotary_pos_emb(x, cos_t, sin_t)
        tf16 = module.apply_rotary_pos_emb(x.bfloat16(), cos16, sin16)
        for o in ours(x.bfloat16()):
            errors["bf16_ours"] = max(errors["bf16_ours"], (o.float() - want).abs().max().item())
        errors["bf16_transformers"] = max(
            errors["bf16_transformers"], (tf16.float() - want).abs().max().item()
        )


# --- the corpus itself -------------------------------------------------------------------------


def test_corpus_files_name_their_source() -> None:
    """Each file is in its folder's SOURCES.jsonl (tests/test_hf_corpus_files.py checks the
    entries: every corpus file verbatim, at least 80 with refused/)."""
    listed = {json.loads(line)["name"] for line in (CORPUS / "SOURCES.jsonl").open()}
    fixtures = {json.loads(line)["name"] for line in (REBUILT / "SOURCES.jsonl").open()}
    assert len(PUBLISHED) >= 70
    for name in PUBLISHED:
        assert f"{name}.json" in listed, name
    for name in FIXTURES:
        assert f"{name[len(PREFIX) :]}.json" in fixtures, name


def _kinds(names: list[str]) -> set[str]:
    kinds = set()
    for name in names:
        for layer_type in rope_keys(hf_text_config(load(name))):
            kw = hf_rope_kwargs(load(name), layer_type)
            kinds.add((kw["scaling"] or {}).get("rope_type", "default"))
            kinds |= {kw["layout"], "partial" if kw["rotary_dim"] < kw["head_dim"] else "full"}
            kinds |= {"mrope"} if "mrope_section" in kw else set()
            kinds |= {"per_layer_type"} if layer_type else set()
            kinds |= {"trailing"} if kw.get("rope_slice") == "trailing" else set()
    return kinds


# rope families no published file of the corpus has yet: only the rebuilt fixtures test them
FIXTURES_ONLY = {"linear", "longrope"}


def test_corpus_covers_the_rope_families() -> None:
    families = {
        "default", "linear", "yarn", "longrope", "llama3", "half", "interleaved", "partial",
        "mrope", "per_layer_type", "proportional", "trailing",
    }  # fmt: skip
    published = _kinds(PUBLISHED)
    assert published >= families - FIXTURES_ONLY
    assert not published & FIXTURES_ONLY, "a published file has it now: drop it from FIXTURES_ONLY"
    assert _kinds(FIXTURES) >= FIXTURES_ONLY


@pytest.mark.parametrize("name", NAMES)
def test_corpus_matches_transformers(name: str) -> None:
    errors = compare(name)
    assert errors["cos_sin"] <= TOL, errors
    assert errors["rotation"] <= TOL * 4, errors  # |q| up to ~4: a few float32 ulps
    assert errors["bf16_ours"] <= errors["bf16_transformers"], errors


# posenc's own reader (use_transformers=False) disagrees with transformers on these published
# files today; strict, so a fix shows at once.
@pytest.mark.parametrize("name", NAMES)
def test_fallback_table_reads_the_corpus_as_transformers_does(name: str) -> None:
    """Without transformers, the table of class defaults gives the same arguments."""
    raw = load(name)
    for layer_type in rope_keys(hf_text_config(raw)):
        assert hf_rope_kwargs(raw, layer_type, use_transformers=False) == hf_rope_kwargs(
            raw, layer_type
        )


def _has_mrope(name: str) -> bool:
    return "mrope_section" in hf_rope_kwargs(load(name), rope_keys(hf_text_config(load(name)))[0])


@pytest.mark.parametrize("name", [n for n in NAMES if _has_mrope(n)])
def test_corpus_mrope_with_3d_positions(name: str) -> None:
    """M-RoPE files with distinct temporal/height/width positions (images, video)."""
    raw = load(name)
    text = hf_text_config(raw)
    module, rotary = modeling(text), rotary_class(modeling(text))
    kw = hf_rope_kwargs(raw)
    torch.manual_seed(1)
    positions = torch.randint(0, 4 * text.max_position_embeddings, (3, 2, 9))  # [3, b, s]
    q, k = torch.randn(2, 2, 9, kw["head_dim"]), torch.randn(2, 1, 9, kw["head_dim"])
    ref = reference_rotation(module, text, kw["rotary_dim"], q, k, rotary(text)(q, positions))
    for form in (raw, hf_text_config(raw)):
        ours = rope_from_hf(form)(q, k, positions)
        for o, x in zip(ours, ref, strict=True):
            assert (o - x).abs().max().item() <= TOL * 4


# --- negative controls: each mutation must be caught -------------------------------------------


def _caught(name: str, **kwargs: Any) -> bool:
    """Whether posenc refuses the mutated config or disagrees with transformers."""
    try:
        errors = compare(name, forms=("dict",), **kwargs)
    except ValueError:
        return True
    return errors["cos_sin"] > TOL or errors["rotation"] > 4 * TOL


def test_negative_control_wrong_base() -> None:
    def plus_one(raw: dict[str, Any]) -> None:
        raw["rope_theta"] += 1

    assert not _caught("llama-3.1-8b-instruct")
    assert _caught("llama-3.1-8b-instruct", mutate=plus_one)
    assert _caught("qwen3-0.6b", mutate=plus_one)


def test_negative_control_swapped_yarn_betas() -> None:
    def swap(raw: dict[str, Any]) -> None:
        sc = raw["rope_scaling"]
        sc["beta_fast"], sc["beta_slow"] = sc["beta_slow"], sc["beta_fast"]

    for name in ("deepseek-v3", "gpt-oss-20b"):
        assert not _caught(name)
        assert _caught(name, mutate=swap), name


def test_negative_control_swapped_llama3_smoothing_factors() -> None:
    def swap(raw: dict[str, Any]) -> None:
        sc = raw["rope_scaling"]
        sc["low_freq_factor"], sc["high_freq_factor"] = (
            sc["high_freq_factor"],
            sc["low_freq_factor"],
        )

    assert _caught("llama-3.1-8b-instruct", mutate=swap)
    assert _caught("llama-3.2-1b-instruct", mutate=swap)


def test_negative_control_longrope_switch_moved_by_one() -> None:
    for name in ("rebuilt/phi-3.5-mini-instruct", "rebuilt/phi-4-mini-instruct"):  # fixtures
        assert not _caught(name)
        assert _caught(name, seq_shift=1), name
        assert _caught(name, seq_shift=-1), name


def test_negative_control_leading_slice_rotated() -> None:
    """DeepSeek-V4's heads are ``[nope | rope]``: rotating the leading ``qk_rope_head_dim``
    channels with the right tables is caught (the cos/sin alone cannot tell)."""
    assert not _caught("deepseek-v4-flash")
    assert _caught("deepseek-v4-flash", rope_slice="leading")


@pytest.mark.parametrize("low_high", [(1.0, 1.0), (2.0, 2.0), (1.0, 4.0)])
def test_llama3_frequencies_equal_transformers_with_equal_smoothing_factors(
    low_high: tuple[float, float],
) -> None:
    """Llama-4-Scout publishes low_freq_factor == high_freq_factor == 1.0: an empty smoothing
    band whose 0/0 transformers' where-masking never selects. posenc reads it and its
    frequencies equal ``_compute_llama3_parameters``' (they were refused before)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    low, high = low_high
    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0,
              "low_freq_factor": low, "high_freq_factor": high,
              "original_max_position_embeddings": 8192}  # fmt: skip
    config = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters=params)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    got, _ = rope_from_hf(config).frequencies()
    assert torch.isfinite(got).all() and torch.equal(got.float(), want.float())
