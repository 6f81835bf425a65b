# Three commands matter: `make run` (the demo on embedded servers), `make check` (lint + the
# tests that start no server of their own, after each edit) and `make test` (lint + every test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
BUS    ?= nats

.PHONY: run check test lint format bench bench-scale soak screenshots install clean

# Python's bytecode cache on, whatever the shell says: the tests start about a thousand Python
# processes, each importing mega and the app, and with PYTHONDONTWRITEBYTECODE set each one
# compiled them again (a tenth of a CPU-second a process; git and Docker ignore __pycache__).
unexport PYTHONDONTWRITEBYTECODE

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "mega-py needs Python 3.11+")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' --config-settings editable_mode=compat  # a plain path: no import hook at start-up
	@touch $@

install: $(BIN)/.installed

# The peers the benchmarks compare with, in a virtualenv of their own (they must not change
# what mega's own environment imports).
PEERS := .venv-peers
$(PEERS)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet 'taskiq>=0.13' 'taskiq-redis>=1.2' 'streaq>=7' \
		'pgqueuer>=1.6' 'asyncpg>=0.30' 'procrastinate>=3.10' 'psycopg[binary]>=3.2'
	@touch $@

run: install  ## the whole demo: embedded NATS + Redis, web, 2 schedulers, 2 workers (BUS=redis or BUS=postgres: jobs and events there)
	MEGA_BUS=$(BUS) $(BIN)/mega dev --port $(PORT)

lint: install
	$(BIN)/ruff check mega app tests bench mega_config.py
	$(BIN)/ruff format --check mega app tests bench mega_config.py
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache  # the architecture contracts of pyproject.toml

check: lint  ## lint, then every test that starts no server or host of its own (about 2 min): run it after each edit
	$(BIN)/pytest -m "not server" -n 2 --dist loadgroup

# Four xdist workers on two cores: most of a test's time is a wait (a browser, a tick, a
# server's election, a niced pool child): a run at four took 14.4 min where three took 16.5.
test: lint  ## lint, then every test (fault, cluster and browser tests included), coverage gate
	chromium="$$(bash tests/tools/chromium.sh)" && MEGA_CHROMIUM="$$chromium" \
		$(BIN)/pytest -n 4 --dist loadgroup --cov=mega --cov-report=term-missing:skip-covered --cov-fail-under=90 --durations=25

format: install
	$(BIN)/ruff check --fix mega app tests bench mega_config.py
	$(BIN)/ruff format mega app tests bench mega_config.py

bench: install $(PEERS)/.installed  ## every benchmark in one go; results go to bench/RESULTS.md
	$(BIN)/python -m bench.run_all

bench-scale: install  ## the scale curves (bench/scale): tables and SVG charts in bench/RESULTS.md
	$(BIN)/python -m bench.scale

soak: install  ## the whole demo under mixed load, a worker SIGKILLed every 30 s (SOAK_S=600 by default)
	$(BIN)/python -m tests.soak

screenshots: install  ## the guide's pictures (docs/guide/img) from the browser tests, on the NATS bus
	MEGA_GUIDE_SCREENSHOTS=1 $(BIN)/pytest tests/e2e -k nats -q -p no:cacheprovider

clean:
	rm -rf $(VENV) $(PEERS) var .mypy_cache .ruff_cache
