"""Unit tests for the tool context: ToolContext, the executor's ToolRetry/ToolCancelled handling, the
cancellation watch. The behaviour on the real server is in tests/integration/test_tool_context.py."""

from __future__ import annotations

import threading

import pytest

from conductor_agents import CancelReason, ToolCancelled, ToolContext, ToolRetry, current_tool_context, tool
from conductor_agents._wire.api import ConductorApi
from conductor_agents._tooldefs.context import call_key, cancel, delivery_attempt
from conductor_agents._worker.task_watch import CancellationWatch, held_by, stop_requested
from conductor_agents._wire.transport import Transport
from conductor_agents.errors import ToolDefinitionError
from tests.helpers import eventually
from tests.unit.fakes import BASE_URL, FakeClock
from tests.unit.test_executor import (  # noqa: F401 (fixtures)
    TASKS_URL, base, clock, gate, make_executor, posted, raw_task, run_to_end,
)

# --- ToolContext ------------------------------------------------------------------------------


def test_context_of_a_polled_task():
    """The server's Task JSON gives ids, the attempt (1 + retries + earlier polls) and the call's key."""
    task = {"taskId": "t-9", "workflowInstanceId": "wf-1", "taskType": "pay", "referenceTaskName": "call_x_0__3",
            "iteration": 3, "retryCount": 0, "pollCount": 1, "domain": "run-1"}
    ctx = ToolContext.of_task(task)
    assert (ctx.execution_id, ctx.task_id, ctx.attempt, ctx.run_id, ctx.reference_name, ctx.tool_name) == (
        "wf-1", "t-9", 1, "run-1", "call_x_0__3", "pay")
    assert ctx.idempotency_key == "wf-1/call_x_0__3"
    assert ToolContext.of_task({**task, "pollCount": 2}).attempt == 2  # handed back, same task
    assert ToolContext.of_task({**task, "retryCount": 1, "pollCount": 1}).attempt == 2  # a server retry
    assert ToolContext.of_task({**task, "retryCount": 1}).idempotency_key == ctx.idempotency_key
    assert ToolContext.of_task({**task, "domain": None}).run_id is None


@pytest.mark.parametrize("task,attempt", [({}, 1), ({"pollCount": 0}, 1), ({"pollCount": 3}, 3),
                                          ({"retryCount": 2, "pollCount": 1}, 3), ({"pollCount": True}, 1)])
def test_delivery_attempt(task, attempt):
    assert delivery_attempt(task) == attempt


def test_call_key_distinguishes_turns_even_without_a_suffix():
    assert call_key("wf", "call_1_0__2", 2) == "wf/call_1_0__2"
    assert call_key("wf", "call_1_0", 2) != call_key("wf", "call_1_0", 3)


def test_a_context_built_by_hand_for_unit_testing_a_tool():
    ctx = ToolContext(execution_id="e", task_id="t")
    assert (ctx.attempt, ctx.idempotency_key, ctx.cancel_reason) == (1, "e/t", None)
    ctx.check_cancelled()  # not cancelled: nothing happens
    assert cancel(ctx, CancelReason.TASK_LOST) and not cancel(ctx, CancelReason.RUN_ENDED)  # first reason sticks
    with pytest.raises(ToolCancelled) as info:
        ctx.check_cancelled()
    assert info.value.reason == CancelReason.TASK_LOST and ctx.cancelled.is_set()
    assert "cancelled" not in repr(ctx)  # the events are state, not identity


def test_tool_retry_checks_its_delay():
    assert ToolRetry("x", after_seconds=2.5).after_seconds == 2.5
    for bad in (-1, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError):
            ToolRetry("x", after_seconds=bad)


# --- the ToolContext parameter ---------------------------------------------------------------


def test_the_context_parameter_is_not_in_the_schema_and_is_passed_to_the_function():
    seen = []

    @tool
    def pay(amount: float, ctx: ToolContext) -> str:
        """Pay."""
        seen.append((ctx, current_tool_context()))
        return "ok"

    assert list(pay.input_schema["properties"]) == ["amount"] and pay.takes_context
    ctx = ToolContext(execution_id="e", task_id="t")
    assert pay.invoke({"amount": 1}, context=ctx) == "ok"
    assert seen == [(ctx, ctx)] and current_tool_context() is None
    with pytest.raises(ToolDefinitionError, match="takes a ToolContext"):
        pay.invoke({"amount": 1})


def test_an_optional_context_parameter_and_async_tools():
    @tool
    async def maybe(ctx: "ToolContext | None" = None) -> bool:
        """Async."""
        return current_tool_context() is ctx

    ctx = ToolContext(execution_id="e", task_id="t")
    assert maybe.invoke({}, context=ctx) is True
    assert maybe.input_schema["properties"] == {}


def test_two_context_parameters_are_refused():
    with pytest.raises(ToolDefinitionError, match="both ToolContext"):
        @tool
        def twice(a: ToolContext, b: ToolContext) -> None:
            """Twice."""


# --- the executor -----------------------------------------------------------------------------


def test_tool_retry_hands_the_task_back_with_its_delay(http, make_executor):
    """IN_PROGRESS with callbackAfterSeconds (whole seconds, at least 1): the run keeps waiting for it."""
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str) -> str:
        """Look up."""
        raise ToolRetry("busy", after_seconds=2.2)

    run_to_end(make_executor(), {**raw_task(), "pollCount": 1, "taskDefinition": {"retryCount": 2}}, lookup)
    # The task leaves the in-flight set before the hand-back is posted (it may come back at once).
    [body] = eventually(lambda: posted(http), timeout=5, message="the hand-back")
    assert {k: v for k, v in body.items() if k != "logs"} == {
        **base(), "status": "IN_PROGRESS", "callbackAfterSeconds": 3, "outputData": {}}
    assert "attempt 1: ToolRetry: busy" in body["logs"][0]["log"]


def test_tool_retry_on_the_last_delivery_is_a_terminal_failure(http, make_executor):
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str) -> str:
        """Look up."""
        raise ToolRetry("busy")

    run_to_end(make_executor(), {**raw_task(), "pollCount": 3, "taskDefinition": {"retryCount": 2}}, lookup)
    [body] = posted(http)
    assert body["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert body["outputData"] == {"error": "busy (gave up after 3 attempts)"}


def test_tool_retry_with_no_budget_fails_at_once(http, make_executor):
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str) -> str:
        """Look up."""
        raise ToolRetry("busy")

    run_to_end(make_executor(), {**raw_task(), "workflowTask": {"retryCount": 0}}, lookup)
    assert posted(http)[0]["status"] == "FAILED_WITH_TERMINAL_ERROR"


def test_a_tool_that_cancels_itself_fails_so_the_run_is_not_left_waiting(http, make_executor):
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str) -> str:
        """Look up."""
        raise ToolCancelled("not needed any more")

    run_to_end(make_executor(), raw_task(), lookup)
    [body] = posted(http)
    assert body["status"] == "FAILED_WITH_TERMINAL_ERROR"
    assert body["outputData"] == {"error": "the tool cancelled itself: not needed any more"}


def waiting_tool(entered, outcome):
    @tool
    def wait_here(city: str, ctx: ToolContext) -> str:
        """Wait for cancellation."""
        entered.set()
        outcome.append(ctx.cancelled.wait(10))
        ctx.check_cancelled()
        return "finished"

    return wait_here


def test_run_ended_cancels_its_tools_and_nothing_is_posted(http, make_executor):
    """The run has ended on the server: its task is CANCELED there, so ToolCancelled posts nothing."""
    http.add("POST", TASKS_URL, body="")
    entered, outcome = threading.Event(), []
    executor = make_executor()
    assert executor.submit(raw_task(), waiting_tool(entered, outcome))
    assert entered.wait(5)
    executor.run_ended("another-run")  # not this one
    executor.run_ended("wf-1")
    eventually(lambda: executor.in_flight_count == 0, timeout=5)
    assert outcome == [True] and posted(http) == []


def test_stop_requested_reaches_running_and_later_tools_of_the_run(http, make_executor):
    http.add("POST", TASKS_URL, body="")
    seen = []
    gate = threading.Event()

    @tool
    def work(city: str, ctx: ToolContext) -> str:
        """Work."""
        gate.wait(5)
        seen.append(ctx.stop_requested.wait(5))
        return "ok"

    executor = make_executor()
    assert executor.submit(raw_task("t-1"), work)
    executor.stop_requested("wf-1")
    gate.set()
    eventually(lambda: executor.in_flight_count == 0, timeout=5)
    run_to_end(executor, raw_task("t-2"), work)  # started after the stop: sees it at once
    assert seen == [True, True]
    executor.run_ended("wf-1")  # forgets the stop with the run
    assert "wf-1" not in executor._stopping


def test_closing_cancels_running_tools_and_hands_their_tasks_back(http, make_executor):
    http.add("POST", TASKS_URL, body="")
    entered, outcome = threading.Event(), []
    executor = make_executor()
    assert executor.submit(raw_task(), waiting_tool(entered, outcome))
    assert entered.wait(5)
    executor.close(grace=5.0)
    assert outcome == [True]
    [body] = posted(http)
    assert (body["status"], body["callbackAfterSeconds"]) == ("IN_PROGRESS", 1)


# --- the cancellation watch -------------------------------------------------------------------


class Call:
    def __init__(self, task_id="t-1", workflow_id="wf-1", started=0.0, poll_count=1):
        self.context = ToolContext(execution_id=workflow_id, task_id=task_id)
        self.started = started
        self.last_checked = started
        self.poll_count = poll_count
        self.body_done = False


@pytest.fixture
def watch():
    return CancellationWatch(ConductorApi(Transport(BASE_URL, clock=FakeClock())), worker_id="me", interval=2.0)


def test_the_watch_reads_nothing_for_tools_that_just_started_or_returned(http, watch):
    done = Call()
    done.body_done = True  # only its result is being posted
    watch.sweep([Call(started=10.0), done], now=11.0)
    assert len(http.calls) == 0


def test_the_watch_cancels_the_tools_of_an_ended_run(http, watch):
    http.add("GET", BASE_URL + "/workflow/wf-1", json={"status": "TERMINATED"})
    calls = [Call("t-1"), Call("t-2")]
    watch.sweep(calls, now=5.0)
    assert [c.context.cancel_reason for c in calls] == [CancelReason.RUN_ENDED] * 2
    assert len(http.calls) == 1  # one read for the run, none for its tasks
    watch.sweep(calls, now=10.0)
    assert len(http.calls) == 1  # cancelled calls are not looked at again


def test_the_watch_sets_stop_requested_and_finds_lost_tasks(http, watch):
    http.add("GET", BASE_URL + "/workflow/wf-1", json={"status": "RUNNING", "variables": {"_stop_requested": True}})
    http.add("GET", BASE_URL + "/tasks/t-1", json={"status": "IN_PROGRESS", "workerId": "me", "pollCount": 1})
    http.add("GET", BASE_URL + "/tasks/t-2", json={"status": "IN_PROGRESS", "workerId": "other", "pollCount": 2})
    held, lost = Call("t-1"), Call("t-2")
    watch.sweep([held, lost], now=5.0)
    assert held.context.stop_requested.is_set() and not held.context.cancelled.is_set()
    assert lost.context.cancel_reason == CancelReason.TASK_LOST


def test_the_watch_survives_an_unreachable_server(http, watch):
    call = Call()
    watch.sweep([call], now=5.0)  # no stub: the request fails
    assert not call.context.cancelled.is_set()


@pytest.mark.parametrize("task,held", [
    ({"status": "IN_PROGRESS", "pollCount": 1}, True),
    ({"status": "IN_PROGRESS", "pollCount": 2}, False),
    ({"status": "CANCELED", "pollCount": 1}, False),
    ({"status": "COMPLETED"}, False),
])
def test_held_by(task, held):
    assert held_by(task, 1) is held


def test_stop_requested_reads_the_loop_variable():
    assert stop_requested({"variables": {"_stop_requested": True}})
    assert not stop_requested({"variables": {"_stop_requested": False}}) and not stop_requested({})


def test_a_task_delivered_again_while_it_runs_here_is_adopted_not_lost(http, make_executor):
    """The same task polled again by this process (handed back elsewhere): not run twice, and the
    watch will judge the running body by the newer delivery's poll count."""
    http.add("POST", TASKS_URL, body="")
    entered, outcome = threading.Event(), []
    executor = make_executor()
    assert executor.submit({**raw_task(), "pollCount": 1}, waiting_tool(entered, outcome))
    assert entered.wait(5)
    assert not executor.submit({**raw_task(), "pollCount": 2}, waiting_tool(entered, outcome))
    [flight] = executor._in_flight.values()
    assert flight.poll_count == 2 and held_by({"status": "IN_PROGRESS", "pollCount": 2}, flight.poll_count)
    executor.run_ended("wf-1")
    eventually(lambda: executor.in_flight_count == 0, timeout=5)


def test_a_cancelled_call_gets_no_lease_extension(http, make_executor, clock, gate):
    """Once cancelled (here: its run ended) a body that ignores it keeps running, unextended; its late
    result is still posted."""
    from tests.unit.test_executor import blocking_tool

    http.add("POST", TASKS_URL, body="")
    started = []
    executor = make_executor()
    executor.submit(raw_task("t-1", response_timeout=10), blocking_tool(gate, started))
    executor.submit({**raw_task("t-2", response_timeout=10), "workflowInstanceId": "wf-2"},
                    blocking_tool(gate, started))
    eventually(lambda: len(started) == 2, timeout=5.0)
    executor.run_ended("wf-1")
    clock.advance(6.0)
    executor._lease_tick(clock.monotonic())  # what the lease thread does every second
    extended = [b["taskId"] for b in posted(http) if b.get("extendLease")]
    assert set(extended) == {"t-2"}  # (the lease thread may tick too) the other run's call, not cancelled, is extended
    gate.set()
    eventually(lambda: executor.in_flight_count == 0, timeout=5.0)
    assert sorted(b["taskId"] for b in posted(http) if b["status"] == "COMPLETED") == ["t-1", "t-2"]
