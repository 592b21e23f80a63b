"""start(): a failure after the server accepted the run raises an error carrying its execution_id,
releases what was reserved and leaves no thread serving the run (issue 11, point 3).

The failures are made by the loopback proxy: every request reaches the real server except the one
the test refuses (a 503, or a connection closed without an answer).
"""

from __future__ import annotations

import attrs
import pytest

from conductor_agents import AgentRuntime, WorkerStartupError
from conductor_agents.errors import ServerError, ServerUnavailableError
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..integration.test_stateful_listener import ActionTools, act_on
from ..proxy import LoopbackProxy
from .support import server_get

pytestmark = pytest.mark.reliability


@pytest.fixture
def proxy(conductor_server):
    with LoopbackProxy(conductor_server.url) as running:
        yield running


def _pollers():
    return [t for t in sdk_threads() if t.startswith("conductor-agents-poll-")]


@pytest.mark.parametrize("refused,status,idempotent,cause", [
    ("/api/workflow/", 503, True, ServerError),              # the idempotent domain lookup
    ("/api/tasks/queue/polldata", 503, False, ServerError),  # the start-up check's poll data
    ("/api/tasks/queue/polldata", 0, False, ServerUnavailableError),  # ... a connection closed unanswered
], ids=["domain-lookup-503", "poll-data-503", "poll-data-connection-error"])
def test_a_failure_after_the_start_names_the_run_and_serves_nothing(
        conductor_server, agent_settings, proxy, scripted_llm, unique_name, refused, status, idempotent, cause):
    model = scripted_llm.script(policy=listener_policy(act_on))
    settings = attrs.evolve(agent_settings, server_url=proxy.url)
    proxy.refuse([refused], status=status)
    with AgentRuntime(settings) as runtime:
        with pytest.raises(WorkerStartupError) as info:
            runtime.start(listener(unique_name("half_started"), model, ActionTools()), "Start listening.",
                          idempotency_key=unique_name("key") if idempotent else None)
        execution_id = info.value.execution_id
        assert execution_id, "the error names the run the server started"
        assert isinstance(info.value.__cause__, cause)
        assert proxy.refused >= 1
        run = server_get(conductor_server.url, f"/workflow/{execution_id}")
        assert run["status"] == "RUNNING"  # the run does exist: the caller can cancel or resume it
        eventually(lambda: not _pollers(), timeout=15, message="no poller left serving the run")
        assert runtime.stats().active_runs == ()
        proxy.refuse([])
        runtime.attach(execution_id).cancel("test cleanup")
