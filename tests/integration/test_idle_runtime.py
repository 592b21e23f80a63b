"""A runtime that serves no run sends no request at all (issue 11, point 7).

Measured through the loopback proxy: every request the runtime sends passes through it and is
recorded. The queue watcher stops when the last poller is gone and comes back with the next run.
"""

from __future__ import annotations

import time

import attrs
import pytest

from conductor_agents import AgentRuntime, RunStatus
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..proxy import LoopbackProxy
from .test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.integration

#: How long the tests watch a runtime that serves nothing (the watcher used to ask 4 times a second).
QUIET_SECONDS = 3.0


def serving_threads():
    return [n for n in sdk_threads() if n.startswith(("conductor-agents-poll", "conductor-agents-watch"))]


@pytest.fixture
def proxy(conductor_server):
    with LoopbackProxy(conductor_server.url) as running:
        yield running


def test_a_runtime_that_never_started_anything_sends_no_request(agent_settings, proxy):
    with AgentRuntime(attrs.evolve(agent_settings, server_url=proxy.url)) as runtime:
        time.sleep(QUIET_SECONDS)  # the measurement window
        runtime.stats()  # no request either
    assert [] == proxy.requests_to("/")


def test_no_request_once_the_last_run_ended_and_the_next_run_is_served(
        agent_settings, proxy, scripted_llm, unique_name):
    model = scripted_llm.script(policy=listener_policy(act_on))
    with AgentRuntime(attrs.evolve(agent_settings, server_url=proxy.url)) as runtime:
        for round_ in range(2):  # the second run gets a fresh watcher
            tools = ActionTools(f"round-{round_}")
            handle = runtime.start(listener(unique_name("idle"), model, tools), "Start listening.")
            assert "conductor-agents-watch" in sdk_threads()
            handle.send_message({"action": f"report-{round_}"})
            eventually(lambda: tools.actions, timeout=60, message="the tool ran")
            handle.stop()
            assert handle.wait(timeout=60).status is RunStatus.COMPLETED
            eventually(lambda: not serving_threads(), timeout=15, message="poller and watcher threads ended")
            before = len(proxy.requests_to("/"))
            time.sleep(QUIET_SECONDS)  # the measurement window
            late = proxy.requests_to("/")[before:]
            assert [] == [(method, path) for method, path, _ in late]
            assert tools.actions == [(f"report-{round_}", "")]
    scripted_llm.assert_no_anomalies(model)
