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
	# trtspec's own modules are compiled here (~1 s), as a regular install
	# would: otherwise the first server start's dozen stubs each compile them.
	$(PY) -m compileall -q toolkit/trtspec
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
