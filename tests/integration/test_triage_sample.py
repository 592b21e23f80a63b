"""samples/triage.py against the session's server: its scripted models, its loopback order service."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "triage.py"


def load_sample():
    spec = importlib.util.spec_from_file_location("triage_sample", SAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_triage_sample_routes_to_both_specialists_and_blocks_the_leak(agent_settings, scripted_llm, server_secrets,
                                                                        capsys):
    """Both specialists answer (the order via the server's HTTP call with the secret token, the account from a
    tool in this process), and the leaked key never reaches the answer."""
    sample = load_sample()
    [(secret_name, token)] = server_secrets.items()
    with contextlib.contextmanager(sample.order_service)(token) as url:
        code = sample.run_scenario(agent_settings, sample.scripted_models(scripted_llm), url, token_secret=secret_name)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ask_orders answered: Order A-17 is shipped." in out
    assert "ask_support answered: Ann is on the pro plan; her account is active." in out
    assert "[tool in this process] lookup_account(user='ann')" in out
    assert "key leaked: False" in out and "run ended COMPLETED" in out
