"""Every model type the installed transformers ships with a rotary class, against posenc.

The sweep enumerates (it keeps no list of types): each ``model_type`` of ``CONFIG_MAPPING`` whose
``modeling_<type>.py`` defines a ``*RotaryEmbedding`` class built from a config. For the type's
default config, its own rotary class and the apply function its attention calls, posenc's
:func:`~posenc.hf.rope_from_hf` must either

* be exact: cos/sin and the rotated q/k equal transformers' (float32, <= 1e-6 times |q|) at a few
  positions, far ones included (4x ``max_position_embeddings``); or
* refuse the config with a ValueError that says why.

Nothing may come back silently wrong. A newer transformers with new types shows them here at once.
Types whose rotary class cannot be built from their own default config, or cannot run on plain
``[1, s]`` positions, are counted as skipped (transformers itself does not run them that way).
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.configuration_auto import model_type_to_module_name  # noqa: E402

from posenc.hf import (  # noqa: E402
    UNSUPPORTED_MODEL_TYPES,
    hf_rope_kwargs,
    rope_from_hf,
)
from posenc.hf.shadow import plain_function  # noqa: E402
from posenc.rotary import MRoPE  # noqa: E402
from test_hf_corpus import reference_cos_sin, reference_rotation, rope_keys  # noqa: E402

MODELS = Path(transformers.__file__).parent / "models"
TOL = 1e-6
_APPLY = re.compile(r"\b(apply_\w*rot\w*|apply_\w*emb\w*)\(")
# Name parts of rotary and attention classes that are not the text decoder's (Qwen2.5-Omni's
# token-to-wave DiT has a plain rotary class beside the thinker's M-RoPE one).
_NOT_TEXT = ("Vision", "Audio", "Vit", "Patch", "DiT")


def _modeling(model_type: str) -> Any | None:
    name = model_type_to_module_name(model_type)
    path = MODELS / name / f"modeling_{name}.py"
    if not path.exists() or not re.search(r"^class \w*RotaryEmbedding\(", path.read_text(), re.M):
        return None
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _rotary_classes(module: Any) -> list[type]:
    """The module's ``*RotaryEmbedding`` classes built from a config, text ones first."""
    found = []
    for name, obj in vars(module).items():
        if name.endswith("RotaryEmbedding") and isinstance(obj, type):
            params = list(inspect.signature(obj.__init__).parameters)
            if obj.__module__ == module.__name__ and params[1:2] == ["config"]:
                found.append(obj)
    return sorted(
        found,
        key=lambda c: (
            "Text" not in c.__name__,
            any(s in c.__name__ for s in _NOT_TEXT),
            c.__name__,
        ),
    )


def _apply_function(module: Any, rotary: type) -> Any | None:
    """The apply function the attention beside ``rotary`` calls (text attention for a text
    rotary class; vision or audio attention never for a text one)."""
    calls: list[str] = []
    other = _NOT_TEXT
    for name, obj in vars(module).items():
        if not (isinstance(obj, type) and obj.__module__ == module.__name__):
            continue
        if "Attention" not in name or any(s in name for s in other) != any(
            s in rotary.__name__ for s in other
        ):
            continue
        try:
            calls += _APPLY.findall(inspect.getsource(obj))
        except (OSError, TypeError):
            continue
    names = [c for c in dict.fromkeys(calls) if hasattr(module, c)]
    # MLA models call the interleaved variant when rope_interleave is set, the plain one otherwise
    if len(names) > 1:
        return None
    return plain_function(getattr(module, names[0])) if names else None


def _reference(module: Any, apply: Any, text: Any, out: Any, q: torch.Tensor, k: torch.Tensor,
               r: int) -> Any:  # fmt: skip
    """``apply`` (the attention's function) on ``q [b, h, s, d]``, ``k``; transformers rotates
    the first ``cos.shape[-1]`` channels (all of them for Gemma-4's proportional RoPE)."""
    if isinstance(out, torch.Tensor):  # complex e^{i angle}: DeepSeek-V2, Llama-4
        return reference_rotation(module, text, r, q, k, out)
    cos, sin = out
    r = max(r, cos.shape[-1])  # gpt-oss: one cos per pair; Gemma-4: the whole head
    if list(inspect.signature(apply).parameters)[1:3] == ["cos", "sin"]:  # Gemma-3n/4: one x
        parts = [apply(x[..., :r], cos, sin) for x in (q, k)]
    else:
        parts = list(apply(q[..., :r], k[..., :r], cos, sin))
    return tuple(torch.cat((p, x[..., r:]), -1) for p, x in zip(parts, (q, k), strict=True))


def _deinterleaved(x: torch.Tensor, r: int) -> torch.Tensor:
    rot = x[..., :r]  # [x0' x1' x2' x3'] -> [x0' x2' | x1' x3']
    return torch.cat((rot[..., 0::2], rot[..., 1::2], x[..., r:]), -1)


def sweep_one(model_type: str) -> tuple[str, str]:
    """``(verdict, detail)``: verdict one of exact, refused, wrong, skipped."""
    module = _modeling(model_type)
    if module is None:
        return "none", ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            text = CONFIG_MAPPING[model_type]().get_text_config(decoder=True)
        except Exception as err:  # a default config transformers itself cannot build
            return "skipped", f"no default config: {err!r:.80}"
    for cls in _rotary_classes(module):
        try:
            rotary = cls(text)
            break
        except Exception:
            continue
    else:
        return "skipped", "no rotary class builds from the default config"
    try:
        params = getattr(text, "rope_parameters", None) or {}
        # DeepSeek-V4 keys its rope sets by label (main, compress), not by layer type
        labels = list(getattr(text, "_rope_type_labels", None) or ()) or rope_keys(text)
        keys = [lt for lt in labels if lt is None or params[lt] is not None]  # not NoPE
        ropes = {lt: rope_from_hf(text, lt) for lt in keys}
    except ValueError as err:
        return "refused", str(err)
    for rope in ropes.values():
        # positions out to 4x max_position_embeddings would grow each table to 2**19+ rows
        # (1-2 s a type); without the table the same float32 rows come from the formula
        # directly (tests/test_rotary.py checks the table's rows equal them)
        rope.max_cache_len = rope.cache_len
    worst = 0.0
    apply = _apply_function(module, type(rotary))
    for lt, rope in ropes.items():
        kw = hf_rope_kwargs(text, lt)
        length = getattr(text, "max_position_embeddings", None) or 4096
        top = length if model_type in ("gptj", "codegen") else 4 * length  # GPT-J's table ends
        positions = torch.tensor([[0, 1, 7, 100, length - 1, top - 1]])
        extra = () if lt is None else (lt,)
        try:
            ref = rotary(torch.zeros(1), positions, *extra)
        except Exception as err:
            return "skipped", f"rotary class does not run on [1, s] positions: {err!r:.80}"
        cos_ref, sin_ref = reference_cos_sin(ref, model_type, rope.span // 2)
        cos, sin = rope.cos_sin(positions, seq_len=top)
        scale = max(1.0, rope.attention_factor)
        err = max((cos - cos_ref).abs().max().item(), (sin - sin_ref).abs().max().item())
        worst = max(worst, err / scale)
        if apply is None:
            continue
        r, d = kw["rotary_dim"], kw["head_dim"]
        torch.manual_seed(0)
        q, k = torch.randn(1, 2, 6, d), torch.randn(1, 1, 6, d)
        if model_type in ("gptj", "codegen"):
            sin_, cos_ = ref  # GPT-J: (sin, cos), one tensor [b, s, h, r] at a time
            theirs = [
                torch.cat((apply(x[..., :r].transpose(1, 2), sin_, cos_).transpose(1, 2),
                           x[..., r:]), -1)
                for x in (q, k)
            ]  # fmt: skip
        else:
            try:
                if kw.get("rope_slice") == "trailing":  # DeepSeek-V4: the whole head, as its apply
                    theirs = [apply(x, *ref) for x in (q, k)]  # rotates the trailing slice
                else:
                    theirs = list(_reference(module, apply, text, ref, q, k, r))
            except Exception as err:
                return "skipped", f"apply function {apply.__name__} not callable here: {err!r:.80}"
        ours = rope(q, k, positions)
        for o, t in zip(ours, theirs, strict=True):
            if apply.__name__.endswith("_interleave"):  # written back de-interleaved
                o = _deinterleaved(o, ref[0].shape[-1])
            worst = max(worst, (o - t).abs().max().item() / 4)  # |q| up to ~4
    if worst > TOL:
        return "wrong", f"max error {worst:.3g}"
    return "exact", f"max error {worst:.3g}" + ("" if apply else " (cos/sin only)")


TYPES = sorted(t for t in CONFIG_MAPPING if _modeling(t) is not None)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[str, str]]:
    return {t: sweep_one(t) for t in TYPES}


def test_sweep_finds_the_rotary_models(verdicts: dict[str, tuple[str, str]]) -> None:
    exact = [t for t, (v, _) in verdicts.items() if v == "exact"]
    assert len(TYPES) >= 150 and len(exact) >= 150, (len(TYPES), len(exact))
    for t in ("llama", "gptj", "deepseek_v3", "gemma3_text", "qwen3_vl_text", "pe_audio_encoder"):
        assert verdicts[t][0] == "exact", (t, verdicts[t])


def test_nothing_is_silently_wrong(verdicts: dict[str, tuple[str, str]]) -> None:
    wrong = {t: d for t, (v, d) in verdicts.items() if v == "wrong"}
    assert not wrong, wrong


def test_refusals_say_why(verdicts: dict[str, tuple[str, str]]) -> None:
    for t, (v, detail) in verdicts.items():
        if v == "refused":
            assert len(detail) > 20 and ("posenc" in detail or "must" in detail), (t, detail)
    assert verdicts["nanochat"][0] == "refused" and "nanochat" in UNSUPPORTED_MODEL_TYPES


def test_labelled_and_indexer_types_are_exact(verdicts: dict[str, tuple[str, str]]) -> None:
    """DeepSeek-V4 (both rope sets, the trailing interleaved slice) and the DSA models whose
    indexers rotate apart from their MLA (tests/test_hf_deepseek_v4.py, tests/test_hf_indexer.py
    check the slices, the value rotation and the indexers)."""
    for t in ("deepseek_v4", "deepseek_v32", "glm_moe_dsa"):
        assert verdicts[t][0] == "exact", (t, verdicts[t])


def test_mistral4_reads_llama_4_scaling_beta(verdicts: dict[str, tuple[str, str]]) -> None:
    assert verdicts["mistral4"][0] == "exact", verdicts["mistral4"]


def test_every_exact_type_is_in_posencs_tables(verdicts: dict[str, tuple[str, str]]) -> None:
    """posenc's own tables know every type measured exact here, so that a dict read without
    transformers finds its layout too. A type a newer transformers adds fails here until its
    measured layout is entered in ``posenc.hf.architectures``."""
    from posenc.hf.architectures import _posenc_model_types

    known = _posenc_model_types()
    missing = sorted(t for t, (v, _) in verdicts.items() if v == "exact" and t not in known)
    assert not missing, f"add to posenc.hf.architectures (half layout unless measured): {missing}"


def test_interleaved_types_are_caught_when_read_as_half(monkeypatch: Any) -> None:
    """Negative control: reading a type of each new interleaved family as half is caught."""
    from posenc.hf import architectures, config

    for t in ("ernie4_5_vl_moe_text", "glm_ocr_text", "blt_patcher", "pe_video_encoder"):
        assert sweep_one(t)[0] == "exact", t
        half = architectures.INTERLEAVED_MODEL_TYPES - {t}
        with monkeypatch.context() as m:
            m.setattr(config, "INTERLEAVED_MODEL_TYPES", half)
            assert sweep_one(t)[0] == "wrong", t


# A consistent small config for the types whose default config transformers cannot run (GLM-4V:
# mrope_section [8, 12, 12] is 32 pairs, the default head 64 pairs).
_SMALL_MROPE = {"head_dim": 64, "hidden_size": 128, "num_attention_heads": 2,
                "partial_rotary_factor": 1.0}  # fmt: skip


def _mrope_error(model_type: str, layout: str | None = None) -> float | None:
    """posenc's M-RoPE against the type's rotary class and apply function on distinct 3-D
    positions (max |error|), or None when posenc reads the type as plain RoPE."""
    module = _modeling(model_type)
    for kwargs in ({}, _SMALL_MROPE):
        text = CONFIG_MAPPING[model_type](**kwargs).get_text_config(decoder=True)
        try:
            rotary = _rotary_classes(module)[0](text)  # text classes first
            rope = rope_from_hf(text, layout=layout)
            break
        except (ValueError, RuntimeError, KeyError):  # KeyError: Cohere-Compass's default
            continue  # config has no rope parameters per type (the registry sweep checks it)
    else:
        return None  # neither config builds (counted by the caller)
    if not isinstance(rope, MRoPE):  # Qwen2-VL's default config has no sections
        return None
    apply = _apply_function(module, type(rotary))
    positions = torch.randint(0, 4 * text.max_position_embeddings, (3, 1, 5))  # [3, b, s]
    q, k = torch.randn(1, 2, 5, rope.head_dim), torch.randn(1, 1, 5, rope.head_dim)
    theirs = _reference(module, apply, text, rotary(q, positions), q, k, rope.rotary_dim)
    ours = rope(q, k, positions)
    if apply.__name__.endswith("_interleave"):  # HY-V4-VL (5.25): written back de-interleaved
        ours = tuple(_deinterleaved(o, rope.rotary_dim) for o in ours)
    return max((o - t).abs().max().item() for o, t in zip(ours, theirs, strict=True))


def test_mrope_types_with_3d_positions() -> None:
    """Every M-RoPE type posenc reads, on distinct temporal/height/width positions, against the
    type's own rotary class and apply function."""
    from posenc.hf import MROPE_MODEL_TYPES

    torch.manual_seed(1)
    errors = {
        t: _mrope_error(t)
        for t in sorted(MROPE_MODEL_TYPES)
        if t in CONFIG_MAPPING and _modeling(t) is not None
    }
    checked = {t: e for t, e in errors.items() if e is not None}
    assert len(checked) >= 16 and {
        "glm4v_text",
        "glm_ocr_text",
        "hy_v4_vl_text",
        "qwen2_5_omni_thinker",
        "ernie4_5_vl_moe_text",
    } <= set(checked)
    assert all(e <= 4 * TOL for e in checked.values()), checked


def test_mrope_pair_layout_is_caught() -> None:
    """Negative control: GLM-4V's M-RoPE over half pairs instead of interleaved ones."""
    torch.manual_seed(1)
    assert _mrope_error("glm4v_text") <= 4 * TOL
    assert _mrope_error("glm4v_text", layout="half") > 0.1


def test_ernie_mrope_allocation_is_caught(monkeypatch: Any) -> None:
    """Negative control: ERNIE-4.5-VL's (H, W, T) sections allocated as Qwen2-VL's, with H and W
    swapped, or over half pairs, are caught on 3-D positions."""
    from posenc.functional import rotary
    from posenc.hf import config

    torch.manual_seed(1)
    assert _mrope_error("ernie4_5_vl_moe_text") <= 4 * TOL
    assert _mrope_error("ernie4_5_vl_moe_text", layout="half") > 0.1
    with monkeypatch.context() as m:
        m.setitem(config.MROPE_ALLOCATION_MODEL_TYPES, "ernie4_5_vl_moe_text", "contiguous")
        assert _mrope_error("ernie4_5_vl_moe_text") > 0.1
    right = rotary.MROPE_ALLOCATIONS["hw_alternating"]
    with monkeypatch.context() as m:  # [W H W H .. T]: the two spatial axes swapped
        m.setitem(rotary.MROPE_ALLOCATIONS, "hw_alternating",
                  lambda sec: [{1: 2, 2: 1}.get(a, a) for a in right(sec)])  # fmt: skip
        assert _mrope_error("ernie4_5_vl_moe_text") > 0.1


def _no_rotary_class(model_type: str) -> bool:
    name = model_type_to_module_name(model_type)
    path = MODELS / name / f"modeling_{name}.py"
    return path.exists() and not re.search(r"^class \w*RotaryEmbedding\(", path.read_text(), re.M)


def test_types_without_a_rotary_class_are_refused() -> None:
    """The other side of the enumeration: a type whose modeling file defines no rotary class
    (ViT, Whisper, NemotronH, BERT, ...) and whose config nests no text decoder is refused,
    saying it has no RoPE, for its default config object and its dict; none is read as one."""
    from posenc.hf.architectures import NO_ROPE_MODEL_TYPES, _posenc_model_types

    known, refused, read = _posenc_model_types() - NO_ROPE_MODEL_TYPES.keys(), [], []
    for model_type in sorted(t for t in CONFIG_MAPPING if t not in TYPES and t not in known):
        if not _no_rotary_class(model_type):
            continue
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:
            continue
        if config.get_text_config(decoder=True) is not config:
            continue  # a wrapper: its text decoder may rotate
        for form in (config, config.to_dict()):
            try:
                rope_from_hf(form)
            except ValueError as err:
                assert "no rotary position encoding" in str(err), (model_type, str(err))
                refused.append(model_type)
            else:
                read.append(model_type)
    assert not read, f"read as RoPE though transformers has no rotary class: {sorted(set(read))}"
    assert len(set(refused)) >= 150, len(set(refused))
    for model_type in ("vit", "bert", "gpt2", "roformer"):
        assert model_type in refused, model_type


def test_named_no_rope_types_are_refused_without_transformers() -> None:
    """posenc's own table refuses them by name when the dict is read without transformers."""
    for model_type in ("vit", "nemotron_h", "whisper"):
        config = CONFIG_MAPPING[model_type]().to_dict()
        with pytest.raises(ValueError, match=f"'{model_type}' has no rotary position encoding"):
            rope_from_hf(config, use_transformers=False)


def test_unknown_type_error_is_unchanged() -> None:
    with pytest.raises(ValueError, match=r"unknown model_type 'GPTJ'.*close matches: \['gptj'"):
        rope_from_hf({"model_type": "GPTJ", "hidden_size": 64, "num_attention_heads": 4})
