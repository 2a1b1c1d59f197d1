"""The ``env`` phase of ``make gpu-check``: what the run ran on, into ``OUT/env.json`` (and
``OUT/nvidia-smi.txt`` where there is one). ``python benchmarks/gpu_env.py OUT``."""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

DISTRIBUTIONS = ("torch", "triton", "transformers", "liger-kernel", "flash-attn", "pytest",
                 "pytest-xdist", "hypothesis", "typer", "rich", "numpy", "matplotlib")  # fmt: skip
#: Optional references the RoPE benchmark imports: whether each imports here.
IMPORTS = (
    ("liger_kernel.transformers.rope", "liger_rotary_pos_emb"),
    ("flash_attn.layers.rotary", "apply_rotary_emb"),
)


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    import torch

    out["torch.version.cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        out["gpu"] = torch.cuda.get_device_name(0)
        out["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        out["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    for mod, attr in IMPORTS:
        try:
            getattr(importlib.import_module(mod), attr)
            out["import " + mod] = "ok"
        except Exception as e:  # recorded, not fatal: the benchmark notes it too
            out["import " + mod] = f"{type(e).__name__}: {e}"[:160]
    import posenc

    out["posenc"] = posenc.__version__
    out["posenc_path"] = posenc.__file__
    return out


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        (out / "nvidia-smi.txt").write_text(smi.stdout + smi.stderr)
    env = probe()
    (out / "env.json").write_text(json.dumps(env, indent=2) + "\n")
    for key, value in env.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
