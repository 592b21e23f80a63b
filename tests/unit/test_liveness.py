"""Unit tests for conductor_agents._liveness.stall: find_stall, server_time_from_date, stall_error."""

import os
import time
from email.utils import formatdate

import pytest

from conductor_agents._liveness.stall import Stall, find_stall, server_time_from_date, stall_error
from tests.unit.fakes import WALL_START

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


# --- stall_error ------------------------------------------------------------------------------


def test_stall_error_names_the_task_the_run_the_domain_the_wait_and_the_remedy():
    """The error carries the stall's fields and its message says what waits, where, how long, what to do."""
    stall = Stall(task_reference_name="lookup_1", task_type="lookup", domain=DOMAIN, waited_seconds=41.25)
    err = stall_error(EXEC, stall)
    assert (EXEC, "lookup_1", DOMAIN, 41.25) == (err.execution_id, err.task_reference_name, err.domain,
                                                err.waited_seconds)
    for part in ("'lookup_1'", EXEC, DOMAIN, "41.2s", "runtime.resume(execution_id, agent)"):
        assert part in str(err)
