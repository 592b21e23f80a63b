"""Unit tests for conductor_agents._liveness: find_stall, server_time_from_date, LivenessMonitor."""

import os
import threading
import time
from email.utils import formatdate

import pytest
import responses

from conductor_agents._api import ConductorApi
from conductor_agents._liveness import LivenessMonitor, Stall, find_stall, server_time_from_date
from conductor_agents._transport import Transport
from conductor_agents.errors import ServerUnavailableError
from tests.helpers import eventually
from tests.unit.fakes import BASE_URL, WALL_START, FakeClock

DOMAIN = "0123456789abcdef0123456789abcdef"
OTHER_DOMAIN = "fedcba9876543210fedcba9876543210"
EXEC = "wf-7"
STALL_SECONDS = 30.0
SERVER_NOW = WALL_START  # the server's true time in these tests
SERVER_DATE = formatdate(WALL_START, usegmt=True)  # "Tue, 14 Nov 2023 22:13:20 GMT"


def task(ref, *, age, domain=DOMAIN, status="SCHEDULED", poll_count=0, task_type="lookup", task_id=None):
    """A task of the workflow's task list, scheduled ``age`` seconds before SERVER_NOW."""
    return {
        "taskId": task_id or f"id-{ref}", "referenceTaskName": ref, "taskType": task_type,
        "status": status, "pollCount": poll_count, "domain": domain,
        "scheduledTime": int((SERVER_NOW - age) * 1000),
    }


def stall_of(tasks, *, server_now=SERVER_NOW, first_seen=None, client_now=0.0):
    return find_stall(tasks, domain=DOMAIN, stall_seconds=STALL_SECONDS, server_now=server_now,
                      first_seen={} if first_seen is None else first_seen, client_now=client_now)


# --- find_stall: what counts -------------------------------------------------------------------


def test_unpolled_domain_task_past_the_threshold_is_a_stall():
    """A SCHEDULED task of the run's domain with pollCount 0 older than the threshold is a stall."""
    expected = Stall(task_reference_name="lookup_1", task_type="lookup", domain=DOMAIN, waited_seconds=40.0)
    assert expected == stall_of([task("lookup_1", age=40)])


def test_unpolled_in_progress_task_counts_too():
    """IN_PROGRESS with pollCount 0 counts like SCHEDULED."""
    assert "t" == stall_of([task("t", age=40, status="IN_PROGRESS")]).task_reference_name


def test_young_task_is_not_a_stall():
    """A task younger than the threshold is not a stall."""
    assert None is stall_of([task("t", age=29.9)])


def test_threshold_is_strict():
    """Exactly the threshold is not yet a stall; just past it is."""
    assert (None, "t") == (stall_of([task("t", age=30)]),
                           getattr(stall_of([task("t", age=30.01)]), "task_reference_name", None))


def test_other_domains_never_count():
    """Tasks routed to another domain or to none are ignored, however old."""
    tasks = [task("other", age=3600, domain=OTHER_DOMAIN), task("none", age=3600, domain=None)]
    assert None is stall_of(tasks)


@pytest.mark.parametrize("task_type", ["LLM_CHAT_COMPLETE", "HUMAN", "WAIT", "PULL_WORKFLOW_MESSAGES"])
def test_server_side_tasks_never_count(task_type):
    """LLM, HUMAN, WAIT and PULL_WORKFLOW_MESSAGES tasks carry no domain and are never stalls."""
    with_null_domain = task("server", age=3600, domain=None, task_type=task_type, status="IN_PROGRESS")
    without_domain_key = {k: v for k, v in task("server2", age=3600, task_type=task_type).items() if k != "domain"}
    assert None is stall_of([with_null_domain, without_domain_key])


@pytest.mark.parametrize("poll_count", [1, 5])
def test_polled_tasks_never_count_however_old(poll_count):
    """A task a worker has polled (pollCount > 0) is being worked on, even after a day."""
    assert None is stall_of([task("busy", age=86_400, status="IN_PROGRESS", poll_count=poll_count)])


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "FAILED_WITH_TERMINAL_ERROR", "CANCELED",
                                    "TIMED_OUT", "SKIPPED", "COMPLETED_WITH_ERRORS"])
def test_terminal_tasks_never_count(status):
    """Finished tasks are not stalls even with pollCount 0."""
    assert None is stall_of([task("done", age=3600, status=status)])


def test_longest_waiting_task_is_reported():
    """Among several stalled tasks the one waiting longest is reported."""
    tasks = [task("a", age=35), task("b", age=90), task("c", age=60), task("polled", age=500, poll_count=1)]
    assert ("b", 90.0) == (stall_of(tasks).task_reference_name, stall_of(tasks).waited_seconds)


# --- find_stall: the first-seen fallback -------------------------------------------------------


def test_without_server_time_the_first_sighting_is_the_start():
    """Without a server time a task's wait starts when the client first saw it unpolled."""
    first_seen = {}
    old = task("t", age=3600)
    assert None is stall_of([old], server_now=None, first_seen=first_seen, client_now=100.0)
    assert {"id-t": 100.0} == first_seen
    assert None is stall_of([old], server_now=None, first_seen=first_seen, client_now=130.0)
    assert 31.0 == stall_of([old], server_now=None, first_seen=first_seen, client_now=131.0).waited_seconds


def test_task_without_scheduled_time_uses_the_first_sighting():
    """A task without scheduledTime falls back to first-seen time even when the server time is known."""
    first_seen = {}
    t = {**task("t", age=0), "scheduledTime": None}
    assert None is stall_of([t], first_seen=first_seen, client_now=5.0)
    assert 40.0 == stall_of([t], first_seen=first_seen, client_now=45.0).waited_seconds


def test_first_seen_forgets_tasks_that_left():
    """Tasks that were polled or ended are dropped from first_seen."""
    first_seen = {}
    stall_of([task("a", age=1), task("b", age=1)], server_now=None, first_seen=first_seen, client_now=1.0)
    stall_of([task("a", age=1, poll_count=1)], server_now=None, first_seen=first_seen, client_now=2.0)
    assert {} == first_seen


def test_a_repolled_task_starts_a_new_wait():
    """A task that reappears unpolled after leaving is timed from its new sighting."""
    first_seen = {}
    stall_of([task("a", age=1)], server_now=None, first_seen=first_seen, client_now=0.0)
    stall_of([], server_now=None, first_seen=first_seen, client_now=20.0)
    assert None is stall_of([task("a", age=1)], server_now=None, first_seen=first_seen, client_now=40.0)


# --- server_time_from_date ---------------------------------------------------------------------

# 1994-11-06T08:49:37Z, the example of RFC 7231 section 7.1.1.1, read as the middle of that second.
RFC_EXAMPLE = 784_111_777.5


@pytest.mark.parametrize("value", [
    "Sun, 06 Nov 1994 08:49:37 GMT",     # IMF-fixdate
    "Sunday, 06-Nov-94 08:49:37 GMT",    # obsolete RFC 850 format
    "Sun Nov  6 08:49:37 1994",          # obsolete asctime format
])
def test_rfc_7231_formats_are_parsed(value):
    """All three date formats of RFC 7231 give the same instant (mid-second)."""
    assert RFC_EXAMPLE == server_time_from_date(value)


@pytest.fixture
def local_time_five_hours_west_of_utc(monkeypatch):
    """Run the test with the process's local time zone at UTC-5 (POSIX TZ, no tz database needed)."""
    monkeypatch.setenv("TZ", "EST5")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("value", [
    "Sun, 06 Nov 1994 08:49:37 GMT",
    "Sunday, 06-Nov-94 08:49:37 GMT",
    "Sun Nov  6 08:49:37 1994",
])
def test_dates_are_gmt_whatever_the_local_time_zone(local_time_five_hours_west_of_utc, value):
    """HTTP dates are GMT in every format, so the local time zone never shifts the server time."""
    assert os.environ["TZ"] == "EST5"
    assert RFC_EXAMPLE == server_time_from_date(value)


def test_server_date_of_these_tests():
    """The Date header used below reads back as the server's time (plus half a second)."""
    assert SERVER_NOW + 0.5 == server_time_from_date(SERVER_DATE)


@pytest.mark.parametrize("value", [None, "", "garbage", "Sun, 32 Nov 1994 08:49:37 GMT",
                                   "Sun, 06 Nov 1994 25:61:37 GMT", "06/11/1994", "1700000000"])
def test_unparseable_dates_are_none(value):
    """A missing or unparseable Date header gives None rather than an exception."""
    assert None is server_time_from_date(value)


# --- LivenessMonitor against a mocked server, with a skewed client clock -----------------------


def monitor_for(clock, **kwargs):
    """A monitor sampling EXEC the way the runtime does: task list plus the server's Date header."""
    api = ConductorApi(Transport(BASE_URL, clock=clock))

    def sample():
        workflow, date = api.sample_workflow(EXEC)
        return workflow, server_time_from_date(date)

    return LivenessMonitor(sample, execution_id=EXEC, domain=DOMAIN, check_interval=10.0,
                           stall_seconds=STALL_SECONDS, clock=clock, **kwargs)


def serve_tasks(http, tasks, *, date=SERVER_DATE, status="RUNNING"):
    headers = {"Date": date} if date else {}
    http.add("GET", f"{BASE_URL}/workflow/{EXEC}", json={"status": status, "tasks": tasks}, headers=headers)


SKEWS = [-600.0, 0.0, 600.0]


@pytest.mark.parametrize("skew", SKEWS)
def test_skewed_client_clock_still_flags_a_real_stall(http, skew):
    """A task unpolled for 45 s on the server's clock is a stall whether the client is 10 min ahead or behind."""
    serve_tasks(http, [task("late", age=45)])
    stall = monitor_for(FakeClock(skew=skew)).check_once()
    assert ("late", 45.5) == (stall.task_reference_name, stall.waited_seconds)


@pytest.mark.parametrize("skew", SKEWS)
def test_skewed_client_clock_raises_no_false_alarm(http, skew):
    """A task unpolled for 10 s on the server's clock is no stall whether the client is 10 min ahead or behind."""
    serve_tasks(http, [task("fresh", age=10), task("busy", age=5000, poll_count=1)])
    monitor = monitor_for(FakeClock(skew=skew))
    assert (None, None) == (monitor.check_once(), monitor.stall)


def test_skew_gives_identical_decisions():
    """The same server data gives the same decision under every client clock."""
    decisions = {}
    for skew in SKEWS:
        with responses.RequestsMock() as mock:
            serve_tasks(mock, [task("late", age=45), task("fresh", age=10, task_id="id-fresh")])
            stall = monitor_for(FakeClock(skew=skew)).check_once()
            decisions[skew] = (stall.task_reference_name, stall.waited_seconds)
    assert [("late", 45.5)] * 3 == list(decisions.values())


@pytest.mark.parametrize("skew", SKEWS)
def test_without_date_header_first_sighting_decides(http, skew):
    """With no Date header the monitor times tasks from its own first sighting (client monotonic)."""
    serve_tasks(http, [task("t", age=3600)], date=None)
    clock = FakeClock(skew=skew)
    monitor = monitor_for(clock)
    assert None is monitor.check_once()
    clock.advance(30.0)
    assert None is monitor.check_once()
    clock.advance(1.0)
    assert ("t", 31.0) == (monitor.check_once().task_reference_name, monitor.stall.waited_seconds)


# --- LivenessMonitor lifecycle -----------------------------------------------------------------


def test_stall_is_kept_and_reported_once(http):
    """The first stall is kept and on_stall hears it once, even when later samples differ."""
    heard = []
    serve_tasks(http, [task("first", age=40)])
    http.add("GET", f"{BASE_URL}/workflow/{EXEC}", json={"status": "RUNNING", "tasks": [task("second", age=99)]},
             headers={"Date": SERVER_DATE})
    monitor = monitor_for(FakeClock(), on_stall=heard.append)
    monitor.check_once()
    monitor.check_once()
    assert (["first"], "first", 2) == ([s.task_reference_name for s in heard],
                                       monitor.stall.task_reference_name, monitor.samples)


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "TERMINATED", "TIMED_OUT"])
def test_terminal_workflow_is_never_a_stall(http, status):
    """A finished workflow gives no stall even if its task list still shows an unpolled task."""
    serve_tasks(http, [task("late", age=400)], status=status)
    monitor = monitor_for(FakeClock())
    assert (None, None) == (monitor.check_once(), monitor.stall)


def live_monitor(samples, interval=0.01, **kwargs):
    """A monitor whose sampler answers from ``samples`` (the last repeats) and counts its calls."""
    answers = list(samples)
    calls = []

    def sample():
        calls.append(1)
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monitor = LivenessMonitor(sample, execution_id=EXEC, domain=DOMAIN, check_interval=interval,
                              stall_seconds=STALL_SECONDS, clock=FakeClock(), **kwargs)
    monitor.sampler_calls = calls
    return monitor


def thread_alive(name):
    return any(t.name == name and t.is_alive() for t in threading.enumerate())


def test_terminal_workflow_stops_the_monitor_thread():
    """After one sample of a terminal workflow the watchdog thread ends by itself."""
    monitor = live_monitor([({"status": "COMPLETED", "tasks": []}, SERVER_NOW)])
    name = f"conductor-agents-liveness-{DOMAIN}"
    monitor.start()
    eventually(lambda: not thread_alive(name), timeout=5.0, message="the monitor thread to end")
    assert 1 == len(monitor.sampler_calls)
    monitor.dispose()


def test_check_once_on_a_terminal_workflow_stops_the_loop():
    """check_once on a terminal workflow stops the monitor: a later start samples nothing."""
    monitor = live_monitor([({"status": "TERMINATED", "tasks": []}, SERVER_NOW)], interval=3600.0)
    assert None is monitor.check_once()
    monitor.start()
    eventually(lambda: not thread_alive(f"conductor-agents-liveness-{DOMAIN}"), timeout=5.0)
    assert 1 == len(monitor.sampler_calls)


def test_monitor_thread_survives_sample_errors_and_stops_on_a_stall():
    """Failed samples are skipped; the thread stops once it found a stall and reports it."""
    heard = []
    monitor = live_monitor([ServerUnavailableError("down"), ServerUnavailableError("down"),
                            ({"status": "RUNNING", "tasks": [task("late", age=40)]}, SERVER_NOW)],
                           on_stall=heard.append)
    monitor.start()
    eventually(lambda: not thread_alive(f"conductor-agents-liveness-{DOMAIN}"), timeout=5.0)
    assert (["late"], 3) == ([s.task_reference_name for s in heard], len(monitor.sampler_calls))
    monitor.dispose()


def test_dispose_is_idempotent_and_safe_before_start():
    """dispose() before start() and twice after it does not raise and leaves no thread."""
    live_monitor([({"status": "RUNNING", "tasks": []}, SERVER_NOW)]).dispose()
    monitor = live_monitor([({"status": "RUNNING", "tasks": []}, SERVER_NOW)], interval=3600.0).start()
    monitor.dispose()
    monitor.dispose()
    assert False is thread_alive(f"conductor-agents-liveness-{DOMAIN}")
