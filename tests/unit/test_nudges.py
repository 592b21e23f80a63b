"""Tasks whose queue message the server leased away, found and made due again (``_liveness/nudges.py``)."""

from __future__ import annotations

import pytest

from conductor_agents._liveness.nudges import (
    JOIN_CHECK_SECONDS,
    JOIN_LOOKS,
    LOST_AFTER_SECONDS,
    UNPOLLED_SECONDS,
    LostPolls,
    lost_tasks,
    nudge_result,
    stuck_joins,
    unpolled_tasks,
)
from conductor_agents._liveness.watchdog import RunWatchdog
from conductor_agents.errors import ServerUnavailableError
from tests.unit.fakes import FakeClock
from tests.unit.test_watchdog import DOMAIN, EXEC, INTERVAL, SERVER_NOW, FakeApi, running, task

RUN = "run-1"


def join(ref="agent_fork_join__2", *, on=("call_3_0",), iteration=2, loop=True, status="IN_PROGRESS"):
    return {"taskId": f"id-{ref}", "referenceTaskName": ref, "taskType": "JOIN", "status": status,
            "workflowInstanceId": RUN, "inputData": {"joinOn": list(on)}, "loopOverTask": loop,
            "iteration": iteration}


def branch(ref, status="IN_PROGRESS", task_type="act"):
    return {"taskId": f"id-{ref}", "referenceTaskName": ref, "taskType": task_type, "status": status}


def test_a_join_none_of_whose_branches_waits_is_stuck():
    assert stuck_joins([join(), branch("loop", task_type="DO_WHILE")]) == [join()]


@pytest.mark.parametrize("waiting", [
    [join(), branch("call_3_0__2")],                                  # its branch (this iteration) still runs
    [join(), branch("call_3_0__2", status="SCHEDULED")],              # ... or waits for a worker
    [join(on=("call_3_0", "call_3_1")), branch("call_3_1__2")],       # one of two branches still runs
    [join(loop=False, iteration=0), branch("call_3_0")],              # outside a loop: no suffix
    [join(on=())],                                                    # waits on nothing we can name
    [join(status="SCHEDULED")],                                       # not in progress
])
def test_a_join_with_a_branch_waiting_or_nothing_to_wait_on_is_left_alone(waiting):
    assert stuck_joins(waiting) == []


def test_the_nudge_is_an_in_progress_result_due_at_once():
    result = nudge_result(join())
    assert (result["workflowInstanceId"], result["taskId"], result["status"], result["callbackAfterSeconds"]) == \
        (RUN, "id-agent_fork_join__2", "IN_PROGRESS", 0)


@pytest.fixture
def watchdog(monkeypatch):
    monkeypatch.setattr(RunWatchdog, "_start_thread", lambda self: None)
    api, clock = FakeApi(), FakeClock()
    dog = RunWatchdog(api, interval=INTERVAL, stall_seconds=30.0, on_ended=lambda run: None, clock=clock)
    dog.watch(RUN, served=True)
    return dog, api, clock


def advance(dog, clock, seconds):
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        clock.advance(INTERVAL)
        dog.run_due()


def test_after_a_tools_result_with_nothing_after_it_a_stuck_join_is_nudged(watchdog):
    dog, api, clock = watchdog
    api.answer(RUN, running(join(), branch("loop", task_type="DO_WHILE")))
    dog.note_result(RUN, tool=True)
    advance(dog, clock, JOIN_CHECK_SECONDS - INTERVAL)
    assert api.count("page", RUN) == 0  # not before its time
    advance(dog, clock, 2 * INTERVAL)
    assert [u["taskId"] for u in api.updates] == ["id-agent_fork_join__2"]
    advance(dog, clock, 2 * JOIN_CHECK_SECONDS - 2 * INTERVAL)
    assert api.count("page", RUN) == 1 and len(api.updates) == 1  # the next look comes twice as late


def test_a_join_still_stuck_after_its_nudge_is_looked_at_and_nudged_again_twice_as_late_a_bounded_number_of_times(
        watchdog):
    dog, api, clock = watchdog
    api.answer(RUN, running(join()))
    dog.note_result(RUN, tool=True)
    advance(dog, clock, JOIN_CHECK_SECONDS + INTERVAL)
    assert len(api.updates) == 1
    advance(dog, clock, 2 * JOIN_CHECK_SECONDS - 2 * INTERVAL)
    assert len(api.updates) == 1  # not before its time
    advance(dog, clock, 2 * INTERVAL)
    assert len(api.updates) == 2
    advance(dog, clock, 100 * JOIN_CHECK_SECONDS)
    assert len(api.updates) == api.count("page", RUN) == JOIN_LOOKS


def test_a_join_evaluated_after_its_nudge_ends_the_looks(watchdog):
    dog, api, clock = watchdog
    api._next = lambda run: running(join()) if not api.updates else running(branch("loop", task_type="DO_WHILE"))
    dog.note_result(RUN, tool=True)
    advance(dog, clock, 100 * JOIN_CHECK_SECONDS)
    assert len(api.updates) == 1 and api.count("page", RUN) == 2


def test_a_task_of_the_run_after_the_tools_result_calls_the_look_off(watchdog):
    dog, api, clock = watchdog
    api.answer(RUN, running(join()))
    dog.note_result(RUN, tool=True)
    dog.note_result(RUN, tool=False)  # the turn callback: the run went past its join
    advance(dog, clock, 3 * JOIN_CHECK_SECONDS)
    assert api.count("page", RUN) == 0 and api.updates == []


def test_a_healthy_join_is_read_but_not_nudged(watchdog):
    dog, api, clock = watchdog
    api.answer(RUN, running(join(), branch("call_3_0__2")))
    dog.note_result(RUN, tool=True)
    advance(dog, clock, JOIN_CHECK_SECONDS + INTERVAL)
    assert api.count("page", RUN) == 1 and api.updates == []


def test_a_failed_look_is_tried_again_at_the_next_sample(watchdog):
    dog, api, clock = watchdog
    api.answer(RUN, ServerUnavailableError("down"), running(join()))
    dog.note_result(RUN, tool=True)
    advance(dog, clock, JOIN_CHECK_SECONDS + 3 * INTERVAL)
    assert len(api.updates) == 1


def test_results_of_runs_not_watched_or_forgotten_are_ignored(watchdog):
    dog, api, clock = watchdog
    dog.note_result(EXEC, tool=True)  # never watched (a sub-run's tool)
    dog.note_result(RUN, tool=True)
    dog.forget(RUN)
    dog.watch(RUN, served=True)
    advance(dog, clock, 3 * JOIN_CHECK_SECONDS)
    assert api.count("page") == 0


# --- a task of a served domain never handed out ----------------------------------------------------------


def test_a_task_of_the_domain_unpolled_past_the_limit_is_found():
    late, young = task("late", age=UNPOLLED_SECONDS + 1), task("young", age=UNPOLLED_SECONDS - 1)
    assert unpolled_tasks([late, young], domain=DOMAIN, server_now=SERVER_NOW) == [late]


@pytest.mark.parametrize("candidate", [
    task("other", age=100, domain="f" * 32),           # another domain
    task("polled", age=100, poll_count=1),             # handed out once (a worker has or had it)
    task("running", age=100, status="IN_PROGRESS"),   # a worker has it
    {**task("retry", age=100), "callbackAfterSeconds": 90},  # its retry delay is not over
])
def test_tasks_polled_elsewhere_or_not_due_yet_are_not(candidate):
    assert unpolled_tasks([candidate], domain=DOMAIN, server_now=SERVER_NOW) == []


def test_a_served_runs_unpolled_task_is_made_due_once_and_a_failed_nudge_is_tried_again(monkeypatch):
    monkeypatch.setattr(RunWatchdog, "_start_thread", lambda self: None)
    api, clock = FakeApi(), FakeClock()
    dog = RunWatchdog(api, interval=INTERVAL, stall_seconds=300.0, on_ended=lambda run: None, clock=clock)
    dog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    waiting = {**task("act", age=UNPOLLED_SECONDS + 5), "workflowInstanceId": EXEC}
    api.answer(EXEC, running(waiting))
    failing = [ServerUnavailableError("down")]
    plain_update = api.update_task

    def update_task(result):
        if failing:
            raise failing.pop()
        plain_update(result)
    api.update_task = update_task
    for _ in range(4):
        clock.advance(INTERVAL)
        dog.run_due()
    assert [(u["taskId"], u["status"], u["callbackAfterSeconds"]) for u in api.updates] == [("id-act", "IN_PROGRESS", 0)]


def test_an_unpolled_task_of_a_run_only_watched_here_is_left_to_the_stall_rule(monkeypatch):
    monkeypatch.setattr(RunWatchdog, "_start_thread", lambda self: None)
    api, clock = FakeApi(), FakeClock()
    dog = RunWatchdog(api, interval=INTERVAL, stall_seconds=300.0, on_ended=lambda run: None, clock=clock)
    dog.watch(EXEC, domain=DOMAIN)  # watched (liveness), not served: nobody here polls it
    api.answer(EXEC, running({**task("act", age=UNPOLLED_SECONDS + 5), "workflowInstanceId": EXEC}))
    for _ in range(3):
        clock.advance(INTERVAL)
        dog.run_due()
    assert api.updates == []


def test_an_unpolled_task_held_back_by_a_full_pool_here_is_not_nudged(monkeypatch):
    monkeypatch.setattr(RunWatchdog, "_start_thread", lambda self: None)
    api, clock = FakeApi(), FakeClock()
    dog = RunWatchdog(api, interval=INTERVAL, stall_seconds=300.0, on_ended=lambda run: None,
                      is_busy=lambda domain: True, clock=clock)
    dog.watch(EXEC, domain=DOMAIN, served=True, served_domain=DOMAIN)
    api.answer(EXEC, running({**task("act", age=UNPOLLED_SECONDS + 5), "workflowInstanceId": EXEC}))
    for _ in range(3):
        clock.advance(INTERVAL)
        dog.run_due()
    assert api.updates == []


# --- a task handed out in a poll whose answer was lost -----------------------------------------------------

WORKER = "worker-here"


def handed(ref, *, age, worker=WORKER, task_type="act", status="IN_PROGRESS"):
    """A task of the run in progress, handed to ``worker`` by a poll ``age`` seconds before SERVER_NOW."""
    return {"taskId": f"id-{ref}", "referenceTaskName": ref, "taskType": task_type, "status": status,
            "workflowInstanceId": RUN, "workerId": worker, "startTime": int((SERVER_NOW - age) * 1000)}


def lost_polls(types=("act",), running=()):
    return LostPolls(frozenset(types), WORKER, lambda task_id: task_id in running)


def test_a_task_in_progress_for_this_worker_not_running_here_and_old_enough_counts_as_lost():
    tasks = [handed("lost", age=LOST_AFTER_SECONDS), handed("young", age=LOST_AFTER_SECONDS - 1),
             handed("running", age=60), handed("other_worker", age=60, worker="worker-elsewhere"),
             handed("other_type", age=60, task_type="record"), handed("done", age=60, status="COMPLETED")]
    found = lost_tasks(tasks, lost_polls(running=("id-running",)), server_now=SERVER_NOW)
    assert [t["referenceTaskName"] for t in found] == ["lost"]


@pytest.fixture
def served_watchdog(monkeypatch):
    monkeypatch.setattr(RunWatchdog, "_start_thread", lambda self: None)
    api, clock = FakeApi(), FakeClock()
    dog = RunWatchdog(api, interval=INTERVAL, stall_seconds=30.0, on_ended=lambda run: None, clock=clock)
    dog.watch(RUN, served=True, served_domain=DOMAIN)
    return dog, api, clock


def test_after_failed_polls_the_runs_tasks_in_progress_are_read_once_and_a_lost_one_is_made_due(served_watchdog):
    dog, api, clock = served_watchdog
    api.answer(RUN, running(handed("call_1_0__2", age=1)))
    dog.resample(DOMAIN, lost_polls())
    dog.run_due()  # the sample the recovery asked for comes at once; the look only LOST_AFTER_SECONDS later
    assert api.count("page", RUN) == 0
    advance(dog, clock, INTERVAL)
    assert api.count("page", RUN) == 1
    assert [(u["taskId"], u["status"], u["callbackAfterSeconds"]) for u in api.updates] == [
        ("id-call_1_0__2", "IN_PROGRESS", 0)]
    advance(dog, clock, 10 * INTERVAL)
    assert api.count("page", RUN) == 1 and len(api.updates) == 1  # one look per recovery


def test_without_failed_polls_or_on_another_domain_nothing_is_read(served_watchdog):
    dog, api, clock = served_watchdog
    api.answer(RUN, running(handed("call_1_0__2", age=60)))
    dog.resample(DOMAIN)
    dog.resample("another-domain", lost_polls())
    advance(dog, clock, 10 * INTERVAL)
    assert api.count("page", RUN) == 0 and api.updates == []


def test_a_look_the_server_did_not_answer_is_made_at_the_next_sample(served_watchdog):
    dog, api, clock = served_watchdog
    api.answer(RUN, ServerUnavailableError("down"), running(handed("call_1_0__2", age=60)))
    dog.resample(DOMAIN, lost_polls())
    advance(dog, clock, 6 * INTERVAL)
    assert len(api.updates) == 1
