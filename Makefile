# Two commands on a fresh machine: `make demo` (start Corral and run the examples) and `make test`.
# Each creates its own virtualenv (.venv) and installs what it needs from this project's files.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.corral-installed

.PHONY: venv demo up test lint typecheck clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,torch]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/corral demo

up: $(STAMP)
	$(VENV)/bin/corral up

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .corral build *.egg-info
