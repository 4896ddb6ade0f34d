# Agent-Reach: one venv (.venv), created and filled by whichever target needs it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: run test test-e2e-redis test-slow bench lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# one stamp per set of extras, redone when pyproject.toml changes
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@
# the browser extra too: the dashboard's tests drive the system's Chromium with Playwright
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test,browser]'
	@touch $@
$(VENV)/.installed-bench: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[bench]'
	@touch $@
$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[test,dev]'
	@touch $@

## run: the gateway and the demo agents on the in-memory registry, the scenarios, then serve
## until Ctrl-C (port: AGENT_REACH_PORT, default 7700)
run: $(VENV)/.installed-base
	$(BIN)/agent-reach demo --keep-running --port $${AGENT_REACH_PORT:-7700}

## test: the whole suite (unit, contract, integration, end-to-end), then the end-to-end suite
## again with every gateway on the shared Redis registry; long scenarios: test-slow
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-e2e-redis

## test-e2e-redis: the end-to-end suite, and token mode's forbidden moves (ids bound to their
## registration must hold across a shared registry), with the gateways on redis://127.0.0.1:6379/0
test-e2e-redis: $(VENV)/.installed-test
	AGENT_REACH_TEST_REGISTRY=$${AGENT_REACH_TEST_REGISTRY:-redis://127.0.0.1:6379/0} \
		$(BIN)/python -m pytest tests/e2e tests/integration/test_security.py -m "not slow" $(PYTEST_ARGS)

# long load and fault scenarios (marked slow; none yet: pytest's "no tests" exit 5 is fine here)
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS) || [ $$? -eq 5 ]

## bench: the benchmarks of benchmarks/, against the seed-style baseline, into benchmarks/out/
bench: $(VENV)/.installed-bench $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

## lint: ruff (lint + format check), mypy --strict, and the layer contracts (import-linter)
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/lint-imports

format: $(VENV)/.installed-dev
	$(BIN)/ruff format src tests benchmarks examples
	$(BIN)/ruff check --fix src tests benchmarks examples

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache benchmarks/out
