"""A listener that waits on a ``HUMAN`` task (``listener_wait="human"``, issue 42: ``docs/idle-listeners.md``).

Its wait is a ``HUMAN`` task the server never evaluates; only its mailbox's forward, in the serving process,
completes it. Every sender (this SDK by the listener's id, another runtime, the server's own REST push to the id)
reaches it once and in order, across switches; the join around the wait is parked while it waits; a person's
question on the same listener is still a request to a person, and the wait never is.
"""

from __future__ import annotations

import collections
import logging
import time

import attrs
import pytest
import requests

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents._common.task_names import MESSAGE_WAIT_MARK
from conductor_agents._listener.chain import is_human_wait_key
from conductor_agents._listener.parking import PARK_SECONDS
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener
from .test_long_listeners import ActionTools, act_on
from .test_mailbox import _live, push

pytestmark = pytest.mark.integration


def _waiting(base: str, run: str) -> tuple[dict | None, dict | None]:
    """The run's HUMAN wait in progress and the JOIN around it."""
    tasks = requests.get(f"{base}/workflow/{run}/tasks", params={"status": "IN_PROGRESS", "count": 50},
                         timeout=10).json()["results"]
    waits = [t for t in tasks if t["taskType"] == "HUMAN"]
    joins = [t for t in tasks if t["taskType"] == "JOIN"]
    return (waits[0] if waits else None), (joins[-1] if joins else None)


def _held(base: str, task_id: str) -> bool:
    """Whether a join is parked and not evaluated for 2 s (not known, so False, when a read is refused: the cluster's
    balancer answers 502 now and then on a loaded machine)."""
    before = requests.get(f"{base}/tasks/{task_id}", timeout=10)
    time.sleep(2)
    after = requests.get(f"{base}/tasks/{task_id}", timeout=10)
    if before.status_code != 200 or after.status_code != 200:
        return False
    now = after.json()
    return now["callbackAfterSeconds"] == PARK_SECONDS and now["pollCount"] == before.json()["pollCount"]


def _tasks(base: str, run: str) -> str:
    tasks = requests.get(f"{base}/workflow/{run}/tasks", params={"count": 100}, timeout=10).json()["results"]
    return f"{run}: " + ", ".join(f"{t['taskType']}/{t['referenceTaskName']}:{t['status']}:{t.get('domain')}"
                                  for t in tasks)


@pytest.mark.both_topologies
def test_a_listener_waiting_on_a_human_task_takes_every_sender_once_in_order_across_switches(
        agent_settings, scripted_llm, unique_name, topology_server, caplog):
    """SDK sends and raw REST pushes to the listener's id, one after the other across at least two switches, then
    a burst of both at once: each acted on exactly once, each sender's in order; while it waits, its wait is a
    marked HUMAN task that is no request to a person, and its join is parked (not evaluated); stop ends it."""
    caplog.set_level(logging.DEBUG, logger="conductor_agents.continuation")  # a failure shows each park's story
    base = topology_server.url
    settings = attrs.evolve(agent_settings, listener_wait="human")
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    # One message per wait: the model acts on a batch's messages with parallel tool calls, whose order is not kept
    # (handing batches in order is a unit test's); one at a time, each sender's order is the order acted on.
    agent = listener(unique_name("human_wait"), model, tools, batch_size=1,
                     continuation=Continuation(max_turns=2))
    sent: list[str] = []
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        execution_id = handle.execution_id
        mailbox = requests.get(f"{base}/workflow/{execution_id}", timeout=10).json()
        assert is_human_wait_key(mailbox.get("correlationId")), mailbox.get("correlationId")
        wait, join = eventually(lambda: (lambda w: w if w[0] and w[1] else None)(
            _waiting(base, handle.current_execution_id)), timeout=60, interval=0.2, message="the first wait")
        assert wait["inputData"]["_description"].endswith(MESSAGE_WAIT_MARK)
        assert handle.pending() == ()  # a wait for messages is no request to a person
        # The join ends up parked: its callback is the park's, and the server no longer evaluates it (a young join's
        # first parks may not hold: the serving process reads it back and parks it again; on a machine at load 25 no
        # park held within a minute).
        eventually(lambda: _held(base, join["taskId"]), timeout=120, interval=0.1, message="the join parked for good",
                   explain=lambda: str({k: v for k, v in requests.get(f"{base}/tasks/{join['taskId']}", timeout=10)
                                        .json().items() if k in ("status", "callbackAfterSeconds", "pollCount",
                                                                 "updateTime", "workerId")}))
        while handle.runs < 3:
            assert len(sent) < 40, "no switch for many messages"
            sent.append(f"m-{len(sent)}")
            if len(sent) % 2:
                push(base, execution_id, sent[-1])
            else:
                handle.send_message({"action": sent[-1]})
            eventually(lambda: sent[-1] in tools.snapshot(), timeout=60, interval=0.05, message=f"{sent[-1]} acted on",
                       explain=lambda: _tasks(base, execution_id) + "\n" + _tasks(base, handle.current_execution_id))
        raw = [f"raw-{i}" for i in range(3)]
        sdk = [f"sdk-{i}" for i in range(3)]
        for a, b in zip(raw, sdk, strict=True):
            push(base, execution_id, a)
            handle.send_message({"action": b})
        sent.extend(raw + sdk)
        eventually(lambda: set(sent) <= set(tools.snapshot()), timeout=120, interval=0.1, message="the burst acted on")
        eventually(lambda: len(_live(base, execution_id)) == 1, timeout=60, interval=0.2,
                   message="the switch came to rest")
        handle.stop()
        result = handle.wait(timeout=120)
    assert result.status is RunStatus.COMPLETED
    acted = tools.snapshot()
    counts = collections.Counter(acted)
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts.most_common(3)
    for sender in (raw, sdk):
        assert [a for a in acted if a in sender] == sender
    scripted_llm.assert_no_anomalies(model)
