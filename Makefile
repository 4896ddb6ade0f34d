# Agent-Reach: one venv (.venv), created and filled by whichever target needs it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: run test test-e2e-redis test-e2e-nats test-slow chaos bench eval lint format clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# one stamp per set of extras, redone when pyproject.toml changes
$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	@touch $@
# the demo puts one agent on NATS when a nats-server answers (the gateway's --nats needs
# nats-py), and serves MCP at /mcp (the mcp SDK)
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[nats,semantic,mcp,a2a]' 'a2a-sdk[http-server]>=1.3,<2'
	@touch $@
# the evaluation of the fallback matchers: the model, and matplotlib for the picture
$(VENV)/.installed-eval: pyproject.toml | $(BIN)/python
	$(PIP) install -e '.[semantic,eval]'
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
## until Ctrl-C (port: AGENT_REACH_PORT, default 7700); one more agent on NATS when a
## nats-server answers on AGENT_REACH_NATS (default nats://127.0.0.1:4222)
run: $(VENV)/.installed-run
	$(BIN)/agent-reach demo --keep-running --port $${AGENT_REACH_PORT:-7700}

# the suite runs in PYTEST_WORKERS processes (pytest-xdist), a test file to each at a time so
# that a module's fixtures stay in one process; 0: all in this one (PYTEST_WORKERS=0 make test)
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadfile

## test: the whole suite (unit, contract, integration, end-to-end), then the end-to-end suite
## again with every gateway on the shared Redis registry, and again with the agents on NATS;
## long scenarios: test-slow
test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-e2e-redis
	$(MAKE) --no-print-directory test-e2e-nats

## test-e2e-redis: the end-to-end suite, and token mode's forbidden moves (ids bound to their
## registration must hold across a shared registry), with the gateways on redis://127.0.0.1:6379/0
test-e2e-redis: $(VENV)/.installed-test
	AGENT_REACH_TEST_REGISTRY=$${AGENT_REACH_TEST_REGISTRY:-redis://127.0.0.1:6379/0} \
		$(BIN)/python -m pytest tests/e2e tests/integration/test_security.py -m "not slow" $(XDIST) \
		$(PYTEST_ARGS)

## test-e2e-nats: the end-to-end suite with the agents serving over NATS (AGENT_REACH_SERVE)
## and every gateway on --nats nats://127.0.0.1:4222 under a prefix of its own
test-e2e-nats: $(VENV)/.installed-test
	AGENT_REACH_TEST_SERVE=$${AGENT_REACH_TEST_SERVE:-nats://127.0.0.1:4222} \
		$(BIN)/python -m pytest tests/e2e -m "not slow" $(XDIST) $(PYTEST_ARGS)

# long load and fault scenarios (marked slow; none yet: pytest's "no tests" exit 5 is fine here)
test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS) || [ $$? -eq 5 ]

## chaos: the reliability suite in full (docs/reliability.md): every scenario of tests/chaos
## with its full durations (AGENT_REACH_CHAOS=full; `make test` runs their seconds-long smoke
## versions), one at a time, each printing its figures as a line `CHAOS {...}`, also appended to
## benchmarks/out/chaos.jsonl; about 47 minutes
chaos: $(VENV)/.installed-test
	@mkdir -p benchmarks/out
	AGENT_REACH_CHAOS=full AGENT_REACH_CHAOS_OUT=$${AGENT_REACH_CHAOS_OUT:-benchmarks/out/chaos.jsonl} \
		$(BIN)/python -m pytest tests/chaos -s $(PYTEST_ARGS)

## bench: the benchmarks of benchmarks/, against the seed-style baseline, into benchmarks/out/
bench: $(VENV)/.installed-bench $(VENV)/.installed-test
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

## eval: the fallback matchers on Banking77, HWU64 and a Chinese set (eval/README.md): precision
## and coverage per threshold, the calibration fit, the seed's cases, the picture, the costs;
## a few minutes (embeddings cached in eval/.cache/); not part of `make test`
eval: $(VENV)/.installed-eval
	$(BIN)/python eval/intent_eval.py --plot docs/img/intent-threshold.png $(EVAL_ARGS)
	$(BIN)/python eval/baseline.py
	$(BIN)/python eval/matcher_bench.py

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
