# Entry points for a fresh machine: `make` (build), `make test` and `make demo`.
# They create .venv and install what they need; Java (for PySpark) comes from apt
# when it is missing and we may install packages.
#
# The hot path (wheel, timer, operation, ops, purgatory, timeouts) is compiled in
# place with Cython by `make build` (python setup.py build_ext --inplace,
# incremental): run it again after editing one of those modules or its .pxd, or the
# stale extension module keeps shadowing the .py file. `make test` does it first.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS := dev,examples,kafka,metrics,trace,analysis,bench,asgi,redis,docs
# The second, pure-Python run leaves out the Spark-heavy tests, which do not touch
# the hot path beyond what the rest of the suite covers (the installed-wheel demo
# builds its own wheel; the cluster tests start a Spark master and worker).
# The suite runs in parallel (pytest-xdist), one test module per worker: most tests
# wait on servers and clients over loopback, so two workers on two cores took the
# compiled run from 19 to 12.5 minutes. `make test XDIST=` runs it in one process.
XDIST ?= --numprocesses=auto --maxprocesses=4 --dist=loadfile
# Those tests carry the `spark` marker (pyproject.toml).
PURE_PYTEST_ARGS := -m "not spark"

# The other CPython versions `make test` runs the suite on: each in a venv of its own
# (.venv-3.12, ...) made and installed like .venv, on its compiled build, minus the
# Spark-heavy tests (PURE_PYTEST_ARGS). `make test PYTHONS=3.13` picks, `PYTHONS=` runs
# none. A version not found (python3.X on PATH, else pyenv's ~/.pyenv/versions/3.X.*) is
# skipped with a line saying so, and so is the default interpreter's own version.
PYTHONS ?= 3.12 3.13
# The interpreter of CPython version $(1): python$(1) on PATH if it starts (a pyenv shim
# of a version not selected does not), else pyenv's; empty when there is none.
find_python = $(firstword $(foreach p,$(shell command -v python$(1)) \
	$(sort $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(1).*/bin/python$(1))),\
	$(if $(shell $(p) -c 'import asyncio' >/dev/null 2>&1 && echo ok),$(p))))
DEFAULT_VERSION = $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
OTHER_VERSIONS = $(filter-out $(DEFAULT_VERSION),$(PYTHONS))
FOUND_VERSIONS = $(foreach v,$(OTHER_VERSIONS),$(if $(call find_python,$(v)),$(v)))
# The suites that drive other interpreters themselves (CPython's asyncio suites in
# tests/loop/test_loop.py and tests/core/test_timeouts.py) do it for all in the compiled default
# run; the other runs test their own interpreter only.
ONLY_THIS := AIOPURGATORY_ONLY_THIS_PYTHON=1

.PHONY: all build test checks lint typecheck docs pytest pytest-compiled pytest-pure demo cluster-demo java clean ceiling-plot pytest-others versions
# The per-version stamps are made by a pattern rule: without this make deletes them.
.PRECIOUS: .venv-%/.installed-stamp

all: build

# The editable install compiles nothing (AIOPURGATORY_NO_EXTENSIONS): `build` does, once,
# keeping its intermediate files under build/ so that later rebuilds are incremental.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	AIOPURGATORY_NO_EXTENSIONS=1 $(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

# Another version's venv, made like .venv by that version's interpreter.
.venv-%/.installed-stamp: pyproject.toml setup.py
	@test -n "$(call find_python,$*)" || { echo "no CPython $* found" >&2; exit 1; }
	$(call find_python,$*) -m venv .venv-$*
	.venv-$*/bin/python -m pip install --quiet --upgrade pip
	AIOPURGATORY_NO_EXTENSIONS=1 .venv-$*/bin/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

build: $(STAMP)
	$(BIN)/python setup.py --quiet build_ext --inplace
	$(BIN)/python -m aiopurgatory --version

java:
	@command -v java >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else \
	    echo "PySpark needs Java 17+: install a JRE (e.g. apt-get install openjdk-17-jre-headless)" >&2; \
	    exit 1; \
	  fi; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The whole suite on the compiled build (a test fails if it did not compile), then
# again on the pure-Python modules, forced with AIOPURGATORY_NO_EXTENSIONS=1, at the
# same time as the suite on the other versions (PYTHONS).
pytest: pytest-compiled pytest-others

# When the other versions' suites run (FOUND_VERSIONS), each holds its interpreter to
# CPython's suites itself: the default run then does not drive them too (about 70 CPU
# seconds saved); with PYTHONS= (CI) it drives every interpreter installed.
pytest-compiled: build java
	AIOPURGATORY_EXPECT_COMPILED=1 $(if $(FOUND_VERSIONS),$(ONLY_THIS)) $(BIN)/pytest $(XDIST)

pytest-pure: $(STAMP)
	AIOPURGATORY_NO_EXTENSIONS=1 $(ONLY_THIS) $(BIN)/pytest $(XDIST) $(PURE_PYTEST_ARGS)

# The pure-Python run, then the other versions' suites, one after the other. Not at the
# same time: three suites of two workers each on two cores pushed tests past their time
# bounds (8 failures in one such run, all of them waiting on a starved loop), and took
# as long in total.
pytest-others: versions
	$(MAKE) --no-print-directory pytest-pure $(addprefix pytest-,$(FOUND_VERSIONS))

versions:
	@$(foreach v,$(filter $(DEFAULT_VERSION),$(PYTHONS)),echo "PYTHONS: $(v) is the default interpreter's: its suites run on $(BIN)/python";)
	@$(foreach v,$(filter-out $(FOUND_VERSIONS),$(OTHER_VERSIONS)),echo "PYTHONS: skipping CPython $(v): no python$(v) on PATH or under ~/.pyenv/versions";)
	@$(foreach v,$(FOUND_VERSIONS),$(MAKE) --no-print-directory build-$(v) &&) true

build-%: .venv-%/.installed-stamp
	.venv-$*/bin/python setup.py --quiet build_ext --inplace
	.venv-$*/bin/python -m aiopurgatory --version

pytest-%: build-% java
	AIOPURGATORY_EXPECT_COMPILED=1 $(ONLY_THIS) .venv-$*/bin/pytest $(XDIST) $(PURE_PYTEST_ARGS)

# The documentation site, into site/: strict (a warning, a broken link or anchor fails
# it), offline (no CDN), diagrams and plots drawn by docs/scripts at build time.
# tests/docs/test_docs.py builds it again and checks it in headless Chromium (skipped, saying
# so, when no chromium is installed; .ci/run installs Debian's). No --quiet: it sets
# mkdocs' logger to ERROR, so warnings never reach the counter strict mode aborts on
# and a broken link built with exit status 0 (tests/docs/test_docs.py runs this very line on
# docs with a broken link planted).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The checks (lint, types, the docs site: one core each at most) run while the other
# versions' venvs are made and built (pip's downloads, then Cython and gcc), then the
# suites: on two cores that takes the versions' set-up off the critical path.
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target checks versions
	$(MAKE) --no-print-directory pytest

checks: lint typecheck docs

demo: build java
	$(BIN)/aiopurgatory demo

# The report on a Spark standalone master and worker started on loopback from the
# pyspark distribution (README, "Running on a cluster"); both are stopped afterwards.
cluster-demo: build java
	$(BIN)/python -m aiopurgatory.analysis.spark_cluster --rows 1000000 --out cluster-report

clean:
	rm -rf $(VENV) $(VENV)-3.* build site .mypy_cache .ruff_cache .pytest_cache .hypothesis purgatory-report cluster-report
	rm -f aiopurgatory/*.so aiopurgatory/*.c aiopurgatory/*.html

# The README's ceiling plot, redrawn from the newest ceiling records (one file: several
# would mix runs).
ceiling-plot: $(STAMP)
	$(BIN)/python -m bench ceiling --records $$(ls bench/ceiling-*.json | tail -n 1) --plot docs/ceiling-lateness.svg
