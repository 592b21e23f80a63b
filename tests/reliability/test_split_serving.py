"""Two processes serving one listener (a take-over the first process did not learn of): a switch made by one is no end
of the listener for the other.

Seen in the hour-long soak on the Redis cluster: after a cut of the serving processes' connections, one process kept
its listeners (its lease renewed) while another adopted them (its view of who was present read before the renewal).
One of them continued a listener; the other saw the listener's run end ("continued as ...") and, reading that as the
listener's end, ended its mailbox: four listeners were unreachable from then on and the messages accepted for them
were never acted on. Here the second process is a ``resume(force=True)`` of a listener the first one serves; messages
go on until the listener is continued, and its mailbox (the id callers hold) must still take messages after.
"""

from __future__ import annotations

import attrs
import pytest

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from ..integration.test_stateful_listener import ActionTools, act_on
from .support import quiescent

pytestmark = pytest.mark.reliability


def test_a_switch_made_by_one_of_two_serving_processes_does_not_end_the_listeners_mailbox(
        agent_settings, scripted_llm, unique_name):
    model = scripted_llm.script(policy=listener_policy(act_on))
    first_tools, second_tools = ActionTools("first"), ActionTools("second")
    name = unique_name("split")
    settings = attrs.evolve(agent_settings, liveness_check_interval_seconds=1.0)
    acted = lambda: len(first_tools.actions) + len(second_tools.actions)  # noqa: E731
    with AgentRuntime(settings) as first, AgentRuntime(settings) as second:
        handle = first.start(listener(name, model, first_tools, continuation=Continuation(max_turns=2)),
                             "Start listening.")
        eventually(lambda: quiescent(settings.server_url, handle.execution_id), timeout=60, message="at rest")
        second.resume(handle.execution_id, listener(name, model, second_tools, continuation=Continuation(max_turns=2)),
                      force=True)
        sent: "list[str]" = []
        while handle.status().runs < 3:  # two switches: each process serves a link that another one continues
            assert len(sent) < 12, "no switch for many messages"
            sent.append(f"m{len(sent)}")
            handle.send_message({"action": sent[-1]})
            eventually(lambda: acted() == len(sent), timeout=60, message=f"{sent[-1]} acted on")
        eventually(lambda: quiescent(settings.server_url, handle.execution_id), timeout=60, message="at rest")
        # Each process has seen a link it served end by now (its watchdog samples every second).
        eventually(lambda: handle.status().runs >= 3, timeout=10, message="three runs")
        sent.append("after")
        handle.send_message({"action": "after"})  # refused (the listener ended) if a process ended its mailbox
        eventually(lambda: acted() == len(sent), timeout=60, message="the message after the switches acted on")
        assert handle.status().status is RunStatus.RUNNING
        assert sorted(a for a, _ in first_tools.actions + second_tools.actions) == sorted(sent)  # each once
        handle.stop()
        handle.wait(timeout=60)
