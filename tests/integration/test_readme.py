"""The README's Python quickstart runs as written, and its links lead somewhere.

The quickstart reads its model from CONDUCTOR_AGENT_MODEL (default a real Anthropic model)
and its server from CONDUCTOR_SERVER_URL; the test sets both to the session's server and a
scripted model, and runs the block in a fresh interpreter exactly as a reader would paste it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conductor_agents.testing import ToolCall, listener_policy

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def quickstart_block() -> str:
    section = README.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no ```python block under ## Quickstart"
    return match.group(1)


def test_quickstart_runs_as_written(agent_settings, scripted_llm) -> None:
    model = scripted_llm.script(policy=listener_policy(
        lambda payload: ToolCall("generate_report", {"topic": "weekly"})
        if payload.get("action") == "generate-report" else None))
    env = {**os.environ, "CONDUCTOR_SERVER_URL": agent_settings.server_url, "CONDUCTOR_AGENT_MODEL": model}
    result = subprocess.run([sys.executable, "-c", quickstart_block()], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "COMPLETED ['weekly']"
    assert len(scripted_llm.requests_for(model)) >= 2
    scripted_llm.assert_no_anomalies(model)


def test_quickstart_runs_offline_with_its_default_model(agent_settings, scripted_llm) -> None:
    """Without CONDUCTOR_AGENT_MODEL the block's ``anthropic/claude-sonnet-4-6`` is answered by the scripted
    model of ``server start --scripted-model`` (issue 41, point 5: it waited 120 s, then printed ``FAILED []``)."""
    from conductor_agents.testing._dev_model import DEFAULT_MODEL, DevModel

    model = scripted_llm.script(policy=DevModel(), model=DEFAULT_MODEL.split("/", 1)[1], replace=True)
    env = {key: value for key, value in os.environ.items() if key != "CONDUCTOR_AGENT_MODEL"}
    env["CONDUCTOR_SERVER_URL"] = agent_settings.server_url
    result = subprocess.run([sys.executable, "-c", quickstart_block()], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "COMPLETED ['weekly']"
    assert [request.path for request in scripted_llm.requests_for(model)][-1].endswith("/v1/messages")
    scripted_llm.assert_no_anomalies(model)


def test_quickstart_defaults_to_a_real_model() -> None:
    assert 'os.environ.get("CONDUCTOR_AGENT_MODEL", "anthropic/claude-sonnet-4-6")' in quickstart_block()


def test_relative_links_resolve() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not re.match(r"^[a-z]+://", link)]
    assert local, "the README links no docs"
    missing = [link for link in local if not (REPO_ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"
    for doc in ("docs/concepts.md", "docs/configuration.md", "docs/operations.md", "docs/cli.md",
                "docs/testing.md", "docs/tools.md"):
        assert f"({doc})" in README, f"the README does not link {doc}"
