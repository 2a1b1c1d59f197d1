"""What the real-model study scripts (``extend_smollm2_tasks.py``, ``extend_gemma3.py``) share:
their command lines, the packaged model they load, and the loop over pieces."""

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from posenc.extend.model.load import ModelSource, load_model, resolve_source
from posenc.extend.model.packaged import packaged_gguf
from posenc.extend.study.config import StudyConfig, parse_lengths
from posenc.extend.study.run import run_study


def threads(argv: list[str]) -> int:
    """``--threads=N`` (default 1, as most committed rows were measured, the other core free for
    the other study; 2 once only one study is left). Each row records its own count."""
    values = [a.removeprefix("--threads=") for a in argv if a.startswith("--threads")]
    if not values:
        return 1
    if len(values) > 1 or not values[0].isdigit() or int(values[0]) < 1:
        raise SystemExit(f"--threads takes one positive whole number as --threads=N, got {values}")
    return int(values[0])


def start(argv: list[str]) -> list[str]:
    """Log to stdout, run on :func:`threads` threads; the positional arguments of ``argv`` (the
    piece's lengths or methods)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    torch.set_num_threads(threads(argv))
    return [a for a in argv[1:] if not a.startswith("--")]


def packaged(name: str, dtype: str = "float32") -> tuple[Any, Any, ModelSource]:
    """``(model, tokenizer, source)``: the packaged GGUF ``name`` loaded in ``dtype``."""
    source = resolve_source(str(packaged_gguf(name)))
    model, tokenizer = load_model(source, dtype=dtype)
    return model, tokenizer, source


def run_pieces(
    loaded: tuple[Any, Any, ModelSource],
    lengths: str,
    configs: Callable[[str], list[StudyConfig]],
    out: str,
    dtype: str,
) -> None:
    """The task pieces at ``lengths``, shortest first (whole columns of the table): each length's
    :class:`StudyConfig` s (``configs(length)``, one per task setting) run into ``out``."""
    model, tokenizer, source = loaded
    for n in parse_lengths(lengths):
        for cfg in configs(str(n)):
            run_study(model, tokenizer, source, cfg, out, dtype=dtype)
