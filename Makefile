# Two entry points for a fresh machine: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-slow lint examples clean

setup: $(STAMP)

# torch first, pinned: on these machines 2.13.0 installs a CPU build from a local file in
# seconds, while an unpinned torch would pull a CUDA build of several GB. transformers is
# pinned for development and CI as well (the package itself accepts >=4.44): its minor
# releases change cache internals (5.25 gave Mamba's cache layers a token counter tensor),
# so CI tests the release we last checked, and a new one is taken on by changing the pin.
# The extras are the README's `all` (every optional backend and service client): CI then
# installs exactly what a user's `pip install "tunetree[all]"` does, and runs the README's
# first code block in it (tests/test_readme.py).
TRANSFORMERS_PIN := transformers==5.25.0

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[all,dev]' 'torch==2.13.0' '$(TRANSFORMERS_PIN)'
	touch $(STAMP)

demo: setup
	$(PY) -m tunetree.demo

test: setup
	$(PY) -m pytest

test-slow: setup
	$(PY) -m pytest -m slow

lint: setup
	$(VENV)/bin/ruff check tunetree tests examples benchmarks
	$(VENV)/bin/ruff format --check tunetree tests examples benchmarks
	$(VENV)/bin/mypy tunetree
	$(VENV)/bin/lint-imports --no-logo

examples: setup
	@set -e; for script in examples/*/run.py; do echo "== $$script"; $(PY) $$script; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
