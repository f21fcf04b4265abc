# The README's two commands: `make demo` and `make test` (what CI runs, via .ci/run).
PYTHON ?= python3
VENV ?= .venv
# Python caches compiled modules (and pytest its rewritten tests) even where the
# environment says not to: a test process or a worker it starts then loads in a
# fraction of the time.
unexport PYTHONDONTWRITEBYTECODE
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install tools demo test slow unit integration adversary test-docker images lock bench bench-profile bench-engine bench-path faults soak

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[worker,dev]'
	touch $(STAMP)

## install: a virtualenv in .venv with runstate, its worker extra and its dev tools
install: $(STAMP)

## tools: what the tests run besides Python: promtool (alert rules), headless Chromium
## with its driver (the inspector's browser tests) and Graphviz (its diagrams' layout),
## from Debian's packages when missing;
## and the second wire implementation's packages (tests/node: npm ci, when node is here)
TOOLS := promtool:prometheus chromium:chromium chromedriver:chromium-driver dot:graphviz
NODE_STAMP := tests/node/node_modules/.installed
tools: $(NODE_STAMP)
	@missing=""; for pair in $(TOOLS); do \
	  command -v "$${pair%%:*}" >/dev/null || missing="$$missing $${pair##*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq >/dev/null; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "missing tools; install Debian's packages:$$missing (sudo apt-get install$$missing), then rerun" >&2; \
	    exit 1; \
	  fi; \
	fi

$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	@if command -v node >/dev/null; then \
	  command -v npm >/dev/null || { echo "node is here but npm is not: install npm, then rerun" >&2; exit 1; }; \
	  npm ci --prefix tests/node --no-audit --no-fund --loglevel=error && touch $@; \
	else \
	  echo "no node: the tests of tests/node (the second wire implementation) will be skipped"; \
	fi

## demo: the main job end to end on a real broker it starts itself (runstate demo)
demo: install
	$(BIN)/runstate demo

## test: the suite but its slow tests (lint, types, the docs site, unit, integration on a real
## broker) in JOBS processes, each with its own broker. Three on two cores: the broker tests
## wait on brokers and workers more than they compute. Then the engine's coverage, over the
## unit tests that call it at a quarter of their examples and a fixed seed: under a tracer
## CPython 3.11 runs all code about twice as slowly, so the full run is not traced
JOBS ?= 3
test: install tools
	RUNSTATE_TEST_EXAMPLES=full $(BIN)/pytest -n $(JOBS) --dist loadgroup -m "not slow" --durations=20
	$(BIN)/pytest -n $(JOBS) -q -m "unit and engine" --hypothesis-seed=0 --cov=processor.engine --cov-branch --cov-report=term-missing:skip-covered --cov-fail-under=95

## slow: the tests of minutes, one at a time: the fault harness at CI size, the benchmark
## command and the compose stack (CI runs them after `make test`)
slow: install tools
	$(BIN)/pytest -m slow --durations=20

## unit: pure tests only, no broker, under a minute: each property tries a quarter of its
## examples (tests/examples.py); `make test` tries them all
unit: install tools
	$(BIN)/pytest -n $(JOBS) -m unit

## adversary: the contract against any key holder, run long (tests/unit/test_adversary.py:
## 5,000 generated attacks of up to 150 proposals each, about 5 minutes); prints what it tried
adversary: install
	RUNSTATE_ADVERSARY_EXAMPLES=$${RUNSTATE_ADVERSARY_EXAMPLES:-5000} \
	RUNSTATE_ADVERSARY_STEPS=$${RUNSTATE_ADVERSARY_STEPS:-150} \
	$(BIN)/pytest -p no:cacheprovider tests/unit/test_adversary.py --hypothesis-show-statistics

## integration: tests on a real broker only
integration: install
	$(BIN)/pytest -m integration

## test-docker: the broker tests on the testcontainers path (a Kafka container of
## RUNSTATE_BROKER_IMAGE, from .env when `make images` wrote one); needs a Docker engine
test-docker: install
	set -a; [ ! -f .env ] || . ./.env; set +a; \
	RUNSTATE_BROKER_SOURCE=docker $(BIN)/pytest -m integration tests/integration/test_broker.py

## images: the images docker-compose.yml runs, official where a registry answers, else built
## here from Debian's packages, PyPI and Maven Central; writes .env naming them
images: install
	PYTHON=$(BIN)/python deploy/images/build

## lock: the image's pinned dependencies (deploy/images/constraints.txt), from a fresh venv
lock:
	rm -rf build/lock && $(PYTHON) -m venv build/lock
	build/lock/bin/pip install --quiet '.[worker]'
	{ echo "# The image's pinned dependencies (runstate[worker]); regenerate with \`make lock\`."; \
	  build/lock/bin/pip freeze --exclude runstate; } > deploy/images/constraints.txt

## bench: side-by-side benchmarks on one broker (ceiling, native, Faust, Quix Streams, SQLite),
## the engine alone and the native worker's profile; writes BENCHMARKS.md (about 30 minutes)
bench: install
	$(BIN)/python -m benchmarks.pipeline

## bench-profile: the native worker's time per proposal by stage (py-spy), and its flame graph
bench-profile: install
	$(BIN)/python -m benchmarks.profile

## bench-engine: decisions per second of the engine, against a reference transition() in plain Python
bench-engine: install
	$(BIN)/python benchmarks/engine.py

## bench-path: the native worker's per-proposal path without Kafka, µs by stage, against decide_record alone
bench-path: install
	$(BIN)/python -m benchmarks.path

## faults: the fault harness, full size (kills, scaling, zombie, hostile input, broker restart; on a 3-node cluster: leader, coordinator kills, rolling restart, pause, lost disk)
faults: install
	$(BIN)/python -m tests.faults

## soak: 30 minutes on a 3-node cluster at half the drain rate, workers killed, a broker restarted; docs/soak/
soak: install
	$(BIN)/python -m tests.faults.soak
