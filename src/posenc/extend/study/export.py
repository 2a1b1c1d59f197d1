"""``posenc extend export``: a study's chosen method written as a model folder that stock
transformers loads, for the model the study's rows were measured on (its ``run.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def export_run(run: str, *, method: str, out: str, length: int) -> None:
    """Write ``method`` for ``length`` tokens (0: the study's longest) into the folder ``out``;
    every refusal (no study, another model, a folder in the way) before the model loads."""
    from ...cli_errors import check_can_write
    from ...hf.extension import EXTENSION_METHODS
    from ..methods.export import export_model
    from ..methods.names import parse_method
    from ..model.load import ModelSource, load_model, model_identity
    from .folder import check_export

    path = Path(run) / "run.json"
    if not path.is_file():
        raise ValueError(f"{run!r} is no `posenc extend` folder (no run.json)")
    spec = json.loads(path.read_text())
    check_export(Path(run), spec)  # run.json names the model its rows were measured on
    chosen = parse_method(method)
    study = spec["study"]  # the target the rows were measured with: every kind of length
    target = length or max(study["lengths"] + study["passkey_lengths"]
                           + study.get("task_lengths", []))  # fmt: skip
    if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise ValueError(f"{out!r} exists and is not an empty folder; nothing was written")
    check_can_write(Path(out), "--out")  # under a file, a read-only disk: before the load
    if chosen.name in EXTENSION_METHODS:
        export_model(None, None, chosen, target, out)  # raises its refusal
    source = ModelSource(**spec["source"])
    model, tokenizer = load_model(source, dtype=spec["dtype"])
    check_export(Path(run), spec, model_identity(source, model, spec["dtype"]))  # unchanged
    written = export_model(model, tokenizer, chosen, target, out)
    typer.echo(f"wrote {written} ({chosen.label} for {target} tokens); load it with "
           f"AutoModelForCausalLM.from_pretrained({str(written)!r})")  # fmt: skip
