"""The seed scenario and stateful-run isolation, on the real server with a scripted model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conductor_agents import AgentRuntime, RunStatus, tool
from conductor_agents.testing import ToolCall, listener_policy

from ..helpers import eventually, listener, listener_runs, sdk_threads

pytestmark = pytest.mark.integration


class ActionTools:
    """Tools with per-instance state: what each instance was asked to do, and on which thread."""

    def __init__(self, label: str = "") -> None:
        self.label = label
        self.actions: list = []
        self.lock = threading.Lock()

    @tool
    def act(self, action: str, tag: str = "") -> dict:
        """Carry out an action requested by an external message."""
        with self.lock:
            self.actions.append((action, tag))
        return {"done": action, "by": self.label}


def act_on(payload: dict) -> ToolCall:
    return ToolCall("act", {"action": payload["action"], "tag": payload.get("tag", "")})


@pytest.mark.both_topologies
def test_seed_scenario_runs_the_tool_in_this_process(agent_runtime, scripted_llm, unique_name):
    """start → send_message → the tool runs here with that argument → stop → COMPLETED."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    tools = ActionTools("seed")
    handle = agent_runtime.start(listener(unique_name("listener"), model, tools), "Start listening.")
    assert handle.run_id and len(handle.run_id) == 32

    agent_runtime.send_message(handle.execution_id, {"action": "generate-report"})
    eventually(lambda: tools.actions, timeout=30, message="the tool ran")
    assert tools.actions == [("generate-report", "")]

    handle.stop()
    result = handle.wait(timeout=60)
    assert result.status is RunStatus.COMPLETED
    assert result.finish_reason is not None
    names = [c.name for c in result.tool_calls]
    assert "act" in names and "wait_for_message" in names
    scripted_llm.assert_no_anomalies(model)


#: Messages to each of two listeners that run at once: enough to interleave their turns several times. Each
#: message is a model turn of its own (about 1.5 s on an idle machine, several times that on a loaded one),
#: one after the other: a message routed to the wrong run shows at the first one that is, so six each prove
#: what twelve did (issue 44: twelve made the single-node case the suite's third slowest test).
EACH = 6


@pytest.mark.both_topologies
def test_two_runs_of_one_agent_at_once_never_cross(agent_runtime, scripted_llm, unique_name):
    """Two concurrent stateful runs of the same agent, interleaved messages to each: zero crossovers."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("listener")
    tools_a, tools_b = ActionTools("a"), ActionTools("b")
    handle_a = agent_runtime.start(listener(name, model, tools_a), "Start listening.")
    handle_b = agent_runtime.start(listener(name, model, tools_b), "Start listening.")
    assert handle_a.execution_id != handle_b.execution_id
    assert handle_a.run_id != handle_b.run_id

    for i in range(EACH):
        handle_a.send_message({"action": f"a-{i}", "tag": "a"})
        handle_b.send_message({"action": f"b-{i}", "tag": "b"})

    eventually(lambda: len(tools_a.actions) >= EACH and len(tools_b.actions) >= EACH, timeout=120,
               message="every action")
    assert sorted(a for a, _ in tools_a.actions) == sorted(f"a-{i}" for i in range(EACH))
    assert sorted(a for a, _ in tools_b.actions) == sorted(f"b-{i}" for i in range(EACH))
    assert {t for _, t in tools_a.actions} == {"a"} and {t for _, t in tools_b.actions} == {"b"}

    handle_a.stop()
    handle_b.stop()
    assert handle_a.wait(timeout=60).status is RunStatus.COMPLETED
    assert handle_b.wait(timeout=60).status is RunStatus.COMPLETED
    scripted_llm.assert_no_anomalies(model)


CHILD = textwrap.dedent(
    """
    import json, sys, threading
    from conductor_agents import AgentRuntime, AgentSettings
    sys.path.insert(0, {root!r})
    from tests.integration.test_stateful_listener import ActionTools, listener
    tools = ActionTools("child")
    with AgentRuntime(AgentSettings(server_url={url!r})) as runtime:
        handle = runtime.start(listener({name!r}, {model!r}, tools), "Start listening.")
        print(json.dumps({{"execution_id": handle.execution_id}}), flush=True)
        result = handle.wait(timeout=180)
        print(json.dumps({{"status": result.status.value, "actions": tools.actions, "error": result.error,
                          "run": result.current_execution_id, "runs": result.runs}}), flush=True)
    """
)


@pytest.mark.both_topologies
def test_two_processes_each_get_only_their_own_messages(agent_runtime, agent_settings, scripted_llm,
                                                        unique_name):
    """One listener here, one in a child process, same agent, interleaved messages: zero crossovers."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("listener")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = CHILD.format(root=root, url=agent_settings.server_url, name=name, model=model)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child_exec = json.loads(child.stdout.readline())["execution_id"]
        tools_here = ActionTools("parent")
        here = agent_runtime.start(listener(name, model, tools_here), "Start listening.")
        for i in range(EACH):
            here.send_message({"action": f"p-{i}", "tag": "parent"})
            agent_runtime.send_message(child_exec, {"action": f"c-{i}", "tag": "child"})
        eventually(lambda: len(tools_here.actions) >= EACH, timeout=120, message="every action here")
        # Stop the child's run only once all of its messages were acted on (the server
        # shows its act tasks): a stop ends the run with whatever is still queued unread.
        eventually(lambda: _completed_acts(agent_runtime, child_exec) >= EACH, timeout=120,
                   interval=0.5, message="every action in the child")
        agent_runtime.attach(child_exec).stop()
        out, _ = child.communicate(timeout=120)
        child_report = json.loads(out.strip().splitlines()[-1])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert child_report["status"] == "COMPLETED", child_report
    assert sorted(a for a, _ in child_report["actions"]) == sorted(f"c-{i}" for i in range(EACH))
    assert {t for _, t in child_report["actions"]} == {"child"}
    assert sorted(a for a, _ in tools_here.actions) == sorted(f"p-{i}" for i in range(EACH))
    assert {t for _, t in tools_here.actions} == {"parent"}
    here.stop()
    assert here.wait(timeout=60).status is RunStatus.COMPLETED


def _completed_acts(runtime, execution_id: str) -> int:
    """Completed ``act`` tasks over every run of the listener (a long one is continued as new runs)."""
    count = 0
    for run in listener_runs(runtime.settings.server_url, execution_id):
        tasks = runtime._api.get_workflow(run, include_tasks=True).get("tasks") or []
        count += sum(1 for t in tasks if t.get("taskType") == "act" and t.get("status") == "COMPLETED")
    return count


def test_idempotency_key_joins_the_existing_runs_domain(agent_settings, scripted_llm, unique_name):
    """A second start with the same key returns the same run, and its workers serve that run's domain."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("listener")
    key = unique_name("key")
    first_tools = ActionTools("first")
    with AgentRuntime(agent_settings) as first_runtime:
        first = first_runtime.start(listener(name, model, first_tools), "Start listening.", idempotency_key=key)
    # The first process is gone (its runtime closed); a new one starts with the same key.
    second_tools = ActionTools("second")
    with AgentRuntime(agent_settings) as runtime:
        second = runtime.start(listener(name, model, second_tools), "Start listening.", idempotency_key=key)
        assert second.execution_id == first.execution_id
        assert second.run_id == first.run_id
        second.send_message({"action": "after-restart"})
        eventually(lambda: second_tools.actions, timeout=30, message="the second process acted")
        assert second_tools.actions == [("after-restart", "")] and first_tools.actions == []
        second.stop()
        assert second.wait(timeout=60).status is RunStatus.COMPLETED


def test_threads_after_a_dozen_runs_equal_threads_before(agent_settings, scripted_llm, unique_name):
    """A dozen finished stateful runs, served at once, leave no poller, monitor or pool thread behind once closed
    (a thread left per run shows as a dozen)."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("listener")
    before = sdk_threads()
    with AgentRuntime(agent_settings) as runtime:
        handles = [runtime.start(listener(name, model, ActionTools(str(i))), "Start listening.")
                   for i in range(12)]
        for handle in handles:
            handle.send_message({"action": "once"})
        for handle in handles:
            handle.stop()
        for handle in handles:
            assert handle.wait(timeout=120).status is RunStatus.COMPLETED
        eventually(lambda: not [t for t in sdk_threads() if t.startswith("conductor-agents-poll-")],
                   timeout=30, message="every per-run poller ended by itself")
    assert sdk_threads() == before
