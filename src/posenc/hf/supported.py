"""The architectures :func:`~posenc.hf.apply_posenc` patches, and how each one rotates.

Each supported architecture is an entry of :data:`SUPPORTED`: its modeling module and, for each
rotation function it calls, a :class:`Rotation` saying how that function rotates (pairing,
cos/sin table layout, output order). ``apply_posenc`` checks each entry against the installed
transformers before patching (:func:`~posenc.hf.patch.check_rotation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..functional.rope_scaling import yarn_mscale


@dataclass(frozen=True)
class Rotation:
    """How one transformers rotation function rotates.

    ``interleaved``: pairs ``(x[2i], x[2i+1])`` (else ``(x[i], x[i + r/2])``); ``table_layout``:
    the cos/sin it receives (``"cat"`` or ``"repeat"``, see :mod:`posenc.hf.rotary`);
    ``deinterleave``: it writes the rotated pairs de-interleaved, ``[x0' x2' .. | x1' x3' ..]``
    (DeepSeek-V3's ``apply_rotary_pos_emb_interleave``).
    """

    interleaved: bool = False
    table_layout: str = "cat"
    deinterleave: bool = False
    partial: bool = False  # it rotates channels 0..r-1 (r = cos width) and passes r..d-1
    # One tensor, ``f(x, cos, sin, unsqueeze_dim=1)``, rotated on its *trailing* r channels
    # (``[nope | rope]`` heads; DeepSeek-V4, whose attention also calls it with ``-sin``).
    trailing: bool = False
    # One tensor, ``f(x, cos, sin, unsqueeze_dim=1)``, rotated on its *leading* r channels
    # (Gemma-3n, which rotates queries and keys by separate calls).
    single: bool = False
    # Llama-4's ``apply_rotary_emb(xq, xk, freqs_cis)``: ``[b, s, h, d]`` tensors and one complex
    # table ``[b, s, r/2]`` (cos + i sin, the rotary's attention scaling folded in).
    freqs_cis: bool = False
    # With ``freqs_cis``: ``[b, h, s, d]`` tensors (DeepSeek-V2's MLA rope slices).
    heads_first: bool = False
    # Turned by minus the angle: NanoChat's ``rotate_half`` is ``cat(x2, -x1)``, so its
    # ``q cos + rotate_half(q) sin`` is the usual rotation with ``-sin``.
    clockwise: bool = False
    # ``f(q, k=None, cos=None, sin=None, unsqueeze_dim=1)``: ``(q', k')`` with k, else ``q'``
    # alone (Qwen4-exp, whose indexer rotates its queries and its pooled keys ``[n, 1, d]``
    # against tables ``[n, r]`` through the attention's own function).
    optional_k: bool = False


HALF = Rotation()
HALF_PARTIAL = Rotation(partial=True)  # GPT-NeoX, Phi-3
# GLM: cat(freqs, freqs) tables, repeated per pair inside, rotate_half on interleaved pairs.
GLM = Rotation(interleaved=True, partial=True)
# Helium, ERNIE-4.5: cat(freqs, freqs) tables, repeated per pair inside, interleaved pairs over
# the whole head (no channel passed through).
GLM_FULL = Rotation(interleaved=True)
# NanoChat: half-split pairs turned by minus the angle.
HALF_CLOCKWISE = Rotation(clockwise=True)
# Cohere: repeat_interleave(freqs, 2) tables and interleaved pairs.
COHERE = Rotation(interleaved=True, table_layout="repeat")
DEEPSEEK_INTERLEAVE = Rotation(interleaved=True, deinterleave=True)
# GLM-4V: repeat_interleave(freqs, 2) tables (its M-RoPE), rotate_half_llm on interleaved pairs.
GLM4V = Rotation(interleaved=True, table_layout="repeat", partial=True)
# gpt-oss: one column per pair (its rotary's output), half-split pairs.
GPT_OSS = Rotation(table_layout="half")
# DeepSeek-V4: one column per pair (its rotary's output), interleaved pairs, trailing slice.
DEEPSEEK_V4 = Rotation(interleaved=True, table_layout="half", trailing=True)
# Gemma-3n: one tensor, half-split pairs, cat(freqs, freqs) tables.
GEMMA3N = Rotation(single=True)
# Llama-4: interleaved pairs, one complex column per pair.
LLAMA4 = Rotation(interleaved=True, table_layout="half", freqs_cis=True)
# DeepSeek-V2: the same complex rotation of its MLA rope slices, heads before positions.
DEEPSEEK_V2 = Rotation(interleaved=True, table_layout="half", freqs_cis=True, heads_first=True)

_STANDARD = {"apply_rotary_pos_emb": HALF}
_Entry = tuple[str, dict[str, Rotation]]


# Architectures that rotate half pairs with apply_rotary_pos_emb in the modeling module named by
# their model type (the last two: text decoders of vision-language models, whose M-RoPE is in the
# rotary module).
_STANDARD_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3",
    "granite", "olmo2", "olmo3", "stablelm", "smollm3", "qwen2_vl", "qwen2_5_vl",
)  # fmt: skip


#: model_type -> (transformers modeling module, {rotation function name: how it rotates}).
SUPPORTED: dict[str, _Entry] = {
    **{t: (t, _STANDARD) for t in _STANDARD_TYPES},
    "gemma3_text": ("gemma3", _STANDARD),
    "qwen2_vl_text": ("qwen2_vl", _STANDARD),
    "qwen2_5_vl_text": ("qwen2_5_vl", _STANDARD),
    # (their full models are found by their text config's model_type)
    "qwen2_5_omni_text": ("qwen2_5_omni", _STANDARD),
    "qwen3_omni_moe_text": ("qwen3_omni_moe", _STANDARD),  # its float32 positions: see rotary.py
    "glm4v_text": ("glm4v", {"apply_rotary_pos_emb": GLM4V}),
    "qwen3_next": ("qwen3_next", {"apply_rotary_pos_emb": HALF_PARTIAL}),  # beside linear layers
    "gemma3n_text": ("gemma3n", {"apply_rotary_pos_emb": GEMMA3N}),
    "llama4_text": ("llama4", {"apply_rotary_emb": LLAMA4}),
    "deepseek_v2": ("deepseek_v2", {"apply_rotary_emb": DEEPSEEK_V2}),
    "phi3": ("phi3", {"apply_rotary_pos_emb": HALF_PARTIAL}),
    "gpt_neox": ("gpt_neox", {"apply_rotary_pos_emb": HALF_PARTIAL}),
    "cohere": ("cohere", {"apply_rotary_pos_emb": COHERE}),
    "cohere2": ("cohere2", {"apply_rotary_pos_emb": COHERE}),
    "gpt_oss": ("gpt_oss", {"apply_rotary_pos_emb": GPT_OSS}),
    "glm": ("glm", {"apply_rotary_pos_emb": GLM}),
    "deepseek_v3": (
        "deepseek_v3",
        {"apply_rotary_pos_emb": HALF, "apply_rotary_pos_emb_interleave": DEEPSEEK_INTERLEAVE},
    ),
    # DSA: the MLA's interleaved rotation and the indexer's own (DeepSeek-V3.2: half-split)
    "deepseek_v32": (
        "deepseek_v32",
        {"apply_rotary_pos_emb": HALF, "apply_rotary_pos_emb_interleave": DEEPSEEK_INTERLEAVE},
    ),
    "glm_moe_dsa": ("glm_moe_dsa", {"apply_rotary_pos_emb_interleave": DEEPSEEK_INTERLEAVE}),
    # DeepSeek-V3's MLA rotation: LongCat-Flash, Bailing's hybrid (beside linear layers), HY-V4
    # (its DSA indexer too, by the same function)
    **{
        t: (t, {"apply_rotary_pos_emb_interleave": DEEPSEEK_INTERLEAVE})
        for t in ("longcat_flash", "bailing_hybrid", "hy_v4")
    },
    # Attention, compressors and indexer: q, the shared key/value, compressed keys; the
    # attention output with -sin (rotation by minus the angle, undoing the values' rotation).
    "deepseek_v4": ("deepseek_v4", {"apply_rotary_pos_emb": DEEPSEEK_V4}),
}

# Rope sets kept by label (DeepSeek-V4's "main" and "compress"): the model's rotary modules are
# replaced by posenc's (:class:`~posenc.hf.rotary.HFRotaryEmbedding`, every label) even without
# ``scaling=``, so the tables as well as the rotation are posenc's.
LABELLED_ROTARY_MODEL_TYPES = frozenset({"deepseek_v4"})


# Attention whose softmax scale reads the rope parameters: DeepSeek-V3's MLA multiplies it by
# yarn_mscale(factor, mscale_all_dim) ** 2 when a YaRN scaling sets mscale_all_dim.
MSCALE_SOFTMAX_MODEL_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "deepseek_v32",
                                        "glm_moe_dsa", "longcat_flash", "bailing_hybrid",
                                        "hy_v4"})  # fmt: skip


def mla_softmax_scale(head_dim: int, scaling: Mapping[str, Any]) -> float:
    """DeepSeek-V3's softmax scale for ``scaling``: ``head_dim ** -0.5``, times
    ``yarn_mscale(factor, mscale_all_dim) ** 2`` for a YaRN scaling with ``mscale_all_dim``."""
    scale = head_dim**-0.5
    rope_type = scaling.get("rope_type", scaling.get("type"))
    mscale_all_dim = scaling.get("mscale_all_dim") or 0
    if rope_type == "yarn" and mscale_all_dim:
        scale *= yarn_mscale(float(scaling["factor"]), float(mscale_all_dim)) ** 2
    return scale


def supported_model_types() -> list[str]:
    """The ``model_type`` values :func:`apply_posenc` accepts by name (any other is tried by
    :func:`~posenc.hf.detect.detected_entry`)."""
    return sorted(SUPPORTED)


#: Rotations tried, in this order, on the ``apply_rotary_pos_emb`` of a model type outside
#: :data:`SUPPORTED` (:func:`~posenc.hf.detect.detected_entry`): the first that gives the stock
#: function's result on random probes is the type's. A half-split function that passes channels
#: past the table's width through passes the partial probe too, so ``HALF_PARTIAL`` goes first
#: (and ``GLM`` before ``GLM_FULL``).
DETECTABLE: tuple[Rotation, ...] = (HALF_PARTIAL, HALF, GLM, GLM_FULL, COHERE, HALF_CLOCKWISE)
#: The same for a one-tensor ``apply_rotary_pos_emb(x, cos, sin, ...)`` (queries and keys rotated
#: by separate calls): Gemma-3n's half-split pairs over the whole head.
SINGLE_DETECTABLE: tuple[Rotation, ...] = (GEMMA3N,)
#: The same for ``apply_rotary_pos_emb(q, k=None, cos=None, sin=None, ...)``, which rotates q and
#: k, or q alone (Qwen4-exp): :data:`DETECTABLE`'s rotations, each taking both call forms.
OPTIONAL_K_DETECTABLE: tuple[Rotation, ...] = tuple(replace(r, optional_k=True) for r in DETECTABLE)

#: Model types never detected, and why (transformers' classes that call ``apply_rotary_pos_emb``
#: but rotate something else with it, or whose attention adds what posenc does not model).
NOT_DETECTED: dict[str, str] = {}


def modeling_module_name(model_type: str) -> str | None:
    """``transformers.models.X.modeling_X`` for the config class of ``model_type`` (a text
    config's type included: ``qwen3_5_text`` -> ``qwen3_5``), or None where transformers has no
    such type."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        config_module = CONFIG_MAPPING[model_type].__module__
    except (ImportError, KeyError):
        return None
    package, _, leaf = config_module.rpartition(".")
    if not leaf.startswith("configuration_"):
        return None
    return f"{package}.modeling_{leaf[len('configuration_') :]}"
