# The README's two commands: `make demo` and `make test` (what CI runs, via .ci/run).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install tools demo test unit integration bench bench-engine faults

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## install: a virtualenv in .venv with runstate and its dev tools
install: $(STAMP)

## tools: promtool, which the alert-rule tests run (Debian's prometheus package)
tools:
	@command -v promtool >/dev/null || { \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing promtool (Debian's prometheus package)"; \
	    apt-get update -qq >/dev/null; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else \
	    echo "promtool is missing: install Debian's prometheus package (sudo apt-get install prometheus) or put Prometheus' promtool on PATH, then rerun" >&2; \
	    exit 1; \
	  fi; }

## demo: the main job end to end on a real broker it starts itself (runstate demo)
demo: install
	$(BIN)/runstate demo

## test: the whole suite (lint, types, unit, integration on a real broker) + engine coverage
test: install tools
	$(BIN)/pytest --cov=processor.engine --cov-branch --cov-report=term-missing:skip-covered --cov-fail-under=95

## unit: pure tests only, no broker, seconds
unit: install tools
	$(BIN)/pytest -m unit

## integration: tests on a real broker only
integration: install
	$(BIN)/pytest -m integration

## bench: side-by-side benchmarks on one broker (ceiling, native, Faust, Quix Streams, SQLite); writes BENCHMARKS.md
bench: install
	$(BIN)/python -m benchmarks.pipeline

## bench-engine: decisions per second of the engine, against the seed's transition()
bench-engine: install
	$(BIN)/python benchmarks/engine.py

## faults: the fault harness, full size (kills, scaling, zombie, hostile input, broker restart)
faults: install
	$(BIN)/python -m tests.faults
