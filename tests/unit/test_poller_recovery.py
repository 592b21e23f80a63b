"""Unit tests for DomainPoller after failed polls (issue 19): the back-off resets on the first poll
that works, is capped (at a quarter of the stall threshold through the runtime), a ring cuts it short
(a task is known to wait), and the first working poll after failures is reported (the watchdog then
samples the domain's runs at once, so a stall that is over is not raised by a later wait())."""

from __future__ import annotations

import threading
import time

from conductor_agents._worker import poller as _poller
from conductor_agents._worker.poller import DomainPoller
from conductor_agents.errors import ServerUnavailableError
from tests.unit.fakes import FakeClock

DOMAIN = "0123456789abcdef0123456789abcdef"


class Executor:
    def __init__(self):
        self.submitted = []

    def free_slots(self):
        return 4

    def submit(self, task, tool_def):
        self.submitted.append(task)


class FlakyApi:
    """Fails the polls while ``down`` is set; otherwise answers with the queued tasks (then none)."""

    def __init__(self):
        self.down = True
        self.polls = []
        self.tasks = []

    def poll_tasks(self, task_type, *, worker_id, domain, count, timeout_ms, http_timeout):
        self.polls.append(time.monotonic())
        if self.down:
            raise ServerUnavailableError("cannot reach the server")
        tasks, self.tasks = self.tasks, []
        return tasks


def make(clock=None, **kwargs):
    api, executor = FlakyApi(), Executor()
    poller = DomainPoller(api, executor, domain=DOMAIN, worker_id="w", long_poll_ms=1000, poll_interval_ms=1,
                          clock=clock or FakeClock(), **kwargs)
    poller._tools = {"act": object()}
    poller._polled.add("act")
    return poller, api, executor


def test_the_backoff_doubles_while_polls_fail_and_resets_on_the_first_that_works():
    poller, api, _ = make()
    backoff, seen = 0.0, []
    for _ in range(7):
        backoff = poller._poll_round(("act",), backoff)
        seen.append(backoff)
    assert seen == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    api.down = False
    assert poller._poll_round(("act",), backoff) == 0.0
    api.down = True
    assert poller._poll_round(("act",), 0.0) == 0.2  # starts over: nothing of the outage is kept


def test_the_backoff_is_capped_by_max_backoff_but_never_below_the_rung_retry():
    poller, _, _ = make(max_backoff=1.0)  # the runtime gives a quarter of a 4 s threshold
    backoff = 0.0
    for _ in range(10):
        backoff = poller._poll_round(("act",), backoff)
    assert backoff == 1.0
    tiny, _, _ = make(max_backoff=0.01)
    backoff = 0.0
    for _ in range(10):
        backoff = tiny._poll_round(("act",), backoff)
    assert backoff == _poller._RUNG_RETRY_SECONDS


def test_a_ring_cuts_the_pause_after_a_failure_short():
    poller, _, _ = make()
    threading.Timer(0.05, poller.ring).start()
    started = time.monotonic()
    poller._pause_after_failure(5.0)
    assert time.monotonic() - started < _poller._RUNG_RETRY_SECONDS + 0.5


def test_without_a_ring_the_pause_lasts_its_backoff_and_stop_ends_it():
    poller, _, _ = make()
    started = time.monotonic()
    poller._pause_after_failure(0.8)
    assert 0.75 <= time.monotonic() - started < 2.0
    threading.Timer(0.05, poller.stop).start()
    started = time.monotonic()
    poller._pause_after_failure(5.0)
    assert time.monotonic() - started < 1.0


def test_the_first_working_round_after_failures_is_reported_once_after_its_tasks_were_taken():
    heard = []
    poller, api, executor = make(on_recovered=lambda p: heard.append(len(executor.submitted)))
    poller._poll_round(("act",), 0.0)
    poller._poll_round(("act",), 0.2)
    assert heard == []
    api.down = False
    api.tasks = [{"taskType": "act", "taskId": "t1", "workflowInstanceId": "e"}]
    poller._poll_round(("act",), 0.4)
    assert heard == [1]  # told after the task was taken (the server counts it polled)
    poller._poll_round(("act",), 0.0)
    assert heard == [1]  # once per recovery


def test_the_recovery_listener_learns_which_types_failed_to_poll_once():
    """Their answers may have carried tasks that never arrived (the watchdog then looks for them)."""
    heard = []
    poller, api, _ = make(on_recovered=lambda p: heard.append(p.take_failed_types()))
    poller._poll_round(("act",), 0.0)
    api.down = False
    poller._poll_round(("act",), 0.2)
    assert heard == [frozenset({"act"})]
    assert poller.take_failed_types() == frozenset()  # taken: the next recovery starts from nothing


def test_a_healed_poller_thread_takes_a_waiting_task_within_the_rung_retry(monkeypatch):
    """The loop: polls fail long enough for the back-off to reach 5 s; the server comes back and a
    ring (the watcher counts the waiting task) gets the task taken within about half a second, not
    at the end of the 5 s pause."""
    from conductor_agents._common.clock import SYSTEM_CLOCK

    poller, api, executor = make(clock=SYSTEM_CLOCK)
    poller._tools = {}
    poller.start()
    try:
        poller.add_execution("e", {"act": object()})
        deadline = time.monotonic() + 30
        while poller.poll_errors < 7 and time.monotonic() < deadline:  # 0.2+0.4+0.8+1.6+3.2+5 s
            time.sleep(0.05)
        assert poller.poll_errors >= 7
        api.tasks = [{"taskType": "act", "taskId": "t1", "workflowInstanceId": "e"}]
        api.down = False
        healed = time.monotonic()
        while not executor.submitted and time.monotonic() - healed < 10:
            poller.ring()  # what the watcher does while the task waits (every round)
            time.sleep(0.05)
        took = time.monotonic() - healed
        assert executor.submitted and took < _poller._RUNG_RETRY_SECONDS + 0.5, took
    finally:
        poller.stop()
        assert poller.join(5)
