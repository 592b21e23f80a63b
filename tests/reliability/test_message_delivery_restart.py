"""Messages queued while the server restarts: lost on SQLite (and reported), delivered on Redis.

A listener is busy in a held tool while two messages are sent (both accepted, each with an id);
then the server restarts on the same data directory and the tool is released. On a SQLite
server the message queue is in the server's memory: a listener that waits with the server's wait
for messages (``listener_wait="pull"``) never sees the two messages, and ``wait_delivered`` must
say so (``MessageLostError``, reason ``NOT_IN_QUEUE``) instead of waiting for ever. A listener that
waits on a ``HUMAN`` task (``"human"``) gets every message through its mailbox, whose
pull moves what it takes out of the queue into its forward task, which the server keeps in its
store: two messages the mailbox took before the restart are delivered after it, once each, in
order. On a Redis-backed server (``LocalServer(backend="redis")``, its own redis-server with an
append-only file, kept across the restart) the same two messages are delivered, whatever the
listener waits in. Either way the run goes on: a message sent afterwards is delivered and acted on.

Each backend's server is restarted once, not the session's (that would disturb every other test); the restart
tests share them (``restartable_servers`` in tests/conftest.py). On SQLite both kinds of listener meet the same
restart, and on Redis a plain run completed before it is read back after it (what LocalServer(backend="redis")
promises).
"""

from __future__ import annotations

import time

import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings, MessageLostError, RunStatus
from conductor_agents._common.task_names import FORWARD_TASK
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..integration.test_local_server import COLD_SERVER_TIMEOUT, WORKFLOW, process_exists
from ..integration.test_message_delivery import HeldTools, act_on
from .support import quiescent, run_summary, server_get, waits_on_human_task
from .test_server_restart import quick_join_check

pytestmark = pytest.mark.reliability


_TERMINAL = {"COMPLETED", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "CANCELED", "TIMED_OUT", "SKIPPED"}


def forward_holds(base: str, mailbox_id: str, message_ids: list[str]) -> bool:
    """Whether a forward of the listener's mailbox not yet done holds every one of ``message_ids`` (its pull took
    them out of the server's queue: they are in the mailbox's task, in the server's store)."""
    tasks = server_get(base, f"/workflow/{mailbox_id}", includeTasks="true").get("tasks") or ()
    return any(t.get("taskType") == FORWARD_TASK and t.get("status") not in _TERMINAL
               and set(message_ids) <= {str(m.get("id")) for m in (t.get("inputData") or {}).get("messages") or ()}
               for t in tasks)


def queue_two(base: str, handle) -> list[str]:
    """Two messages pushed to the listener's mailbox as a sender that is not this SDK does it (two pushes, then one
    signal), so that one pull of the mailbox takes both; their ids."""
    ids = []
    for n in (1, 2):
        response = requests.post(f"{base}/workflow/{handle.execution_id}/messages", json={"action": f"queued-{n}"},
                                 timeout=30)
        assert response.status_code == 200, response.text
        ids.append(response.text.strip().strip('"'))
    requests.post(f"{base}/tasks/{handle.execution_id}/COMPLETED/signal", json={}, timeout=30)
    return ids


class Case:
    """One listener of the restart: started, its tool held, two messages queued; after the restart, what became of
    them and of the run. ``wait``: what the listener waits in (None: the default)."""

    def __init__(self, server, scripted_llm, unique_name, backend: str, wait: "str | None") -> None:
        self.base, self.backend = server.url, backend
        self.tools = HeldTools()
        self.model = scripted_llm.script(policy=listener_policy(act_on))
        # A fresh server compiles its first agent slowly on a loaded machine (read timeouts of 30 s and
        # of 120 s were seen on POST /agent/start).
        self.settings = AgentSettings.from_env(environ={}, server_url=self.base, http_timeout_seconds=300,
                                               **({"listener_wait": wait} if wait else {}))
        self.runtime = AgentRuntime(self.settings)
        self.handle = self.runtime.start(listener(unique_name(f"restart-{backend}-{wait or 'default'}"), self.model,
                                                  self.tools), "Start listening.")
        self.handle.send_message({"action": "hold"})
        self.queued: "list[str]" = []
        self.durable = False

    def queue_two(self) -> None:
        """Once the tool holds: two messages sent, each as what the listener waits in decides it matters."""
        base, handle = self.base, self.handle
        assert self.tools.holding.wait(240), "the held tool never started"  # three LLM turns on a fresh server
        human = waits_on_human_task(base, handle.execution_id)
        assert human is (self.settings.listener_wait == "human")
        # What the listener waits in decides what a SQLite server's restart does to messages sent now.
        self.durable = self.backend == "redis" or human
        if self.backend == "sqlite" and human:
            self.queued = queue_two(base, handle)
            eventually(lambda: forward_holds(base, handle.execution_id, self.queued), timeout=60, interval=0.1,
                       message="both messages taken by the mailbox, its forward waiting for the busy listener")
        else:
            self.queued = [handle.send_message({"action": f"queued-{n}"}) for n in (1, 2)]
        assert all(self.queued)

    def check(self) -> None:
        """After the restart: the queued messages delivered (or reported lost), then the run goes on."""
        base, handle, tools = self.base, self.handle, self.tools
        # The run comes back to waiting for messages (the join after the tool, leased by the old process, is
        # evaluated again once the SDK looks at the run's joins: ``quick_join_check``).
        if self.durable:
            deliveries = [handle.wait_delivered(message_id, timeout=240) for message_id in self.queued]
            assert [d.message_id for d in deliveries] == self.queued
            eventually(lambda: tools.actions == ["hold", "queued-1", "queued-2"], timeout=60,
                       message="the queued messages acted on")
        else:
            for message_id in self.queued:
                with pytest.raises(MessageLostError) as info:
                    handle.wait_delivered(message_id, timeout=240)
                err = info.value
                assert (err.reason, err.message_id, err.execution_id) == (
                    MessageLostError.NOT_IN_QUEUE, message_id, handle.execution_id), run_summary(base, handle.execution_id)
                assert "restart" in str(err)
            assert tools.actions == ["hold"]

        # The run goes on: a message sent now is delivered and acted on here.
        eventually(lambda: quiescent(base, handle.execution_id), timeout=150, interval=0.2, message="waiting again")
        after = handle.send_message({"action": "after"})
        assert handle.wait_delivered(after, timeout=60).message_id == after
        eventually(lambda: tools.actions[-1:] == ["after"], timeout=60, message="the action after the restart")
        handle.stop()
        assert handle.wait(timeout=60).status is RunStatus.COMPLETED


def restart(server, cases: "list[Case]") -> None:
    """The server restarted (same data dir and port) while every case's tool holds; then the tools are let go."""
    restarted_at = time.monotonic()
    server.restart()
    print(f"\n{cases[0].backend} server restarted in {time.monotonic() - restarted_at:.1f}s")
    for case in cases:
        case.tools.gate.set()


def test_messages_queued_across_a_sqlite_restart(restartable_servers, scripted_llm, unique_name, monkeypatch):
    """On SQLite, one restart for both kinds of listener (each JVM start costs 15-25 s here): the one that waits with
    ``pull`` loses the two messages, and says so; the one that waits on a ``HUMAN`` task gets both, from its
    mailbox's forward."""
    server = restartable_servers.get("sqlite")
    quick_join_check(monkeypatch)
    before = sdk_threads()
    cases = []
    try:
        cases = [Case(server, scripted_llm, unique_name, "sqlite", wait) for wait in ("pull", "human")]
        for case in cases:
            case.queue_two()
        restart(server, cases)
        for case in cases:
            case.check()
    finally:
        for case in cases:
            case.tools.gate.set()
            case.runtime.close()
    assert [c.durable for c in cases] == [False, True]
    assert sdk_threads() == before


def test_messages_queued_across_a_redis_restart(restartable_servers, scripted_llm, unique_name, monkeypatch):
    """backend="redis": the server runs on a redis-server of its own (append-only file in the data dir); restart()
    restarts both. The two messages are delivered, and a run that completed before the restart is still there.
    (That stop() leaves neither process is checked with the stand-in java and a real redis-server in
    TestLifecycleWithFakeJava.)"""
    server = restartable_servers.get("redis")
    quick_join_check(monkeypatch)
    assert server.redis is not None and server.redis.pid is not None
    assert "-Dconductor.db.type=redis_standalone" in server.log_path.read_text()
    completed = completed_workflow(server.url)
    before = sdk_threads()
    case = None
    try:
        case = Case(server, scripted_llm, unique_name, "redis", None)
        case.queue_two()
        redis_pid, java_pid = server.redis.pid, server.pid
        restart(server, [case])
        assert server.redis.pid not in (None, redis_pid) and not process_exists(redis_pid)
        assert not process_exists(java_pid)
        run = requests.get(f"{server.url}/workflow/{completed}", timeout=COLD_SERVER_TIMEOUT).json()
        assert run["status"] == "COMPLETED" and run["output"] == {"answer": 42}
        assert server.data_dir is not None and (server.data_dir / "redis" / "appendonlydir").is_dir()
        case.check()
    finally:
        if case is not None:
            case.tools.gate.set()
            case.runtime.close()
    assert sdk_threads() == before


def completed_workflow(base: str) -> str:
    """The id of a plain workflow (one INLINE task) run to its end on the server at ``base``."""
    response = requests.post(f"{base}/metadata/workflow", json=WORKFLOW, timeout=COLD_SERVER_TIMEOUT)
    assert response.status_code in (200, 204), response.text
    workflow_id = requests.post(f"{base}/workflow/{WORKFLOW['name']}", json={}, timeout=COLD_SERVER_TIMEOUT).text

    def status() -> str:
        run = requests.get(f"{base}/workflow/{workflow_id}", timeout=COLD_SERVER_TIMEOUT).json()
        return run["status"] if run["status"] != "RUNNING" else ""

    assert eventually(status, timeout=60, interval=0.2, message="workflow done") == "COMPLETED"
    return workflow_id
