"""Where the config files of the HF tests live.

``tests/data/hf_configs/`` is the corpus: published ``config.json`` files, each a verbatim copy
with its source in ``SOURCES.jsonl`` (``pending/`` and ``refused/`` below it the same).
``tests/data/hf_configs_rebuilt/`` holds reconstructed fixtures (dicts, presets, excerpts, configs
with fewer layers): tests run them as fixtures, never as evidence about a published model.

A name is a file stem: ``"llama-3.1-8b"`` (the corpus), ``"pending/glm-5"``, ``"refused/..."``, or
``"rebuilt/gemma-2-9b"`` (a fixture). A bare stem that only the fixtures folder has resolves
there, so tests that name a fixture by its old stem keep reading it.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "hf_configs"
REBUILT = DATA / "hf_configs_rebuilt"
PREFIX = "rebuilt/"


def config_path(name: str) -> Path:
    """The file of ``name`` (a stem, optionally ``pending/``, ``refused/`` or ``rebuilt/``)."""
    name = name.removesuffix(".json")
    if name.startswith(PREFIX):
        return REBUILT / f"{name[len(PREFIX) :]}.json"
    path = CORPUS / f"{name}.json"
    if not path.exists() and (REBUILT / f"{name}.json").exists():
        return REBUILT / f"{name}.json"
    return path


def corpus_files() -> list[Path]:
    """The corpus files of the top folder (not pending/ or refused/)."""
    return sorted(CORPUS.glob("*.json"))


def rebuilt_files() -> list[Path]:
    """The reconstructed fixtures."""
    return sorted(REBUILT.glob("*.json"))


def top_level_files() -> list[Path]:
    """Corpus files of the top folder, then the fixtures: what tests that read every config run."""
    return corpus_files() + rebuilt_files()
