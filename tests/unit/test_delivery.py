"""Unit tests for message delivery checks (conductor_agents._listener.delivery): delivered, lost, not known yet.

The task lists have the shape the real server returns (checked in
tests/integration/test_message_delivery.py): each wait-for-message task completes with
``{messages: [{id, workflowId, payload, receivedAt}], count}`` and counts its evaluations in
``pollCount``.
"""

import pytest
import requests
import responses

from conductor_agents import MessageDelivery, MessageLostError
from conductor_agents._wire.api import ConductorApi
from conductor_agents._listener.directory import Chain
from conductor_agents._listener.delivery import DeliveryCheck
from conductor_agents._wire.transport import Transport
from conductor_agents.errors import ExecutionNotFoundError, ServerUnavailableError, WaitTimeoutError
from conductor_agents.handle import AgentHandle
from conductor_agents.settings import AgentSettings
from tests.unit.fakes import BASE_URL, FakeClock, FakeEvent

EXEC = "wf-7"
MID = "5b0c-message"
WORKFLOW = f"{BASE_URL}/workflow/{EXEC}"


def pull(ref, status, poll_count, *ids, task_id=None):
    output = {}
    if ids:
        output = {"messages": [{"id": i, "workflowId": EXEC, "payload": {"n": i}, "receivedAt": f"t-{i}"}
                               for i in ids], "count": len(ids)}
    return {"taskType": "PULL_WORKFLOW_MESSAGES", "referenceTaskName": ref, "taskId": task_id or f"id-{ref}",
            "status": status, "pollCount": poll_count, "outputData": output}


def flow(status, *tasks):
    return {"workflowId": EXEC, "status": status,
            "tasks": [{"taskType": "LLM_CHAT_COMPLETE", "referenceTaskName": "llm", "status": "COMPLETED"}, *tasks]}


# --- the rules, sample by sample -----------------------------------------------------------------


def test_a_message_in_a_batch_is_delivered():
    check = DeliveryCheck(EXEC, MID)
    delivery = check.observe(flow("RUNNING", pull("call_1__1", "COMPLETED", 2, "other"),
                                  pull("call_5__3", "COMPLETED", 1, "first", MID, "third")))
    assert delivery == MessageDelivery(execution_id=EXEC, message_id=MID, task_reference_name="call_5__3",
                                       task_id="id-call_5__3", received_at=f"t-{MID}", batch_count=3)


def test_a_message_pulled_by_an_earlier_iteration_is_found_after_the_run_ended():
    check = DeliveryCheck(EXEC, MID)
    assert check.observe(flow("COMPLETED", pull("call_1__1", "COMPLETED", 2, MID),
                              pull("call_3__2", "COMPLETED", 4, "stop"))) is not None


def test_a_run_that_ended_without_the_message_lost_it():
    check = DeliveryCheck(EXEC, MID)
    with pytest.raises(MessageLostError) as info:
        check.observe(flow("TERMINATED", pull("call_1__1", "CANCELED", 3)))
    err = info.value
    assert (err.reason, err.run_status, err.execution_id, err.message_id) == (
        MessageLostError.RUN_ENDED, "TERMINATED", EXEC, MID)
    assert isinstance(err, LookupError)


def test_a_wait_evaluated_twice_after_the_first_sample_then_confirmed_means_lost():
    """One evaluation may have been under way when the message arrived; two cannot both be."""
    check = DeliveryCheck(EXEC, MID)
    assert check.observe(flow("RUNNING", pull("call_9__5", "IN_PROGRESS", 4))) is None
    assert check.observe(flow("RUNNING", pull("call_9__5", "IN_PROGRESS", 5))) is None  # +1: not proof
    assert check.observe(flow("RUNNING", pull("call_9__5", "IN_PROGRESS", 6))) is None  # +2: suspect
    with pytest.raises(MessageLostError) as info:
        check.observe(flow("RUNNING", pull("call_9__5", "IN_PROGRESS", 7)))  # confirmed
    assert info.value.reason == MessageLostError.NOT_IN_QUEUE and info.value.run_status == "RUNNING"


def test_the_confirming_sample_may_still_find_the_message():
    check = DeliveryCheck(EXEC, MID)
    check.observe(flow("RUNNING", pull("a__1", "IN_PROGRESS", 0), pull("b__1", "IN_PROGRESS", 0)))
    assert check.observe(flow("RUNNING", pull("a__1", "IN_PROGRESS", 2), pull("b__1", "IN_PROGRESS", 1))) is None
    assert check.observe(flow("RUNNING", pull("a__1", "IN_PROGRESS", 3), pull("b__1", "COMPLETED", 2, MID)))


def test_a_run_busy_in_a_tool_tells_nothing():
    """No waiting task: the message sits in the queue for the next wait, however long that takes."""
    check = DeliveryCheck(EXEC, MID)
    busy = flow("RUNNING", pull("call_1__1", "COMPLETED", 2, "before"),
                {"taskType": "act", "referenceTaskName": "act_1", "status": "IN_PROGRESS", "pollCount": 1})
    for _ in range(20):
        assert check.observe(busy) is None


def test_a_new_wait_task_counts_from_when_it_was_first_seen():
    check = DeliveryCheck(EXEC, MID)
    assert check.observe(flow("RUNNING", pull("w__1", "COMPLETED", 2, "other"), pull("w__2", "IN_PROGRESS", 1))) is None
    assert check.observe(flow("RUNNING", pull("w__1", "COMPLETED", 2, "other"), pull("w__2", "IN_PROGRESS", 2))) is None
    assert check.observe(flow("RUNNING", pull("w__1", "COMPLETED", 2, "other"), pull("w__2", "IN_PROGRESS", 3))) is None
    with pytest.raises(MessageLostError):
        check.observe(flow("RUNNING", pull("w__2", "IN_PROGRESS", 3)))


# --- the waiting loop ------------------------------------------------------------------------------


@pytest.fixture
def http():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def make_handle(**settings):
    clock = FakeClock()
    handle = AgentHandle(api=ConductorApi(Transport(BASE_URL, clock=clock)), execution_id=EXEC,
                         agent_name="listener", run_id=None, settings=AgentSettings(server_url=BASE_URL, **settings),
                         clock=clock, chain=Chain(EXEC))
    pauses = FakeEvent(clock)
    handle._pause = pauses.wait
    return handle, pauses


def status(run_status="RUNNING", *pulled):
    """``GET /workflow/{id}/status?includeVariables=true``: the digest lists the messages pulled so far."""
    digest = [{"name": "wait_for_message", "output": {"messages": [{"id": m} for m in pulled], "count": len(pulled)}}]
    return {"workflowId": EXEC, "status": run_status, "variables": {"_last_tool_results": digest if pulled else []}}


def page(*tasks, total=None):
    return {"totalHits": len(tasks) if total is None else total, "results": list(tasks)}


def test_wait_delivered_returns_once_pulled(http):
    """Two small reads per sample; once the digest lists it, the task that pulled it is looked up once."""
    http.add("GET", f"{WORKFLOW}/status", json=status("RUNNING"))
    http.add("GET", f"{WORKFLOW}/status", json=status("RUNNING", MID))
    http.add("GET", f"{WORKFLOW}/tasks", json=page(pull("w__1", "IN_PROGRESS", 1)))
    http.add("GET", f"{WORKFLOW}/tasks", json=page(pull("w__1", "COMPLETED", 2, MID), total=1))
    http.add("GET", f"{WORKFLOW}/tasks", json=page(pull("w__1", "COMPLETED", 2, MID)))
    handle, pauses = make_handle()
    assert handle.wait_delivered(MID, timeout=5).task_reference_name == "w__1"
    assert pauses.waits == [0.5]
    assert not any("includeTasks=true" in call.request.url for call in http.calls)


def test_wait_delivered_times_out_while_the_run_is_busy(http):
    http.add("GET", f"{WORKFLOW}/status", json=status("RUNNING"))
    http.add("GET", f"{WORKFLOW}/tasks", json=page())
    handle, pauses = make_handle()
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait_delivered(MID, timeout=2)
    assert info.value.timeout == 2 and len(http.calls) == 10 and sum(pauses.waits) == 2


def test_wait_delivered_tolerates_transient_errors_like_wait(http):
    http.add("GET", f"{WORKFLOW}/status", body=requests.ConnectionError("refused"))
    http.add("GET", f"{WORKFLOW}/status", status=503, json={"message": "down"})
    http.add("GET", f"{WORKFLOW}/status", json=status("RUNNING", MID))
    http.add("GET", f"{WORKFLOW}/tasks", json=page(pull("w__1", "COMPLETED", 2, MID)))
    handle, _ = make_handle()
    assert handle.wait_delivered(MID, timeout=10).message_id == MID


def test_wait_delivered_gives_up_after_too_many_transient_errors(http):
    http.add("GET", f"{WORKFLOW}/status", body=requests.ConnectionError("refused"))
    handle, _ = make_handle(max_transient_errors=1)
    with pytest.raises(ServerUnavailableError):
        handle.wait_delivered(MID, timeout=10)


def test_wait_delivered_on_an_unknown_run_raises_at_once(http):
    http.add("GET", f"{WORKFLOW}/status", status=404, json={"message": "no such workflow"})
    handle, pauses = make_handle()
    with pytest.raises(ExecutionNotFoundError):
        handle.wait_delivered(MID, timeout=10)
    assert pauses.waits == []


@pytest.mark.parametrize("message_id, timeout", [("", 5), ("  ", 5), (None, 5), (MID, 0), (MID, -1)])
def test_wait_delivered_checks_its_arguments_before_any_request(http, message_id, timeout):
    handle, _ = make_handle()
    with pytest.raises(ValueError):
        handle.wait_delivered(message_id, timeout=timeout)
    assert len(http.calls) == 0


# --- which run of a continued listener took a message in --------------------------------------------


def test_the_run_that_took_a_message_is_found_newest_first_past_retired_runs():
    """A message sent through the mailbox (or by another process) names no run this process knows: the
    runs are read newest first, a retired one skipped, until one whose digest lists it."""
    from conductor_agents._listener.delivery import _taken_by

    chain = Chain("mbox-1", run_id="r-1", agent_name="listener", mailbox=True, human_wait=True)
    digests = {3: ["later"], 2: None, 1: ["before", MID], 0: [MID]}  # run 2 retired; 0 never read
    by_id = {chain.link(n).execution_id: ids for n, ids in digests.items()}
    read: "list[str]" = []

    class Api:
        def workflow_status(self, execution_id, *, include_variables):
            read.append(execution_id)
            ids = by_id[execution_id]
            if ids is None:
                raise ExecutionNotFoundError(f"no run {execution_id}", execution_id=execution_id)
            return {"variables": {"_last_tool_results": [{"output": {"messages": [{"id": i} for i in ids]}}]}}

    class Directory:
        def refresh(self, _chain):
            return chain.link(3)

    assert _taken_by(Api(), Directory(), chain, MID) == chain.link(1)
    assert read == [chain.link(n).execution_id for n in (3, 2, 1)]
    assert _taken_by(Api(), Directory(), chain, "never-sent") is None
