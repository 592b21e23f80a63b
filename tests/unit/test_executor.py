"""Unit tests for conductor_agents._worker.executor.ToolExecutor: outcomes, result retries, duplicates, leases, shutdown."""

import json
import logging
import threading

import pytest
import requests

from conductor_agents import tool
from conductor_agents._wire.api import ConductorApi
from conductor_agents._worker.executor import ToolExecutor
from conductor_agents._wire.transport import Transport
from tests.helpers import eventually
from tests.unit.fakes import BASE_URL, FakeClock, FakeEvent

TASKS_URL = BASE_URL + "/tasks"
WORKER_ID = "host-1-abc"
GATE_TIMEOUT = 5.0  # a tool body blocked on a gate gives up after this (real seconds), never hangs a run


def raw_task(task_id="t-1", *, input_data=None, task_type="lookup", response_timeout=3600):
    return {
        "taskId": task_id, "workflowInstanceId": "wf-1", "taskType": task_type,
        "referenceTaskName": f"{task_type}_ref",
        "inputData": input_data if input_data is not None else {"city": "Oslo"},
        "responseTimeoutSeconds": response_timeout,
    }


def base(task_id="t-1"):
    return {"workflowInstanceId": "wf-1", "taskId": task_id, "workerId": WORKER_ID}


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def gate():
    """An event blocked tool bodies wait on; always opened at teardown."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def make_executor(http, clock, gate):
    made = []

    def make(**kwargs):
        executor = ToolExecutor(ConductorApi(Transport(BASE_URL, clock=clock)), threads=2, worker_id=WORKER_ID,
                                clock=clock, **kwargs)
        # The result-retry backoff waits on _abandon; the fake moves the clock instead of sleeping.
        executor._abandon = FakeEvent(clock)
        made.append(executor)
        return executor

    yield make
    gate.set()
    for executor in made:
        eventually(lambda: executor.in_flight_count == 0, timeout=GATE_TIMEOUT + 1, message="tools to finish")
        executor.close(grace=1.0)


def posted(http):
    """The bodies POSTed to /tasks, in order."""
    return [json.loads(c.request.body) for c in http.calls if c.request.url == TASKS_URL]


def run_to_end(executor, task, tool_def):
    assert True is executor.submit(task, tool_def)
    eventually(lambda: executor.in_flight_count == 0, timeout=5.0, message="the task to finish")


# --- outcomes ---------------------------------------------------------------------------------


def test_dict_return_is_the_output(http, make_executor):
    """A tool returning a dict completes the task with that dict as output."""
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str) -> dict:
        """Look up a city."""
        return {"city": city, "temp": 12}

    run_to_end(make_executor(), raw_task(), lookup)
    assert [{**base(), "status": "COMPLETED", "outputData": {"city": "Oslo", "temp": 12}}] == posted(http)


@pytest.mark.parametrize("value,output", [("sunny", {"result": "sunny"}), (3, {"result": 3}),
                                          (None, {"result": None}), ([1, 2], {"result": [1, 2]})])
def test_non_dict_return_is_wrapped(http, make_executor, value, output):
    """A non-dict return value is sent as {"result": value}."""
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str):
        """Look up a city."""
        return value

    run_to_end(make_executor(), raw_task(), lookup)
    assert [{**base(), "status": "COMPLETED", "outputData": output}] == posted(http)


def test_server_input_keys_do_not_reach_the_body(http, make_executor):
    """The server's extra input keys (method, _agent_*) are not passed to the function."""
    http.add("POST", TASKS_URL, body="")
    seen = []

    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        seen.append(city)
        return "ok"

    task = raw_task(input_data={"city": "Rome", "method": "lookup", "_agent_state": {}, "_agent_tool_name": "x"})
    run_to_end(make_executor(), task, lookup)
    assert (["Rome"], "COMPLETED") == (seen, posted(http)[0]["status"])


def test_raising_tool_fails_terminally_with_the_exception_text(http, make_executor, clock):
    """A tool that raises fails its task with FAILED_WITH_TERMINAL_ERROR and the exception's text."""
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        raise LookupError(f"no such city: {city}")

    run_to_end(make_executor(), raw_task(), lookup)
    [body] = posted(http)
    reason = "LookupError: no such city: Oslo"
    assert ({**base(), "status": "FAILED_WITH_TERMINAL_ERROR", "reasonForIncompletion": reason,
             "outputData": {"error": reason}}) == {k: v for k, v in body.items() if k != "logs"}
    assert int(clock.time() * 1000) == body["logs"][0]["createdTime"]
    assert "no such city: Oslo" in body["logs"][0]["log"]


def test_schema_violation_fails_without_calling_the_body(http, make_executor):
    """Arguments that break the input schema fail the task and the body never runs."""
    http.add("POST", TASKS_URL, body="")
    calls = []

    @tool
    def lookup(city: str, days: int = 1) -> str:
        """Look up a city."""
        calls.append(city)
        return "ok"

    run_to_end(make_executor(), raw_task(input_data={"city": 5, "days": "two"}), lookup)
    [body] = posted(http)
    assert ([], "FAILED_WITH_TERMINAL_ERROR") == (calls, body["status"])
    assert body["reasonForIncompletion"].startswith("Invalid arguments for tool 'lookup'")
    assert "city" in body["reasonForIncompletion"] and "days" in body["reasonForIncompletion"]


@pytest.mark.parametrize("value", [object(), {"when": threading.Lock()}, float("nan"), {1: "x"}])
def test_unserialisable_return_fails_with_a_clear_reason(http, make_executor, value):
    """A return value that is not JSON fails the task with a reason naming the tool and the problem."""
    http.add("POST", TASKS_URL, body="")

    @tool
    def lookup(city: str):
        """Look up a city."""
        return value

    run_to_end(make_executor(), raw_task(), lookup)
    [body] = posted(http)
    assert "FAILED_WITH_TERMINAL_ERROR" == body["status"]
    assert body["reasonForIncompletion"].startswith("tool 'lookup' returned an unusable value")
    assert body["outputData"] == {"error": body["reasonForIncompletion"]}


def test_task_done_hook_hears_the_outcome(http, make_executor):
    """on_task_done receives the task, its outcome and its duration on the clock."""
    http.add("POST", TASKS_URL, body="")
    heard = []

    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        raise ValueError("x")

    run_to_end(make_executor(on_task_done=lambda t, outcome, took: heard.append((t.task_id, outcome, took))),
               raw_task(), lookup)
    assert [("t-1", "FAILED_WITH_TERMINAL_ERROR", 0.0)] == heard


# --- posting results --------------------------------------------------------------------------


@tool
def echo(city: str) -> str:
    """Echo the city."""
    return city


def test_result_is_retried_with_backoff_until_accepted(http, make_executor):
    """503s and connection errors on the result POST are retried with growing pauses until it is accepted."""
    http.add("POST", TASKS_URL, status=503, body="busy")
    http.add("POST", TASKS_URL, body=requests.ConnectionError("refused"))
    http.add("POST", TASKS_URL, status=503, body="busy")
    http.add("POST", TASKS_URL, body="")
    executor = make_executor()
    run_to_end(executor, raw_task(), echo)
    bodies = posted(http)
    assert 4 == len(bodies)
    assert [{**base(), "status": "COMPLETED", "outputData": {"result": "Oslo"}}] * 4 == bodies
    assert [0.25, 0.5, 1.0] == executor._abandon.waits


def test_result_retries_give_up_after_the_retry_window(http, make_executor, caplog):
    """When the server stays unavailable past result_retry_seconds the result is DROPPED with an ERROR."""
    caplog.set_level(logging.ERROR, logger="conductor_agents.worker")
    http.add("POST", TASKS_URL, status=503, body="busy")
    executor = make_executor(result_retry_seconds=10.0)
    run_to_end(executor, raw_task(), echo)
    assert (6, [0.25, 0.5, 1.0, 2.0, 4.0]) == (len(posted(http)), executor._abandon.waits)
    assert ["DROPPED"] == [r.getMessage().split()[0] for r in caplog.records if r.levelno == logging.ERROR]


def test_a_task_the_server_no_longer_knows_is_dropped_at_once(http, make_executor, caplog):
    """A 404 (the task is gone) is not retried and is logged at ERROR as DROPPED."""
    caplog.set_level(logging.ERROR, logger="conductor_agents.worker")
    http.add("POST", TASKS_URL, status=404, json={"message": "No such task found by id: t-1"})
    run_to_end(make_executor(), raw_task(), echo)
    assert 1 == len(posted(http))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert 1 == len(errors)
    assert errors[0].startswith("DROPPED the COMPLETED result of task t-1")
    assert "no longer knows the task" in errors[0]


@pytest.mark.parametrize("status", [400, 409, 413])
def test_a_result_the_server_refuses_is_not_retried_and_not_called_dropped(http, make_executor, caplog, status):
    """Another 4xx refuses this very body: not retried (it would be refused again), logged REFUSED."""
    caplog.set_level(logging.ERROR, logger="conductor_agents.worker")
    http.add("POST", TASKS_URL, status=status, json={"message": "bad result"})
    run_to_end(make_executor(), raw_task(), echo)
    assert 1 == len(posted(http))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert 1 == len(errors) and errors[0].startswith("REFUSED") and f"HTTP {status}" in errors[0]


# --- duplicates and capacity -------------------------------------------------------------------


def blocking_tool(gate, started):
    @tool
    def slow(city: str) -> str:
        """Wait for the test to let it finish."""
        started.append(city)
        gate.wait(GATE_TIMEOUT)
        return city

    return slow


def test_same_task_submitted_twice_runs_once(http, make_executor, gate):
    """The same task id submitted again while it runs is refused and its body runs once."""
    http.add("POST", TASKS_URL, body="")
    started = []
    slow = blocking_tool(gate, started)
    executor = make_executor()
    assert True is executor.submit(raw_task(), slow)
    eventually(lambda: started, timeout=5.0)
    assert False is executor.submit(raw_task(), slow)
    gate.set()
    eventually(lambda: executor.in_flight_count == 0, timeout=5.0)
    assert (["Oslo"], 1) == (started, len(posted(http)))


def test_same_task_may_run_again_after_it_finished(http, make_executor):
    """Once a task finished, the same id is accepted again (the server may redeliver it)."""
    http.add("POST", TASKS_URL, body="")
    executor = make_executor()
    run_to_end(executor, raw_task(), echo)
    run_to_end(executor, raw_task(), echo)
    assert 2 == len(posted(http))


def test_free_slots_count_twice_the_threads(http, make_executor, gate):
    """An executor of 2 threads accepts 4 tasks; each running one takes a slot."""
    http.add("POST", TASKS_URL, body="")
    started = []
    slow = blocking_tool(gate, started)
    executor = make_executor()
    assert 4 == executor.free_slots()
    executor.submit(raw_task("a"), slow)
    executor.submit(raw_task("b"), slow)
    executor.submit(raw_task("c"), slow)
    assert (1, 3) == (executor.free_slots(), executor.in_flight_count)


# --- leases -----------------------------------------------------------------------------------


def test_long_running_tool_gets_its_lease_extended(http, make_executor, clock, gate):
    """Once half its responseTimeoutSeconds passed, a running task gets IN_PROGRESS with extendLease=true."""
    http.add("POST", TASKS_URL, body="")
    started = []
    executor = make_executor()
    executor.submit(raw_task(response_timeout=10), blocking_tool(gate, started))
    eventually(lambda: started, timeout=5.0)
    clock.advance(5.0)
    eventually(lambda: posted(http), timeout=5.0, message="a lease extension")
    assert [{**base(), "status": "IN_PROGRESS", "extendLease": True, "outputData": {}}] == posted(http)
    gate.set()
    eventually(lambda: executor.in_flight_count == 0, timeout=5.0)
    assert ["IN_PROGRESS", "COMPLETED"] == [b["status"] for b in posted(http)]


# --- shutdown ---------------------------------------------------------------------------------


def test_shutdown_hands_still_running_tasks_back(http, make_executor, clock, gate):
    """A tool still running when the grace period ends has its task handed back (requeued IN_PROGRESS,
    not FAILED: the agent's join would show a failure to the model and drop the retry's result)."""
    http.add("POST", TASKS_URL, body="")
    started = []
    executor = make_executor()
    executor.submit(raw_task(), blocking_tool(gate, started))
    eventually(lambda: started, timeout=5.0)
    clock.auto_advance = 1.0  # the grace period is measured on the clock: each reading moves it 1 s on
    executor.close(grace=1.0)
    assert [{**base(), "status": "IN_PROGRESS", "callbackAfterSeconds": 1, "outputData": {},
             "logs": [{"log": "the worker shut down before the tool finished"}]}] == posted(http)
    gate.set()
    eventually(lambda: executor.in_flight_count == 0, timeout=5.0)


def test_shutdown_lets_tools_finish_within_the_grace_period(http, make_executor, gate):
    """A tool that ends within the grace period posts its result and nothing is reported FAILED."""
    http.add("POST", TASKS_URL, body="")
    started = []
    executor = make_executor()
    executor.submit(raw_task(), blocking_tool(gate, started))
    eventually(lambda: started, timeout=5.0)
    closer = threading.Thread(target=executor.close, args=(30.0,), name="test-closer")
    closer.start()
    gate.set()
    closer.join(timeout=5.0)
    assert (False, ["COMPLETED"]) == (closer.is_alive(), [b["status"] for b in posted(http)])


def test_no_tasks_accepted_after_shutdown(http, make_executor):
    """After shutdown submit refuses tasks, and a second shutdown does nothing."""
    executor = make_executor()
    executor.close(grace=1.0)
    executor.close(grace=1.0)
    assert (False, 0) == (executor.submit(raw_task(), echo), len(http.calls))


# --- fullness (busy is not dead) ----------------------------------------------------------------


def test_full_within_tells_a_full_pool_from_one_that_has_been_free_long_enough(http, make_executor, clock, gate):
    """threads=2 holds 4 tasks: full while 4 are in flight, and for ``seconds`` after one finished."""
    http.add("POST", TASKS_URL, body="")

    @tool
    def hold(city: str) -> dict:
        """Block until the test opens the gate."""
        gate.wait(GATE_TIMEOUT)
        return {}

    executor = make_executor()
    never_full = executor.full_within(3600.0)
    for i in range(4):
        executor.submit(raw_task(f"t-{i}"), hold)
    full_now = (executor.free_slots(), executor.full_within(0.0))
    gate.set()
    eventually(lambda: executor.in_flight_count == 0, timeout=GATE_TIMEOUT, message="the tools to finish")
    clock.advance(30.0)
    assert (False, (0, True)) == (never_full, full_now)
    assert (True, False) == (executor.full_within(30.0), executor.full_within(29.9))


def test_a_token_usage_termination_gets_the_runs_usage_from_the_server(http, make_executor):
    """A Termination.token_usage check reads GET /agent/execution/{id} and decides on its tokenUsage."""
    from conductor_agents import Termination
    from conductor_agents._teams.termination import termination_worker

    http.add("POST", TASKS_URL, body="")
    http.add("GET", BASE_URL + "/agent/execution/wf-1",
             json={"tokenUsage": {"promptTokens": 30, "completionTokens": 15, "totalTokens": 45}})
    worker = termination_worker("desk", Termination.token_usage(max_total_tokens=40))
    run_to_end(make_executor(), raw_task(input_data={"result": "", "iteration": 3}, task_type=worker.name), worker)
    assert posted(http)[-1]["outputData"] == {"should_continue": False}
    plain = termination_worker("desk", Termination.max_messages(9))
    run_to_end(make_executor(), raw_task("t-2", input_data={"result": "", "iteration": 3}, task_type=plain.name),
               plain)
    assert posted(http)[-1]["outputData"] == {"should_continue": True}
    assert sum("/agent/execution/" in c.request.url for c in http.calls) == 1  # only the usage check reads it
