"""Unit tests for conductor_agents._serving.served: whether a process serves a run, and since when none does,
and how ``status``, ``list`` and ``wait``'s progress say it (issue 41)."""

from __future__ import annotations

import io
import threading
from email.utils import formatdate
from typing import Any

import attrs
import pytest

from conductor_agents import AgentSettings, RunStatus
from conductor_agents._common.task_names import CARRY_TASK, FORWARD_TASK, TURN_TASK
from conductor_agents._listener.running import RunningRun
from conductor_agents._serving import served as served_module
from conductor_agents._serving.served import (
    SERVE_HINT,
    Serving,
    read_serving,
    row_with_serving,
    unserved_line,
    unserved_words,
    with_serving,
)
from conductor_agents._wire.api import TaskPage
from conductor_agents.cli._agents import _status_dict, status_line
from conductor_agents.cli._progress import ProgressDisplay, ServedWatch
from conductor_agents.cli._watch import _doing
from conductor_agents.errors import ServerError
from conductor_agents.result import AgentStatus

NOW = 1_800_000_000.0  # the server's clock, in its Date header (to the second)
READ = NOW + 0.5  # ... as the check reads it (the middle of that second)
DOMAIN = "dom-1"
RUN, MAILBOX = "run-1", "mailbox-1"
SETTINGS = AgentSettings(server_url="http://localhost:8080/api", liveness_stall_seconds=30.0)


def task(task_type: str = "act", *, waited: float = 0.0, domain: str | None = DOMAIN, status: str = "SCHEDULED",
         polls: int = 0) -> dict[str, Any]:
    return {"taskId": f"{task_type}-{waited}", "taskType": task_type, "referenceTaskName": f"{task_type}_ref",
            "domain": domain, "status": status, "pollCount": polls, "scheduledTime": int((READ - waited) * 1000)}


def poll(worker: str, seconds_ago: float, domain: str = DOMAIN) -> dict[str, Any]:
    return {"domain": domain, "workerId": worker, "lastPollTime": int((READ - seconds_ago) * 1000)}


class FakeApi:
    """The three reads the check makes, counted."""

    def __init__(self, *, status: str = "RUNNING", routes: dict[str, str] | None = None, age: float = 600.0,
                 scheduled: dict[str, list[dict[str, Any]]] | None = None,
                 polls: dict[str, list[dict[str, Any]]] | None = None) -> None:
        self.workflow = {"workflowId": RUN, "status": status, "startTime": int((READ - age) * 1000),
                         "taskToDomain": {"act": DOMAIN, TURN_TASK: DOMAIN} if routes is None else routes}
        self.scheduled = scheduled or {}
        self.polls = polls or {}
        self.reads: list[tuple[str, str]] = []

    def get_workflow(self, execution_id: str) -> dict[str, Any]:
        self.reads.append(("workflow", execution_id))
        return self.workflow

    def workflow_tasks(self, execution_id: str, *, statuses: tuple[str, ...] = (), count: int = 15,
                       start: int = 0) -> TaskPage:
        self.reads.append(("tasks", execution_id))
        tasks = [t for t in self.scheduled.get(execution_id, []) if not statuses or t["status"] in statuses]
        return TaskPage(total=len(tasks), tasks=tasks, date=formatdate(NOW, usegmt=True))

    def poll_data_sample(self, task_type: str) -> tuple[list[dict[str, Any]], str | None]:
        self.reads.append(("polls", task_type))
        return self.polls.get(task_type, []), formatdate(NOW, usegmt=True)


@pytest.fixture
def dead(monkeypatch) -> set[str]:
    """Worker ids this host knows dead (a killed process of this machine)."""
    known: set[str] = set()
    monkeypatch.setattr(served_module, "worker_is_dead_here", lambda worker: worker in known)
    return known


def check(api: FakeApi, **kwargs: Any) -> Serving:
    return read_serving(api, SETTINGS, RUN, **kwargs)  # type: ignore[arg-type]


# --- the rule ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["COMPLETED", "TERMINATED", "PAUSED"])
def test_a_run_that_ended_or_is_paused_cannot_be_told_and_costs_one_read(status):
    api = FakeApi(status=status, scheduled={RUN: [task(waited=500)]})
    assert check(api) == Serving(None, None)
    assert api.reads == [("workflow", RUN)]


def test_a_stateless_run_cannot_be_told_any_process_of_its_agent_serves_it():
    api = FakeApi(routes={}, scheduled={RUN: [task(waited=500, domain=None)]})
    assert check(api) == Serving(None, None)


def test_a_task_nobody_polled_past_the_bound_is_not_served_for_as_long_as_it_waited(dead):
    api = FakeApi(age=50, scheduled={RUN: [task(waited=41)]}, polls={"act": [poll("w-old", 45)]})
    assert check(api) == Serving(False, 45.0)  # the type's last poll is older than the task's wait
    api = FakeApi(age=50, scheduled={RUN: [task(waited=41)]}, polls={"act": [poll("w-old", 35)]})
    assert check(api) == Serving(False, 41.0)


def test_a_task_of_a_run_never_polled_is_not_served_since_the_run_started(dead):
    api = FakeApi(age=50, scheduled={RUN: [task(waited=41)]})
    assert check(api) == Serving(False, 50.0)


def test_a_waiting_task_whose_type_a_live_worker_polled_within_the_bound_is_a_busy_worker_not_a_dead_one(dead):
    api = FakeApi(scheduled={RUN: [task(waited=41)]}, polls={"act": [poll("w-busy", 10)]})
    assert check(api) == Serving(True, None)
    dead.add("w-busy")  # ... unless that worker's process of this host is gone
    assert check(api).served is False


@pytest.mark.parametrize("waiting", [
    task(waited=20),                       # not yet past the bound
    task(waited=500, domain="dom-2"),      # another run's domain
    task(waited=500, polls=1),             # polled: taken by a worker
    task(CARRY_TASK, waited=500),          # a switch's carry task: never polled, within its grace
    task(waited=500, status="IN_PROGRESS"),  # not in the SCHEDULED page the check reads
], ids=["young", "other-domain", "polled", "carry", "in-progress"])
def test_only_a_task_of_the_domain_never_polled_past_the_bound_counts_as_waiting(dead, waiting):
    api = FakeApi(scheduled={RUN: [waiting]}, polls={TURN_TASK: [poll("w-live", 50)]})
    assert check(api) == Serving(True, None)  # the live poll of the domain decides


def test_a_task_of_the_mailbox_counts_as_the_runs(dead):
    api = FakeApi(age=100, scheduled={MAILBOX: [task(FORWARD_TASK, waited=60)]},
                  polls={TURN_TASK: [poll("w-live", 5)]})
    assert check(api) == Serving(True, None)  # the run's own tasks: none waits
    assert check(api, also=(MAILBOX,)) == Serving(False, 100.0)  # the forward waits, its type never polled
    assert ("tasks", MAILBOX) in api.reads


def test_a_run_that_waits_on_the_server_is_served_while_a_live_worker_polls_its_domain(dead):
    api = FakeApi(polls={TURN_TASK: [poll("w-live", 70)]})  # idle: a safety poll at least every minute
    assert check(api) == Serving(True, None)


def test_a_run_that_waits_on_the_server_is_not_served_once_no_live_worker_polled_its_domain(dead):
    api = FakeApi(polls={TURN_TASK: [poll("w-gone", 80)], "act": [poll("w-gone", 90)]})
    assert check(api) == Serving(False, 80.0)  # the freshest poll by anyone


def test_a_killed_process_of_this_host_leaves_its_run_unserved_once_the_bound_passed(dead):
    dead.add("w-killed")
    assert check(FakeApi(polls={TURN_TASK: [poll("w-killed", 2)]})) == Serving(None, None)  # too soon to say
    assert check(FakeApi(polls={TURN_TASK: [poll("w-killed", 31)]})) == Serving(False, 31.0)
    assert check(FakeApi(polls={TURN_TASK: [poll("w-killed", 31), poll("w-new", 5)]})) == Serving(True, None)


def test_a_run_never_polled_is_not_served_once_older_than_the_bound(dead):
    assert check(FakeApi(age=10)) == Serving(None, None)
    assert check(FakeApi(age=45)) == Serving(False, 45.0)


def test_reads_stop_at_the_first_live_poll_turn_task_first_carry_never_read(dead):
    routes = {CARRY_TASK: DOMAIN, "zeta": DOMAIN, "act": DOMAIN, TURN_TASK: DOMAIN}
    api = FakeApi(routes=routes, polls={TURN_TASK: [poll("w-live", 1)]})
    assert check(api) == Serving(True, None)
    assert [r for r in api.reads if r[0] == "polls"] == [("polls", TURN_TASK)]
    api = FakeApi(routes={f"tool{i}": DOMAIN for i in range(10)}, age=5)
    check(api)
    assert len([r for r in api.reads if r[0] == "polls"]) == 6  # at most six types read


def test_with_serving_fills_a_running_status_and_leaves_the_rest_alone(dead):
    running = AgentStatus(execution_id=MAILBOX, status=RunStatus.RUNNING, is_waiting=True,
                          pending_tool={"taskRefName": "wait_ref"})
    api = FakeApi(age=100)
    filled = with_serving(api, SETTINGS, running, RUN)  # type: ignore[arg-type]
    assert (filled.waiting_for, filled.served, filled.unserved_for) == ("message", False, 100.0)
    ended = attrs.evolve(running, status=RunStatus.COMPLETED)
    assert with_serving(api, SETTINGS, ended, RUN) is ended  # type: ignore[arg-type]
    paused = with_serving(api, SETTINGS, attrs.evolve(running, status=RunStatus.PAUSED), RUN)  # type: ignore[arg-type]
    assert (paused.waiting_for, paused.served) == ("message", None)  # what it waits for, as before; not "served"


def test_with_serving_keeps_the_status_when_a_read_fails():
    class Failing(FakeApi):
        def get_workflow(self, execution_id: str) -> dict[str, Any]:
            raise ServerError("the server is busy")

    running = AgentStatus(execution_id=RUN, status=RunStatus.RUNNING, is_waiting=True)
    status = with_serving(Failing(), SETTINGS, running, RUN)  # type: ignore[arg-type]
    assert (status.served, status.unserved_for) == (None, None)


def test_row_with_serving_reads_the_current_run_and_the_mailbox(dead):
    row = RunningRun(MAILBOX, RUN, RunStatus.RUNNING, "message")
    api = FakeApi(age=100)
    filled = row_with_serving(api, SETTINGS, row)  # type: ignore[arg-type]
    assert (filled.served, filled.unserved_for) == (False, 100.0)
    assert ("tasks", RUN) in api.reads and ("tasks", MAILBOX) in api.reads
    assert filled.to_dict()["served"] is False and filled.to_dict()["unservedFor"] == 100.0


# --- how it is said -----------------------------------------------------------------------------------


def test_the_line_says_for_how_long_and_what_would_serve_it():
    assert unserved_line(41.4) == ("not served: no process has polled its tasks for 41 s "
                                   "(serve it with: conductor-agents serve MODULE:AGENT)")
    assert unserved_line(None).startswith("not served: no process has polled its tasks (serve it with: ")
    assert SERVE_HINT == "conductor-agents serve MODULE:AGENT"


def test_a_wait_that_timed_out_says_that_nobody_serves_the_run_and_nothing_else(dead):
    """``wait()``'s timeout (issue 41, point 3): said only when no process serves the run; a failed read: nothing."""
    assert unserved_words(FakeApi(age=100), SETTINGS, RUN, MAILBOX) == (  # type: ignore[arg-type]
        ", and no process has polled its tasks for 100 s (serve it with runtime.resume('mailbox-1', agent), "
        "or conductor-agents serve MODULE:AGENT)")
    live = FakeApi(age=100, polls={TURN_TASK: [poll("w-live", 2)]})
    assert unserved_words(live, SETTINGS, RUN, MAILBOX) == ""  # type: ignore[arg-type]

    class Failing(FakeApi):
        def get_workflow(self, execution_id: str) -> dict[str, Any]:
            raise ServerError("the server is busy")

    assert unserved_words(Failing(), SETTINGS, RUN, MAILBOX) == ""  # type: ignore[arg-type]


def test_status_line_adds_what_the_run_waits_for_and_that_nobody_serves_it():
    base = AgentStatus(execution_id=RUN, status=RunStatus.RUNNING)
    assert status_line(base, RUN) == "RUNNING"
    assert status_line(attrs.evolve(base, served=True, waiting_for="message"), RUN) == "RUNNING (waiting for a message)"
    unserved = attrs.evolve(base, waiting_for="message", served=False, unserved_for=41.0)
    assert status_line(unserved, RUN) == ("RUNNING (waiting for a message), not served: no process has polled its "
                                          "tasks for 41 s (serve it with: conductor-agents serve MODULE:AGENT)")
    person = attrs.evolve(base, waiting_for="person")
    assert status_line(person, RUN) == f"RUNNING (waiting for a person: conductor-agents pending {RUN})"


def test_status_json_has_the_fields():
    class Handle:
        execution_id, agent_name, run_id = RUN, "helper", DOMAIN

    status = AgentStatus(execution_id=RUN, status=RunStatus.RUNNING, waiting_for="message", served=False,
                         unserved_for=41.0)
    fields = _status_dict(status, Handle())  # type: ignore[arg-type]
    assert (fields["waitingFor"], fields["served"], fields["unservedFor"]) == ("message", False, 41.0)
    assert AgentStatus(execution_id=RUN, status=RunStatus.RUNNING).served is None  # unknown unless read


@pytest.mark.parametrize("row, said", [
    ({"waitingFor": None, "served": True, "unservedFor": None}, "waits for nothing (working)"),
    ({"waitingFor": "message", "served": None, "unservedFor": None}, "waits for message"),
    ({"waitingFor": None, "served": False, "unservedFor": 41.0}, "not served for 41s"),
    ({"waitingFor": "message", "served": False, "unservedFor": 3700.0}, "not served for 1h (waits for message)"),
])
def test_list_says_not_served_instead_of_working(row, said):
    assert _doing(row) == said


def test_wait_progress_says_once_that_nobody_serves_the_run_and_once_that_it_is_served_again():
    running = AgentStatus(execution_id=RUN, status=RunStatus.RUNNING)
    answers = [attrs.evolve(running, served=False, unserved_for=41.0), attrs.evolve(running, served=False,
               unserved_for=42.0), attrs.evolve(running, served=None), attrs.evolve(running, served=True),
               attrs.evolve(running, served=True), attrs.evolve(running, status=RunStatus.COMPLETED)]
    done = threading.Event()

    def check() -> AgentStatus:
        answer = answers.pop(0)
        if not answers:
            done.set()
        return answer

    stream = io.StringIO()
    watch = ServedWatch(ProgressDisplay(stream, tty=False), check, interval=0.001).start()
    assert done.wait(10)
    watch.stop()
    assert stream.getvalue().splitlines() == [unserved_line(41.0), "served again: a process polls its tasks"]


def test_wait_progress_survives_a_failed_check():
    calls: list[int] = []
    done = threading.Event()

    def check() -> AgentStatus:
        calls.append(1)
        if len(calls) == 1:
            raise ServerError("the server is busy")
        done.set()
        return AgentStatus(execution_id=RUN, status=RunStatus.COMPLETED)

    stream = io.StringIO()
    watch = ServedWatch(ProgressDisplay(stream, tty=False), check, interval=0.001).start()
    assert done.wait(10)
    watch.stop()
    assert len(calls) == 2 and stream.getvalue() == ""
