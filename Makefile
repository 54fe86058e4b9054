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
PURE_PYTEST_ARGS := --ignore=tests/test_analysis.py --ignore=tests/test_cli.py \
	--ignore=tests/test_demo_installed.py --ignore=tests/test_cluster.py \
	--ignore=tests/test_class_cache.py

.PHONY: all build test lint typecheck docs pytest pytest-compiled pytest-pure demo cluster-demo java clean ceiling-plot

all: build

# The editable install compiles nothing (AIOPURGATORY_NO_EXTENSIONS): `build` does, once,
# keeping its intermediate files under build/ so that later rebuilds are incremental.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	AIOPURGATORY_NO_EXTENSIONS=1 $(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

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
# again on the pure-Python modules, forced with AIOPURGATORY_NO_EXTENSIONS=1.
pytest: pytest-compiled pytest-pure

pytest-compiled: build java
	AIOPURGATORY_EXPECT_COMPILED=1 $(BIN)/pytest $(XDIST)

pytest-pure: $(STAMP)
	AIOPURGATORY_NO_EXTENSIONS=1 $(BIN)/pytest $(XDIST) $(PURE_PYTEST_ARGS)

# The documentation site, into site/: strict (a warning, a broken link or anchor fails
# it), offline (no CDN), diagrams and plots drawn by docs/scripts at build time.
# tests/test_docs.py builds it again and checks it in headless Chromium (skipped, saying
# so, when no chromium is installed; .ci/run installs Debian's). No --quiet: it sets
# mkdocs' logger to ERROR, so warnings never reach the counter strict mode aborts on
# and a broken link built with exit status 0 (tests/test_docs.py runs this very line on
# docs with a broken link planted).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint typecheck docs pytest

demo: build java
	$(BIN)/aiopurgatory demo

# The report on a Spark standalone master and worker started on loopback from the
# pyspark distribution (README, "Running on a cluster"); both are stopped afterwards.
cluster-demo: build java
	$(BIN)/python -m aiopurgatory.analysis.cluster --rows 1000000 --out cluster-report

clean:
	rm -rf $(VENV) build site .mypy_cache .ruff_cache .pytest_cache .hypothesis purgatory-report cluster-report
	rm -f aiopurgatory/*.so aiopurgatory/*.c aiopurgatory/*.html

# The README's ceiling plot, redrawn from the newest ceiling records (one file: several
# would mix runs).
ceiling-plot: $(STAMP)
	$(BIN)/python -m bench ceiling --records $$(ls bench/ceiling-*.json | tail -n 1) --plot docs/ceiling-lateness.svg
