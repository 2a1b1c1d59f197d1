"""Where a Hugging Face config comes from: a dict, a config object, a file, a folder, or the cache.

:func:`resolve_config` is called once at each public entry of :mod:`posenc.hf`
(:func:`~posenc.hf.rope_from_hf`, :func:`~posenc.hf.hf_rope_kwargs`,
:func:`~posenc.hf.attention_temperature_from_hf`, :func:`~posenc.hf.position_plan`) and turns what
the caller gave into a dict (read from JSON) or leaves a config object as it is:

* a ``Mapping`` (a parsed ``config.json``) or a transformers config object: returned unchanged;
* a path (``str`` or :class:`os.PathLike`) to a ``config.json`` file, or to a model folder that
  holds one;
* a path to a ``.gguf`` file: its metadata as transformers reads it (:func:`gguf_config`);
* a model id ``"org/name"`` already in the local Hugging Face cache (``HF_HUB_CACHE``, else
  ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``; layout
  ``models--org--name/snapshots/<rev>/config.json``).

Nothing here touches the network: a model that is not cached is an error that says how to fetch
its config.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .gguf_read import gguf_read_once

_DEFAULT_CACHE = Path("~/.cache/huggingface/hub")


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache folder, from the environment at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return _DEFAULT_CACHE.expanduser()


def _looks_like_model_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and " " not in text


def cached_config_path(model_id: str, cache_dir: Path | None = None) -> Path | None:
    """The ``config.json`` of ``model_id`` in the local hub cache, or None when it is not there.

    Uses ``huggingface_hub.try_to_load_from_cache`` when it is installed (the ``refs/main``
    revision), else reads the cache layout: ``refs/main`` if present, else the newest snapshot.
    """
    cache = hub_cache_dir() if cache_dir is None else cache_dir
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # optional: the cache layout is read directly below
        pass
    else:
        found = try_to_load_from_cache(model_id, "config.json", cache_dir=str(cache))
        if isinstance(found, str) and Path(found).is_file():
            return Path(found)
    repo = cache / f"models--{model_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip() / "config.json"
        if candidate.is_file():
            return candidate
    found_files = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    return found_files[-1] if found_files else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read config file {str(path)!r}: {err}") from err
    except json.JSONDecodeError as err:
        raise ValueError(f"config file {str(path)!r} is not valid JSON: {err}") from err
    except RecursionError:  # the parser recurses once per level
        raise ValueError(_too_deep(path)) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"config file {str(path)!r} must hold a JSON object, got {type(data).__name__}"
        )
    if _depth(data) > MAX_DEPTH:  # what the parser took, deepcopy and the readers would not
        raise ValueError(_too_deep(path))
    return data


#: The deepest nesting of objects and arrays a config file may have (published ones: 4 or 5).
MAX_DEPTH = 64


def _too_deep(path: Path) -> str:
    return (
        f"config file {str(path)!r} nests objects or arrays more than {MAX_DEPTH} levels deep; "
        "a config.json nests a few"
    )


def _depth(data: Any) -> int:
    """How deep ``data`` nests dicts and lists, walked without recursion."""
    deepest, todo = 0, [(data, 1)]
    while todo:
        value, depth = todo.pop()
        children = value.values() if isinstance(value, dict) else value
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                todo.extend((c, depth + 1) for c in children)
    return deepest


def config_path(source: str | os.PathLike[str]) -> Path:
    """The ``config.json`` that ``source`` names: the file itself, ``source/config.json`` for a
    folder, or the cached file of a model id. Raises ``ValueError`` naming every place tried."""
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        if (path / "config.json").is_file():
            return path / "config.json"
        raise ValueError(f"model folder {text!r} has no config.json")
    tried = [f"no file or folder {text!r}"]
    if isinstance(source, str) and _looks_like_model_id(text):
        cache = hub_cache_dir()
        found = cached_config_path(text, cache)
        if found is not None:
            return found
        tried.append(
            f"no model {text!r} with a config.json in the Hugging Face cache {str(cache)!r}"
        )
        hint = (
            f" (posenc never downloads: fetch it first, e.g. "
            f"`huggingface-cli download {text} config.json`)"
        )
    else:
        tried.append("not a model id 'org/name' to look up in the Hugging Face cache")
        hint = ""
    raise ValueError(f"config {text!r} not found: {'; '.join(tried)}{hint}")


def resolve_config(config: Any) -> Any:
    """A config to read: a dict (a ``Mapping`` as given, or a ``config.json`` read from a path,
    a model folder or the cache) or the config object itself.

    >>> resolve_config({"model_type": "llama"})
    {'model_type': 'llama'}
    """
    if isinstance(config, Mapping):
        return config
    if isinstance(config, (str, os.PathLike)):
        if Path(os.fspath(config)).suffix.lower() == ".gguf":
            return gguf_config(Path(os.fspath(config)).expanduser())
        return _read_json(config_path(config))
    if isinstance(config, (bytes, int, float, list, tuple)) or config is None:
        raise TypeError(
            "config must be a dict, a transformers config object, a path to a config.json or "
            f"a model folder, or a cached model id 'org/name'; got {type(config).__name__}"
        )
    return config


def gguf_config(path: Path) -> Any:
    """The transformers config of a ``.gguf`` file, read from its metadata as
    ``from_pretrained(..., gguf_file=)`` reads it (no weights are read; never the network, never
    code from the folder). Needs transformers and gguf (``pip install -e '.[real]'``)."""
    if not path.is_file():
        raise ValueError(f"no GGUF file {str(path)!r}")
    try:
        import gguf  # noqa: F401 - transformers reads the file with it
        from transformers.models.auto.configuration_auto import AutoConfig
    except ImportError as err:
        raise ValueError(
            f"reading {path.name!r} needs transformers and gguf: pip install -e '.[real]'"
        ) from err
    try:
        with gguf_read_once():
            return AutoConfig.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True,
                trust_remote_code=False,
            )  # fmt: skip
    # a file cut short or not GGUF at all: gguf's parser fails with struct.error or IndexError
    except (ValueError, OSError, KeyError, TypeError, IndexError, struct.error) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot read the GGUF metadata of {str(path)!r}: {first}") from err
