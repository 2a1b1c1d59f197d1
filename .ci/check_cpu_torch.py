"""Fail when the set-up installed CUDA packages: the CI machine has no GPU, and the README
promises that `make setup` installs a CPU build of torch and nothing from NVIDIA.

Run with the environment's own Python (`.venv/bin/python .ci/check_cpu_torch.py`).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys

CUDA_NAME = re.compile(r"^(nvidia|cuda)[-_.]", re.IGNORECASE)


def main() -> int:
    names = sorted({(d.metadata["Name"] or "") for d in md.distributions()})
    cuda = [n for n in names if CUDA_NAME.match(n)]
    torch_version = md.version("torch")
    torch_requires = [r for r in (md.requires("torch") or []) if CUDA_NAME.match(r)]
    import torch

    problems = []
    if cuda:
        problems.append(f"CUDA packages installed: {', '.join(cuda)}")
    if torch.version.cuda is not None:
        problems.append(f"torch {torch_version} is a CUDA {torch.version.cuda} build")
    if torch_requires:
        problems.append(f"torch {torch_version} requires {', '.join(torch_requires)}")
    if problems:
        print("set-up is not CPU-only:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"CPU-only set-up: torch {torch_version}, {len(names)} packages, none from NVIDIA")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
