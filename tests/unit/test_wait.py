"""Unit tests for AgentHandle.wait: deadline, transient-error budget, stall flag, caching."""

import pytest
import requests
import responses

from conductor_agents._listener.directory import Chain
from conductor_agents._wire.api import ConductorApi
from conductor_agents._liveness.stall import Stall, stall_error
from conductor_agents._wire.transport import HttpError, Transport
from conductor_agents.errors import (
    ExecutionNotFoundError,
    ServerUnavailableError,
    WaitTimeoutError,
    WorkerStallError,
)
from conductor_agents.handle import AgentHandle
from conductor_agents.result import AgentResult, RunStatus, TokenUsage
from conductor_agents.settings import AgentSettings
from tests.unit.fakes import BASE_URL, FakeClock, FakeEvent, FakeWatch, status_body

EXEC = "wf-42"
RUN_ID = "0123456789abcdef0123456789abcdef"
STATUS = f"{BASE_URL}/agent/{EXEC}/status"
DETAIL = f"{BASE_URL}/agent/execution/{EXEC}"
WORKFLOW = f"{BASE_URL}/workflow/{EXEC}"
STALL = stall_error(EXEC, Stall(task_reference_name="lookup_ref_3", task_type="lookup", domain=RUN_ID,
                                 waited_seconds=41.5))

RUNNING = {"json": status_body(EXEC, "RUNNING")}
COMPLETED = {"json": status_body(EXEC, "COMPLETED", output={"result": "all done", "finishReason": "STOP"})}
UNAVAILABLE = {"body": requests.ConnectionError("connection refused")}
E503 = {"status": 503, "json": {"message": "unavailable"}}
E429 = {"status": 429, "json": {"message": "slow down"}}
E502 = {"status": 502, "body": "bad gateway"}


@pytest.fixture
def http():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add("GET", DETAIL, json={"tokenUsage": {"promptTokens": 7, "completionTokens": 3, "totalTokens": 10}})
        mock.add("GET", WORKFLOW, json={"status": "COMPLETED", "tasks": [
            {"taskType": "LLM_CHAT_COMPLETE", "referenceTaskName": "llm"},
            {"taskType": "lookup", "referenceTaskName": "lookup_1", "status": "COMPLETED",
             "inputData": {"city": "Oslo"}, "outputData": {"t": 1}},
        ]})
        yield mock


def statuses(http, *answers):
    """Answer the status endpoint with ``answers`` in order (the last one repeats)."""
    for answer in answers:
        http.add("GET", STATUS, **answer)


def status_calls(http):
    return sum(1 for c in http.calls if c.request.url.split("?")[0] == STATUS)


def make_handle(*, liveness=None, on_terminal=None, **settings):
    """A handle on EXEC whose sleeps advance a fake clock instead of blocking."""
    clock = FakeClock()
    handle = AgentHandle(
        chain=Chain(EXEC), api=ConductorApi(Transport(BASE_URL, clock=clock)), execution_id=EXEC, agent_name="listener",
        run_id=RUN_ID, settings=AgentSettings(server_url=BASE_URL, **settings), clock=clock,
        liveness=liveness, on_terminal=on_terminal,
    )
    handle._wake = FakeEvent(clock)  # wait() sleeps on _wake; the fake moves the clock instead
    return handle, clock


# --- the deadline ------------------------------------------------------------------------------


def test_deadline_polls_five_times_in_two_seconds(http):
    """With a 0.5 s poll interval and timeout=2.0 wait polls 5 times, then raises WaitTimeoutError."""
    statuses(http, RUNNING)
    handle, clock = make_handle()
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait(timeout=2.0)
    assert 5 == status_calls(http)
    assert [0.5, 0.5, 0.5, 0.5] == handle._wake.waits
    assert 2.0 == clock.elapsed
    err = info.value
    assert (EXEC, 2.0) == (err.execution_id, err.timeout)
    assert isinstance(err, TimeoutError)


def test_deadline_message_says_the_run_goes_on(http):
    """The timeout message names the run, its last status and says it goes on on the server."""
    statuses(http, RUNNING)
    handle, _ = make_handle()
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait(timeout=2.0)
    message = str(info.value)
    assert EXEC in message
    assert "still RUNNING" in message
    assert "goes on on the server" in message


def test_deadline_message_says_the_run_is_not_cancelled(http):
    """The timeout message states outright that the run was not cancelled."""
    statuses(http, RUNNING)
    handle, _ = make_handle()
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait(timeout=2.0)
    assert "not cancelled" in str(info.value)


def test_default_deadline_is_600_seconds(http):
    """Without timeout= wait gives up after the settings' 600 s default."""
    statuses(http, RUNNING)
    handle, clock = make_handle(status_poll_interval_seconds=100.0)
    assert 600.0 == AgentSettings().wait_timeout_seconds
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait()
    assert (600.0, 600.0, 7) == (info.value.timeout, clock.elapsed, status_calls(http))


def test_deadline_comes_from_settings(http):
    """wait_timeout_seconds in the settings sets the default deadline."""
    statuses(http, RUNNING)
    handle, clock = make_handle(wait_timeout_seconds=1.0)
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait()
    assert (1.0, 1.0, 3) == (info.value.timeout, clock.elapsed, status_calls(http))


def test_last_sleep_is_cut_to_the_deadline(http):
    """The last pause is shortened so wait never overshoots its deadline."""
    statuses(http, RUNNING)
    handle, clock = make_handle()
    with pytest.raises(WaitTimeoutError):
        handle.wait(timeout=1.2)
    assert [0.5, 0.5, 0.2] == [round(w, 9) for w in handle._wake.waits]
    assert 4 == status_calls(http)


@pytest.mark.parametrize("timeout", [0, -1.0])
def test_non_positive_timeout_is_value_error(http, timeout):
    """timeout <= 0 is a ValueError and sends nothing."""
    handle, _ = make_handle()
    with pytest.raises(ValueError):
        handle.wait(timeout=timeout)
    assert 0 == len(http.calls)


def test_a_fraction_or_an_integral_timeout_is_a_number_of_seconds(http):
    """Any numbers.Real is a timeout (a NumPy integer, a Fraction): the wait takes its float()."""
    from fractions import Fraction

    from tests.unit.test_checks import Count

    statuses(http, RUNNING)
    handle, clock = make_handle()
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait(timeout=Fraction(1, 2))
    assert (0.5, 0.5) == (info.value.timeout, clock.elapsed)
    with pytest.raises(WaitTimeoutError) as info:
        handle.wait(timeout=Count(1))
    assert 1.0 == info.value.timeout


def test_wait_again_after_timeout_returns_the_result(http):
    """After a WaitTimeoutError, wait() may be called again and returns once the run ends."""
    statuses(http, RUNNING, RUNNING, COMPLETED)
    handle, _ = make_handle()
    with pytest.raises(WaitTimeoutError):
        handle.wait(timeout=0.5)
    assert RunStatus.COMPLETED is handle.wait(timeout=10).status


# --- results -----------------------------------------------------------------------------------


def test_terminal_status_returns_the_result(http):
    """A terminal status ends the wait with an AgentResult built from status, detail and tasks."""
    statuses(http, RUNNING, RUNNING, COMPLETED)
    handle, clock = make_handle()
    result = handle.wait()
    assert isinstance(result, AgentResult)
    assert (EXEC, RunStatus.COMPLETED, "all done", "STOP", TokenUsage(7, 3, 10), ("lookup_1",), 1.0) == (
        result.execution_id, result.status, result.output, result.finish_reason, result.token_usage,
        tuple(c.task_reference_name for c in result.tool_calls), clock.elapsed)


@pytest.mark.parametrize("status", ["FAILED", "TERMINATED", "TIMED_OUT"])
def test_unsuccessful_ends_are_results_not_errors(http, status):
    """FAILED, TERMINATED and TIMED_OUT come back as results carrying the reason."""
    statuses(http, {"json": status_body(EXEC, status, reasonForIncompletion="it broke")})
    result = make_handle()[0].wait()
    assert (RunStatus(status), "it broke", False) == (result.status, result.error, result.ok)


def test_second_wait_returns_the_cached_result(http):
    """A second wait() returns the same result without asking the server again."""
    statuses(http, COMPLETED)
    handle, _ = make_handle()
    first = handle.wait()
    calls = len(http.calls)
    assert first is handle.wait()
    assert calls == len(http.calls)


def test_unreadable_details_still_give_a_result(http):
    """If the run detail cannot be read, wait still returns the result from the status."""
    http.replace("GET", DETAIL, status=500, body="oops")
    statuses(http, COMPLETED)
    result = make_handle()[0].wait()
    assert (RunStatus.COMPLETED, "all done", TokenUsage()) == (result.status, result.output, result.token_usage)


def test_on_terminal_is_told(http):
    """The on_terminal hook hears the execution id once the run ends."""
    seen = []
    statuses(http, COMPLETED)
    make_handle(on_terminal=seen.append)[0].wait()
    assert [EXEC] == seen


# --- transient errors --------------------------------------------------------------------------


def test_three_transient_errors_are_tolerated(http):
    """Three consecutive transient errors (connection, 5xx, 429) do not end the wait."""
    statuses(http, UNAVAILABLE, E503, E429, COMPLETED)
    assert RunStatus.COMPLETED is make_handle()[0].wait().status
    assert 4 == status_calls(http)


def test_fourth_consecutive_transient_error_raises(http):
    """The fourth consecutive transient error is raised."""
    statuses(http, E503, UNAVAILABLE, E429, E502, COMPLETED)
    with pytest.raises(HttpError) as info:
        make_handle()[0].wait()
    assert (502, 4) == (info.value.status, status_calls(http))


def test_fourth_connection_error_raises_server_unavailable(http):
    """When the fourth transient error is a connection error, ServerUnavailableError is raised."""
    statuses(http, UNAVAILABLE)
    with pytest.raises(ServerUnavailableError):
        make_handle()[0].wait()
    assert 4 == status_calls(http)


def test_a_success_resets_the_error_count(http):
    """A good status answer resets the count: 3 errors, success, 3 errors, end is fine."""
    statuses(http, E503, E503, E503, RUNNING, UNAVAILABLE, E429, E503, COMPLETED)
    assert RunStatus.COMPLETED is make_handle()[0].wait().status
    assert 8 == status_calls(http)


def test_budget_comes_from_settings(http):
    """max_transient_errors=0 makes the first transient error fatal."""
    statuses(http, E503, COMPLETED)
    with pytest.raises(HttpError):
        make_handle(max_transient_errors=0)[0].wait()
    assert 1 == status_calls(http)


def test_404_raises_at_once(http):
    """A 404 is not transient: ExecutionNotFoundError on the first answer."""
    statuses(http, {"status": 404, "json": {"message": "no such workflow"}})
    with pytest.raises(ExecutionNotFoundError) as info:
        make_handle()[0].wait()
    assert (EXEC, 1) == (info.value.execution_id, status_calls(http))


def test_404_after_transient_errors_raises_at_once(http):
    """A 404 following transient errors is raised immediately, not counted."""
    statuses(http, E503, E503, {"status": 404}, COMPLETED)
    with pytest.raises(ExecutionNotFoundError):
        make_handle()[0].wait()
    assert 3 == status_calls(http)


def test_non_transient_status_raises_at_once(http):
    """A 400 is raised at once."""
    statuses(http, {"status": 400, "body": "bad"}, COMPLETED)
    with pytest.raises(HttpError) as info:
        make_handle()[0].wait()
    assert (400, 1) == (info.value.status, status_calls(http))


# --- the stall flag -----------------------------------------------------------------------------


def test_stall_flag_raises_worker_stall_error(http):
    """A stall raises WorkerStallError with task, execution, domain and waited time."""
    statuses(http, RUNNING)
    handle, _ = make_handle(liveness=FakeWatch(stall=STALL))
    with pytest.raises(WorkerStallError) as info:
        handle.wait()
    err = info.value
    assert ("lookup_ref_3", EXEC, RUN_ID, 41.5) == (
        err.task_reference_name, err.execution_id, err.domain, err.waited_seconds)


def test_stall_message_says_what_to_do(http):
    """The stall message names the task, run and domain and points at runtime.resume."""
    statuses(http, RUNNING)
    handle, _ = make_handle(liveness=FakeWatch(stall=STALL))
    with pytest.raises(WorkerStallError) as info:
        handle.wait()
    message = str(info.value)
    for part in ("lookup_ref_3", EXEC, RUN_ID, "41.5s", "runtime.resume"):
        assert part in message


def test_a_stall_flagged_before_wait_raises_without_a_status_poll(http):
    """A stall the watchdog found before wait() is raised at once: no status request is sent."""
    statuses(http, RUNNING)
    handle, clock = make_handle(liveness=FakeWatch(stall=STALL))
    with pytest.raises(WorkerStallError):
        handle.wait()
    assert (0, 0.0) == (status_calls(http), clock.elapsed)


def test_each_wait_raises_a_fresh_error_and_the_flag_stays(http):
    """wait() raises a new error each time (no traceback piling up); handle.stall keeps the watchdog's."""
    statuses(http, RUNNING)
    handle, _ = make_handle(liveness=FakeWatch(stall=STALL))
    raised = []
    for _ in range(2):
        with pytest.raises(WorkerStallError) as info:
            handle.wait()
        raised.append(info.value)
    assert (False, True, False) == (raised[0] is raised[1], handle.stall is STALL, raised[0] is STALL)


def test_stall_found_between_polls_is_raised_before_the_next_poll(http):
    """A stall flagged while wait runs is raised before the following status poll."""
    watch = FakeWatch()
    answered = []

    def answer(request):
        answered.append(request.url)
        if len(answered) == 2:
            watch.flag(STALL)
        return 200, {"Content-Type": "application/json"}, '{"executionId": "wf-42", "status": "RUNNING"}'

    http.add_callback("GET", STATUS, callback=answer)
    handle, _ = make_handle(liveness=watch)
    with pytest.raises(WorkerStallError):
        handle.wait()
    assert 2 == status_calls(http)


def test_a_stall_wakes_the_waiting_thread(http):
    """The handle listens on its run's watch: a stall sets the event wait() sleeps on."""
    watch = FakeWatch()
    handle, _ = make_handle(liveness=watch)
    assert (1, False) == (len(watch.listeners), handle._wake.is_set())
    watch.flag(STALL)
    assert True is handle._wake.is_set()


def test_a_cleared_stall_lets_wait_return_the_result(http):
    """Once the watchdog clears the flag (the task was polled after all), wait() polls and returns."""
    statuses(http, COMPLETED)
    watch = FakeWatch(stall=STALL)
    handle, _ = make_handle(liveness=watch)
    with pytest.raises(WorkerStallError):
        handle.wait()
    watch.stall = None
    assert (RunStatus.COMPLETED, None) == (handle.wait().status, handle.stall)


def test_stall_is_none_without_liveness(http):
    """A handle without a watch (attach(), liveness off) never reports a stall."""
    statuses(http, COMPLETED)
    handle, _ = make_handle()
    assert (None, RunStatus.COMPLETED) == (handle.stall, handle.wait().status)


# --- cancel ------------------------------------------------------------------------------------


def test_cancel_ends_again_a_run_that_a_racing_stop_brought_back(http):
    """The server's stop rewrites the run it read, without a lock: racing a cancel it can leave the run
    RUNNING (seen on 3.32.3: 1 in 30 races). cancel() reads the run back and ends it again."""
    cancel = f"{BASE_URL}/agent/{EXEC}/cancel"
    http.add("DELETE", cancel, status=200)
    statuses(http, RUNNING, {"json": status_body(EXEC, "TERMINATED")})
    handle, _ = make_handle()
    handle.cancel()
    assert 2 == sum(1 for c in http.calls if c.request.url.split("?")[0] == cancel)
