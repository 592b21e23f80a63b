"""Steps 2 and 3 of a switch: the drain (when the old run counts as at rest, as making progress, or as
stuck), and ending the old run."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import pytest

from conductor_agents._wire.api import TaskPage
from conductor_agents._common.task_names import CARRY_TASK
from conductor_agents._listener.directory import Chain
from conductor_agents._listener.chain import continued_reason
from conductor_agents._listener.switch import Switch
from conductor_agents.errors import ConductorAgentsError

RUN_ID = "0" * 32
CHAIN = Chain("first-run", RUN_ID, "listener", 0)
OLD = CHAIN.link(0)
NEW_ID = CHAIN.link(1).execution_id
NEW_CREATED_MS = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now


class OldRunApi:
    """The server as the drain reads it: the old run's pending tasks at each read, from ``frames``."""

    def __init__(self, frames: Callable[[int], List[dict]]) -> None:
        self.frames = frames
        self.reads = 0

    def agent_status(self, execution_id: str) -> dict:
        return {"status": "RUNNING"}

    def workflow_tasks(self, execution_id: str, *, statuses: Any = (), start: int = 0, count: int = 50) -> TaskPage:
        if execution_id != OLD.execution_id:  # the new run: its carry task, made when it started
            return TaskPage(total=1, tasks=[{"taskType": CARRY_TASK, "status": "SCHEDULED",
                                              "scheduledTime": NEW_CREATED_MS, "taskId": "carry"}])
        tasks = self.frames(self.reads)
        self.reads += 1
        return TaskPage(total=len(tasks), tasks=tasks)


def drain(frames: Callable[[int], List[dict]], *, step: float, idle: Callable[[int], bool] = lambda n: True,
          drain_seconds: float = 60.0) -> "tuple[str, Optional[str], float, int]":
    clock = FakeClock()
    api = OldRunApi(frames)

    def pause(seconds: float) -> bool:
        clock.now += step
        return False

    switch = Switch(api, CHAIN, OLD, None, worker_id="w", clock=clock, pause=pause,  # type: ignore[arg-type]
                    drain_seconds=drain_seconds, locally_idle=lambda execution_id: idle(api.reads))
    state, ended = switch.drain()
    return state, ended, clock.now, api.reads


def acting(seq: int) -> "list[dict]":
    """The old run between two waits: a model turn or a tool call, the task numbered ``seq``."""
    return [{"taskType": "LLM_CHAT_COMPLETE", "status": "SCHEDULED", "seq": seq, "taskId": f"t{seq}"}]


def waiting(seq: int, poll_count: int, scheduled_ms: int) -> "list[dict]":
    return [{"taskType": "JOIN", "status": "IN_PROGRESS", "seq": seq - 1, "taskId": f"j{seq}"},
            {"taskType": "PULL_WORKFLOW_MESSAGES", "status": "IN_PROGRESS", "seq": seq, "taskId": f"p{seq}",
             "pollCount": poll_count, "scheduledTime": scheduled_ms}]


def test_a_backlog_worked_off_between_reads_is_progress_though_no_read_catches_a_wait():
    # 50 reads 10 s apart: the old run takes a new task each time, never seen at a wait (each ends at
    # once: a message is queued). Far past the 60 s bound, it is not cut short; then it waits, at rest.
    def frames(read: int) -> "list[dict]":
        return acting(10 + read) if read < 50 else waiting(1000, 1, NEW_CREATED_MS + 5_000)

    state, _, elapsed, reads = drain(frames, step=10.0)
    assert state == "quiet"
    assert reads == 51 and elapsed >= 500


def test_progress_for_ten_times_the_bound_is_cut_short_there():
    # A sender that bypasses the SDK and never stops keeps the old run busy for ever.
    state, _, elapsed, _ = drain(lambda read: acting(10 + read), step=10.0)
    assert state == "timeout"
    assert 600 <= elapsed <= 610


def test_a_run_that_takes_no_new_task_is_cut_short_after_the_bound():
    state, _, elapsed, _ = drain(lambda read: acting(7), step=1.0)
    assert state == "timeout"
    assert 60 <= elapsed <= 62


def test_a_tool_running_here_is_progress_until_ten_times_the_bound():
    # The same task for ever, but a tool of the run is busy in this process: not stuck, up to the cap.
    state, _, elapsed, _ = drain(lambda read: acting(7), step=5.0, idle=lambda read: False)
    assert state == "timeout"
    assert 600 <= elapsed <= 606


def test_a_wait_that_began_before_the_new_run_is_at_rest_after_two_more_evaluations():
    def frames(read: int) -> "list[dict]":
        return waiting(20, 3 + read, NEW_CREATED_MS - 10_000)

    state, _, elapsed, reads = drain(frames, step=1.0)
    assert state == "quiet"
    assert reads == 3  # first seen at 3 evaluations, quiet at 5


def test_a_wait_scheduled_after_the_new_run_began_is_at_rest_once_evaluated():
    state, _, _, reads = drain(lambda read: waiting(20, 1, NEW_CREATED_MS + 1_000), step=1.0)
    assert state == "quiet" and reads == 1


def test_a_wait_is_not_rest_while_a_tool_of_the_run_still_runs_here():
    state, _, _, reads = drain(lambda read: waiting(20, 1, NEW_CREATED_MS + 1_000), step=1.0,
                               idle=lambda read: read > 4)
    assert state == "quiet" and reads == 5


# --- step 3: ending the old run ------------------------------------------------------------------


class EndingApi:
    """The old run's status after each end: ``answers`` in turn (the last repeats)."""

    def __init__(self, *answers: dict) -> None:
        self.answers = list(answers)
        self.cancels: "list[tuple[str, str]]" = []

    def cancel_agent(self, execution_id: str, reason: str) -> None:
        self.cancels.append((execution_id, reason))

    def agent_status(self, execution_id: str) -> dict:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def ending(api: EndingApi) -> Switch:
    return Switch(api, CHAIN, OLD, None, worker_id="w", clock=FakeClock(),  # type: ignore[arg-type]
                  pause=lambda seconds: False)


def test_an_old_run_a_concurrent_stop_brought_back_is_ended_again():
    """The server's stop rewrites the run it read without a lock: racing the end, it leaves the run
    RUNNING. Read back running, the old run is ended again rather than the switch given up."""
    switch = ending(EndingApi({"status": "RUNNING"}, {"status": "TERMINATED",
                                                      "reasonForIncompletion": continued_reason(NEW_ID)}))
    assert switch.terminate_old() is None
    assert [OLD.execution_id] * 2 == [run for run, _ in switch._api.cancels]


def test_an_old_run_that_ended_on_its_own_gives_up_the_switch():
    assert "COMPLETED" == ending(EndingApi({"status": "COMPLETED"})).terminate_old()


def test_an_old_run_that_keeps_coming_back_is_an_error_not_an_abandoned_switch():
    switch = ending(EndingApi({"status": "RUNNING"}))
    with pytest.raises(ConductorAgentsError, match="still running"):
        switch.terminate_old()
    assert 5 == len(switch._api.cancels)


class _NewRunApi:
    """The newest link as a take-up reads it: running, with ``tasks`` (``total`` of them in all)."""

    def __init__(self, tasks: List[dict], total: Optional[int] = None) -> None:
        self.tasks, self.total = tasks, len(tasks) if total is None else total

    def workflow_status(self, execution_id: str) -> dict:
        return {"status": "RUNNING"}

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 5, statuses: Any = ()) -> TaskPage:
        return TaskPage(total=self.total, tasks=self.tasks[start:start + count])


_FIRST = [{"taskType": "INLINE", "status": "COMPLETED"}, {"taskType": "SET_VARIABLE", "status": "COMPLETED"}]


@pytest.mark.parametrize("tasks, total, pending", [
    (_FIRST + [{"taskType": CARRY_TASK, "status": "SCHEDULED"}], None, True),  # begun, not committed
    (_FIRST + [{"taskType": CARRY_TASK, "status": "COMPLETED"}], None, False),  # committed
    (_FIRST, None, True),  # begun, its carry not scheduled yet (a busy server): not taken for committed
    (_FIRST + [{"taskType": "LLM_CHAT_COMPLETE", "status": "COMPLETED"}], None, False),  # it has turned
    (_FIRST * 3, 9, False),  # more tasks than the page: the carry may be further on, not judged pending
])
def test_a_switch_is_pending_until_its_new_runs_carry_is_completed(tasks, total, pending):
    from conductor_agents._listener.switch import pending_switch

    found = pending_switch(_NewRunApi(tasks, total), CHAIN, CHAIN.link(1))  # type: ignore[arg-type]
    assert found == (OLD if pending else None)
