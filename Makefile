# The two set-up commands of the README: `make demo` and `make test`. Each works from
# nothing: it creates .venv/ in the checkout and installs the project into it first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: demo test test-fast bench lint clean install system-deps

# Debian tools some tests drive: headless Chromium renders report.html for the DOM test,
# shellcheck checks the deploy scripts. Installed when missing and we can (root + apt);
# otherwise those tests skip and say why.
SYSTEM_TOOLS := chromium shellcheck

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
test: $(STAMP) system-deps
	$(PY) -m pytest -q -rs $(PYTEST_ARGS)

system-deps:
	@missing=""; for t in $(SYSTEM_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing (Debian packages)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
			|| echo "warning: could not install$$missing; the tests that need them will skip"; \
	else echo "note:$$missing not installed (needs root + apt-get); the tests that need them will skip"; fi

# Everything but the msrun end-to-end jobs.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not e2e" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/step_time.py
	$(VENV)/bin/rankscope bench ingest --ranks 256 --tensors 128 --steps 20

clean:
	rm -rf $(VENV) demo-out .pytest_cache
