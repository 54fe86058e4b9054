# Two entry points for a fresh machine: `make test` and `make demo`.
# Both create .venv and install what they need; Java (for PySpark) comes from apt
# when it is missing and we may install packages.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
EXTRAS := dev,examples,metrics,trace,analysis,bench

.PHONY: test lint typecheck pytest demo java clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $(STAMP)

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

pytest: $(STAMP) java
	$(BIN)/pytest

test: lint typecheck pytest

demo: $(STAMP) java
	$(BIN)/aiopurgatory demo

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis purgatory-report
