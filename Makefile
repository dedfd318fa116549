# The two commands a new user needs (see README):
#   make demo   set up, fetch the default model pair, and generate with it
#   make test   set up and run the checks: ruff, mypy on the package, the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
ES := $(VENV)/bin/edgespec

.PHONY: setup demo test test-fast lint pull bench docs clean

setup:
	bash scripts/setup.sh

pull: setup
	$(ES) models pull

demo: pull
	$(ES) generate "Write a Python function that reverses a singly linked list, with a short docstring." --temperature 0 --max-tokens 160

lint: setup
	$(PY) -m ruff check edgespec tests scripts bench research docs/examples
	$(PY) -m mypy

test: lint
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not real"

docs: setup
	$(PY) scripts/gen_cli_docs.py

bench: pull
	$(ES) bench

clean:
	rm -rf $(VENV) build *.egg-info
