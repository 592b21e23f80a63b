"""A stop finishes what the listener accepted, and ``stop()`` returns at once (issue 41; the rule:
``docs/concepts.md``, *Stop and cancel*).

A message accepted before ``stop()`` is read by the listener's model before the run ends, whichever process stops
it, in the middle of its switches, with either kind of wait; a listener that waits with nothing unread ends with no
model turn after the stop (the seed's events are unchanged: ``test_events.py``).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import attrs
import pytest

from conductor_agents import AgentRuntime, Continuation, ExecutionNotRunningError, RunStatus
from conductor_agents.continuation import KEEP_ALL_RUNS
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from .test_long_listeners import ROOT, ActionTools, act_on

pytestmark = pytest.mark.integration

#: A switch every two model turns: with one message per wait, one after each message acted on.
SWITCHING = Continuation(max_turns=2, keep_runs=KEEP_ALL_RUNS)


@pytest.mark.both_topologies
def test_a_message_sent_just_before_stop_is_acted_on_and_one_after_it_is_refused(
        agent_runtime, scripted_llm, unique_name):
    """``send_message(m); stop(); wait()`` on a listener waiting for messages: m is acted on before the end, and
    ``wait_delivered`` says delivered; the listener then refuses a message (before issue 41: COMPLETED with m never
    acted on, while ``wait_delivered`` said delivered)."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    handle = agent_runtime.start(listener(unique_name("stop_after"), model, tools), "Start listening.")
    scripted_llm.wait_for_requests(model, 1, timeout=60)
    message_id = handle.send_message({"action": "before-stop"})
    handle.stop()
    result = handle.wait(timeout=60)
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    assert tools.actions == ["before-stop"]
    assert agent_runtime.wait_delivered(handle.execution_id, message_id, timeout=30).message_id == message_id
    with pytest.raises(ExecutionNotRunningError):
        handle.send_message({"action": "after-stop"})
    scripted_llm.assert_no_anomalies(model)


@pytest.mark.both_topologies
def test_a_stop_from_another_process_comes_after_the_messages_it_sent_mid_switch_on_a_human_wait(
        agent_settings, scripted_llm, unique_name, topology_server):
    """Another process, holding only the listener's id, sends four messages and stops it at once, while the listener
    (waiting on a HUMAN task) is continued every two turns: all four are acted on, once, before the end, and that
    process's ``wait_delivered`` says each was delivered."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("stop_human"), model, tools, continuation=SWITCHING)
    with AgentRuntime(attrs.evolve(agent_settings, listener_wait="human")) as runtime:
        handle = runtime.start(agent, "Start listening.")
        handle.send_message({"action": "warm"})
        eventually(lambda: tools.actions == ["warm"] and handle.runs >= 2, timeout=60, interval=0.2,
                   message="the warm-up acted on, and a switch")
        other = subprocess.run([sys.executable, "-m", "tests.integration.sender", topology_server.url,
                                handle.execution_id, "p", "4", "stop"], cwd=ROOT, capture_output=True, text=True,
                               timeout=240, check=False)
        assert other.returncode == 0, other.stderr[-3000:]
        line = json.loads(other.stdout.strip().splitlines()[-1])
        result = handle.wait(timeout=120)
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    counts = collections.Counter(tools.actions)
    assert sorted(counts) == sorted(["warm", *(f"p-{i}" for i in range(4))]) and set(counts.values()) == {1}, counts
    assert line["outcomes"] == ["delivered"] * 4, line
    scripted_llm.assert_no_anomalies(model)


def test_an_idle_listener_on_a_human_wait_ends_at_its_stop_with_no_model_turn_after_it(
        agent_settings, scripted_llm, unique_name):
    """A listener waiting on a HUMAN task with nothing unread is stopped: its serving process sets the stop flag as
    it hands the stop over, so the run ends without a model turn reading the stop."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    with AgentRuntime(attrs.evolve(agent_settings, listener_wait="human")) as runtime:
        handle = runtime.start(listener(unique_name("idle_human"), model, tools), "Start listening.")
        handle.send_message({"action": "one"})
        eventually(lambda: tools.actions == ["one"] and len(scripted_llm.requests_for(model)) >= 3, timeout=60,
                   interval=0.1, message="one acted on, and the listener waiting again")
        eventually(lambda: handle.status().waiting_for is not None, timeout=30, interval=0.1,
                   message="the listener waits")
        turns = len(scripted_llm.requests_for(model))
        handle.stop()
        result = handle.wait(timeout=60)
    assert (result.status, result.ended_by) == (RunStatus.COMPLETED, "stop"), result
    assert len(scripted_llm.requests_for(model)) == turns
    scripted_llm.assert_no_anomalies(model)
