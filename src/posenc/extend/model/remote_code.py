"""Nothing from a model folder runs code: a folder whose configuration needs code of its own is
refused before transformers reads it.

transformers runs a folder's Python when its ``config.json`` or ``tokenizer_config.json`` names
classes in it (``auto_map``, ``custom_pipelines``) and the caller trusts remote code; asked
nothing (``trust_remote_code`` unset) it asks "run the custom code? [y/N]" at a terminal. posenc
passes ``trust_remote_code=False`` to every load (:func:`posenc.extend.model.load.load_model`), and
before that :func:`refuse_folder_code` says in one line which file names which code, so no prompt
is ever shown. A ``model_type`` transformers does not know is refused the same way: only a
folder's own code could build it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The configuration files transformers reads from a model folder for a causal LM and its
#: tokenizer, and the keys in them that name the folder's own code.
CONFIG_FILES = ("config.json", "tokenizer_config.json")
CODE_KEYS = ("auto_map", "custom_pipelines")

NEVER = (
    "posenc never runs a model folder's code (trust_remote_code=False): use a model whose "
    "architecture transformers implements"
)


def _json(path: Path) -> Any:
    """The file's JSON, or None (absent, unreadable or no JSON: transformers says what is wrong)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def _modules(value: Any) -> set[str]:
    """The module files named in an ``auto_map``-like value (``"evil.EvilConfig"`` ->
    ``evil.py``; ``"repo--evil.EvilConfig"`` names a module of another repository)."""
    if isinstance(value, str) and "." in value:
        return {value.split("--")[-1].rsplit(".", 1)[0].replace(".", "/") + ".py"}
    if isinstance(value, dict):
        return set().union(*(_modules(v) for v in value.values()))
    if isinstance(value, list | tuple):
        return set().union(*(_modules(v) for v in value))
    return set()


def _code(folder: Path, named: set[str]) -> str:
    """The code a folder holds or names: its ``.py`` files and the modules its configs name."""
    files = {p.name for p in folder.glob("*.py")} | named
    return ", ".join(sorted(files)) if files else "no .py file here"


def refuse_folder_code(path: str | Path) -> None:
    """Raise ValueError (one line naming the file, the key and the code) if the model folder
    ``path`` needs code of its own: a configuration with ``auto_map``/``custom_pipelines``, or a
    ``model_type`` transformers does not know. Not a folder (a model id, a GGUF file's folder
    without a config): nothing to check."""
    folder = Path(path)
    if not folder.is_dir():
        return
    for name in CONFIG_FILES:
        data = _json(folder / name)
        if not isinstance(data, dict):
            continue
        keys = [k for k in CODE_KEYS if data.get(k)]
        if keys:
            named = set().union(*(_modules(data[k]) for k in keys))
            raise ValueError(
                f"{folder / name} names code of its own ({', '.join(keys)}: "
                f"{_code(folder, named)}); {NEVER}"
            )
    config = _json(folder / "config.json")
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(model_type, str) and model_type:
        import transformers
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if model_type not in CONFIG_MAPPING:
            raise ValueError(
                f"{folder / 'config.json'} has model_type {model_type!r}, which transformers "
                f"{transformers.__version__} does not implement (the folder holds "
                f"{_code(folder, set())}); {NEVER}"
            )
