"""Unit tests for a stop that finishes what the listener accepted and returns at once (issue 41): the caller's
steps (:mod:`conductor_agents._listener.stopping`), the serving process's flag before the model turn that reads
the stop, and the forward of a HUMAN wait that hands a batch beginning with the stop over
(:mod:`conductor_agents._listener.handover`)."""

from __future__ import annotations

from typing import Any

import pytest

from conductor_agents import MessageLostError
from conductor_agents._listener.delivery import DeliveryCheck
from conductor_agents._listener.directory import Chain, Link
from conductor_agents._listener.handover import complete_wait
from conductor_agents._listener.stop_flag import behind_stop, holds_stop, post_stop_flag, stop_heads, stop_in_digest
from conductor_agents._listener.stopping import resting, stop_if_read, stop_listener_in_order, turn_reads_messages
from conductor_agents._wire.api import TaskPage
from conductor_agents._wire.transport import HttpError
from conductor_agents.errors import ExecutionNotRunningError, RunPausedError

STOP = {"_signal": "stop"}
CHAIN = Chain("mailbox-1", run_id="r" * 32, agent_name="agent", mailbox=True)


def envelope(message_id: str, payload: Any) -> dict[str, Any]:
    return {"id": message_id, "payload": payload}


def task(kind: str, status: str = "IN_PROGRESS", **extra: Any) -> dict[str, Any]:
    return {"taskType": kind, "status": status, **extra}


HUMAN_WAIT = task("HUMAN", inputData={"_description": "Wait. (conductor-agents: waits for messages)"})


class FakeServer:
    """The reads and writes a stop makes of one run, scripted by the test; ``calls`` records them in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.status = "RUNNING"
        self.in_flight: list[dict[str, Any]] = [task("DO_WHILE"), task("JOIN"), task("PULL_WORKFLOW_MESSAGES")]
        self.digest: list[dict[str, Any]] = []  # the run's _last_tool_results
        self.flag = False
        self.undo_flags = 0  # posts of the flag a write of the server's undoes

    def workflow_status(self, execution_id: str, *, include_variables: bool = False) -> dict[str, Any]:
        self.calls.append("status")
        return {"status": self.status, "variables": {"_last_tool_results": self.digest, "_stop_requested": self.flag}}

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 15,
                       statuses: tuple[str, ...] = ()) -> TaskPage:
        self.calls.append("tasks")
        return TaskPage(total=len(self.in_flight), tasks=self.in_flight[start:start + count])

    def stop_agent(self, execution_id: str) -> None:
        self.calls.append("flag")
        if self.status != "RUNNING":
            raise HttpError("not running", status=409, server_message="", method="POST", path="/agent/x/stop")
        if self.undo_flags:
            self.undo_flags -= 1
        else:
            self.flag = True

    def update_task(self, result: dict[str, Any]) -> None:
        self.calls.append("complete")


class FakeDirectory:
    """The listener's newest run, and the messages this process sent it."""

    def __init__(self, *, human_wait: bool = False, sent: tuple[str, ...] = ()) -> None:
        self.box = Chain(CHAIN.execution_id, run_id=CHAIN.run_id, agent_name="agent", mailbox=True,
                         human_wait=human_wait)
        self.newest = self.box.link(3)
        self.sent = list(sent)

    def anchor(self, chain: Chain, *, cached: bool = False) -> Chain:
        return self.box

    def refresh(self, chain: Chain) -> Link:
        return self.newest

    def accepted_at(self, link: Link) -> list[str]:
        return self.sent if link == self.newest else []


def stop(server: FakeServer, directory: FakeDirectory, *, refuse: Exception | None = None) -> list[str]:
    told: list[str] = []

    def send_stop() -> str:
        server.calls.append("send")
        if refuse is not None:
            raise refuse
        return "stop-id"

    stop_listener_in_order(server, directory, directory.box, send_stop=send_stop,  # type: ignore[arg-type]
                           on_stop=told.append)
    return told


# --- reading -------------------------------------------------------------------------------------------------


def test_a_run_rests_when_it_waits_for_messages_and_does_nothing_else():
    assert resting([task("DO_WHILE"), task("JOIN"), task("PULL_WORKFLOW_MESSAGES")])
    assert resting([task("DO_WHILE"), task("JOIN"), HUMAN_WAIT])
    assert not resting([task("DO_WHILE"), task("JOIN"), task("PULL_WORKFLOW_MESSAGES"), task("act")])  # a tool runs
    assert not resting([task("DO_WHILE"), task("LLM_CHAT_COMPLETE", "SCHEDULED")])  # a model turn is due
    assert not resting([task("DO_WHILE"), task("JOIN"), task("HUMAN", inputData={"_description": "Approve?"})])
    assert not resting([])


def test_the_stop_message_is_found_in_a_batch_and_at_its_head():
    batch = [envelope("a", {"x": 1}), envelope("s", STOP)]
    assert holds_stop(batch) and not stop_heads(batch)
    assert stop_heads([envelope("s", STOP), envelope("b", {"x": 2})]) and not stop_heads([])
    assert not holds_stop([envelope("a", {"_signal": "stop", "more": 1}), "garbage"])
    assert stop_in_digest({"_last_tool_results": [{"output": {"done": 1}}, {"output": {"messages": batch}}]})
    assert not stop_in_digest({"_last_tool_results": [{"output": {"messages": batch[:1]}}]}) and not stop_in_digest({})


def test_a_turn_reads_messages_when_the_turn_before_called_a_wait():
    assert turn_reads_messages([{"name": "wait_for_message", "type": "PULL_WORKFLOW_MESSAGES"}])
    assert turn_reads_messages([{"name": "act", "type": "SIMPLE"}, {"name": "wait", "type": "HUMAN"}])
    assert not turn_reads_messages([{"name": "act", "type": "SIMPLE"}]) and not turn_reads_messages(None)


# --- the caller: stop() ----------------------------------------------------------------------------------------


def test_a_listener_at_rest_with_nothing_unread_is_flagged_then_woken():
    server, directory = FakeServer(), FakeDirectory()
    told = stop(server, directory)
    assert server.calls == ["tasks", "flag", "send"] and told == [directory.newest.execution_id]


def test_a_busy_listener_gets_only_the_stop_message_behind_what_it_accepted():
    server, directory = FakeServer(), FakeDirectory()
    server.in_flight = [task("DO_WHILE"), task("LLM_CHAT_COMPLETE")]
    told = stop(server, directory)
    assert server.calls == ["tasks", "send"] and not server.flag
    assert told == [CHAIN.link(2).execution_id, CHAIN.link(3).execution_id]  # its tools here, and a drained run's


def test_a_message_sent_from_here_and_still_queued_makes_the_listener_busy():
    server, directory = FakeServer(), FakeDirectory(sent=("taken", "queued"))
    server.digest = [{"output": {"messages": [envelope("taken", {"x": 1})]}}]
    stop(server, directory)
    assert server.calls == ["tasks", "status", "send"] and not server.flag
    server.digest.append({"output": {"messages": [envelope("queued", {"x": 2})]}})
    server.calls.clear()
    stop(server, directory)
    assert server.calls == ["tasks", "status", "flag", "send"]


def test_a_listener_on_a_human_wait_always_gets_the_stop_through_its_mailbox():
    server, directory = FakeServer(), FakeDirectory(human_wait=True)
    server.in_flight = [task("DO_WHILE"), task("JOIN"), HUMAN_WAIT]
    stop(server, directory)
    assert server.calls == ["send"] and not server.flag  # its forward sets the flag, in order


def test_a_listener_that_takes_no_stop_message_is_flagged_and_an_ended_one_is_left_alone():
    server, directory = FakeServer(), FakeDirectory(human_wait=True)
    stop(server, directory, refuse=RunPausedError("paused", execution_id="x"))
    assert server.calls == ["send", "flag"]
    server.calls.clear()
    assert stop(server, directory, refuse=ExecutionNotRunningError("ended", execution_id="x")) == []
    assert server.calls == ["send"]


# --- the serving process: the turn task, the flag, the forward ---------------------------------------------------


def test_the_turn_that_reads_the_stop_sets_the_flag_before_its_model_call():
    server = FakeServer()
    waited = [{"name": "wait_for_message", "type": "PULL_WORKFLOW_MESSAGES"}]
    assert not stop_if_read(server, "run", tool_calls=[{"name": "act", "type": "SIMPLE"}]) and server.calls == []
    server.digest = [{"output": {"messages": [envelope("a", {"x": 1})]}}]
    assert not stop_if_read(server, "run", tool_calls=waited) and server.calls == ["status"]
    server.digest.append({"output": {"messages": [envelope("s", STOP)]}})
    server.calls.clear()
    assert stop_if_read(server, "run", tool_calls=waited) and server.flag
    assert server.calls == ["status", "flag", "status"]
    server.calls.clear()
    assert not stop_if_read(server, "run", tool_calls=waited) and server.calls == ["status"]  # flagged already


def test_a_stop_a_switch_carried_over_is_read_at_the_new_runs_first_turn():
    server = FakeServer()
    assert stop_if_read(server, "run", tool_calls=None, carried=[envelope("a", {"x": 1}), envelope("s", STOP)])
    assert server.calls == ["flag", "status"]


def test_a_flag_a_write_of_the_server_undid_is_posted_again_and_an_ended_run_is_not():
    server = FakeServer()
    server.undo_flags = 1
    assert post_stop_flag(server, "run") and server.calls == ["flag", "status", "flag", "status"]  # type: ignore[arg-type]
    server = FakeServer()
    server.status = "COMPLETED"
    assert not post_stop_flag(server, "run") and server.calls == ["flag"]  # type: ignore[arg-type]


@pytest.mark.parametrize(("batch", "calls"), [
    ([envelope("s", STOP)], ["flag", "status", "complete"]),
    ([envelope("a", {"x": 1}), envelope("s", STOP)], ["complete"]),  # its model reads a first: the turn task flags
    ([envelope("a", {"x": 1})], ["complete"]),
])
def test_the_forward_flags_a_wait_it_completes_with_a_batch_that_begins_with_the_stop(batch, calls):
    server = FakeServer()
    complete_wait(server, "run", {"taskId": "t"}, batch, worker_id="w")  # type: ignore[arg-type]
    assert server.calls == calls


def test_a_message_a_wait_took_in_behind_the_stop_is_reported_not_acted_on():
    wait = {"taskType": "PULL_WORKFLOW_MESSAGES", "referenceTaskName": "call__3", "taskId": "t",
            "outputData": {"messages": [envelope("a", {"x": 1}), envelope("s", STOP), envelope("b", {"x": 2})]}}
    assert (behind_stop(wait, "a"), behind_stop(wait, "b")) == (False, True)
    assert not behind_stop({"outputData": {}}, "a")
    sample = {"status": "COMPLETED", "tasks": [wait]}
    assert DeliveryCheck("run", "a").observe(sample) is not None
    with pytest.raises(MessageLostError) as info:
        DeliveryCheck("run", "b", reported_as="listener").observe(sample)
    err = info.value
    assert (err.reason, err.execution_id) == (MessageLostError.NOT_ACTED_ON, "listener")
    assert "behind its stop" in str(err)
