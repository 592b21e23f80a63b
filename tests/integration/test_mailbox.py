"""One id for every sender (issue 30, items 2 and 4): a continued listener's mailbox.

A sender that uses only the server's own REST push (``POST /workflow/{id}/messages``) to the id callers
hold reaches the listener after any number of switches, exactly once; a burst of such pushes during
switches neither loses a message nor keeps a switch from coming to rest; and the id answers everything
after the listener's first run was retired. A tiny budget (a switch every couple of turns).
"""

from __future__ import annotations

import collections
import threading
import time

import attrs
import pytest
import requests

from conductor_agents import AgentRuntime, Continuation, RunStatus
from conductor_agents._common.task_names import FORWARD_TASK, MAILBOX_REST_TASK
from conductor_agents._listener import mailbox, mailbox_checks
from conductor_agents._listener.chain import parse_mailbox_key
from conductor_agents._listener.head import read_mailbox
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import Transport
from conductor_agents.testing import listener_policy

from ..helpers import eventually, listener, listener_links, push_raw
from .test_long_listeners import ActionTools, act_on

pytestmark = pytest.mark.integration


def push(base: str, execution_id: str, action: str) -> None:
    """The server's own push, as a webhook or another SDK would send it (retried on nothing)."""
    response = push_raw(base, execution_id, {"action": action})
    assert response.status_code == 200, (response.status_code, response.text)


@pytest.mark.both_topologies
def test_raw_rest_pushes_to_the_one_id_reach_the_listener_once_across_switches(
        agent_settings, scripted_llm, unique_name, topology_server):
    """Raw pushes to ``handle.execution_id``, each once the previous was acted on, across at least three
    switches, then a burst of twenty pushed at once while switches happen: every message is acted on
    exactly once, the listener comes to rest (one live run), its first run is retired (``keep_runs=1``)
    and the id still answers status, totals, events and pending from a fresh runtime; after the listener
    ended, a push to the id is refused (409), an error the sender sees."""
    base = getattr(topology_server, "url")
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    agent = listener(unique_name("mailbox"), model, tools, batch_size=4,
                     continuation=Continuation(max_turns=2, keep_runs=1))
    sent: "list[str]" = []
    with AgentRuntime(agent_settings) as runtime:
        handle = runtime.start(agent, "Start listening.")
        execution_id = handle.execution_id
        status = requests.get(f"{base}/workflow/{execution_id}", timeout=10).json()
        assert parse_mailbox_key(status.get("correlationId")) is not None  # the id callers hold is the mailbox
        assert handle.current_execution_id != execution_id
        while handle.runs < 4:  # three switches (five until issue 44: each is two model turns, the same proof)
            assert len(sent) < 40, "no switch for many messages"
            sent.append(f"one-{len(sent)}")
            push(base, execution_id, sent[-1])
            eventually(lambda: sent[-1] in tools.snapshot(), timeout=60, interval=0.05, message=f"{sent[-1]} acted on")
        runs_before_burst = handle.runs
        burst = [f"burst-{i}" for i in range(20)]
        for action in burst:
            push(base, execution_id, action)
        sent.extend(burst)
        eventually(lambda: set(sent) <= set(tools.snapshot()), timeout=120, interval=0.1, message="the burst acted on")
        assert handle.runs > runs_before_burst  # it was continued during the burst
        # At rest: one live run, and link 0 retired (the mailbox is the anchor).
        eventually(lambda: [n for n, _ in listener_links(base, execution_id)][0] > 0, timeout=60, interval=0.2,
                   message="link 0 retired")
        eventually(lambda: len(_live(base, execution_id)) == 1, timeout=60, interval=0.2,
                   message="the switch came to rest")

        with AgentRuntime(agent_settings) as other:  # only the id, from a fresh runtime
            watched = other.attach(execution_id)
            status = watched.status()
            assert (status.execution_id, status.is_terminal) == (execution_id, False)
            assert status.runs == handle.runs > runs_before_burst
            assert watched.pending() == ()
            # Once the last switch is committed (its record holds the totals of the runs before it):
            eventually(lambda: watched.totals().runs == handle.runs, timeout=30, interval=0.2,
                       message="the last switch committed")
            assert watched.totals().messages >= len(sent)
            events = watched.events(timeout=120)
            other.send_message(execution_id, {"action": "via-sdk"})  # the SDK's own send, by the same id
            sent.append("via-sdk")
            eventually(lambda: "via-sdk" in tools.snapshot(), timeout=60, message="the SDK's message acted on")
            watched.stop()
            result = watched.wait(timeout=120)
            kinds = collections.Counter()
            with events:
                for event in events:
                    kinds[event.kind] += 1
        assert (result.status, result.execution_id) == (RunStatus.COMPLETED, execution_id)
        assert kinds["done"] == 1
        # The mailbox ended with the listener: a push now is refused, not accepted and dropped.
        eventually(lambda: requests.post(f"{base}/workflow/{execution_id}/messages", json={"action": "late"},
                                         timeout=10).status_code == 409, timeout=30, message="409 after the end")
    counts = collections.Counter(tools.snapshot())
    assert sorted(counts) == sorted(sent) and set(counts.values()) == {1}, counts.most_common(3)
    scripted_llm.assert_no_anomalies(model)


def _mailbox_tasks(base: str, execution_id: str) -> list[dict]:
    return requests.get(f"{base}/workflow/{execution_id}", params={"includeTasks": "true"}, timeout=10).json()["tasks"]


def _rest(base: str, execution_id: str) -> "dict | None":
    """The mailbox's rest in progress, if its round rests (its queue was found empty)."""
    return next((t for t in _mailbox_tasks(base, execution_id)
                 if t["taskType"] == "HUMAN" and t.get("taskDefName") == MAILBOX_REST_TASK
                 and t["status"] == "IN_PROGRESS"), None)


def _resting(base: str, execution_id: str) -> bool:
    return _rest(base, execution_id) is not None


@pytest.mark.both_topologies
def test_a_raw_push_wakes_a_resting_mailbox_and_pushes_during_a_forward_are_taken_next_round(
        agent_settings, scripted_llm, unique_name, topology_server, monkeypatch):
    """A mailbox whose serving process checks it only once an hour: a raw push alone (no signal, no SDK) is acted on,
    since the server's decide after the push ends a rest over a second old; three raw pushes made while the forward
    of that message is held are taken by the round right after it (no rest in between), in order, once each."""
    base = topology_server.url
    held, release = threading.Event(), threading.Event()

    def holding_the_first(step):
        def held_step(*args, **kwargs):
            if not held.is_set():
                held.set()
                release.wait(30)  # bounded: the forward's lease is 60 s
            return step(*args, **kwargs)
        return held_step

    # The forward's step that reaches the listener, for either kind of wait: its push into the run ("pull"), or
    # its completion of the run's wait ("human").
    monkeypatch.setattr(mailbox, "send_to_listener", holding_the_first(mailbox.send_to_listener))
    monkeypatch.setattr(mailbox, "complete_wait", holding_the_first(mailbox.complete_wait))
    # No check at all within the test, the first one included (it comes 1.5-6.5 s after the start, and its round
    # left a young rest that the raw push, 1.5 s after the first rest, could land on: then nothing ends it).
    monkeypatch.setattr(mailbox_checks, "AFTER_ROUND_SECONDS", 3600)
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    settings = attrs.evolve(agent_settings, mailbox_check_seconds=3600)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(listener(unique_name("woken"), model, tools), "Start listening.")
        execution_id = handle.execution_id
        eventually(lambda: _resting(base, execution_id), timeout=30, interval=0.1, message="the mailbox rests")
        time.sleep(1.5)  # bounded: the rest is older than a second
        push(base, execution_id, "raw")
        eventually(held.is_set, timeout=30, interval=0.05, message="the raw push's forward")
        during = ["during-0", "during-1", "during-2"]
        for action in during:
            push(base, execution_id, action)
        release.set()
        eventually(lambda: len(tools.snapshot()) >= 4, timeout=60, interval=0.05, message="all four acted on")
        assert tools.snapshot() == ["raw", *during]
        eventually(lambda: _resting(base, execution_id), timeout=30, interval=0.1, message="the mailbox rests again")
        handle.stop()
        assert handle.wait(timeout=120).status is RunStatus.COMPLETED
    assert tools.snapshot() == ["raw", *during]
    scripted_llm.assert_no_anomalies(model)


def test_a_raw_push_as_the_mailbox_begins_to_rest_is_taken_at_the_serving_processs_check_and_it_stays_small(
        agent_settings, scripted_llm, unique_name, conductor_server):
    """A raw push that lands while the mailbox's rest is younger than a second is not taken by the server's decide
    after it: the serving process's next check (every 2 s here) has the server decide the mailbox again, and the
    message is acted on. Over several rounds the mailbox keeps the tasks of its last two rounds only (at most seven:
    the loop, and pull, switch, rest or forward twice)."""
    base = conductor_server.url
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    with AgentRuntime(attrs.evolve(agent_settings, mailbox_check_seconds=2)) as runtime:
        handle = runtime.start(listener(unique_name("checked"), model, tools), "Start listening.")
        execution_id = handle.execution_id
        eventually(lambda: _resting(base, execution_id), timeout=30, interval=0.1, message="the mailbox rests")
        pushed, young = [], None
        for attempt in range(10):  # a new rest, pushed to at once (a check of the process's may come in between)
            old = _rest(base, execution_id)
            requests.put(f"{base}/workflow/decide/{execution_id}", timeout=10).raise_for_status()
            rest = eventually(lambda o=old: (lambda r: r if r and r["taskId"] != (o or {}).get("taskId") else None)(
                _rest(base, execution_id)), timeout=10, interval=0.02, message="a new rest")
            pushed.append(f"young-{attempt}")
            push(base, execution_id, pushed[-1])
            if (_rest(base, execution_id) or {}).get("taskId") == rest["taskId"]:  # the push's decide left it
                young = pushed[-1]
                break
            eventually(lambda: len(tools.snapshot()) == len(pushed), timeout=30, message="acted on at once")
        assert young is not None, "no push landed on a rest younger than a second in 10 tries"
        eventually(lambda: young in tools.snapshot(), timeout=30, interval=0.1, message="acted on after a check")
        (loop,) = [t for t in _mailbox_tasks(base, execution_id) if t["taskType"] == "DO_WHILE"]
        first = loop["iteration"]
        eventually(lambda: next(t["iteration"] for t in _mailbox_tasks(base, execution_id)
                                if t["taskType"] == "DO_WHILE") >= first + 3, timeout=60, interval=0.5,
                   message="three more rounds (the checks')")
        tasks = _mailbox_tasks(base, execution_id)
        assert len(tasks) <= 7, [(t["referenceTaskName"], t["status"]) for t in tasks]
        assert min(t["iteration"] for t in tasks if t["taskType"] != "DO_WHILE") >= first + 1
        handle.stop()
        assert handle.wait(timeout=120).status is RunStatus.COMPLETED
    assert tools.snapshot() == pushed
    scripted_llm.assert_no_anomalies(model)


def _live(base: str, execution_id: str) -> "list[int]":
    """The links of the listener that are still running."""
    live = []
    for number, run in listener_links(base, execution_id):
        status = requests.get(f"{base}/workflow/{run}/status", timeout=10).json().get("status")
        if status == "RUNNING":
            live.append(number)
    return live


def test_a_cancel_of_the_id_from_outside_the_sdk_cancels_the_listener(agent_settings, scripted_llm, unique_name,
                                                                      topology_server):
    """A client that is not this SDK (or the Conductor UI) cancels the id it was given, the mailbox, with the
    server's own call: the serving process cancels the listener too, naming why; before, the listener ran on
    for good, reachable by no sender holding that id (found by benchmarks/server_share.py, whose leftover
    listeners raised the server's idle CPU run after run)."""
    base = getattr(topology_server, "url")
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    settings = attrs.evolve(agent_settings, liveness_check_interval_seconds=1.0)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(listener(unique_name("cancelled_outside"), model, tools), "Start listening.")
        execution_id, current = handle.execution_id, handle.current_execution_id
        push(base, execution_id, "before")
        eventually(lambda: "before" in tools.snapshot(), timeout=60, message="the first message acted on")
        response = requests.delete(f"{base}/agent/{execution_id}/cancel", params={"reason": "from the ops console"},
                                   timeout=30)
        assert response.status_code == 200, response.text
        status = eventually(lambda: (lambda s: s if s.is_terminal else None)(handle.status()), timeout=60,
                            interval=0.2, message="the listener ended after its mailbox was cancelled")
        assert status.status is RunStatus.TERMINATED
        assert "mailbox" in (status.reason or "") and "from the ops console" in (status.reason or ""), status
        run = requests.get(f"{base}/workflow/{current}", params={"includeTasks": "false"}, timeout=10).json()
        assert run["status"] == "TERMINATED"
        assert _live(base, execution_id) == []
    assert tools.snapshot() == ["before"]
    scripted_llm.assert_no_anomalies(model)


def test_a_mailbox_that_failed_is_retried_and_takes_messages_again_by_the_same_id(
        agent_settings, scripted_llm, unique_name, topology_server, monkeypatch):
    """A task of the mailbox gave up (here its forward, failed for good from outside while it ran): the mailbox
    FAILED while its listener ran on, and every sender holding the id was refused as if the listener had ended. The
    serving process retries the mailbox; the retried forward delivers the message once, and raw pushes to the id
    reach the listener again (issue 44). (The rest cannot fail the mailbox: it is optional.)"""
    base = getattr(topology_server, "url")
    held, release = threading.Event(), threading.Event()

    def failing_the_first(step):  # the forward's step that reaches the listener, for either kind of wait
        def held_step(*args, **kwargs):
            if not held.is_set():
                held.set()
                release.wait(30)  # bounded: the forward's lease is 60 s
                raise RuntimeError("this forward was failed from outside")  # as a worker that died would
            return step(*args, **kwargs)
        return held_step

    monkeypatch.setattr(mailbox, "send_to_listener", failing_the_first(mailbox.send_to_listener))
    monkeypatch.setattr(mailbox, "complete_wait", failing_the_first(mailbox.complete_wait))
    tools = ActionTools()
    model = scripted_llm.script(policy=listener_policy(act_on))
    settings = attrs.evolve(agent_settings, liveness_check_interval_seconds=1.0)
    with AgentRuntime(settings) as runtime:
        handle = runtime.start(listener(unique_name("failed_mailbox"), model, tools), "Start listening.")
        execution_id = handle.execution_id
        eventually(lambda: _resting(base, execution_id), timeout=60, message="the mailbox rests")
        push(base, execution_id, "before")
        eventually(held.is_set, timeout=30, interval=0.05, message="the forward of the first message")
        forward = next(t for t in _mailbox_tasks(base, execution_id)
                       if t["taskType"] == FORWARD_TASK and t["status"] == "IN_PROGRESS")
        response = requests.post(f"{base}/tasks", json={
            "workflowInstanceId": execution_id, "taskId": forward["taskId"], "status": "FAILED_WITH_TERMINAL_ERROR",
            "reasonForIncompletion": "failed by the test"}, timeout=30)
        assert response.status_code == 200, response.text
        release.set()
        eventually(lambda: "before" in tools.snapshot(), timeout=60, interval=0.2,
                   message="the mailbox retried, its forward delivered again")
        eventually(lambda: requests.get(f"{base}/workflow/{execution_id}/status", timeout=10).json()["status"]
                   == "RUNNING" and _resting(base, execution_id), timeout=60, interval=0.5,
                   message="the retried mailbox resting again")
        push(base, execution_id, "after")
        eventually(lambda: "after" in tools.snapshot(), timeout=60, message="a raw push after the retry acted on")
        assert handle.status().status is RunStatus.RUNNING
        handle.stop()
        assert handle.wait(timeout=90).ok
    assert tools.snapshot() == ["before", "after"]


@pytest.mark.both_topologies
def test_two_keyed_starts_opening_a_mailbox_at_once_keep_one(agent_settings, unique_name, monkeypatch):
    """Two starts of one key each open a mailbox; the first has written its own down and read it back before the
    second writes (the interleaving that left both kept, issue 44). The server's create-once record decides: both
    get the same id, the other mailbox is ended, and the id written down is the one kept."""
    run_id = unique_name("keyed").replace("-", "")
    apis = [ConductorApi(Transport(agent_settings.server_url)) for _ in range(2)]
    both_opened = threading.Barrier(2, timeout=60)
    first_done = threading.Event()
    opened: "dict[int, str]" = {}
    created: "list[str]" = []
    real_start = ConductorApi.start_workflow

    def start_then_meet(self, body):  # both have found nothing written and opened one before either goes on
        started = real_start(self, body)
        created.append(started)
        both_opened.wait()
        if self is apis[1]:
            assert first_done.wait(60)
        return started

    monkeypatch.setattr(ConductorApi, "start_workflow", start_then_meet)

    def open_one(index: int) -> None:
        opened[index] = mailbox.Mailboxes(apis[index]).open(run_id, "keyed_listener", human_wait=True, keyed=True)
        if index == 0:
            first_done.set()

    threads = [threading.Thread(target=open_one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert opened[0] == opened[1]
    kept = opened[0]
    statuses = {run: apis[0].get_workflow(run)["status"] for run in created}
    assert len(statuses) == 2 and statuses[kept] == "RUNNING", statuses
    assert sorted(statuses.values()) == ["RUNNING", "TERMINATED"], statuses
    assert read_mailbox(apis[0], run_id) == kept
    apis[0].terminate_workflow(kept, "the test is over")
