"""Exit 1 unless the set-up left byte code for modules deep in torch and transformers.

Run with ``python -B``: the imports below then write no byte code, so they cannot make the files
this checks."""

import importlib
import importlib.util
import os
import sys

MODULES = ("torch", "torch.nn.modules.module", "transformers", "transformers.modeling_utils")

assert sys.dont_write_bytecode, "run with python -B"
missing = [
    m
    for m in MODULES
    if not os.path.exists(importlib.util.cache_from_source(importlib.import_module(m).__file__))
]
if missing:
    sys.exit(f"the set-up left no byte code for {', '.join(missing)} (Makefile: compile_venv)")
print("byte code: ok")
