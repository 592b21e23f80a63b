"""Secrets on the real server: credentials declared by an agent or a tool reach the tool
(ctx.secret) from the server's secrets store, and the value appears in no log line, no repr and
no failure text the SDK posts."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, List

import pytest

from conductor_agents import Agent, MissingSecretError, ToolContext, tool
from conductor_agents.testing import ToolCall
from conductor_agents.testing.pytest_plugin import TEST_SECRET_NAME

pytestmark = pytest.mark.integration


def server_logs(server: object) -> List[Path]:
    """The log files of the session's server (each node of a cluster); none for a server started elsewhere."""
    nodes = getattr(server, "nodes", None) or (server,)
    return [p for p in (getattr(node, "log_path", None) for node in nodes) if p is not None and Path(p).exists()]


def lines_with(secret: str, records: Iterable[logging.LogRecord], files: Iterable[Path]) -> List[str]:
    found = [r.getMessage() for r in records if secret in r.getMessage() or secret in str(r.exc_text or "")]
    for path in files:
        found += [line for line in Path(path).read_text(errors="replace").splitlines() if secret in line]
    return found


@pytest.mark.both_topologies
def test_a_secret_reaches_the_tool_and_appears_in_no_log_line(agent_runtime, scripted_llm, unique_name,
                                                               server_secrets, topology_server, caplog):
    """Tool-level and agent-level credentials deliver the value; logs, reprs and failure texts never show it."""
    secret = server_secrets[TEST_SECRET_NAME]
    own, inherited, leaky = unique_name("own"), unique_name("inherited"), unique_name("leaky")
    seen = {}

    @tool(name=own, credentials=[TEST_SECRET_NAME])
    def use_own(ctx: ToolContext) -> dict:
        """Use the secret declared on this tool."""
        seen["own"] = ctx.secret(TEST_SECRET_NAME) == secret
        seen["repr"] = repr(ctx)
        logging.getLogger("conductor_agents.test").debug("context %r", ctx)
        return {"ok": True}

    @tool(name=inherited)
    def use_inherited(ctx: ToolContext) -> dict:
        """Use the agent's secret."""
        seen["inherited"] = ctx.secret(TEST_SECRET_NAME) == secret
        return {"ok": True}

    @tool(name=leaky)
    def leak(ctx: ToolContext) -> dict:
        """Fail with the secret in the error (a careless tool)."""
        raise RuntimeError(f"cannot log in with {ctx.secret(TEST_SECRET_NAME)}")

    model = scripted_llm.script([[ToolCall(own), ToolCall(inherited), ToolCall(leaky)], "done"])
    agent = Agent(name=unique_name("vault"), model=model, tools=[use_own, use_inherited, leak],
                  credentials=[TEST_SECRET_NAME])
    caplog.set_level(logging.DEBUG)  # every logger, the HTTP libraries' included
    result = agent_runtime.run(agent, "Use the secret.", timeout=90)

    assert result.output == "done"
    assert seen["own"] and seen["inherited"]
    assert secret not in seen["repr"] and TEST_SECRET_NAME not in seen["repr"]
    [failed] = [c for c in result.tool_calls if c.name == leaky]
    assert failed.status in ("COMPLETED_WITH_ERRORS", "FAILED_WITH_TERMINAL_ERROR")  # an optional task failed
    assert f"[secret {TEST_SECRET_NAME}]" in failed.error and secret not in failed.error
    outputs = scripted_llm.requests_for(model)[-1].tool_outputs
    assert all(secret not in str(o.output) for o in outputs)  # nor did the model see it
    assert lines_with(secret, caplog.records, server_logs(topology_server)) == []
    assert any(r.name.startswith("conductor_agents") for r in caplog.records)  # the capture did see the SDK


@pytest.mark.both_topologies
def test_a_missing_secret_is_an_error_naming_it(agent_runtime, scripted_llm, unique_name):
    """Undeclared, or declared but absent from the server: MissingSecretError says which and why."""
    name = unique_name("needy")
    errors = {}

    @tool(name=name, credentials=["CONDUCTOR_AGENTS_NO_SUCH_SECRET"])
    def needy(ctx: ToolContext) -> dict:
        """Needs secrets."""
        for wanted in ("CONDUCTOR_AGENTS_NO_SUCH_SECRET", "UNDECLARED_SECRET"):
            try:
                ctx.secret(wanted)
            except MissingSecretError as err:
                errors[wanted] = err
        return {"ok": True}

    model = scripted_llm.script([ToolCall(name), "done"])
    agent_runtime.run(Agent(name=unique_name("vault"), model=model, tools=[needy]), "Go.", timeout=90)
    absent, undeclared = errors["CONDUCTOR_AGENTS_NO_SUCH_SECRET"], errors["UNDECLARED_SECRET"]
    assert (absent.name, absent.tool_name, absent.declared) == ("CONDUCTOR_AGENTS_NO_SUCH_SECRET", name, True)
    assert "CONDUCTOR_SECRET_CONDUCTOR_AGENTS_NO_SUCH_SECRET" in str(absent)
    assert (undeclared.name, undeclared.declared) == ("UNDECLARED_SECRET", False)
    assert "credentials" in str(undeclared)
