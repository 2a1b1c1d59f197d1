"""What each transformers architecture does with positions, read from its modeling code.

Tables keyed by ``model_type``: the pair layout, the rotary dim rule, M-RoPE, the query
temperature, the architectures posenc refuses (with the reason), and :func:`known_model_type`
with :func:`unknown_model_type_error` for names neither posenc nor transformers knows.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .defaults import CLASS_DEFAULTS

_XDROPE_REFUSAL = (
    "HunYuan-VL's XD-RoPE is not a rotation posenc can express: transformers' "
    "HunYuanVLRotaryEmbedding splits its {n} axis sections {section} over cat(freqs, freqs), so "
    "on image tokens the two channels of a half-split pair (j, j + d/2) turn by the angles of "
    "different axes (the map changes |q|); posenc's tables hold one angle per pair"
)
#: model_type -> why posenc refuses its multi-axis RoPE (``{n}``, ``{section}``: the sections).
MROPE_REFUSALS = {"hunyuan_vl": _XDROPE_REFUSAL, "hunyuan_vl_text": _XDROPE_REFUSAL}

# Attention rotates pairs (x[2i], x[2i+1]): rotate_every_two / "interleaved" rotate_half, or a
# complex product (DeepSeek-V2, Llama-4), or MLA models that always de-interleave.
INTERLEAVED_MODEL_TYPES = frozenset(
    {
        "axk2", "bailing_hybrid", "blt", "codegen", "cohere", "cohere2", "cohere2_moe",
        "deepseek_v2", "deepseek_v32", "deepseek_v4", "dots3_note", "dots3_note_text",
        "ernie4_5", "ernie4_5_moe", "glm", "glm4", "glm_moe_dsa", "gptj", "helium", "llama4",
        "llama4_text", "longcat_flash",
        "mistral_large4", "mistral_large4_text", "moonshine", "moonshine_streaming",
        "openai_privacy_filter",
        # rotate_half over (x[2i], x[2i+1]) (rotate_half_text / rotate_half_llm / BLT's own), or
        # q reshaped into pairs (Perception Encoder audio/video)
        "blt_global_transformer", "blt_local_decoder", "blt_local_encoder", "blt_patcher",
        "ernie4_5_vl_moe", "ernie4_5_vl_moe_text", "glm_ocr", "glm_ocr_text", "glm4v",
        "glm4v_text", "hy_v4_vl", "hy_v4_vl_text",
        # interleaved pairs written back de-interleaved, as DeepSeek-V3's
        # apply_rotary_pos_emb_interleave, always (transformers >= 5.25; 5.24 rotated HY-V4's text
        # model by half-split pairs and its VL model by interleaved ones)
        "hy_v4",
        "pe_audio", "pe_audio_encoder", "pe_audio_video", "pe_audio_video_encoder",
        "pe_video", "pe_video_encoder",
    }
)  # fmt: skip
# MLA models with a ``rope_interleave`` flag (and its class default): True -> interleaved pairs.
# transformers then writes the rotated channels de-interleaved ([x0 x2 .. | x1 x3 ..]); queries and
# keys get the same permutation, so attention scores equal those of the interleaved rotation.
ROPE_INTERLEAVE_MODEL_TYPES: dict[str, bool] = {
    "axk1": True, "deepseek_v3": True, "glm4_moe_lite": True, "mistral4": True,
    "sarvam_mla": True, "youtu": True,
}  # fmt: skip
# Model types whose M-RoPE posenc reproduces, with the sections their rotary class falls back to
# when the config has none (None: no fallback, plain RoPE then).
MROPE_MODEL_TYPES: dict[str, tuple[int, int, int] | None] = {
    "qwen2_vl": None, "qwen2_vl_text": None, "qwen2_5_vl": None, "qwen2_5_vl_text": None,
    # Qwen2-VL's section layout, falling back to [16, 24, 24] (Qwen2_5OmniRotaryEmbedding)
    **dict.fromkeys(
        ("qwen2_5_omni", "qwen2_5_omni_text", "qwen2_5_omni_thinker", "qwen2_5_omni_talker"),
        (16, 24, 24),
    ),
    "qwen3_vl": (24, 20, 20), "qwen3_vl_text": (24, 20, 20),
    "qwen3_vl_moe": (24, 20, 20), "qwen3_vl_moe_text": (24, 20, 20),
    "qwen3_5": (11, 11, 10), "qwen3_5_text": (11, 11, 10),
    "qwen3_5_moe": (11, 11, 10), "qwen3_5_moe_text": (11, 11, 10),
    # Qwen4-exp: Qwen3.5's rotary class, renamed (its text model always passes [3, b, s])
    "qwen4_exp": (11, 11, 10), "qwen4_exp_text": (11, 11, 10),
    "cosmos3_edge": (24, 20, 20), "cosmos3_edge_text": (24, 20, 20),  # Qwen3-VL's, renamed
    # Cohere-Compass: Qwen3-VL's interleaved sections, rope parameters by layer type
    "cohere_compass": (24, 20, 20), "cohere_compass_text": (24, 20, 20),
    # Qwen3-Omni's thinker: Qwen3-VL's rotary class, renamed
    "qwen3_omni_moe": (24, 20, 20), "qwen3_omni_moe_thinker": (24, 20, 20),
    "qwen3_omni_moe_text": (24, 20, 20),
    # Qwen2-VL's section layout; GLM-4V and GLM-OCR over interleaved pairs, the others half
    **dict.fromkeys(
        ("glm4v", "glm4v_text", "glm4v_moe", "glm4v_moe_text", "glm_image", "glm_image_text",
         "glm_ocr", "glm_ocr_text"), (8, 12, 12),
    ),
    # Qwen3-VL's interleaved sections over interleaved pairs
    "hy_v4_vl": (24, 20, 20), "hy_v4_vl_text": (24, 20, 20),
    # ERNIE-4.5-VL: sections (H, W, T) over interleaved pairs, its own allocation (below)
    "ernie4_5_vl_moe": (22, 22, 20), "ernie4_5_vl_moe_text": (22, 22, 20),
}  # fmt: skip
# Model types whose rotary class allocates the sections its own way (a name of
# posenc.functional.rotary.MROPE_ALLOCATIONS), whatever ``mrope_interleaved`` says.
MROPE_ALLOCATION_MODEL_TYPES: dict[str, str] = {
    "ernie4_5_vl_moe": "hw_alternating", "ernie4_5_vl_moe_text": "hw_alternating",
}  # fmt: skip
# Their rotary class interleaves the sections (T H W T H W ...) whatever ``mrope_interleaved`` says.
INTERLEAVED_MROPE_MODEL_TYPES = frozenset(
    t
    for t in MROPE_MODEL_TYPES
    if t.startswith(
        (
            "qwen3_vl",
            "qwen3_5",
            "qwen4_exp",
            "cosmos3_edge",
            "hy_v4_vl",
            "qwen3_omni_moe",
            "cohere_compass",
        )
    )
)
# The rotary dim is the config's ``rotary_dim`` (else hidden_size), not a factor of head_dim.
ROTARY_DIM_MODEL_TYPES = frozenset({"codegen", "gptj"})
# Attention that multiplies queries by ``llama_4_scaling_beta``'s scale (rope parameter key).
LLAMA4_SCALING_MODEL_TYPES = frozenset({"ministral3", "mistral3", "mistral4"})
LLAMA4_MODEL_TYPES = frozenset({"llama4", "llama4_text"})
# Architectures whose tables are RoPE's but whose rotation posenc's modules do not perform: their
# cos/sin read all the same where only the tables are wanted (a rotary module replaced in the
# model, whose own patched rotation applies them: NanoChat's, by minus the angle).
ROTATION_ONLY_UNSUPPORTED = {
    "nanochat": "its rotate_half flips the signs, i.e. it rotates by minus the angle",
}
# Rotary classes whose angles are float64 products of float32 frequencies (Ergo's
# ``position.double() * inv_freq.double()``): no one ``angle_dtype`` of a posenc module gives
# them, so rope_from_hf refuses them (below) while HFRotaryEmbedding, which computes its tables
# that way for these types, reads their frequencies.
FLOAT64_ANGLE_MODEL_TYPES = frozenset({"ergo"})
# Architectures whose rotation posenc cannot express.
UNSUPPORTED_MODEL_TYPES = {
    "nanochat": ROTATION_ONLY_UNSUPPORTED["nanochat"],
    "ergo": (
        "its rotary class multiplies float32 frequencies by float64 positions (float64 angles "
        "of float32 frequencies); rope_from_hf's module computes frequencies and angles in one "
        "angle_dtype, whose cos/sin differ from its own by up to 0.05 at 4x its context "
        "(transformers 5.25); posenc.hf.HFRotaryEmbedding and apply_posenc reproduce it"
    ),
    **dict.fromkeys(
        ("interns1_pro", "interns1_pro_text"),
        "its FoPE mixes learned coefficients into cos/sin: build posenc.rotary.FoPE with "
        "posenc.hf.fope_from_hf(config) and load the checkpoint's rotary_emb.cos_coef/sin_coef",
    ),
}


# Architectures without RoPE (transformers ships no rotary class for them, or their attention
# never calls it), with what they use instead: a RoPE read from their config would be made up.
_LEARNED = "learned absolute positions"
NO_ROPE_MODEL_TYPES: dict[str, str] = {
    **dict.fromkeys(("vit", "vit_msn", "deit", "dinov2", "ijepa"), _LEARNED),
    "nemotron_h": (
        "its attention layers apply none, the Mamba layers carry order; transformers ships "
        "no rotary class for it"
    ),
    "whisper": "sinusoidal encoder and learned decoder absolute positions",
    **dict.fromkeys(("gpt2", "bert", "roberta", "opt", "gpt_neo", "gpt_bigcode"), _LEARNED),
    **dict.fromkeys(("bloom", "mpt"), "ALiBi biases (posenc.bias)"),
    "t5": "bucketed relative position biases (posenc.bias)",
    **dict.fromkeys(("mamba", "mamba2", "rwkv"), "no attention"),
    # its modeling file's one rotary class is the vision encoder's (axial, pairwise)
    "inkling2_text": (
        "a relative position bias conditioned on the hidden states (Inkling2RelativePositionBias) "
        "and log(position)-scaled queries; its one rotary class is its vision encoder's"
    ),
}


# Half-split pairs (x[i], x[i + r/2]), transformers' plain rotate_half: the model types known to
# rotate that way (measured against each type's own rotary class and apply function, see
# tests/test_hf_sweep.py), so that a dict read without transformers can tell a known architecture
# from a misspelt one.
HALF_MODEL_TYPES = frozenset(
    {
        "EvollaModel", "afmoe", "apertus", "beam", "apertus1p5", "apertus1p5_text", "arcee", "aria",
        "aria_text", "bamba", "bitnet", "chameleon", "csm", "csm_depth_decoder_model", "cwm",
        "dbrx", "deepseek_ocr2", "deepseek_ocr2_encoder", "deepseek_ocr2_text", "dia",
        "dia_decoder", "dia_encoder", "diffllama", "diffusion_gemma", "diffusion_gemma_text",
        "doge", "dory", "dots1", "dots3_note_audio_encoder", "embedding_gemma2",
        "embedding_gemma2_text", "emu3", "emu3_text_model", "esm", "esmc", "eurobert", "evolla",
        "exaone4", "exaone_moe", "falcon", "falcon_h1", "flex_olmo", "flint", "gemma", "gemma2",
        "gemma3", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "gemma4_unified",
        "gemma4_unified_text", "glmasr", "glmasr_encoder", "gpt_neox_japanese",
        "gradium_phonon_tts", "granite", "granite4_vision", "granite4_vision_text",
        "granite_docling", "granite_docling_text", "granite_swa", "granitemoe",
        "granitemoe_swa", "granitemoehybrid", "granitemoeshared", "gte", "higgs_audio_v2",
        "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hunyuan_vl", "hunyuan_vl_text",
        "hy_v3", "hyperclovax", "idefics", "jais2", "jetmoe", "jina_embeddings_v3",
        "kolibri1", "kolibri1_1", "kyutai_speech_to_text", "laguna", "lara_mini", "lasr_encoder",
        "lfm2", "lfm2_moe", "lfm3", "llama", "mellum", "mimi", "mimi_decoder", "mimi_encoder",
        "mimo_v2_flash", "minicpm3", "minicpm5_moe", "minimax", "minimax_m2", "minimax_m3_vl",
        "minimax_m3_vl_text", "ministral", "mistral", "mixtral", "mllama", "mllama_text_model",
        "modernbert", "modernbert-decoder", "molmo2", "molmo2_text", "moshi", "muse_glimmer",
        "muse_glimmer_assistant", "muse_glimmer_text", "muse_spark", "muse_spark_text",
        "musicflamingo", "nemotron", "nemotron3_5_transcribe_asr_audio",
        "nemotron3_5_transcribe_word_timestamp", "nemotron3_diarization_audio", "neomme",
        "neucodec", "nomic_bert", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe",
        "paddleocr_vl", "paddleocr_vl_text", "phi3", "phi4_multimodal", "phimoe", "pocket_tts",
        "pocket_tts_audio_tokenizer", "pocket_tts_audio_tokenizer_decoder",
        "pocket_tts_audio_tokenizer_encoder", "qwen2", "qwen2_5_omni", "qwen2_5_omni_dit",
        "qwen2_5_omni_talker", "qwen2_5_omni_text", "qwen2_5_omni_thinker", "qwen2_moe",
        "qwen3", "qwen3_moe", "qwen3_omni_moe_talker_code_predictor",
        "qwen3_omni_moe_talker_text", "qwen4_exp", "qwen4_exp_text", "recurrent_gemma",
        "seed_oss", "smollm3", "solar_open", "starcoder2", "step3p5", "step3p7",
        "t5_gemma_module", "t5gemma", "t5gemma2", "t5gemma2_decoder", "t5gemma2_encoder",
        "t5gemma2_text", "timesfm2_5", "ultrabert", "unlimited_ocr", "unlimited_ocr_text",
        "vaultgemma", "voxtral_realtime", "voxtral_realtime_encoder", "voxtral_realtime_text",
        "xcodec2", "zamba2", "zaya"
    }
)  # fmt: skip


def _posenc_model_types() -> frozenset[str]:
    return frozenset().union(
        INTERLEAVED_MODEL_TYPES, ROPE_INTERLEAVE_MODEL_TYPES, MROPE_MODEL_TYPES,
        ROTARY_DIM_MODEL_TYPES, LLAMA4_SCALING_MODEL_TYPES, LLAMA4_MODEL_TYPES,
        UNSUPPORTED_MODEL_TYPES, HALF_MODEL_TYPES, CLASS_DEFAULTS, NO_ROPE_MODEL_TYPES,
    )  # fmt: skip


def _transformers_model_types() -> frozenset[str]:
    try:  # a name lookup only: transformers is optional
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return frozenset()
    return frozenset(CONFIG_MAPPING.keys())


def known_model_type(model_type: str) -> bool:
    """Whether posenc's tables or the installed transformers know ``model_type``."""
    return model_type in _posenc_model_types() or model_type in _transformers_model_types()


def unknown_model_type_error(model_type: str) -> ValueError:
    """The error for a ``model_type`` nobody knows, naming the close matches."""
    names = sorted(_posenc_model_types() | _transformers_model_types())
    lower = {n.lower(): n for n in names}
    close = [lower[n] for n in difflib.get_close_matches(model_type.lower(), list(lower), n=3)]
    hint = f"; close matches: {close}" if close else ""
    return ValueError(
        f"unknown model_type {model_type!r}: neither posenc's architecture tables nor the "
        f"installed transformers know it, so its pair layout and rotary dim are unknown{hint} "
        "(rope_from_hf(config, layout='half' or 'interleaved') reads it with the pairing you "
        "name)"
    )


_ROTARY_CLASS = re.compile(r"^class \w*RotaryEmbedding\(", re.M)


@functools.cache
def _transformers_has_rotary_class(model_type: str) -> bool | None:
    """Whether the installed transformers' ``modeling_<type>.py`` defines a ``*RotaryEmbedding``
    class (the enumeration of tests/test_hf_sweep.py); None when that cannot be told (no
    transformers, no such type or modeling file)."""
    try:  # a file read only: transformers is optional and its modeling code is not imported
        import transformers
        from transformers.models.auto.configuration_auto import model_type_to_module_name
    except ImportError:
        return None
    if model_type not in _transformers_model_types():
        return None
    name = model_type_to_module_name(model_type)
    path = Path(transformers.__file__).parent / "models" / name / f"modeling_{name}.py"
    if not path.is_file():
        return None
    return bool(_ROTARY_CLASS.search(path.read_text(encoding="utf-8")))


def _nests_text_config(config: Any) -> bool:
    """Whether ``config`` (a dict or config object) nests a text config: a decoder that may
    rotate though the wrapper's own modeling code has no rotary class."""
    if isinstance(config, Mapping):
        return isinstance(config.get("text_config"), Mapping)
    get_text_config = getattr(config, "get_text_config", None)
    sub = get_text_config(decoder=True) if callable(get_text_config) else config
    return sub is not config or getattr(config, "text_config", None) is not None


def check_has_rope(model_types: frozenset[str], config: Any) -> None:
    """Raise when a config of ``model_types`` has no RoPE to read.

    A type of :data:`NO_ROPE_MODEL_TYPES` says so by name. Otherwise, when every type is one
    transformers knows, posenc's tables do not, and whose modeling file defines no rotary class
    (and ``config`` nests no text config, whose decoder may have one), that is the reason.
    """
    for model_type in sorted(model_types):
        if model_type in NO_ROPE_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} has no rotary position encoding "
                f"({NO_ROPE_MODEL_TYPES[model_type]}): rope_from_hf has nothing to build"
            )
    if not model_types or model_types & _posenc_model_types() or _nests_text_config(config):
        return
    if all(_transformers_has_rotary_class(t) is False for t in model_types):
        names = sorted(model_types)
        raise ValueError(
            f"model_type {names[0]!r} has no rotary position encoding posenc can read: the "
            "installed transformers defines no rotary embedding class for it "
            f"(modeling code of {names}), so its positions are not a config-built RoPE"
        )
