"""Listeners that last: a long-lived listener is continued as fresh runs behind its first id (issue 18).

Small budgets (a switch every couple of turns) so that one test goes through six switches.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings, Continuation, RunStatus, tool
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


class ActionTools:
    """Records every action, in order, with the thread-safe lock the pool needs."""

    def __init__(self) -> None:
        self.actions: list = []
        self.lock = threading.Lock()

    @tool
    def act(self, action: str, tag: str = "") -> dict:
        """Carry out an action requested by an external message."""
        with self.lock:
            self.actions.append(action)
        return {"done": action}

    def snapshot(self) -> list:
        with self.lock:
            return list(self.actions)


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"], "tag": payload.get("tag", "")})


def send_from_another_process(url: str, execution_id: str, prefix: str, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.integration.sender", url, execution_id, prefix, str(count)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


def task_list_bytes(url: str, execution_id: str) -> int:
    response = requests.get(f"{url}/workflow/{execution_id}", params={"includeTasks": "true"}, timeout=30)
    response.raise_for_status()
    return len(response.content)


#: Messages from each of two sender processes, and the switches the listener must go through: six, so that most of
#: them happen while older runs are being retired (the default keeps two ended runs). The suite ran a dozen until
#: issue 44: each switch costs two model turns, and the twelve took a minute on the cluster (a thousand: ``benchmarks/``).
EACH, SWITCHES = 8, 6


@pytest.mark.both_topologies
def test_senders_in_two_processes_across_six_switches_lose_and_repeat_nothing(
        agent_runtime, scripted_llm, unique_name, topology_server):
    """Two other processes push 8 messages each without pause while the listener is continued every
    couple of turns (then this one sends more until it had 6 switches): every message is acted on
    exactly once, in this process, and the listener keeps its first id (status, stop and wait through
    it) across 7+ runs. (A thousand switches: ``benchmarks/``.)"""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    # Batches of 4: the senders outrun the listener, and a backlog is worked off by the run that holds it.
    agent = listener(unique_name("long"), model, tools, batch_size=4, continuation=Continuation(max_turns=2))
    handle = agent_runtime.start(agent, "Start listening.")
    url = getattr(topology_server, "url")
    senders = [send_from_another_process(url, handle.execution_id, prefix, EACH) for prefix in ("a", "b")]
    try:
        sent = [json.loads(p.communicate(timeout=300)[0])["sent"] for p in senders]
    finally:
        for process in senders:
            process.kill()
    assert [len(ids) for ids in sent] == [EACH, EACH] and len(set(sent[0] + sent[1])) == 2 * EACH
    expected = [f"{p}-{i}" for p in ("a", "b") for i in range(EACH)]
    eventually(lambda: len(tools.snapshot()) >= 2 * EACH, timeout=300, interval=0.2, message="every sent action")
    while handle.runs < SWITCHES + 1:  # top up from here, one at a time, until the switches happened
        assert len(expected) < 150, "no switch for a hundred messages"
        expected.append(f"c-{len(expected)}")
        handle.send_message({"action": expected[-1], "tag": "c"})
        eventually(lambda: len(tools.snapshot()) >= len(expected), timeout=60, interval=0.1, message="topped up")

    counts = collections.Counter(tools.snapshot())
    assert sorted(counts) == sorted(expected) and set(counts.values()) == {1}, counts.most_common(3)
    # (No order within a sender's messages: a batch's calls run in parallel.)

    status = handle.status()
    assert status.execution_id == handle.execution_id and status.runs == handle.runs >= SWITCHES + 1
    assert status.current_execution_id != handle.execution_id and not status.is_terminal
    handle.stop()
    result = handle.wait(timeout=120)
    assert (result.status, result.execution_id) == (RunStatus.COMPLETED, handle.execution_id)
    # A stop that comes while a switch is under way ends the listener in the run being continued.
    assert result.runs in (status.runs, status.runs - 1) and result.runs >= SWITCHES
    scripted_llm.assert_no_anomalies(model)


def test_any_process_reaches_the_current_run_through_the_first_id(agent_runtime, scripted_llm, unique_name,
                                                                   agent_settings):
    """A runtime that never saw a switch sends, checks delivery, reads status and events, and stops the
    listener by its first id; the new run's model is shown the conversation so far."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("identity"), model, tools, continuation=Continuation(max_turns=2, keep_exchanges=2))
    handle = agent_runtime.start(agent, "Start listening.")
    for i in range(3):
        handle.send_message({"action": f"early-{i}"})
        eventually(lambda: f"early-{i}" in tools.snapshot(), timeout=60, message=f"early-{i} acted on")
    eventually(lambda: handle.runs >= 3, timeout=60, interval=0.2, message="two switches")

    with AgentRuntime(agent_settings) as other:
        watched = other.attach(handle.execution_id)
        assert watched.runs >= 3 and watched.current_execution_id != handle.execution_id
        events = watched.events(timeout=120)
        message_id = other.send_message(handle.execution_id, {"action": "late"})
        delivery = other.wait_delivered(handle.execution_id, message_id, timeout=60)
        assert delivery.message_id == message_id
        eventually(lambda: "late" in tools.snapshot(), timeout=60, message="the late message acted on")
        assert other.attach(handle.execution_id).status().current_execution_id == handle.current_execution_id
        watched.stop()
        kinds = []
        with events:
            for event in events:
                kinds.append(event.kind)
    assert kinds[-1] == "done" and "tool_call" in kinds, kinds
    assert handle.wait(timeout=60).status is RunStatus.COMPLETED
    assert tools.snapshot().count("late") == 1

    # The first request of a continued run carries the conversation over (the last exchanges verbatim).
    continued = [r for r in scripted_llm.requests_for(model) if r.is_continuation and r.is_first_turn]
    assert continued, "no continued run was asked anything"
    assert "You are continuing an earlier conversation" in (continued[-1].instructions or "")
    assert "[tool_call] act(" in (continued[-1].instructions or "")
    assert handle.stats().tools_executed == 4  # every run's tools count as the listener's


def test_default_settings_outlive_the_payload_wall(agent_runtime, scripted_llm, unique_name, conductor_server):
    """With the defaults and 24 KB messages: a run that is never continued fails at message 10, within a
    minute (its variables pass the server's 256 KB limit; ``benchmarks/results.md``); the continued
    listener acts on three times as many, and no run's task list ever passed 2 MB."""
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    # Every run kept (no retention), to measure each of them; otherwise the default budget.
    handle = agent_runtime.start(listener(unique_name("wall"), model, tools, continuation=Continuation(keep_runs=None)),
                                 "Start listening.")
    for i in range(30):
        handle.send_message({"action": f"m{i:03d}-" + "x" * 24_000})
        eventually(lambda: len(tools.snapshot()) > i, timeout=60, interval=0.05, message=f"message {i} acted on")
    assert [a[:4] for a in tools.snapshot()] == [f"m{i:03d}" for i in range(30)]
    assert not handle.status().is_terminal and handle.runs >= 3
    chain = handle._chain()  # every run of the listener, measured once it is done growing
    sizes = [task_list_bytes(conductor_server.url, chain.link(n).execution_id) for n in range(handle.runs)]
    assert max(sizes) < 2_000_000, sizes
