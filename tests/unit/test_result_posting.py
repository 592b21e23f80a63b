"""Posting tool results: every failure that may pass is retried until the server takes the result
or the runtime's close grace ends; DROPPED only when the server says the task is gone (issue 11)."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import requests

from conductor_agents._wire.api import ConductorApi
from conductor_agents._worker.executor import TaskRef, ToolExecutor
from conductor_agents._wire.transport import Transport
from tests.unit.fakes import BASE_URL, FakeClock, FakeEvent

TASKS_URL = BASE_URL + "/tasks"
TOKEN_URL = BASE_URL + "/token"
TASK = TaskRef(task_id="t-1", workflow_id="wf-1", task_type="lookup", reference_name="lookup_ref",
               input_data={}, response_timeout_seconds=3600)
RESULT = {"workflowInstanceId": "wf-1", "taskId": "t-1", "workerId": "w", "status": "COMPLETED",
          "outputData": {"result": "Oslo"}}


class ClosingAfter(FakeEvent):
    """An abandon event that is set (the runtime's grace ended) after ``waits`` pauses."""

    def __init__(self, clock: FakeClock, waits: int) -> None:
        super().__init__(clock)
        self._left = waits

    def wait(self, timeout=None):
        self._left -= 1
        if self._left < 0:
            self.set()
        return super().wait(timeout)


def post(http, clock, abandon, *, auth=False):
    """Post RESULT the way a tool pool thread does (through the executor); True once accepted."""
    transport = Transport(BASE_URL, clock=clock, auth_key="key" if auth else None,
                          auth_secret="secret" if auth else None)
    executor = ToolExecutor(ConductorApi(transport), threads=1, worker_id="w", clock=clock)
    executor._abandon = abandon  # the fake moves the clock instead of sleeping
    try:
        executor._post_result(TASK, RESULT)
    finally:
        executor._abandon = threading.Event()
        executor.close(grace=0.1)
    last = [c for c in http.calls if c.request.url == TASKS_URL][-1]
    return getattr(last.response, "status_code", None) == 200


def task_posts(http):
    return [json.loads(c.request.body) for c in http.calls if c.request.url == TASKS_URL]


@pytest.mark.parametrize("failure", [
    dict(status=503, body="busy"), dict(status=500, body="oops"), dict(status=502, body="bad gateway"),
    dict(status=504, body="timeout"), dict(status=429, body="slow down"), dict(status=408, body="timeout"),
    dict(body=requests.ConnectionError("refused")), dict(body=requests.ReadTimeout("slow")),
], ids=["503", "500", "502", "504", "429", "408", "connection", "read-timeout"])
def test_each_failure_that_may_pass_is_retried_until_accepted(http, failure):
    clock = FakeClock()
    for _ in range(3):
        http.add("POST", TASKS_URL, **failure)
    http.add("POST", TASKS_URL, body="")
    abandon = FakeEvent(clock)
    assert post(http, clock, abandon) is True
    assert [RESULT] * 4 == task_posts(http)
    assert [0.25, 0.5, 1.0] == abandon.waits


def test_a_503_burst_longer_than_ten_minutes_is_outlasted(http, caplog):
    """No fixed retry window: an hour of 503s (the task's lease) and the result still lands, once."""
    caplog.set_level(logging.DEBUG, logger="conductor_agents.worker")
    clock = FakeClock()
    for _ in range(720):
        http.add("POST", TASKS_URL, status=503, body="busy")
    http.add("POST", TASKS_URL, body="")
    abandon = FakeEvent(clock)
    assert post(http, clock, abandon) is True
    assert 721 == len(task_posts(http))
    assert clock.elapsed > 3000 and max(abandon.waits) == 5.0  # bounded backoff
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert 0 < len(warnings) <= 720 // 12 + 1  # a long outage does not log a line per attempt


def test_the_token_endpoint_failing_is_retried(http):
    """A 5xx from POST /token (no token, so no POST /tasks yet) is retried like any outage."""
    clock = FakeClock()
    http.add("POST", TOKEN_URL, status=503, body="busy")
    http.add("POST", TOKEN_URL, status=500, body="oops")
    http.add("POST", TOKEN_URL, json={"token": "tok-1"})
    http.add("POST", TASKS_URL, body="")
    assert post(http, clock, FakeEvent(clock), auth=True) is True
    [call] = [c for c in http.calls if c.request.url == TASKS_URL]
    assert call.request.headers["X-Authorization"] == "tok-1"


def test_an_auth_refresh_that_fails_is_retried(http):
    """The token expired (401), refreshing it fails (401, then 502): retried until a fresh token works."""
    clock = FakeClock()
    http.add("POST", TOKEN_URL, json={"token": "old"})
    http.add("POST", TASKS_URL, status=401, body="expired")
    http.add("POST", TOKEN_URL, status=401, body="no")
    http.add("POST", TOKEN_URL, status=502, body="bad gateway")
    http.add("POST", TOKEN_URL, json={"token": "new"})
    http.add("POST", TASKS_URL, body="")
    assert post(http, clock, FakeEvent(clock), auth=True) is True
    tasks = [c for c in http.calls if c.request.url == TASKS_URL]
    assert ["old", "new"] == [c.request.headers["X-Authorization"] for c in tasks]


def test_retries_end_when_the_close_grace_ends(http, caplog):
    """Once the runtime's grace is over (abandon set) the result is given up and logged DROPPED."""
    caplog.set_level(logging.ERROR, logger="conductor_agents.worker")
    clock = FakeClock()
    http.add("POST", TASKS_URL, status=503, body="busy")
    assert post(http, clock, ClosingAfter(clock, waits=5)) is False
    assert 6 == len(task_posts(http))
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("DROPPED the COMPLETED result of task t-1") and "runtime closed" in error


def test_a_task_the_server_no_longer_knows_is_dropped_at_once(http, caplog):
    caplog.set_level(logging.ERROR, logger="conductor_agents.worker")
    clock = FakeClock()
    http.add("POST", TASKS_URL, status=503, body="busy")
    http.add("POST", TASKS_URL, status=404, json={"message": "No such task found by id: t-1"})
    assert post(http, clock, FakeEvent(clock)) is False
    assert 2 == len(task_posts(http))
    [error] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("DROPPED") and "No such task" in error
