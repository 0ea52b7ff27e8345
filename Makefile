# The set-up commands of the README: `make demo` and `make test`. Each works from
# nothing: it creates .venv/ in the checkout with $(PYTHON) and installs into it first.
#   make demo PYTHON=python3.10     pick the interpreter (one pyproject's requires-python admits)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
# The MindSpore release the tests run against; pyproject declares the compatible range.
TESTED_MINDSPORE := mindspore==2.10.0
PYTEST_ARGS ?=

.PHONY: demo test test-fast docs-check bench lint clean install venv system-deps

# Debian tools some tests drive: headless Chromium renders report.html for the DOM test,
# shellcheck checks the deploy scripts, a one-node Slurm cluster (munge, slurmctld, slurmd)
# runs deploy/slurm/rankscope.sbatch for real. Installed when missing and we can (root +
# apt); otherwise those tests skip and say why. Each entry is command:package.
SYSTEM_TOOLS := chromium:chromium shellcheck:shellcheck munged:munge slurmctld:slurmctld \
	slurmd:slurmd sbatch:slurm-client

# Python's answer to "is this interpreter one pyproject's requires-python admits?":
# prints X.Y, or exits 1 saying which versions are needed.
define CHECK_PYTHON
import re, sys
spec = re.search(r'requires-python\s*=\s*"([^"]+)"', open("pyproject.toml").read()).group(1)
lo, hi = re.search(r">=\s*(\d+)\.(\d+)", spec), re.search(r"<\s*(\d+)\.(\d+)", spec)
v = sys.version_info[:2]
ok = (not lo or v >= (int(lo[1]), int(lo[2]))) and (not hi or v < (int(hi[1]), int(hi[2])))
print(f"{v[0]}.{v[1]}") if ok else sys.exit(
    f"{sys.executable} is Python {v[0]}.{v[1]}; rankscope needs Python {spec}: pick one with PYTHON=, e.g. make demo PYTHON=python3.11")
endef
export CHECK_PYTHON

# The venv is rebuilt when its interpreter is one pyproject does not admit (e.g. made by
# an earlier PYTHON=python3.12 whose install failed), or when PYTHON names a different one.
venv:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "make: PYTHON=$(PYTHON) not found" >&2; exit 1; }; \
	want=$$($(PYTHON) -c "$$CHECK_PYTHON") || exit 1; \
	if [ -x $(PY) ] || [ -L $(PY) ]; then \
		have=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "a broken interpreter"); \
		if ! $(PY) -c "$$CHECK_PYTHON" >/dev/null 2>&1 || { [ "$(origin PYTHON)" != file ] && [ "$$have" != "$$want" ]; }; then \
			echo "rebuilding $(VENV): it holds Python $$have, PYTHON=$(PYTHON) is $$want"; rm -rf $(VENV); \
		fi; \
	fi; \
	if [ ! -x $(PY) ]; then echo "creating $(VENV) with $(PYTHON) (Python $$want)"; $(PYTHON) -m venv $(VENV); fi

# demo: the rank side plus the coordinator (Ray); test: that plus the test tools.
$(VENV)/.installed-demo-$(HASH):
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[coordinator]" "$(TESTED_MINDSPORE)"
	rm -f $(VENV)/.installed-demo-*
	touch $@

$(VENV)/.installed-test-$(HASH):
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[coordinator,test]" "$(TESTED_MINDSPORE)"
	rm -f $(VENV)/.installed-test-*
	touch $@

install: venv
	@$(MAKE) --no-print-directory $(VENV)/.installed-demo-$(HASH)

# A real 4-rank data-parallel MindSpore job on CPU (msrun) under `rankscope launch`,
# with a fault injected on one rank; prints the verdict and where the report is.
demo: venv
	@$(MAKE) --no-print-directory $(VENV)/.installed-demo-$(HASH)
	$(VENV)/bin/rankscope demo --export-dir demo-out

# Unit tests, a real local Ray, real sockets, and a few real msrun jobs end to end. The
# documentation site is built first: --strict fails on a broken link, a missing anchor or
# a page left out of the nav, so the docs break the build as code does.
test: venv system-deps
	@$(MAKE) --no-print-directory $(VENV)/.installed-test-$(HASH)
	@$(MAKE) --no-print-directory docs-check
	$(PY) -m pytest -q -rs --durations=25 $(PYTEST_ARGS)

# The site goes inside .venv/ (ignored, and removed by `make clean`); only the build's
# verdict matters here. NO_MKDOCS_2_WARNING silences Material's banner about its successor.
docs-check:
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir $(VENV)/site

system-deps:
	@missing=""; for tp in $(SYSTEM_TOOLS); do command -v $${tp%%:*} >/dev/null 2>&1 || missing="$$missing $${tp#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing (Debian packages)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
			|| echo "warning: could not install$$missing; the tests that need them will skip"; \
	else echo "note:$$missing not installed (needs root + apt-get); the tests that need them will skip"; fi

# Everything but the msrun end-to-end jobs.
test-fast: venv
	@$(MAKE) --no-print-directory $(VENV)/.installed-test-$(HASH)
	$(PY) -m pytest -q -m "not e2e" $(PYTEST_ARGS)

bench: venv
	@$(MAKE) --no-print-directory $(VENV)/.installed-demo-$(HASH)
	$(PY) bench/step_time.py
	$(VENV)/bin/rankscope bench ingest --ranks 256 --tensors 128 --steps 20

clean:
	rm -rf $(VENV) demo-out .pytest_cache
