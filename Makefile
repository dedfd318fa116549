# The two commands a new user needs (see README):
#   make demo   set up, fetch the default model pair, and generate with it
#   make test   set up and run the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
ES := $(VENV)/bin/edgespec

.PHONY: setup demo test test-fast pull bench clean

setup:
	bash scripts/setup.sh

pull: setup
	$(ES) models pull

demo: pull
	$(ES) generate "Write a Python function that reverses a singly linked list, with a short docstring." --temperature 0 --max-tokens 160

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not real"

bench: pull
	$(ES) bench

clean:
	rm -rf $(VENV) build *.egg-info
