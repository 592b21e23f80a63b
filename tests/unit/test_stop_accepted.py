"""Unit tests for a stop that finishes what the listener accepted (issue 41): which model turn reads a wait's
messages (:mod:`conductor_agents._listener.reading`), the stop's steps in order (:mod:`.stopping`), and a message a
run took in and never showed its model reported as not acted on (:mod:`.delivery`)."""

from __future__ import annotations

from typing import Any

import pytest

from conductor_agents import MessageLostError
from conductor_agents._listener.delivery import AFTER_STOP_KEY, READ_KEY, DeliveryCheck
from conductor_agents._listener.directory import Chain, ChainDirectory
from conductor_agents._listener.reading import after_stop, iteration_of, read_after
from conductor_agents._listener.stopping import stop_in_order
from conductor_agents._wire.api import TaskPage
from conductor_agents._wire.transport import HttpError
from conductor_agents.errors import ExecutionNotRunningError, MessageQueueDisabledError
from tests.unit.fakes import FakeClock, FakeEvent

RUN = "run-1"
STOP_ID = "stop-message"


def task(kind: str, ref: str, status: str = "COMPLETED", **extra: Any) -> dict[str, Any]:
    return {"taskType": kind, "referenceTaskName": ref, "status": status, "taskId": f"id-{ref}", **extra}


def wait(ref: str, *ids: str) -> dict[str, Any]:
    return task("PULL_WORKFLOW_MESSAGES", ref, outputData={"messages": [{"id": i} for i in ids], "count": len(ids)})


# --- which turn reads a wait's messages ------------------------------------------------------------


def test_the_iteration_of_a_loop_task_comes_from_the_server_or_its_reference_name():
    assert iteration_of({"iteration": 3, "referenceTaskName": "x__7"}) == 3
    assert iteration_of({"referenceTaskName": "call_1_0__12"}) == 12
    assert iteration_of({"referenceTaskName": "agent_synth_output"}) == 0


def test_a_model_turn_of_a_later_iteration_reads_the_wait():
    tasks = [task("LLM_CHAT_COMPLETE", "llm__1"), wait("call__1", "m"), task("JOIN", "join__1"),
             task("conductor_agents_turn", "before_model__2", "IN_PROGRESS")]
    assert read_after(tasks, 1) is False  # the next iteration began, its model turn not yet
    assert read_after([*tasks, task("LLM_CHAT_COMPLETE", "llm__2", "SCHEDULED")], 1) is True


def test_a_run_that_ended_right_after_the_wait_never_read_it():
    tasks = [task("LLM_CHAT_COMPLETE", "llm__4"), wait("call__4", "m"), task("SET_VARIABLE", "set_state__4"),
             task("INLINE", "agent_synth_output")]
    assert read_after(tasks, 4) is False


def test_a_page_that_does_not_reach_back_to_the_wait_says_so():
    assert read_after([task("SWITCH", "router__9"), task("JOIN", "join__9")], 4) is None
    assert read_after([task("LLM_CHAT_COMPLETE", "llm__9"), task("JOIN", "join__9")], 4) is True


def test_a_message_behind_a_stop_in_one_wait_is_not_read_as_acted_on():
    taken = {"outputData": {"messages": [{"id": "a", "payload": {"x": 1}}, {"id": "s", "payload": {"_signal": "stop"}},
                                         {"id": "b", "payload": {"x": 2}}]}}
    assert (after_stop(taken, "a"), after_stop(taken, "b"), after_stop(taken, "missing")) == (False, True, True)
    assert after_stop({"outputData": {}}, "a") is False


# --- delivered means read -------------------------------------------------------------------------


def sample(status: str, read: bool | None) -> dict[str, Any]:
    found: dict[str, Any] = {"status": status, "tasks": [wait("call__2", "m")]}
    if read is not None:
        found[READ_KEY] = read
    return found


def test_a_message_taken_in_is_delivered_once_a_model_turn_read_it():
    check = DeliveryCheck(RUN, "m")
    assert check.observe(sample("RUNNING", False)) is None  # its model turn has not begun yet
    assert check.observe(sample("RUNNING", True)).task_reference_name == "call__2"
    assert DeliveryCheck(RUN, "m").observe(sample("COMPLETED", None)) is not None  # a sample that does not say


def test_a_message_taken_in_by_a_run_that_then_ended_was_not_acted_on():
    with pytest.raises(MessageLostError) as info:
        DeliveryCheck(RUN, "m", reported_as="listener-0").observe(sample("COMPLETED", False))
    err = info.value
    assert (err.reason, err.run_status, err.execution_id) == (MessageLostError.NOT_ACTED_ON, "COMPLETED", "listener-0")
    assert "not acted on" in str(err) and "listener-0" in str(err)


def test_a_message_taken_in_behind_the_stop_is_reported_so():
    behind = {**sample("COMPLETED", False), AFTER_STOP_KEY: True}
    assert DeliveryCheck(RUN, "m").observe({**behind, "status": "RUNNING"}) is None
    with pytest.raises(MessageLostError) as info:
        DeliveryCheck(RUN, "m").observe(behind)
    assert info.value.reason == MessageLostError.NOT_ACTED_ON and "behind its stop" in str(info.value)


# --- the stop's steps -----------------------------------------------------------------------------


class FakeServer:
    """The reads a stop makes of one run (``RUN``), scripted by the test; records what it was asked to do."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.calls: list[str] = []
        self.status = "RUNNING"
        self.pulled: list[str] = []  # message ids in the run's tool-results digest
        self.tasks: list[dict[str, Any]] = []
        self.flag = False
        self.undo_flags = 0  # how many posts of the flag a model call's write-back undoes
        self.on_look: Any = None  # called at each look at the run's status (moves the run on)

    def workflow_status(self, execution_id: str, *, include_variables: bool = False) -> dict[str, Any]:
        if self.on_look is not None:
            self.on_look(self)
        digest = [{"output": {"messages": [{"id": i} for i in self.pulled]}}] if self.pulled else []
        return {"status": self.status, "variables": {"_last_tool_results": digest, "_stop_requested": self.flag}}

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 15,
                       statuses: tuple[str, ...] = ()) -> TaskPage:
        chosen = [t for t in self.tasks if not statuses or t["status"] in statuses]
        return TaskPage(total=len(chosen), tasks=chosen[start:start + count])

    def stop_agent(self, execution_id: str) -> None:
        self.calls.append("flag")
        if self.status != "RUNNING":
            raise HttpError(409, "not running", method="POST", path=f"/agent/{execution_id}/stop")
        if self.undo_flags:
            self.undo_flags -= 1
        else:
            self.flag = True


def stop(server: FakeServer, *, send: Any = None, reach: float = 30.0) -> list[str]:
    sends: list[str] = []

    def send_stop() -> str:
        server.calls.append("send")
        if send is not None:
            send()
        sends.append(STOP_ID)
        return STOP_ID

    stopped: list[str] = []
    stop_in_order(server, ChainDirectory(server), Chain(RUN), send_stop=send_stop, on_stop=stopped.append,  # type: ignore[arg-type]
                  clock=server.clock, pause=FakeEvent(server.clock).wait, reach_seconds=reach)
    return stopped


def takes_in_the_stop_then_turns(server: FakeServer) -> None:
    """The run's wait takes the stop in at the second look, and its next iteration's model turn begins at the
    fourth (a listener that waited)."""
    looks = server.calls.count("look") + 1
    server.calls.append("look")
    if looks == 2:
        server.pulled = ["earlier", STOP_ID]
        server.tasks = [task("LLM_CHAT_COMPLETE", "llm__3"), wait("call__3", "earlier", STOP_ID)]
    if looks == 4:
        server.tasks.append(task("LLM_CHAT_COMPLETE", "llm__4", "IN_PROGRESS"))
    if looks == 6:  # the model asked to stop (its flag read back) acts and ends
        server.tasks[-1]["status"] = "COMPLETED"


def test_the_flag_is_set_only_once_the_model_began_the_turn_that_reads_the_stop():
    server = FakeServer(FakeClock())
    server.on_look = takes_in_the_stop_then_turns
    stopped = stop(server)
    steps = [c for c in server.calls if c != "look"]
    assert steps == ["send", "flag", "send"], server.calls
    assert server.calls.index("flag") > 4  # not before the look that saw the model turn after the wait
    assert stopped == [RUN, RUN] and server.flag  # its tools here are told at once, and again with the flag


def test_a_flag_undone_by_the_model_calls_write_back_is_posted_again():
    server = FakeServer(FakeClock())
    server.on_look = takes_in_the_stop_then_turns
    server.undo_flags = 2
    stop(server)
    assert [c for c in server.calls if c != "look"] == ["send", "flag", "flag", "flag", "send"] and server.flag


def test_a_listener_that_does_not_take_the_stop_in_is_stopped_at_the_bound():
    clock = FakeClock()
    server = FakeServer(clock)
    stop(server, reach=5.0)
    assert server.calls == ["send", "flag", "send"] and 5.0 <= clock.elapsed < 7.0


def test_a_listener_that_ended_meanwhile_is_left_alone():
    server = FakeServer(FakeClock())
    server.on_look = lambda s: setattr(s, "status", "COMPLETED")
    assert stop(server) == [RUN] and server.calls == ["send"]  # told its tools here; no flag


def test_a_run_that_takes_no_message_is_flagged_at_once():
    server = FakeServer(FakeClock())

    def refuse() -> None:
        raise MessageQueueDisabledError("queue off", execution_id=RUN)

    assert stop(server, send=refuse) == [RUN] and server.calls == ["send", "flag"]


def test_an_ended_run_is_not_stopped():
    server = FakeServer(FakeClock())

    def ended() -> None:
        raise ExecutionNotRunningError("ended", execution_id=RUN)

    assert stop(server, send=ended) == [] and server.calls == ["send"]
