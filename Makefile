# The README's two commands are `make demo` and `make test`; .ci/run calls `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trtspec-installed

.PHONY: setup test test-fast lint demo clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# --no-compile: pip would byte-compile every installed module (~50 s here);
	# Python compiles the ones actually imported on first use instead.
	$(PY) -m pip install --quiet --no-compile -e '.[cpu,dev]'
	# Compiled here once, as a regular install would (--no-compile above):
	# trtspec's modules (~1 s), and torch, numpy and tokenizers as an engine
	# stub imports them (~10 s). Otherwise the first server start's stubs each
	# compile the same ~800 modules at once (Triton's stub ignores
	# PYTHONDONTWRITEBYTECODE; a first demo start took 18 s instead of 12).
	$(PY) -m compileall -q toolkit/trtspec
	env -u PYTHONDONTWRITEBYTECODE $(PY) -c 'import numpy, tokenizers, torch'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not e2e"

lint: $(STAMP)
	$(VENV)/bin/ruff check toolkit tests benchmarks
	$(VENV)/bin/ruff format --check toolkit tests benchmarks
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(PY) -m trtspec.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
