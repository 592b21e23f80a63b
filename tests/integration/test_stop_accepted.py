"""A stop finishes what the listener accepted (issue 41; the rule: ``docs/concepts.md``, *Stop and cancel*).

A message accepted before ``stop()`` is read by the listener's model before the run ends, whichever process stops
it, in the middle of its switches (a listener continued every 2 turns); and no message is reported delivered that
was not acted on. The listener waits as ``CONDUCTOR_AGENT_LISTENER_WAIT`` says when it is set (``pull`` or
``human``), so the suite can be run under either shape.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time

import attrs
import pytest

from conductor_agents import (
    Agent,
    AgentRuntime,
    AgentSettings,
    Continuation,
    ExecutionNotRunningError,
    MessageLostError,
    RunStatus,
    ToolContext,
    WaitForMessageTool,
    tool,
)
from conductor_agents.continuation import KEEP_ALL_RUNS
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener
from .test_long_listeners import ROOT, ActionTools, act_on

pytestmark = pytest.mark.integration

#: A switch every two model turns: with one message per wait, one after each message acted on.
SWITCHING = Continuation(max_turns=2, keep_runs=KEEP_ALL_RUNS)


def settings_for(agent_settings: AgentSettings) -> AgentSettings:
    """The test's settings, with the listener's wait from ``CONDUCTOR_AGENT_LISTENER_WAIT`` when it is set."""
    wait = os.environ.get("CONDUCTOR_AGENT_LISTENER_WAIT", "").strip().lower()
    return attrs.evolve(agent_settings, listener_wait=wait) if wait else agent_settings


def warm_up(handle, tools: ActionTools, count: int) -> list[str]:
    """Send ``count`` messages one at a time, each acted on before the next: the listener has switched since."""
    sent = []
    for i in range(count):
        sent.append(f"warm-{i}")
        handle.send_message({"action": sent[-1]})
        eventually(lambda: sent[-1] in tools.snapshot(), timeout=60, interval=0.1, message=f"{sent[-1]} acted on")
    eventually(lambda: handle.runs >= 2, timeout=60, interval=0.2, message="a switch")
    return sent


@pytest.mark.both_topologies
def test_a_stop_from_another_process_comes_after_the_messages_it_sent_before(
        agent_settings, scripted_llm, unique_name, topology_server):
    """Another process, holding only the listener's id, sends four messages and stops it at once, while the listener
    is continued after every message: all four are acted on (once) before the end, and that process's
    ``wait_delivered`` says each was delivered. (Before issue 41: COMPLETED, the last messages never acted on, and
    ``wait_delivered`` said delivered.)"""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("stop_after"), model, tools, continuation=SWITCHING)
    with AgentRuntime(settings_for(agent_settings)) as runtime:
        handle = runtime.start(agent, "Start listening.")
        sent = warm_up(handle, tools, 2)
        other = subprocess.run([sys.executable, "-m", "tests.integration.sender", topology_server.url,
                                handle.execution_id, "p", "4", "stop"], cwd=ROOT, capture_output=True, text=True,
                               timeout=240, check=False)
        assert other.returncode == 0, other.stderr[-3000:]
        line = json.loads(other.stdout.strip().splitlines()[-1])
        result = handle.wait(timeout=120)
    sent += [f"p-{i}" for i in range(4)]
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    counts = collections.Counter(tools.snapshot())
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts
    assert line["outcomes"] == ["delivered"] * 4, line
    assert result.runs >= 2
    scripted_llm.assert_no_anomalies(model)


@pytest.mark.both_topologies
def test_messages_sent_while_another_runtime_stops_are_acted_on_or_reported_not_acted_on(
        agent_settings, scripted_llm, unique_name, topology_server):
    """A sender keeps sending while a second runtime stops the listener (continued every two turns): every message
    accepted before the stop was asked is acted on; a later one is refused, or acted on, or reported not acted on;
    none is reported delivered without being acted on, and none is acted on twice."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("stop_race"), model, tools, batch_size=2, continuation=SWITCHING)
    settings = settings_for(agent_settings)
    accepted: list[tuple[str, str, float]] = []  # (action, message id, when the send returned)
    refused: list[str] = []
    with AgentRuntime(settings) as runtime, AgentRuntime(settings) as stopper:
        handle = runtime.start(agent, "Start listening.")
        warm_up(handle, tools, 2)
        done = threading.Event()

        def keep_sending() -> None:
            for i in range(40):
                action = f"s-{i}"
                try:
                    message_id = handle.send_message({"action": action})
                except ExecutionNotRunningError:
                    refused.append(action)
                    break
                accepted.append((action, message_id, time.monotonic()))
                if done.wait(0.05):
                    break

        sender = threading.Thread(target=keep_sending, name="test-sender")
        sender.start()
        try:
            eventually(lambda: len(accepted) >= 3, timeout=60, interval=0.05, message="three messages accepted")
            asked = time.monotonic()
            stopper.attach(handle.execution_id).stop()
            result = handle.wait(timeout=120)
        finally:
            done.set()
            sender.join(timeout=60)
        assert not sender.is_alive()
        outcomes = {}
        for action, message_id, _ in accepted:
            try:
                stopper.wait_delivered(handle.execution_id, message_id, timeout=60)
                outcomes[action] = "delivered"
            except MessageLostError as err:
                outcomes[action] = err.reason
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    acted = collections.Counter(tools.snapshot())
    assert set(acted.values()) == {1}, acted
    before = [action for action, _, at in accepted if at < asked]
    assert len(before) >= 3 and all(acted[action] == 1 and outcomes[action] == "delivered" for action in before), (
        before, outcomes, acted)
    for action, outcome in outcomes.items():
        assert (outcome == "delivered") == (acted[action] == 1), (action, outcome, acted)
        assert outcome in ("delivered", MessageLostError.NOT_ACTED_ON, MessageLostError.RUN_ENDED), outcome
    assert not set(refused) & set(acted)
    scripted_llm.assert_no_anomalies(model)


@pytest.mark.both_topologies
def test_a_run_that_is_no_continued_listener_stopped_by_id_reads_the_message_sent_before(
        agent_settings, scripted_llm, unique_name):
    """A run waiting for messages that is not a continued listener (no tool of this process), stopped by id from a
    runtime that never saw its agent: the message sent just before the stop reaches its model, and
    ``wait_delivered`` says delivered (before issue 41: the stop ended it with the message unread)."""
    seen = []

    def on_message(payload):
        seen.append(payload)
        return None

    model = scripted_llm.script(policy=listener_policy(on_message))
    agent = Agent(unique_name("plain"), model, tools=[WaitForMessageTool.create()], max_turns=50)
    with AgentRuntime(settings_for(agent_settings)) as runtime, AgentRuntime(agent_settings) as other:
        handle = runtime.start(agent, "Listen.")
        scripted_llm.wait_for_requests(model, 1, timeout=60)
        message_id = handle.send_message({"n": 1})
        other.attach(handle.execution_id).stop()
        result = handle.wait(timeout=120)
        delivery = other.wait_delivered(handle.execution_id, message_id, timeout=30)
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    assert {"n": 1} in seen and delivery.message_id == message_id


class SlowTools(ActionTools):
    """``act``, and ``work``: a long tool that returns early once a stop is asked (``ctx.stop_requested``)."""

    def __init__(self) -> None:
        super().__init__()
        self.saw_stop: list[bool] = []
        self.working = threading.Event()

    @tool
    def work(self, ctx: ToolContext) -> dict:
        """Work for a while, or until the run is asked to stop."""
        self.working.set()
        self.saw_stop.append(ctx.stop_requested.wait(15))  # shorter than a stop waits for the listener to take it in
        return {"worked": True}


def test_a_long_tool_of_a_listener_stopped_here_is_told_at_once_and_the_message_behind_it_is_acted_on(
        agent_settings, scripted_llm, unique_name):
    """A listener busy in a long tool is stopped from this process, with a message sent just before: the tool sees
    ``ctx.stop_requested`` at once (it does not wait for the stop to be taken in), returns early, and the message is
    acted on before the end."""
    tools = SlowTools()
    model = scripted_llm.script(policy=listener_policy(
        lambda payload: ToolCall("work", {}) if payload["action"] == "work" else act_on(payload)))
    agent = listener(unique_name("busy"), model, tools, continuation=SWITCHING)
    with AgentRuntime(settings_for(agent_settings)) as runtime:
        handle = runtime.start(agent, "Start listening.")
        handle.send_message({"action": "work"})
        assert tools.working.wait(60)
        handle.send_message({"action": "after-work"})
        handle.stop()
        result = handle.wait(timeout=120)
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    assert tools.saw_stop == [True] and tools.snapshot() == ["after-work"]
    scripted_llm.assert_no_anomalies(model)
