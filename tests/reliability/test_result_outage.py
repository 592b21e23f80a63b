"""A tool's result posted while the server refuses every request: retried, and it lands exactly once
when the server is back (issue 11, point 4); meanwhile the listener's status names the id its caller holds
(issue 41, point 4). The outage is made by the loopback proxy."""

from __future__ import annotations

import threading

import attrs
import pytest

from conductor_agents import AgentRuntime, RunStatus, ServerUnavailableError, tool
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from ..integration.test_stateful_listener import act_on
from ..proxy import LoopbackProxy
from .support import workflow

pytestmark = pytest.mark.reliability

GATE_TIMEOUT = 60.0


class GatedTools:
    """``act`` blocks until the test opens the gate, so the test can cut the server meanwhile."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.runs: list = []

    @tool
    def act(self, action: str, tag: str = "") -> dict:
        """Carry out an action requested by an external message."""
        self.started.set()
        self.gate.wait(GATE_TIMEOUT)
        self.runs.append(action)
        return {"done": action}


@pytest.mark.parametrize("status", [503, 0], ids=["503", "connection-closed"])
def test_a_result_posted_during_an_outage_lands_exactly_once(conductor_server, agent_settings, scripted_llm,
                                                             unique_name, status):
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = GatedTools()
    with LoopbackProxy(conductor_server.url) as proxy, \
            AgentRuntime(attrs.evolve(agent_settings, server_url=proxy.url)) as runtime:
        handle = runtime.start(listener(unique_name("outage"), model, tools), "Start listening.")
        handle.send_message({"action": "report"})
        assert tools.started.wait(60), "the tool started"
        proxy.refuse(["/api/"], status=status)  # the whole API is down
        if status == 0:  # unreachable: a listener's status names the id its caller holds, then the run (issue 41)
            with pytest.raises(ServerUnavailableError) as down:
                handle.status()
            assert handle.current_execution_id != handle.execution_id  # the caller holds the listener's mailbox
            assert str(down.value).startswith(
                f"listener {handle.execution_id}: GET /agent/{handle.current_execution_id}/status: "), down.value
        tools.gate.set()
        eventually(lambda: len([r for r in proxy.requests_to("/api/tasks") if r[0] == "POST"]) >= 3,
                   timeout=30, message="the result POST refused and retried")
        proxy.refuse([])  # the server is back
        eventually(lambda: _acts(conductor_server.url, handle.execution_id) == ["COMPLETED"], timeout=60,
                   interval=0.2, message="the result landed")
        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    acts = [t for t in workflow(conductor_server.url, handle.execution_id)["tasks"] if t["taskType"] == "act"]
    assert [("COMPLETED", {"done": "report"})] == [(t["status"], t["outputData"]) for t in acts]
    assert tools.runs == ["report"]  # the tool ran once: its result was not lost and re-run
    scripted_llm.assert_no_anomalies(model)


def _acts(base_url: str, execution_id: str) -> list:
    return [t["status"] for t in workflow(base_url, execution_id)["tasks"] if t["taskType"] == "act"]
