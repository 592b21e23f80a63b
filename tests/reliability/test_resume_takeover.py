"""resume() refuses to take a run over while another worker still polls its domain (issue 11, point 5).

Three runtimes in this process (each has its own worker id, as separate processes would) take turns
on one run. The freshness window is shortened for the test: the poller's safety poll (60 s) to 2 s
and the margin to 3 s, so "the window passed" takes seconds, not 75 s; the logic is the same.
"""

from __future__ import annotations

import time

import pytest

from conductor_agents import AgentRuntime, ResumeError, RunStatus
from conductor_agents import _poller, _takeover
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from ..integration.test_stateful_listener import ActionTools, act_on
from .support import last_poll_ms

pytestmark = pytest.mark.reliability


@pytest.fixture
def short_window(monkeypatch):
    monkeypatch.setattr(_poller, "_SAFETY_POLL_SECONDS", 2.0)
    monkeypatch.setattr(_takeover, "_MARGIN_SECONDS", 3.0)
    return _takeover.freshness_window()


def test_resume_is_refused_while_another_worker_polls_then_allowed(agent_settings, scripted_llm, unique_name,
                                                                  short_window):
    base = agent_settings.server_url
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("takeover")
    first_tools, second_tools, third_tools = ActionTools("first"), ActionTools("second"), ActionTools("third")

    first = AgentRuntime(agent_settings)
    try:
        handle = first.start(listener(name, model, first_tools), "Start listening.")
        handle.send_message({"action": "m1"})
        eventually(lambda: first_tools.actions, timeout=60, message="the first runtime acted")
        with AgentRuntime(agent_settings) as second:
            # The first runtime is alive and polls the run's domain: no take-over.
            with pytest.raises(ResumeError) as refused:
                second.resume(handle.execution_id, listener(name, model, second_tools))
            message = str(refused.value)
            assert first.worker_id in message and "force=True" in message and "ago" in message
            assert refused.value.execution_id == handle.execution_id
            assert second.stats().active_runs == ()  # it serves nothing of the run
            handle.send_message({"action": "m2"})  # still served by the first runtime alone
            eventually(lambda: len(first_tools.actions) == 2, timeout=60, message="the first runtime acted again")
    finally:
        first.close()

    with AgentRuntime(agent_settings) as second:
        # Closed a moment ago: its last poll is still fresh, so still refused without force ...
        with pytest.raises(ResumeError):
            second.resume(handle.execution_id, listener(name, model, second_tools))
        # ... and taken over with force=True.
        resumed = second.resume(handle.execution_id, listener(name, model, second_tools), force=True)
        assert resumed.workers_attached
        resumed.send_message({"action": "m3"})
        eventually(lambda: second_tools.actions, timeout=60, message="the second runtime acted")

    # Once nobody has polled the domain for the window, resume() takes the run over by itself.
    eventually(lambda: time.time() - last_poll_ms(base, "act", handle.run_id) / 1000.0 > short_window + 1,
               timeout=short_window + 30, interval=0.2, message="the window passed")
    with AgentRuntime(agent_settings) as third:
        resumed = third.resume(handle.execution_id, listener(name, model, third_tools))
        resumed.send_message({"action": "m4"})
        eventually(lambda: third_tools.actions, timeout=60, message="the third runtime acted")
        resumed.stop()
        assert resumed.wait(timeout=60).status is RunStatus.COMPLETED

    assert [a for a, _ in first_tools.actions] == ["m1", "m2"]
    assert [a for a, _ in second_tools.actions] == ["m3"]
    assert [a for a, _ in third_tools.actions] == ["m4"]
    scripted_llm.assert_no_anomalies(model)
