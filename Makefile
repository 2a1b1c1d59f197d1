# One-command set-up and runs. A CPU build of torch is installed first so that nothing pulls
# CUDA packages; override with e.g. `make test TORCH_SPEC="torch==2.5.1"` or TORCH_SPEC=torch.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.posenc-installed

.PHONY: setup demo lab test lint typecheck unit docs bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
