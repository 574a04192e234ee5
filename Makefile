# Two commands a newcomer runs on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test server-side test-data lint docs bench-access bench-wallclock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs DuckDB only: `.[demo]`, not the test suite's environment (`.[dev]`).
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/topk-middleware demo

# Parallel workers and the grouping of tests that share a server-side singleton come from
# pyproject.toml's pytest options (tests/conftest.py); plain `pytest` runs the same way.
test: $(STAMP) server-side test-data
	$(BIN)/python -m pytest -q

# What the SQL functions need on the local PostgreSQL servers: PL/Python and the library
# topk_server (refusals without CONTEXT lines, the functions' reads kept out of the caller's
# EXPLAIN); idempotent, quiet when in place.
server-side:
	./scripts/ensure-server-side.sh

# Data sets the tests read from Debian's packages (WordNet for the utility benchmark's senses).
test-data:
	./scripts/ensure-test-data.sh

lint: $(STAMP)
	$(BIN)/ruff check .

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench-access: $(STAMP)
	$(BIN)/python -m benchmarks access

bench-wallclock: $(STAMP)
	$(BIN)/python -m benchmarks wallclock

clean:
	rm -rf $(VENV) .pytest_cache demo-data site benchmarks/scratch
