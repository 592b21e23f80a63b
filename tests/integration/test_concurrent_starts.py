"""The first starts of a brand-new agent, racing: from threads of one process and from two processes.

Before the fix the server answered the losers ``HTTP 500: Workflow with <name>.1 already exists!``
(its definition insert conflicts; no run was created for them). Every start must now succeed and
each run must be served by the runtime that started it: zero crossovers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from conductor_agents import RunStatus
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from .test_stateful_listener import ActionTools, act_on

pytestmark = pytest.mark.integration

THREADS = 6
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_threads_of_one_process_start_one_new_agent_at_once(agent_runtime, scripted_llm, unique_name):
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("first_burst")  # never started before: every start creates its definition
    barrier = threading.Barrier(THREADS)
    tools = [ActionTools(f"t{i}") for i in range(THREADS)]
    handles: dict = {}
    errors: list = []

    def start(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            handles[i] = agent_runtime.start(listener(name, model, tools[i]), "Start listening.")
        except Exception as err:  # collected: the test reports every failure
            errors.append(repr(err))

    threads = [threading.Thread(target=start, args=(i,), name=f"test-starter-{i}") for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [] == errors
    assert THREADS == len({h.execution_id for h in handles.values()})

    for i, handle in handles.items():
        handle.send_message({"action": f"own-{i}", "tag": f"t{i}"})
    eventually(lambda: all(t.actions for t in tools), timeout=120, message="every run acted")
    for i, handle in handles.items():
        handle.stop()
    for i, handle in handles.items():
        assert handle.wait(timeout=120).status is RunStatus.COMPLETED
        assert tools[i].actions == [(f"own-{i}", f"t{i}")]  # its own message, in its own starter's objects
    scripted_llm.assert_no_anomalies(model)


CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    from conductor_agents import AgentRuntime, AgentSettings
    from tests.integration.test_stateful_listener import ActionTools
    from tests.helpers import listener
    tools = ActionTools({label!r})
    with AgentRuntime(AgentSettings(server_url={url!r})) as runtime:
        print("ready", flush=True)
        sys.stdin.readline()  # the barrier: the parent releases both children at once
        try:
            handle = runtime.start(listener({name!r}, {model!r}, tools), "Start listening.")
        except Exception as err:
            print(json.dumps({{"error": repr(err)}}), flush=True)
            raise SystemExit(1)
        print(json.dumps({{"execution_id": handle.execution_id}}), flush=True)
        result = handle.wait(timeout=180)
        print(json.dumps({{"status": result.status.value, "actions": tools.actions}}), flush=True)
    """
)


def test_two_processes_start_one_new_agent_at_once(agent_runtime, agent_settings, scripted_llm, unique_name):
    model = scripted_llm.script(policy=listener_policy(act_on))
    name = unique_name("first_burst")
    labels = ("left", "right")
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD.format(root=ROOT, url=agent_settings.server_url, name=name, model=model,
                                                label=label)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for label in labels
    ]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        for child in children:  # as close together as two writes go
            child.stdin.write("go\n")
            child.stdin.flush()
        started = [json.loads(child.stdout.readline()) for child in children]
        assert all("execution_id" in s for s in started), started
        ids = [s["execution_id"] for s in started]
        assert ids[0] != ids[1]
        for label, execution_id in zip(labels, ids):
            agent_runtime.send_message(execution_id, {"action": f"for-{label}", "tag": label})
        eventually(lambda: all(_acted(agent_runtime, e) for e in ids), timeout=120, interval=0.5,
                   message="both children acted")
        for execution_id in ids:
            agent_runtime.attach(execution_id).stop()
        reports = [json.loads(child.communicate(timeout=120)[0].strip().splitlines()[-1]) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
    for label, report in zip(labels, reports):
        assert report["status"] == "COMPLETED"
        assert report["actions"] == [[f"for-{label}", label]]  # its own message only
    scripted_llm.assert_no_anomalies(model)


def _acted(runtime, execution_id: str) -> bool:
    current = runtime.attach(execution_id).current_execution_id  # the listener's run (the id is its mailbox)
    tasks = runtime._api.get_workflow(current, include_tasks=True).get("tasks") or []
    return any(t.get("taskType") == "act" and t.get("status") == "COMPLETED" for t in tasks)
