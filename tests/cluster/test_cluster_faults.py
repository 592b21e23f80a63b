"""Faults on the local cluster (two Conductor nodes on one Redis behind HAProxy).

Each test drives a stateful listener through the balancer while a part of the cluster
fails: a node SIGKILLed with a tool in flight and messages queued, Redis restarted, the
whole cluster restarted. The ground truth is the list of actions the tool carried out in
this process: every message acted on exactly once, and ``wait()`` returns.
Also: a message sent through either node's own URL reaches the run.
"""

from __future__ import annotations

import threading
import time
from typing import List

import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings, RunStatus, tool
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, run_tasks_summary
from ..integration.test_stateful_listener import act_on

pytestmark = pytest.mark.reliability


class GatedTools:
    """``act`` records each action; the action named ``hold`` blocks until :meth:`release`."""

    def __init__(self) -> None:
        self.actions: List[str] = []
        self.lock = threading.Lock()
        self.entered_hold = threading.Event()
        self.gate = threading.Event()

    @tool
    def act(self, action: str, tag: str = "") -> dict:
        """Carry out an action requested by an external message."""
        with self.lock:
            self.actions.append(action)
        if action == "hold":
            self.entered_hold.set()
            self.gate.wait(300)  # bounded; the test releases it
        return {"done": action}

    def release(self) -> None:
        self.gate.set()

    def snapshot(self) -> List[str]:
        with self.lock:
            return list(self.actions)


def settings_for(url: str) -> AgentSettings:
    return AgentSettings.from_env(environ={}, server_url=url)


def start_holding_listener(runtime, scripted_llm, unique_name, tools: GatedTools, queued: List[str]):
    """A listener whose tool is in flight on ``hold`` while ``queued`` messages wait in the run's queue."""
    model = scripted_llm.script(policy=listener_policy(act_on))
    handle = runtime.start(listener(unique_name("listener"), model, tools), "Start listening.")
    handle.send_message({"action": "hold"})
    assert tools.entered_hold.wait(120), "the tool never started"
    for action in queued:
        handle.send_message({"action": action})
    return model, handle


def explain_run(handle, tools: GatedTools, base_url: str) -> str:
    """The actions, then the listener's current run and its mailbox (the id the handle holds), as the server has
    them: a timed-out wait's state."""
    current = handle.current_execution_id
    runs = [current] if current == handle.execution_id else [current, handle.execution_id]
    return "\n".join([f"actions: {tools.snapshot()}", *(run_tasks_summary(base_url, run) for run in runs),
                      *waiting_queues(base_url, current)])


def waiting_queues(base_url: str, run_id: str) -> "list[str]":
    """For each task of ``run_id`` still SCHEDULED on a domain: its queue's size as three answers of the balancer
    give it, and who polled that domain when (the server's clock, ms): a task nobody took while its worker
    polled means its queue message was lost (seen once after a node's SIGKILL: a tool SCHEDULED for 180 s)."""
    run = requests.get(f"{base_url}/workflow/{run_id}", params={"includeTasks": "true"}, timeout=10).json()
    lines = []
    for task in run.get("tasks") or ():
        if task.get("status") != "SCHEDULED" or not task.get("domain"):
            continue
        queue = f"{task['domain']}:{task['taskType']}"
        sizes = [requests.get(f"{base_url}/tasks/queue/sizes", params={"taskType": queue}, timeout=10).json().get(queue)
                 for _ in range(3)]
        rows = requests.get(f"{base_url}/tasks/queue/polldata", params={"taskType": task["taskType"]}, timeout=10).json()
        polled = [(r.get("workerId"), r.get("lastPollTime")) for r in rows if r.get("domain") == task["domain"]]
        lines.append(f"  queue {queue} (task {task.get('taskId')}, scheduled {task.get('scheduledTime')}): sizes {sizes}; "
                     f"polled {polled}; now {int(time.time() * 1000)}")
    return lines


def finish(handle, tools: GatedTools, expected: List[str], scripted_llm, model, *, base_url: str = "") -> None:
    eventually(lambda: len(tools.snapshot()) >= len(expected), timeout=180, interval=0.1,
               message=f"{len(expected)} actions",
               explain=lambda: explain_run(handle, tools, base_url) if base_url else f"actions: {tools.snapshot()}")
    handle.stop()
    result = handle.wait(timeout=180)
    assert result.status is RunStatus.COMPLETED, result
    assert sorted(tools.snapshot()) == sorted(expected)  # none lost, none twice
    scripted_llm.assert_no_anomalies(model)


def test_send_message_through_either_node_reaches_the_run(conductor_cluster, scripted_llm, unique_name):
    """The run is served through the balancer; messages go in through each node's own URL."""
    tools = GatedTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    senders = [AgentRuntime(settings_for(url)) for url in conductor_cluster.node_urls]
    try:
        with AgentRuntime(settings_for(conductor_cluster.url)) as runtime:
            handle = runtime.start(listener(unique_name("listener"), model, tools), "Start listening.")
            expected = [f"m{i}" for i in range(10)]
            for i, action in enumerate(expected):
                senders[i % len(senders)].send_message(handle.execution_id, {"action": action})
            finish(handle, tools, expected, scripted_llm, model)
    finally:
        for sender in senders:
            sender.close()


def test_sigkill_of_a_node_with_a_tool_in_flight_loses_and_repeats_nothing(conductor_cluster, scripted_llm,
                                                                          unique_name):
    """Node 1 dies (SIGKILL) while the tool runs and five messages are queued: the run goes on
    through node 2, every message is acted on exactly once, and wait() returns."""
    tools = GatedTools()
    queued = [f"q{i}" for i in range(5)]
    try:
        with AgentRuntime(settings_for(conductor_cluster.url)) as runtime:
            model, handle = start_holding_listener(runtime, scripted_llm, unique_name, tools, queued)
            conductor_cluster.kill_node(0)
            tools.release()
            after = [f"after{i}" for i in range(3)]
            eventually(lambda: len(tools.snapshot()) >= 1 + len(queued), timeout=180, interval=0.1,
                       message="the queued messages acted on after the kill",
                       explain=lambda: explain_run(handle, tools, conductor_cluster.node_urls[1]))
            for action in after:
                handle.send_message({"action": action})
            finish(handle, tools, ["hold", *queued, *after], scripted_llm, model,
                   base_url=conductor_cluster.node_urls[1])
    finally:
        tools.release()
        if not conductor_cluster.nodes[0].is_running:
            conductor_cluster.start_node(0)


def test_messages_pushed_before_a_redis_restart_are_delivered_after_it(conductor_cluster, scripted_llm,
                                                                       unique_name):
    tools = GatedTools()
    queued = [f"q{i}" for i in range(3)]
    try:
        with AgentRuntime(settings_for(conductor_cluster.url)) as runtime:
            model, handle = start_holding_listener(runtime, scripted_llm, unique_name, tools, queued)
            conductor_cluster.restart_redis()
            tools.release()
            finish(handle, tools, ["hold", *queued], scripted_llm, model)
    finally:
        tools.release()


def test_a_listener_resumes_and_continues_after_the_whole_cluster_restarts(conductor_cluster, scripted_llm,
                                                                           unique_name):
    """Redis, both nodes and the balancer restart (same ports) while the tool runs with two messages
    queued: the same runtime keeps serving the run, and a message sent after the restart is acted on."""
    tools = GatedTools()
    queued = ["q0", "q1"]
    try:
        with AgentRuntime(settings_for(conductor_cluster.url)) as runtime:
            model, handle = start_holding_listener(runtime, scripted_llm, unique_name, tools, queued)
            conductor_cluster.restart()
            tools.release()
            eventually(lambda: len(tools.snapshot()) >= 3, timeout=180, interval=0.1,
                       message="the messages queued before the restart acted on")
            handle.send_message({"action": "after"})
            finish(handle, tools, ["hold", *queued, "after"], scripted_llm, model)
    finally:
        tools.release()
