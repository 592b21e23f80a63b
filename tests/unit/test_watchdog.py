"""Unit tests for conductor_agents._liveness.watchdog: one thread samples every run for its end and its liveness.

Time is a FakeClock and samples are taken with ``run_due()`` on the test's thread, except in
the last section, which checks the real thread's lifecycle.
"""

import logging
import threading
from email.utils import formatdate

import pytest
import responses

from conductor_agents._wire.api import ConductorApi, TaskPage
from conductor_agents._wire.transport import Transport
from conductor_agents._liveness.watchdog import RunWatchdog
from conductor_agents.errors import ExecutionNotFoundError, ServerUnavailableError, WorkerStallError
from tests.helpers import eventually
from tests.unit.fakes import BASE_URL, WALL_START, FakeClock

DOMAIN = "0123456789abcdef0123456789abcdef"
EXEC = "wf-7"
INTERVAL = 10.0
STALL_SECONDS = 30.0
SERVER_NOW = WALL_START
SERVER_DATE = formatdate(WALL_START, usegmt=True)


def task(ref, *, age, domain=DOMAIN, status="SCHEDULED", poll_count=0, task_type="lookup"):
    """A task of the run's task list, scheduled ``age`` seconds before SERVER_NOW (server clock)."""
    return {"taskId": f"id-{ref}", "referenceTaskName": ref, "taskType": task_type, "status": status,
            "pollCount": poll_count, "domain": domain, "scheduledTime": int((SERVER_NOW - age) * 1000)}


def running(*tasks):
    return {"status": "RUNNING", "tasks": list(tasks)}


class FakeApi:
    """The calls the watchdog makes, answered from per-run scripts (the last answer repeats); the task
    results it posts (``nudges.py``) are recorded in ``updates``."""

    def __init__(self, server_now=SERVER_NOW):
        self.answers = {}
        self.calls = []
        self.updates = []
        self.poll_rows = []
        self.server_now = server_now

    def answer(self, execution_id, *answers):
        self.answers[execution_id] = list(answers)

    def _next(self, execution_id):
        answers = self.answers.get(execution_id) or [running()]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def liveness_sample(self, execution_id):
        self.calls.append(("tasks", execution_id))
        date = formatdate(self.server_now, usegmt=True) if self.server_now is not None else None
        return self._next(execution_id), date

    def workflow_status(self, execution_id, include_variables=False):
        self.calls.append(("status", execution_id))
        workflow = self._next(execution_id)
        return {k: v for k, v in workflow.items() if k != "tasks"}

    def get_workflow(self, execution_id, include_tasks=False):
        """The one-time read of the run's name, or of a failed run's reason (not counted: it is no sample); from its
        next answer."""
        answers = self.answers.get(execution_id) or [running()]
        answer = answers[0]
        if isinstance(answer, Exception):
            return {}
        return {k: v for k, v in answer.items() if k in ("workflowName", "workflowVersion", "status",
                                                          "reasonForIncompletion")}

    def workflow_tasks(self, execution_id, *, start=0, count=15, statuses=()):
        """A page of a run's tasks in ``statuses`` (a listener's current run, read with its mailbox)."""
        self.calls.append(("page", execution_id))
        tasks = self._next(execution_id)["tasks"]
        return TaskPage(total=len(tasks), tasks=[t for t in tasks if not statuses or t["status"] in statuses],
                        date=None)

    def update_task(self, result):
        self.calls.append(("update", result["workflowInstanceId"]))
        self.updates.append(result)

    def poll_data(self, task_type):
        self.calls.append(("polldata", task_type))
        return list(self.poll_rows)

    running_ids = None  # workflow name -> ids (or an exception to raise); None: the method is missing

    def running_workflow_ids(self, workflow_name, version=None):
        self.calls.append(("running", workflow_name))
        answer = (self.running_ids or {}).get(workflow_name, [])
        if isinstance(answer, Exception):
            raise answer
        return list(answer)

    def count(self, kind, execution_id=None):
        return sum(1 for k, e in self.calls if k == kind and (execution_id is None or e == execution_id))


class Host:
    """What the WorkerSet gives the watchdog: ended runs, busy domains, rings."""

    def __init__(self):
        self.ended = []
        self.busy = set()
        self.rings = []


def make(api=None, clock=None, host=None, **kwargs):
    api = api if api is not None else FakeApi()
    clock = clock if clock is not None else FakeClock()
    host = host if host is not None else Host()
    watchdog = RunWatchdog(api, interval=INTERVAL, stall_seconds=STALL_SECONDS, on_ended=host.ended.append,
                           is_busy=lambda d: d in host.busy, ring=host.rings.append, clock=clock, **kwargs)
    return watchdog, api, clock, host


@pytest.fixture
def no_thread(monkeypatch):
    """Watch without starting the real thread: these tests drive samples with run_due()."""
    monkeypatch.setattr(RunWatchdog, "_start_thread", lambda self: None)


def tick(watchdog, clock, seconds=INTERVAL):
    clock.advance(seconds)
    return watchdog.run_due()


# --- the stall rule on sampled runs ----------------------------------------------------------


def test_a_task_unpolled_past_the_threshold_stalls_the_run(no_thread):
    """A run whose domain task waited 45 s unpolled gets a WorkerStallError on its watch."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("late", age=45)))
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    assert (None, 1) == (watch.stall, tick(watchdog, clock))
    assert isinstance(watch.stall, WorkerStallError)
    assert ("late", EXEC, DOMAIN, 45.5) == (watch.stall.task_reference_name, watch.stall.execution_id,
                                            watch.stall.domain, watch.stall.waited_seconds)


def test_a_listeners_run_that_stalls_is_logged_by_the_id_callers_hold(no_thread, caplog):
    """The warning named a continued listener's run only, an id the caller never held (issue 41, point 4)."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("late", age=45)))
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    watch.listener_id = "mailbox-1"  # as the listener's tracker sets it
    with caplog.at_level(logging.WARNING, logger="conductor_agents.liveness"):
        tick(watchdog, clock)
    assert [r.getMessage() for r in caplog.records] == [
        f"listener mailbox-1 (its run {EXEC}): task late (domain {DOMAIN}) has not been polled for 45.5s"]


def test_a_watch_with_a_successor_goes_on_in_the_newer_run_when_its_run_ends(no_thread):
    """An observer's watch of a continued listener with no mailbox samples a link; when the link ends (continued),
    the watch goes on in the newer link (it ended there before, and no stall of the listener was seen again), and
    ends with the last link (issue 44)."""
    watchdog, api, clock, host = make()
    newest = ["wf-7"]
    api.answer(EXEC, {"status": "COMPLETED", "tasks": []})
    api.answer("wf-8", running(), running(task("late", age=45)), {"status": "COMPLETED", "tasks": []})
    watch = watchdog.watch(EXEC, domain=DOMAIN, successor=lambda: newest[0])
    newest[0] = "wf-8"
    tick(watchdog, clock)
    assert watch.execution_id == "wf-8" and watch.stall is None
    tick(watchdog, clock)
    tick(watchdog, clock)
    assert watch.stall is not None and watch.stall.execution_id == "wf-8"
    tick(watchdog, clock)  # wf-8 ended, and it is the newest: the watch ends
    assert watch.stall is None and tick(watchdog, clock) == 0
    assert host.ended == []  # not served here: nothing to release


def test_a_watch_whose_run_ended_for_good_is_not_followed(no_thread):
    watchdog, api, clock, _ = make()
    api.answer(EXEC, {"status": "COMPLETED", "tasks": []})
    watch = watchdog.watch(EXEC, domain=DOMAIN, successor=lambda: EXEC)
    tick(watchdog, clock)
    assert watch.execution_id == EXEC and tick(watchdog, clock) == 0


def test_a_paused_run_is_never_stalled_and_its_stall_clears(no_thread):
    """A paused run schedules nothing and its waiting tasks wait for the unpause: no stall, and a stall
    flagged before the pause clears; after the unpause the rule applies again."""
    watchdog, api, clock, _ = make()
    paused = {**running(task("late", age=45)), "status": "PAUSED"}
    api.answer(EXEC, running(task("late", age=45)), paused, running(task("late", age=45)))
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    seen = []
    for _ in range(3):
        tick(watchdog, clock)
        seen.append(watch.stall is not None)
    assert [True, False, True] == seen


def test_no_sample_before_one_interval(no_thread):
    """The first sample of a run is one interval after it is watched, not at once."""
    watchdog, api, clock, _ = make()
    watchdog.watch(EXEC, domain=DOMAIN)
    assert (0, 0) == (tick(watchdog, clock, INTERVAL - 0.01), len(api.calls))
    assert 1 == tick(watchdog, clock, 0.01)


def test_listeners_hear_a_stall_once_until_it_clears(no_thread):
    """Listeners are told when the run stalls, not again while it stays stalled, and again after it cleared."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("a", age=40)), running(task("a", age=50)), running(),
               running(task("b", age=40)))
    heard = []
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    watch.add_listener(heard.append)
    flags = []
    for _ in range(4):
        tick(watchdog, clock)
        flags.append(watch.stall.task_reference_name if watch.stall else None)
    assert (["a", "a", None, "b"], ["a", "b"]) == (flags, [e.task_reference_name for e in heard])


def test_a_listener_that_raises_is_logged_and_the_others_still_hear(no_thread, caplog):
    """An exception in a listener (e.g. on_stall) is logged; the next listener and the watchdog go on."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("a", age=40)))
    heard = []
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    watch.add_listener(lambda error: 1 / 0)
    watch.add_listener(heard.append)
    with caplog.at_level(logging.ERROR, logger="conductor_agents.liveness"):
        tick(watchdog, clock)
    assert (1, 1) == (len(heard), sum("stall listener" in r.getMessage() for r in caplog.records))
    assert 1 == tick(watchdog, clock)  # still sampling


@pytest.mark.parametrize("skew", [-600.0, 0.0, 600.0])
def test_a_skewed_client_clock_neither_raises_nor_hides_a_stall(http, skew, no_thread):
    """Through the real API and Date header: 45 s unpolled is a stall, 10 s is not, whatever the client clock."""
    for execution_id, tasks in ((EXEC, [task("late", age=45)]),
                                (("fresh"), [task("fresh", age=10), task("busy", age=5000, poll_count=1)])):
        http.add("GET", f"{BASE_URL}/workflow/{execution_id}", json={"workflowName": "listener"})
        http.add("GET", f"{BASE_URL}/workflow/{execution_id}/status", json={"status": "RUNNING"})
        http.add("GET", f"{BASE_URL}/workflow/{execution_id}/tasks", headers={"Date": SERVER_DATE},
                 json={"totalHits": len(tasks), "results": tasks})
    http.add("GET", f"{BASE_URL}/tasks/queue/polldata", json=[])
    clock = FakeClock(skew=skew)
    watchdog, _, _, _ = make(api=ConductorApi(Transport(BASE_URL, clock=clock)), clock=clock)
    late, fresh = watchdog.watch(EXEC, domain=DOMAIN), watchdog.watch("fresh", domain=DOMAIN)
    tick(watchdog, clock)
    assert (("late", 45.5), None) == ((late.stall.task_reference_name, late.stall.waited_seconds), fresh.stall)


def test_without_a_date_header_the_first_sighting_decides(no_thread):
    """With no server time the wait is counted from the watchdog's first sighting of the task."""
    watchdog, api, clock, _ = make(api=FakeApi(server_now=None))
    api.answer(EXEC, running(task("t", age=3600)))
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    stalls = []
    for _ in range(5):  # seen at 10, 20, 30, 40, 50 s
        tick(watchdog, clock)
        stalls.append(watch.stall.waited_seconds if watch.stall else None)
    assert ([None, None, None, None, 40.0], 0) == (stalls, api.count("polldata"))


# --- busy is not dead ------------------------------------------------------------------------


def test_a_busy_local_pool_holds_off_the_stall(no_thread):
    """While this process serves the domain with a full pool, an unpolled task is no stall; after, it is."""
    watchdog, api, clock, host = make()
    api.answer(EXEC, running(task("next", age=45)))
    host.busy.add(DOMAIN)
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    tick(watchdog, clock)
    held_off = watch.stall
    host.busy.clear()
    tick(watchdog, clock)
    assert (None, "next") == (held_off, watch.stall.task_reference_name)


@pytest.mark.parametrize("last_poll_age, domain, stalled", [
    (5.0, DOMAIN, False),          # polled 5 s ago: a busy worker elsewhere
    (STALL_SECONDS, DOMAIN, False),  # just within the threshold
    (31.0, DOMAIN, True),          # the last poll is as old as a dead worker's
    (1.0, "another-domain", True),  # someone polls, but not this run's domain
    (None, DOMAIN, True),          # the domain was never polled
])
def test_the_servers_poll_data_tells_busy_from_dead(no_thread, last_poll_age, domain, stalled):
    """A candidate stall is dismissed when the server saw the run's domain polled within the threshold."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("next", age=45)))
    if last_poll_age is not None:
        api.poll_rows = [{"queueName": f"{domain}:lookup", "domain": domain,
                          "lastPollTime": int((SERVER_NOW + 0.5 - last_poll_age) * 1000)}]
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    tick(watchdog, clock)
    assert (stalled, [("polldata", "lookup")]) == (watch.stall is not None,
                                                   [c for c in api.calls if c[0] == "polldata"])


def test_poll_data_is_read_only_for_a_candidate_stall(no_thread):
    """A run with nothing unpolled past the threshold costs one request per sample, no poll-data read."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("young", age=5), task("busy", age=500, poll_count=1)))
    watchdog.watch(EXEC, domain=DOMAIN)
    for _ in range(3):
        tick(watchdog, clock)
    assert [("tasks", EXEC)] * 3 == api.calls


# --- end of run --------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"])
def test_an_ended_served_run_is_released_and_forgotten(no_thread, status):
    """A served run a sample finds ended is reported to on_ended once and no longer sampled."""
    watchdog, api, clock, host = make()
    api.answer(EXEC, {"status": status, "tasks": [task("late", age=400)]})
    watch = watchdog.watch(EXEC, domain=DOMAIN, served=True)
    tick(watchdog, clock)
    tick(watchdog, clock)
    assert ([EXEC], (), None, 1) == (host.ended, watchdog.watched(), watch.stall, len(api.calls))


def test_a_served_run_the_server_failed_by_its_own_fault_is_retried_and_still_watched(no_thread):
    """FAILED with "Error scheduling tasks" (a Redis restart as the server wrote the tasks it decided): retried with the
    server's own retry, not released (``server_fault``; the real server's case in ``tests/reliability``)."""
    watchdog, api, clock, host = make()
    failed = {"status": "FAILED", "reasonForIncompletion": f"Error scheduling tasks: [t1], for workflow: {EXEC}",
              "tasks": []}
    api.answer(EXEC, failed, failed, running())  # the reason is read from the answer after the sample's
    api.retry_workflow = lambda execution_id: api.calls.append(("retry", execution_id))
    watchdog.watch(EXEC, domain=DOMAIN, served=True)
    tick(watchdog, clock)
    tick(watchdog, clock)
    assert ([], (EXEC,)) == (host.ended, watchdog.watched())
    assert ("retry", EXEC) in api.calls


def test_an_ended_run_that_is_only_watched_is_forgotten_without_on_ended(no_thread):
    """A run watched for liveness only (no local workers) is dropped silently when it ends."""
    watchdog, api, clock, host = make()
    api.answer(EXEC, {"status": "COMPLETED"})
    watchdog.watch(EXEC, domain=DOMAIN)
    tick(watchdog, clock)
    assert ([], ()) == (host.ended, watchdog.watched())


def test_a_mailbox_watch_samples_its_listeners_current_run_and_follows_it(no_thread):
    """A listener's mailbox watched where nobody serves it: a turn task unpolled in the listener's current run
    is its stall (one more read per sample); that run ended (a switch), the next one is read, asked for
    once; a run gone from the server is no end of the mailbox."""
    watchdog, api, clock, host = make()
    loop = task("loop", age=100, domain=None, status="IN_PROGRESS", task_type="DO_WHILE")
    api.answer("mailbox", running())
    api.answer("link-0", running(loop, task("turn__2", age=45, task_type="conductor_agents_turn")), running())
    api.answer("link-1", running(loop), running(loop, task("act__1", age=31)))
    listener = CurrentRun("link-0", then="link-1")
    watch = watchdog.watch("mailbox", domain=DOMAIN, companions=listener)
    tick(watchdog, clock)
    assert ("turn__2", "mailbox", [("page", "link-0")]) == (
        watch.stall.task_reference_name, watch.stall.execution_id, [c for c in api.calls if c[0] == "page"])
    tick(watchdog, clock)  # link-0 has ended: link-1 is read, nothing waits there
    assert (None, [False, False, True], 1) == (watch.stall, listener.asked, api.count("page", "link-1"))
    tick(watchdog, clock)
    assert ("act__1", [False, False, True, False]) == (watch.stall.task_reference_name, listener.asked)
    api.answer("link-1", ExecutionNotFoundError("retired", execution_id="link-1"))
    tick(watchdog, clock)
    assert (("mailbox",), [], None) == (watchdog.watched(), host.ended, watch.stall)


class CurrentRun:
    """A listener's current run as its mailbox's watch asks for it: ``then`` once asked to refresh."""

    def __init__(self, current, *, then):
        self.current, self.then, self.asked = current, then, []

    def __call__(self, refresh):
        self.asked.append(refresh)
        self.current = self.then if refresh else self.current
        return (self.current,)


def test_a_vanished_run_is_released(no_thread):
    """A 404 on the sample (the server forgot the run) releases it like an ended run."""
    watchdog, api, clock, host = make()
    api.answer(EXEC, ExecutionNotFoundError("gone", execution_id=EXEC))
    watchdog.watch(EXEC, served=True)
    tick(watchdog, clock)
    assert ([EXEC], ()) == (host.ended, watchdog.watched())


def test_a_failed_sample_keeps_the_run_and_tries_again_next_interval(no_thread):
    """An unreachable server skips one sample; the run is sampled again one interval later."""
    watchdog, api, clock, host = make()
    api.answer(EXEC, ServerUnavailableError("down"), {"status": "COMPLETED"})
    watchdog.watch(EXEC, served=True)
    tick(watchdog, clock)
    kept = watchdog.watched()
    tick(watchdog, clock)
    assert ((EXEC,), [EXEC]) == (kept, host.ended)


def test_a_run_without_a_domain_gets_the_cheap_sample(no_thread):
    """Served runs without liveness (non-stateful, or liveness off) are sampled without their task list."""
    watchdog, api, clock, _ = make()
    watchdog.watch(EXEC, served=True)
    tick(watchdog, clock)
    assert [("status", EXEC)] == api.calls


def test_watching_again_merges_served_and_domain(no_thread):
    """The runtime registers a run twice (workers, then liveness): one watch, one sample per interval."""
    watchdog, api, clock, host = make()
    first = watchdog.watch(EXEC, served=True)
    second = watchdog.watch(EXEC, domain=DOMAIN)
    api.answer(EXEC, {"status": "COMPLETED"})
    tick(watchdog, clock)
    assert (True, [("tasks", EXEC)], [EXEC]) == (first is second, api.calls, host.ended)


def test_forget_stops_sampling_and_clears_the_stall(no_thread):
    """forget() (a handle saw the run end) drops the run and its stall flag at once."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("a", age=40)))
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    tick(watchdog, clock)
    stalled = watch.stall is not None
    watchdog.forget(EXEC)
    watchdog.forget(EXEC)
    assert (True, None, 0) == (stalled, watch.stall, tick(watchdog, clock))


def test_a_sample_in_flight_when_the_run_is_forgotten_cannot_flag_it_again(no_thread):
    """A sample that read the run before its end finishes after forget(): the flag stays clear and
    nobody hears of a stall (the handle that cancelled the run saw it end)."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("a", age=40)))
    watch = watchdog.watch(EXEC, domain=DOMAIN)
    heard = []
    watch.add_listener(heard.append)
    read = api.liveness_sample

    def read_then_forget(execution_id):
        answer = read(execution_id)
        watchdog.forget(EXEC)  # the run ends while the sample is on its way back
        return answer

    api.liveness_sample = read_then_forget
    tick(watchdog, clock)
    assert (None, []) == (watch.stall, heard)


# --- missed rings ------------------------------------------------------------------------------


def test_an_unpolled_task_of_a_served_run_rings_its_poller(no_thread):
    """A sample that finds a task of a served run's domain unpolled rings that domain's poller."""
    watchdog, api, clock, host = make()
    api.answer(EXEC, running(task("young", age=1)))
    api.answer("observed", running(task("young", age=1)))
    watchdog.watch(EXEC, domain=DOMAIN, served=True)
    watchdog.watch("observed", domain="other-domain")
    tick(watchdog, clock)
    assert [DOMAIN] == host.rings


# --- request arithmetic -------------------------------------------------------------------------


def test_each_run_is_sampled_at_most_once_per_interval(no_thread):
    """Over 100 s in 1 s steps, each of 20 runs is sampled exactly 10 times: never twice within an interval."""
    watchdog, api, clock, _ = make()
    for i in range(20):
        watchdog.watch(f"run-{i}", domain=DOMAIN)
        clock.advance(0.37)  # runs start at different moments
    for _ in range(100):
        tick(watchdog, clock, 1.0)
    per_run = {api.count("tasks", f"run-{i}") for i in range(20)}
    assert {10} == per_run


def test_a_late_watchdog_never_samples_a_run_twice_in_a_row(no_thread):
    """When the thread falls behind (a 35 s gap), each run is sampled once then waits a full interval."""
    watchdog, api, clock, _ = make()
    watchdog.watch(EXEC, domain=DOMAIN)
    tick(watchdog, clock, 35.0)
    assert (1, 0, 1) == (api.count("tasks"), tick(watchdog, clock, INTERVAL - 0.01), tick(watchdog, clock, 0.01))


# --- the thread --------------------------------------------------------------------------------


def watchdog_threads():
    return [t for t in threading.enumerate() if t.name == "conductor-agents-watchdog"]


def real_clock_watchdog(host, api):
    return RunWatchdog(api, interval=0.05, stall_seconds=STALL_SECONDS, on_ended=host.ended.append,
                       is_busy=lambda d: False, ring=host.rings.append)


def test_one_thread_serves_hundreds_of_runs_and_ends_with_the_last():
    """300 watched runs share one thread; it ends when the last run ended and restarts on demand."""
    host, api = Host(), FakeApi()
    watchdog = real_clock_watchdog(host, api)
    before = len(watchdog_threads())
    try:
        for i in range(300):
            watchdog.watch(f"run-{i}", domain=DOMAIN, served=True)
        during = len(watchdog_threads())
        eventually(lambda: api.count("tasks") >= 300, timeout=30, message="every run sampled")
        for i in range(300):
            api.answer(f"run-{i}", {"status": "COMPLETED"})
        eventually(lambda: not watchdog.is_running, timeout=30, message="the thread to end after the last run")
        ended = sorted(host.ended)
        after = len(watchdog_threads())
        watchdog.watch("late-run", served=True)
        again = (watchdog.is_running, watchdog.threads_started)
    finally:
        watchdog.close()
    assert (1, 0, 2) == (during - before, after - before, again[1])
    assert (True, sorted(f"run-{i}" for i in range(300))) == (again[0], ended)


def test_close_joins_the_thread_and_later_watches_start_none():
    """close() ends the thread at once (no waiting for the next due sample); watch() after it samples nothing."""
    host, api = Host(), FakeApi()
    watchdog = RunWatchdog(api, interval=3600.0, stall_seconds=STALL_SECONDS, on_ended=host.ended.append)
    watchdog.watch(EXEC, domain=DOMAIN)
    running_before = watchdog.is_running
    watchdog.close()
    watchdog.close()
    late = watchdog.watch("after-close", domain=DOMAIN)
    assert (True, False, (), None, []) == (running_before, watchdog.is_running, watchdog.watched(),
                                           late.stall, api.calls)


def test_forgetting_the_last_run_ends_the_thread_without_waiting_for_its_interval():
    """The thread sleeps on an Event: forget() wakes it, and with nothing left to watch it ends."""
    host, api = Host(), FakeApi()
    watchdog = RunWatchdog(api, interval=3600.0, stall_seconds=STALL_SECONDS, on_ended=host.ended.append)
    try:
        watchdog.watch(EXEC, domain=DOMAIN)
        watchdog.forget(EXEC)
        eventually(lambda: not watchdog.is_running, timeout=10, message="the idle thread to end")
    finally:
        watchdog.close()
    assert [] == api.calls


def test_the_stall_reaches_listeners_from_the_thread_with_nobody_waiting():
    """With the real thread, a stall is flagged on the watch and told to its listener without any wait()."""
    host, api = Host(), FakeApi()
    api.answer(EXEC, running(task("late", age=45)))
    watchdog = real_clock_watchdog(host, api)
    heard = []
    try:
        watch = watchdog.watch(EXEC, domain=DOMAIN)
        watch.add_listener(lambda error: heard.append(threading.current_thread().name))
        eventually(lambda: watch.stall is not None, timeout=10, message="the stall flag")
        eventually(lambda: heard, timeout=10, message="the listener called")
    finally:
        watchdog.close()
    assert ["conductor-agents-watchdog"] == heard


# --- the runtime's on_stall argument --------------------------------------------------------


def test_on_stall_must_be_callable():
    """AgentRuntime(on_stall=...) refuses a value it could not call, naming the argument."""
    from conductor_agents import AgentRuntime, AgentSettings, AgentTypeError

    with pytest.raises(AgentTypeError) as info:
        AgentRuntime(AgentSettings(server_url=BASE_URL), on_stall="log it")
    assert ("on_stall", "log it") == (info.value.field, info.value.value)


# --- idle runs ---------------------------------------------------------------------------------


def test_an_idle_served_run_is_sampled_only_for_its_end(no_thread):
    """While the watcher reads its queues empty, a served run costs one sample per 30 s, not per 10 s."""
    empty = {DOMAIN}
    watchdog, api, clock, _ = make(queues_empty=lambda d: d in empty)
    watch = watchdog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    for _ in range(12):  # 120 s; an idle run is sampled every IDLE_SAMPLE_INTERVALS (3) intervals
        tick(watchdog, clock)
    assert (4, 8) == (api.count("tasks"), watch.skipped)


def test_a_queued_task_brings_back_a_sample_every_interval(no_thread):
    """As soon as the watcher sees a task in the run's queue, every interval samples (and finds the stall)."""
    empty = {DOMAIN}
    watchdog, api, clock, _ = make(queues_empty=lambda d: d in empty)
    api.answer(EXEC, running(task("late", age=45)))
    watch = watchdog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    tick(watchdog, clock)
    skipped_while_empty = api.count("tasks")
    empty.clear()  # the watcher now counts a task in the run's queue
    tick(watchdog, clock)
    assert (0, 1) == (skipped_while_empty, api.count("tasks"))
    assert isinstance(watch.stall, WorkerStallError)


def test_a_run_seen_idle_again_has_its_stall_cleared(no_thread):
    """A stalled run whose queue the watcher then reads empty (the task was taken) is no longer stalled."""
    empty = set()
    watchdog, api, clock, _ = make(queues_empty=lambda d: d in empty)
    api.answer(EXEC, running(task("late", age=45)))
    watch = watchdog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    tick(watchdog, clock)
    stalled = watch.stall is not None
    empty.add(DOMAIN)
    tick(watchdog, clock)
    assert (True, None, 1) == (stalled, watch.stall, api.count("tasks"))


def test_runs_not_served_here_or_on_the_shared_poller_are_never_skipped(no_thread):
    """Only a run this process polls on its own domain can be known idle from the watcher's counts."""
    watchdog, api, clock, _ = make(queues_empty=lambda d: True)
    watchdog.watch("observed", domain=DOMAIN)
    watchdog.watch("shared", served=True)
    for _ in range(3):
        tick(watchdog, clock)
    assert (3, 3) == (api.count("tasks", "observed"), api.count("status", "shared"))


def named(name="listener", status="RUNNING"):
    return {"status": status, "workflowName": name, "workflowVersion": 1, "tasks": []}


def test_idle_runs_of_one_workflow_share_one_running_list_for_their_end_checks(no_thread):
    """After a first sample tells each run's workflow name, the end-of-run checks of idle runs of that
    name are answered by one running list per interval, not one request per run."""
    watchdog, api, clock, _ = make(queues_empty=lambda d: True)
    runs = [f"wf-{i}" for i in range(5)]
    api.running_ids = {"listener": runs}
    watches = []
    for i, execution_id in enumerate(runs):
        api.answer(execution_id, named())
        watches.append(watchdog.watch(execution_id, domain=DOMAIN, served=True, served_domain=f"d{i}"))
    for _ in range(3):  # the first end check: each run sampled itself (its name is not known yet)
        tick(watchdog, clock)
    first = (api.count("tasks"), api.count("running"))
    for _ in range(9):  # three more end checks each, all answered by the list
        tick(watchdog, clock)
    assert first == (5, 0)
    assert (5, 3) == (api.count("tasks"), api.count("running"))
    assert [w.listed for w in watches] == [3] * 5


def test_an_idle_run_missing_from_the_running_list_is_sampled_and_released(no_thread):
    watchdog, api, clock, host = make(queues_empty=lambda d: True)
    api.running_ids = {"listener": [EXEC]}
    api.answer(EXEC, named(), named(status="TERMINATED"))
    watchdog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    for _ in range(6):
        tick(watchdog, clock)
    assert (1, 1, []) == (api.count("tasks"), api.count("running"), host.ended)
    api.running_ids = {"listener": []}  # cancelled from another process
    for _ in range(3):
        tick(watchdog, clock)
    assert (2, 2, [EXEC]) == (api.count("tasks"), api.count("running"), host.ended)


def test_a_server_without_the_running_list_gets_one_sample_per_idle_run(no_thread):
    from conductor_agents._wire.transport import HttpError

    watchdog, api, clock, _ = make(queues_empty=lambda d: True)
    api.running_ids = {"listener": HttpError("no", status=404, server_message="", method="GET", path="/x")}
    api.answer(EXEC, named())
    watchdog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    for _ in range(12):
        tick(watchdog, clock)
    assert (4, 1) == (api.count("tasks"), api.count("running"))


def test_the_agent_name_given_at_watch_spares_the_first_sample(no_thread):
    """Watched with its workflow name (the agent's), an idle run's end checks use the running list at
    once; under a wrong name it is missing from that list, sampled once, and listed under the right one."""
    watchdog, api, clock, _ = make(queues_empty=lambda d: True)
    api.running_ids = {"listener": ["wf-a", "wf-b"]}
    api.answer("wf-b", named("listener"))
    a = watchdog.watch("wf-a", domain=DOMAIN, served=True, served_domain="da", workflow_name="listener")
    b = watchdog.watch("wf-b", domain=DOMAIN, served=True, served_domain="db", workflow_name="renamed")
    for _ in range(6):
        tick(watchdog, clock)
    assert (0, 1) == (api.count("tasks", "wf-a"), api.count("tasks", "wf-b"))
    assert (a.listed, b.listed, b.workflow_name) == (2, 1, "listener")


def test_the_thread_sleeps_past_the_next_due_time_so_runs_due_together_share_a_wake_up(no_thread):
    """A tenth of the interval (1 s at most) late: three runs due within 0.6 s are sampled at one wake-up."""
    watchdog, api, clock, _ = make()
    for i in range(3):
        watchdog.watch(f"run-{i}", domain=DOMAIN)
        clock.advance(0.3)
    clock.advance(INTERVAL - 0.9 - 0.5)  # the first is due in 0.5 s
    run, wait = watchdog._next_due()
    assert run is None and wait == pytest.approx(0.5 + 1.0)
    clock.advance(wait)
    assert 3 == watchdog.run_due()


def test_a_poller_that_polls_again_has_its_domains_runs_sampled_at_once(no_thread):
    """Issue 19: after a healed outage the stall found during it is cleared by a sample taken as soon
    as the domain's poller polls again, not up to an interval later (a wait() then would raise it)."""
    watchdog, api, clock, _ = make()
    api.answer(EXEC, running(task("late", age=45)), running())
    watch = watchdog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    tick(watchdog, clock)
    assert watch.stall is not None
    clock.advance(0.1)
    assert watchdog.run_due() == 0  # not due for another interval
    assert watchdog.resample("another-domain") == 0
    assert watchdog.resample(DOMAIN) == 1
    assert watchdog.run_due() == 1 and watch.stall is None
