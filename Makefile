# Vigil: the two commands a new user types are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench lint clean venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[all,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/vigil demo

test: $(STAMP)
	bash .ci/debian-packages.sh
	$(BIN)/python -m pytest -q tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests

# `make bench` runs every benchmark; `make bench BENCH="rca logs"` some. They need the source checkout (they write
# bench/results/), so they are not a `vigil` verb.
BENCH ?= $(sort $(basename $(notdir $(wildcard bench/*.py))))

bench: $(STAMP)
	set -e; for name in $(BENCH); do echo "== bench/$$name.py"; $(BIN)/python bench/$$name.py; done

lint: $(STAMP)
	$(BIN)/ruff check vigil vigil_eval tests bench
	$(BIN)/mypy vigil vigil_eval
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .vigil .pytest_cache .mypy_cache
