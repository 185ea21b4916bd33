# The README's two commands are `make demo` and `make test`; .ci/run calls `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.trtspec-installed
# Test processes (pytest-xdist), each given whole test files (--dist loadfile:
# a module's server starts once; the files that share one server are given
# together, tests/fixtures/shared.GROUPS). On two cores two of them take a third off
# the suite's wall time (9:23 -> 6:12), since much of it is waiting on servers
# and subprocesses. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

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
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not e2e"

lint: $(STAMP)
	$(VENV)/bin/ruff check toolkit tests benchmarks
	$(VENV)/bin/ruff format --check toolkit tests benchmarks
	$(VENV)/bin/mypy

demo: $(STAMP)
	$(PY) -m trtspec.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
