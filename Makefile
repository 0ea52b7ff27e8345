# The two set-up commands of the README: `make demo` and `make test`. Each works from
# nothing: it creates .venv/ in the checkout and installs the project into it first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: demo test test-fast bench lint clean install

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# A real 4-rank data-parallel MindSpore job on CPU (msrun) under `rankscope launch`,
# with a fault injected on one rank; prints the verdict and where the report is.
demo: $(STAMP)
	$(VENV)/bin/rankscope demo --export-dir demo-out

# Unit tests, a real local Ray, real sockets, and a few real msrun jobs end to end.
test: $(STAMP)
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

# Everything but the msrun end-to-end jobs.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not e2e" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/step_time.py
	$(VENV)/bin/rankscope bench ingest --ranks 256 --tensors 128 --steps 20

clean:
	rm -rf $(VENV) demo-out .pytest_cache
