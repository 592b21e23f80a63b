"""Faults on the local cluster (two Conductor nodes on one Redis behind HAProxy).

Each test drives a stateful listener through the balancer while a part of the cluster
fails: a node SIGKILLed with a tool in flight and messages queued, Redis restarted, the
whole cluster restarted. The ground truth is the list of actions the tool carried out in
this process: every message acted on exactly once, and ``wait()`` returns.
Also: a message sent through either node's own URL reaches the run.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import List

import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings, RunStatus, tool
from conductor_agents._wire.api import ConductorApi
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


def explain_run(handle, tools: GatedTools, base_url: str, cluster=None) -> str:
    """The actions, then the listener's current run and its mailbox (the id the handle holds), as the server has
    them: a timed-out wait's state; with ``cluster``, what each running node's system-task threads do."""
    current = handle.current_execution_id
    runs = [current] if current == handle.execution_id else [current, handle.execution_id]
    return "\n".join([f"actions: {tools.snapshot()}", *(run_tasks_summary(base_url, run) for run in runs),
                      *waiting_queues(base_url, current), *(node_threads(cluster) if cluster is not None else ())])


#: The frames a system-task thread waits in when it has nothing to do (a poller's pop or sleep, a sweeper's sleep).
_IDLE_FRAMES = ("QueueMonitor.pop(", "sleepUninterruptibly", "sleepWhenIdle")


def node_threads(cluster) -> "list[str]":
    """For each running node: its threads dumped (``jcmd Thread.print``, the JDK the node runs on) into a file
    beside its log, and the system-task threads that are not idle (name, state, top frames). Written after a
    JOIN stayed unevaluated on the surviving node although it was made due (CI stop 52)."""
    lines = []
    for index, node in enumerate(cluster.nodes):
        pid, log = node.pid, node.log_path
        if pid is None or log is None:
            continue
        try:
            jcmd = Path(os.readlink(f"/proc/{pid}/exe")).with_name("jcmd")
            dump = subprocess.run([str(jcmd), str(pid), "Thread.print"], capture_output=True, text=True,
                                  timeout=30, check=False).stdout
        except (OSError, subprocess.SubprocessError) as err:
            lines.append(f"  node {index}: no thread dump ({err!r})")
            continue
        path = log.with_name(f"threads-{int(time.time())}.txt")
        path.write_text(dump)
        lines.append(f"  node {index} threads (all in {path}):")
        for block in dump.split("\n\n"):
            rows = [row.strip() for row in block.strip().splitlines()]
            if not rows or not any(word in rows[0] for word in ("system-task", "queue-monitor", "sweeper")):
                continue
            state = next((row.split(":", 1)[1].strip() for row in rows if row.startswith("java.lang.Thread.State")),
                         "?")
            ours = [row[3:] for row in rows[1:8]
                    if row.startswith("at ") and not row.startswith(("at java.", "at jdk."))]
            idle = not ours or any(mark in ours[0] for mark in _IDLE_FRAMES)
            if not idle or "JOIN" in rows[0]:
                lines.append(f"    {rows[0].split(' #')[0]} {state}: {' < '.join(ours[:3]) or '(idle)'}")
    return lines


def waiting_queues(base_url: str, run_id: str) -> "list[str]":
    """For each task of ``run_id`` still SCHEDULED or IN_PROGRESS: its queue's size as three answers of the
    balancer give it and, for a worker's task, who polled its domain when (the server's clock, ms); then the
    decider queue's size. A task nobody took while its worker polled means its queue message was lost (seen
    after a node's SIGKILL: a tool SCHEDULED for 180 s)."""
    run = requests.get(f"{base_url}/workflow/{run_id}", params={"includeTasks": "true"}, timeout=10).json()
    lines = []

    def sizes(queue: str) -> list:
        return [requests.get(f"{base_url}/tasks/queue/sizes", params={"taskType": queue}, timeout=10).json().get(queue)
                for _ in range(3)]

    for task in run.get("tasks") or ():
        if task.get("status") not in ("SCHEDULED", "IN_PROGRESS"):
            continue
        domain = task.get("domain")
        queue = f"{domain}:{task['taskType']}" if domain else task["taskType"]
        polled = ""
        if domain:
            rows = requests.get(f"{base_url}/tasks/queue/polldata", params={"taskType": task["taskType"]},
                                timeout=10).json()
            pollers = [(r.get("workerId"), r.get("lastPollTime")) for r in rows if r.get("domain") == domain]
            polled = f"; polled {pollers}"
        lines.append(f"  queue {queue} (task {task.get('taskId')} {task.get('status')}, scheduled "
                     f"{task.get('scheduledTime')}): sizes {sizes(queue)}{polled}")
    lines.append(f"  decider queue: sizes {sizes('_deciderQueue')}; now {int(time.time() * 1000)}")
    return lines


def finish(handle, tools: GatedTools, expected: List[str], scripted_llm, model, *, base_url: str) -> None:
    eventually(lambda: len(tools.snapshot()) >= len(expected), timeout=180, interval=0.1,
               message=f"{len(expected)} actions", explain=lambda: explain_run(handle, tools, base_url))
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
            finish(handle, tools, expected, scripted_llm, model, base_url=conductor_cluster.url)
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
                       explain=lambda: explain_run(handle, tools, conductor_cluster.node_urls[1], conductor_cluster))
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
            finish(handle, tools, ["hold", *queued], scripted_llm, model, base_url=conductor_cluster.url)
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
                       message="the messages queued before the restart acted on",
                       explain=lambda: explain_run(handle, tools, conductor_cluster.url))
            handle.send_message({"action": "after"})
            finish(handle, tools, ["hold", *queued, "after"], scripted_llm, model, base_url=conductor_cluster.url)
    finally:
        tools.release()


def redis_command(port: int, *args: str) -> bytes:
    """One command to the cluster's Redis (RESP over a socket); the raw reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(resp(*args))
        return sock.recv(65536)


def resp(*args: str) -> bytes:
    """A Redis command in RESP."""
    return (f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)).encode()


def bulk_strings(reply: bytes) -> "list[str]":
    """The strings of a small RESP array reply (``KEYS``, ``ZRANGE``)."""
    return [line for line in reply.decode().split("\r\n") if line and not line.startswith(("*", "$"))]


class LeaseAway:
    """A thread that leases queue messages an hour ahead (``ZADD XX``), as fast as one connection goes, until
    :meth:`stop`: those of ``member`` in the queue ``key`` or, without one, every message of every queue whose
    key matches ``key`` (a glob, looked up each round: the queue may not exist yet). ``leased``: what it did."""

    def __init__(self, port: int, key: str, member: "str | None" = None) -> None:
        self.port, self.key, self.member = port, key, member
        self.leased: "set[str]" = set()
        self._on = threading.Event()
        self._on.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _targets(self) -> "list[tuple[str, str]]":
        if self.member is not None:
            return [(self.key, self.member)]
        return [(key, member) for key in bulk_strings(redis_command(self.port, "KEYS", self.key))
                for member in bulk_strings(redis_command(self.port, "ZRANGE", key, "0", "-1"))]

    def _run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            while self._on.is_set():
                for key, member in self._targets():
                    sock.sendall(resp("ZADD", key, "XX", str(int(time.time() * 1000) + 3_600_000), member))
                    sock.recv(64)
                    self.leased.add(member)

    def stop(self) -> None:
        self._on.clear()
        self._thread.join(5)


def test_a_join_whose_queue_message_was_leased_away_is_evaluated_again(conductor_cluster, scripted_llm,
                                                                         unique_name, monkeypatch, caplog):
    """The state a Redis restart can leave (the answer to a node's lease write lost, the JOIN's message leased
    for an hour, its evaluation skipped) made on purpose: while the tool runs, the JOIN's message is leased
    an hour ahead again and again until its evaluations stop; the SDK finds the JOIN after the tool's result
    and has the server evaluate it: the queued messages are acted on, with the warning."""
    monkeypatch.setattr("conductor_agents._liveness.nudges.JOIN_CHECK_SECONDS", 3.0)
    caplog.set_level(logging.WARNING, logger="conductor_agents.liveness")
    port = conductor_cluster.redis.port
    tools = GatedTools()
    queued = ["q0", "q1"]
    settings = AgentSettings.from_env(environ={}, server_url=conductor_cluster.url, liveness_check_interval_seconds=1.0)
    leaser = None
    try:
        with AgentRuntime(settings) as runtime:
            model, handle = start_holding_listener(runtime, scripted_llm, unique_name, tools, queued)
            run = handle.current_execution_id

            def waiting() -> "list[dict]":
                return requests.get(f"{conductor_cluster.url}/workflow/{run}/tasks",
                                    params={"status": "IN_PROGRESS", "count": 50}, timeout=10).json()["results"]

            join = eventually(lambda: next((t for t in waiting() if t["taskType"] == "JOIN"), None), timeout=30,
                              message="the hold's JOIN")
            queue = next(k for k in bulk_strings(redis_command(port, "KEYS", "*QUEUE.JOIN*"))
                         if k.endswith("QUEUE.JOIN.c"))
            leaser = LeaseAway(port, queue, join["taskId"])  # a node's evaluation rarely slips in
            polls = [-1]

            def quiet() -> bool:  # the hold's result taken, and the JOIN evaluated no more
                tasks = waiting()
                now = next((t["pollCount"] for t in tasks if t["taskId"] == join["taskId"]), None)
                still = now is not None and now == polls[-1] and not any(t["taskType"] == "act" for t in tasks)
                polls.append(now)
                return still

            time.sleep(1.0)  # the evaluations under way end; no new one starts
            tools.release()
            eventually(quiet, timeout=30, interval=1.5, message="the JOIN left unevaluated",
                       explain=lambda: f"poll counts {polls}; " + explain_run(handle, tools, conductor_cluster.url))
            leaser.stop()
            score = float(bulk_strings(redis_command(port, "ZSCORE", queue, join["taskId"]))[0])
            assert score > time.time() * 1000 + 3_000_000, "the JOIN's message was not leased away"
            finish(handle, tools, ["hold", *queued], scripted_llm, model, base_url=conductor_cluster.url)
        assert any("unevaluated though its branches ended" in r.getMessage() for r in caplog.records)
    finally:
        if leaser is not None:
            leaser.stop()
        tools.release()


def test_a_tool_task_whose_queue_message_was_leased_away_is_handed_out_again(conductor_cluster, scripted_llm,
                                                                            unique_name, monkeypatch, caplog):
    """The state a node's SIGKILL can leave (a tool's task popped by the dying node: SCHEDULED, never polled,
    its message leased for an hour) made on purpose: every message of the run's ``act`` queue is leased an
    hour ahead until the task for ``q0`` waits so; the SDK, polling that domain in vain, makes it due again
    and acts on it, with the warning. After its first poll of ``act`` (the one start() confirms, before any task),
    this process's poller answers nothing for ``act`` until the lease is made: a poll between the task's queueing
    and the lease took it (CI stop 51)."""
    monkeypatch.setattr("conductor_agents._liveness.nudges.UNPOLLED_SECONDS", 3.0)
    lease_made = threading.Event()
    first_polls: "list[str]" = []
    real_poll = ConductorApi.poll_tasks

    def poll_after_the_lease(api: ConductorApi, task_type: str, **kwargs: object) -> "list[dict]":
        if task_type == "act" and first_polls and not lease_made.is_set():
            lease_made.wait(0.5)
            return []
        if task_type == "act":
            first_polls.append(task_type)
        return real_poll(api, task_type, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ConductorApi, "poll_tasks", poll_after_the_lease)
    caplog.set_level(logging.WARNING, logger="conductor_agents.liveness")
    port = conductor_cluster.redis.port
    tools = GatedTools()
    settings = AgentSettings.from_env(environ={}, server_url=conductor_cluster.url, liveness_check_interval_seconds=1.0)
    model = scripted_llm.script(policy=listener_policy(act_on))
    leaser = None
    try:
        with AgentRuntime(settings) as runtime:
            handle = runtime.start(listener(unique_name("listener"), model, tools), "Start listening.")
            leaser = LeaseAway(port, f"*QUEUE.{handle.run_id}:act*")  # every act task, as soon as it is queued
            handle.send_message({"action": "q0"})
            eventually(lambda: leaser.leased, timeout=60, message="the act task leased away")
            lease_made.set()
            time.sleep(1.0)
            leaser.stop()
            assert tools.snapshot() == [], "the poller took the task before it was leased away"
            handle.send_message({"action": "q1"})
            finish(handle, tools, ["q0", "q1"], scripted_llm, model, base_url=conductor_cluster.url)
        assert any("never handed out" in r.getMessage() for r in caplog.records)
    finally:
        if leaser is not None:
            leaser.stop()
        tools.release()
