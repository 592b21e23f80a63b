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

Each case restarts a server of its own backend, not the session's (that would disturb every other
test); the restart tests share them (``restartable_servers`` in tests/conftest.py).
"""

from __future__ import annotations

import time

import pytest
import requests

from conductor_agents import AgentRuntime, AgentSettings, MessageLostError, RunStatus
from conductor_agents._common.task_names import FORWARD_TASK
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, sdk_threads
from ..integration.test_message_delivery import HeldTools, act_on
from .support import quiescent, run_summary, server_get, waits_on_human_task

pytestmark = pytest.mark.reliability


@pytest.fixture(params=[("sqlite", "pull"), ("sqlite", "human"), ("redis", None)],
                ids=["sqlite-pull", "sqlite-human", "redis"])
def restarting_server(request, restartable_servers):
    """``(backend, what listeners wait in (None: the default), the server)``. SQLite loses its queue in a restart,
    so what the listener waits in decides what happens to the messages: each kind has its case; on Redis nothing is
    lost either way.

    SQLite is the default backend. The servers are shared with the other restart tests (each JVM start costs
    20-50 s here); their budgets are generous: six servers share two cores on the machine these tests run on
    (start-ups of 390 s and the server's own 4 s limit on its agent-loop scripts were both seen to run out)."""
    backend, wait = request.param
    return backend, wait, restartable_servers.get(backend)


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


def test_messages_queued_across_a_restart(restarting_server, scripted_llm, unique_name):
    backend, wait, server = restarting_server
    base = server.url
    tools = HeldTools()
    before = sdk_threads()
    model = scripted_llm.script(policy=listener_policy(act_on))
    # A fresh server compiles its first agent slowly on a loaded machine (read timeouts of 30 s and
    # of 120 s were seen on POST /agent/start).
    settings = AgentSettings.from_env(environ={}, server_url=base, http_timeout_seconds=300,
                                      **({"listener_wait": wait} if wait else {}))
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(listener(unique_name(f"restart-{backend}"), model, tools), "Start listening.")
        handle.send_message({"action": "hold"})
        assert tools.holding.wait(240), "the held tool never started"  # three LLM turns on a fresh server
        human = waits_on_human_task(base, handle.execution_id)
        assert human is (settings.listener_wait == "human")
        # What the listener waits in decides what a SQLite server's restart does to messages sent now.
        durable = backend == "redis" or human
        if backend == "sqlite" and human:
            queued = queue_two(base, handle)
            eventually(lambda: forward_holds(base, handle.execution_id, queued), timeout=60, interval=0.1,
                       message="both messages taken by the mailbox, its forward waiting for the busy listener")
        else:
            queued = [handle.send_message({"action": f"queued-{n}"}) for n in (1, 2)]
        assert all(queued)

        restarted_at = time.monotonic()
        server.restart()  # same data dir and port
        print(f"\n{backend} server restarted in {time.monotonic() - restarted_at:.1f}s")
        tools.gate.set()

        # The run comes back to waiting for messages (the server re-evaluates the join after the
        # tool only when the old process's system-task lease times out: 30-60 s seen).
        if durable:
            deliveries = [handle.wait_delivered(message_id, timeout=240) for message_id in queued]
            assert [d.message_id for d in deliveries] == queued
            eventually(lambda: tools.actions == ["hold", "queued-1", "queued-2"], timeout=60,
                       message="the queued messages acted on")
        else:
            for message_id in queued:
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
        result = handle.wait(timeout=60)
    assert result.status is RunStatus.COMPLETED
    assert sdk_threads() == before

