"""Unit tests for retiring a continued listener's older runs (_listener.retention, _listener.head) and for
finding its newest run once the runs in between are gone (_listener.directory)."""

import logging
import threading
import time
from datetime import timedelta

import pytest

from conductor_agents._listener.chain import continued_reason
from conductor_agents._listener.directory import ChainDirectory
from conductor_agents._listener.following import current_status
from conductor_agents._listener.head import SLOTS, read_head, write_head
from conductor_agents import Continuation
from conductor_agents._listener.retention import (
    FAILURE_HOLDS_SECONDS,
    FULL_REMOVAL_FAILED,
    RESWEEP_FLOOR,
    Remover,
    Retirer,
    sweep,
)
from conductor_agents._wire.transport import HttpError
from conductor_agents.errors import (AgentDefinitionError, AgentTypeError, ExecutionNotFoundError,
                                     ServerUnavailableError)
from tests.unit.fakes import FakeClock
from tests.unit.test_chain_directory_and_sending import RUN, FakeChainServer, send


class RetentionServer(FakeChainServer):
    """A chain server that can remove runs, and whose links may have sub-runs."""

    def __init__(self, links=1):
        super().__init__(links)
        self.subs = {}  # execution id -> [sub-run ids]
        self.removed = []  # (execution id, archive) in order
        self.fail_full_removal = None  # an exception the archive=False call raises
        self.clock = FakeClock()  # a failed full removal holds it for ``full_removal_holds`` seconds
        self.full_removal_holds = 15.0  # the SQLite symptom: held until the request timed out
        self.refuse_archive = set()  # runs whose archive the server refuses (a task of them still in progress)
        self.full_attempts = 0  # archive=False calls
        self.poll_times = {}  # (task type, domain) -> epoch ms of the last mark
        self.fail_poll_data = None  # an exception reading the poll data raises
        self.sub_gone = set()
        self.ended = {}  # execution id -> endTime (epoch ms) the server reports once the run ended

    def _known(self, execution_id):
        if execution_id not in self.runs:
            raise ExecutionNotFoundError("gone", execution_id=execution_id)

    def push_message(self, execution_id, body):
        self._known(execution_id)
        return super().push_message(execution_id, body)

    def agent_status(self, execution_id, timeout=None):
        self._known(execution_id)
        status = super().agent_status(execution_id, timeout)
        if status["status"] != "RUNNING":
            status["endTime"] = self.ended.get(execution_id)
        return status

    def poll_data_sample(self, task_type):
        """The poll data with each row's time of its last poll (``poll_times``, epoch ms), and no ``Date`` header."""
        if self.fail_poll_data is not None:
            raise self.fail_poll_data
        rows = self.poll_data(task_type)
        for row in rows:
            row["lastPollTime"] = self.poll_times.get((task_type, row["domain"]), 1)
        return rows, None

    def mark_presence(self, task_type, worker_id, domain):
        super().mark_presence(task_type, worker_id, domain)
        self.poll_times[(task_type, domain)] = time.time() * 1000

    def remove_workflow(self, execution_id, *, archive, timeout=15.0):
        self.calls.append(("remove", execution_id))
        if not archive:
            self.full_attempts += 1
        if not archive and self.fail_full_removal is not None:
            self.clock.advance(self.full_removal_holds)
            raise self.fail_full_removal
        if archive and execution_id in self.refuse_archive:
            said = f"Cannot archive task: t1 of workflow: {execution_id} with non-terminal status: IN_PROGRESS"
            raise HttpError(f"HTTP 400: {said}", status=400, server_message=said, method="DELETE", path="/remove")
        if execution_id in self.runs:
            del self.runs[execution_id]
        elif execution_id in self.subs_alive():
            self.sub_gone.add(execution_id)
        else:
            raise ExecutionNotFoundError("gone", execution_id=execution_id)
        self.removed.append((execution_id, archive))

    def subs_alive(self):
        return {s for subs in self.subs.values() for s in subs} - self.sub_gone

    def get_workflow(self, execution_id, include_tasks=False):
        if execution_id not in self.runs and execution_id not in self.subs_alive():
            raise ExecutionNotFoundError("gone", execution_id=execution_id)
        return {"tasks": [{"taskType": "SUB_WORKFLOW", "subWorkflowId": s} for s in self.subs.get(execution_id, ())]}


def chain_of(server, links):
    for number in range(links - 1):
        server.continue_link(number)
    directory = ChainDirectory(server)
    return directory, directory.chain(server.key(0).execution_id)


def held(server):
    return sorted(server.runs[i]["number"] for i in server.runs)


def test_a_sweep_keeps_the_first_run_and_the_newest_ended_ones_and_writes_the_head_first():
    server = RetentionServer()
    directory, chain = chain_of(server, 8)  # links 0..7, 7 live
    server.calls.clear()
    assert sweep(server, directory, chain, 7, 2, Remover(server)).retired == 4
    assert held(server) == [0, 5, 6, 7]  # link 0, the newest 2 ended, the live one
    kinds = [kind for kind, _ in server.calls]
    assert kinds.index("poll") < kinds.index("remove")  # the head hint is written before anything goes
    assert [server.runs.get(server.key(n).execution_id) for n in (1, 2, 3, 4)] == [None] * 4
    assert read_head(server, RUN) == 7


def test_a_fresh_process_holding_only_the_first_id_finds_the_newest_run_after_retirement():
    server = RetentionServer()
    directory, chain = chain_of(server, 30)
    sweep(server, directory, chain, 29, 0, Remover(server))
    assert held(server) == [0, 29]
    fresh = ChainDirectory(server)
    first = fresh.chain(server.key(0).execution_id)
    server.calls.clear()
    assert fresh.refresh(first).number == 29
    assert len(server.calls) <= 4  # one probe, the hint, the hinted link, the one after it
    link, status = current_status(server, fresh, first)
    assert link.number == 29 and status.status.value == "RUNNING"


def test_a_process_whose_cached_run_was_retired_moves_on_to_the_newest():
    server = RetentionServer()
    directory, chain = chain_of(server, 5)
    stale = ChainDirectory(server)
    stale_chain = stale.chain(server.key(0).execution_id)
    assert stale.refresh(stale_chain).number == 4  # it knew link 4 ...
    for number in range(4, 12):
        server.continue_link(number)
    sweep(server, directory, chain, 12, 1, Remover(server))  # ... which is gone now
    assert server.key(4).execution_id not in server.runs
    link, status = current_status(server, stale, stale_chain)
    assert link.number == 12 and not status.is_terminal
    assert send(server, stale, chain.execution_id) and server.runs[server.key(12).execution_id]["queue"]


def test_a_sweep_cut_short_is_finished_by_the_next_one_and_repeats_do_nothing():
    server = RetentionServer()
    directory, chain = chain_of(server, 10)
    write_head(server, RUN, 9)
    for number in (1, 2, 3):  # a process died after retiring these (the lowest first)
        server.retire(number)
    assert sweep(server, directory, ChainDirectory(server).chain(chain.execution_id), 9, 2, Remover(server)).retired == 3
    assert held(server) == [0, 7, 8, 9]
    server.calls.clear()
    assert sweep(server, directory, chain, 9, 2, Remover(server)).retired == 0
    assert "remove" not in [kind for kind, _ in server.calls]


def test_keep_all_writes_the_head_and_retires_nothing():
    server = RetentionServer()
    directory, chain = chain_of(server, 6)
    assert sweep(server, directory, chain, 5, None, Remover(server)).retired == 0
    assert held(server) == [0, 1, 2, 3, 4, 5] and read_head(server, RUN) == 5


def test_sub_runs_go_before_the_link_that_lists_them():
    server = RetentionServer()
    directory, chain = chain_of(server, 5)
    one = server.key(1).execution_id
    server.subs = {one: ["sub-a"], "sub-a": ["sub-a-inner"]}
    sweep(server, directory, chain, 4, 2, Remover(server))
    assert [i for i, _ in server.removed] == ["sub-a-inner", "sub-a", one]


def test_a_late_writer_does_not_hide_the_newest_head():
    server = RetentionServer()
    for number in range(1, 10):
        write_head(server, RUN, number)
    write_head(server, RUN, 7)  # a process that committed link 7 and was paused meanwhile
    assert read_head(server, RUN) == 9
    assert len({d for (_, d) in server.poll_rows}) == SLOTS


@pytest.mark.parametrize("failure", [
    ServerUnavailableError("read timed out"),
    HttpError("500", status=500, server_message="HikariPool-1 - Connection is not available", method="DELETE",
              path="/workflow/x/remove"),
])
def test_a_server_that_cannot_remove_in_full_gets_archived_removals_and_one_warning(failure, caplog):
    server = RetentionServer()
    directory, chain = chain_of(server, 8)
    server.fail_full_removal = failure
    remover = Remover(server, clock=server.clock)
    with caplog.at_level(logging.WARNING, logger="conductor_agents.continuation"):
        assert sweep(server, directory, chain, 7, 1, remover).retired == 5
    assert remover.archive and all(archive for _, archive in server.removed)
    full = [i for kind, i in server.calls if kind == "remove"]
    assert len(full) == 6  # one full attempt, then five archived removals
    assert len([r for r in caplog.records if "taskIndexingEnabled=false" in r.getMessage()]) == 1


def test_a_failed_full_removal_is_recorded_on_the_server_and_a_new_process_archives_from_its_first_removal(caplog):
    """Under gunicorn recycling each new worker paid the 30 s stall again: the failure is now recorded in the server's
    poll data, which the next process reads once, before its first removal."""
    server = RetentionServer()
    directory, chain = chain_of(server, 12)
    server.fail_full_removal = ServerUnavailableError("read timed out")
    sweep(server, directory, chain, 7, 1, Remover(server, clock=server.clock))
    assert server.full_attempts == 1 and (FULL_REMOVAL_FAILED, "retention") in server.poll_rows
    with caplog.at_level(logging.INFO, logger="conductor_agents.continuation"):
        later = Remover(server)  # another process
        assert sweep(server, directory, chain, 11, 1, later).retired == 4
    assert server.full_attempts == 1 and later.archive and all(archive for _, archive in server.removed)
    assert [c for c in server.calls if c == ("polldata", FULL_REMOVAL_FAILED)] == [("polldata", FULL_REMOVAL_FAILED)] * 2
    assert len([r for r in caplog.records if "a full removal failed on this server" in r.getMessage()]) == 1


def test_a_full_removal_that_failed_at_once_archives_that_run_only(caplog):
    """Seen in the cluster soak: a Redis restart answered one full removal with "LOADING" (at once), and every process
    archived for a day; the archive refused runs with a task still in progress, which then blocked the retirement of
    every later run of their listeners (Redis 12 -> 473 MB in the hour). A failure that did not hold the server says
    nothing of its settings: that run is archived, the next removals are full again, and nothing is recorded."""
    server = RetentionServer()
    directory, chain = chain_of(server, 8)
    server.fail_full_removal = HttpError("500", status=500, server_message="LOADING Redis is loading the dataset",
                                         method="DELETE", path="/workflow/x/remove")
    server.full_removal_holds = 0.05
    remover = Remover(server, clock=server.clock)
    with caplog.at_level(logging.WARNING, logger="conductor_agents.continuation"):
        assert sweep(server, directory, chain, 7, 1, remover).retired == 5
    assert not remover.archive and server.full_attempts == 5  # each run's full removal tried
    assert (FULL_REMOVAL_FAILED, "retention") not in server.poll_rows
    assert "taskIndexingEnabled=false" not in caplog.text


def test_a_run_the_archive_refuses_for_a_task_still_in_progress_is_removed_in_full():
    """A process that archives (the server's record says a full removal failed) meets an ended run with a task still in
    progress: the archive refuses it (400), and the full removal frees it; the later runs are retired past it."""
    server = RetentionServer()
    directory, chain = chain_of(server, 8)
    stuck = chain.link(1).execution_id
    server.refuse_archive.add(stuck)
    remover = Remover(server)
    remover.archive = True
    assert sweep(server, directory, chain, 7, 1, remover).retired == 5
    assert (stuck, False) in server.removed and server.full_attempts == 1


def test_a_record_older_than_it_holds_or_unreadable_lets_a_process_try_a_full_removal_again():
    server = RetentionServer()
    directory, chain = chain_of(server, 8)
    server.mark_presence(FULL_REMOVAL_FAILED, "full removal failed", "retention")
    server.poll_times[(FULL_REMOVAL_FAILED, "retention")] = (time.time() - FAILURE_HOLDS_SECONDS - 60) * 1000
    remover = Remover(server)
    assert sweep(server, directory, chain, 4, 1, remover).retired == 2
    assert server.full_attempts == 2 and not remover.archive
    server.poll_times[(FULL_REMOVAL_FAILED, "retention")] = time.time() * 1000
    server.fail_poll_data = ServerUnavailableError("read timed out")
    remover = Remover(server)
    assert sweep(server, directory, chain, 7, 1, remover).retired == 3
    assert server.full_attempts == 5 and not remover.archive


def test_the_retirer_sweeps_in_the_background_and_closes():
    server = RetentionServer()
    directory, chain = chain_of(server, 6)
    retirer = Retirer(server, directory)
    done = threading.Event()
    original = retirer.remover.remove

    def remove(execution_id):
        result = original(execution_id)
        if execution_id == server.key(2).execution_id:
            done.set()
        return result

    retirer.remover.remove = remove
    retirer.request(chain, 5, 2)
    assert done.wait(5.0)
    retirer.close(5.0)
    assert held(server) == [0, 3, 4, 5]
    assert not [t for t in threading.enumerate() if t.name == "conductor-agents-retire"]


def test_events_skip_the_runs_retention_removed():
    server = RetentionServer()
    directory, chain = chain_of(server, 9)
    sweep(server, directory, chain, 8, 2, Remover(server))
    fresh = ChainDirectory(server)
    first = fresh.chain(server.key(0).execution_id)
    assert fresh.next_link(first, 0).number == 6  # links 1-5 are gone: the first kept one follows link 0
    assert fresh.next_link(first, 6).number == 7 and fresh.next_link(first, 8) is None


def test_a_continued_reason_names_the_run_after_it():  # the reason stays what senders outside read
    assert continued_reason("abc").endswith("as abc")


def test_a_listener_served_from_a_later_runs_id_still_keeps_its_first_run():
    server = RetentionServer()
    directory, _ = chain_of(server, 7)
    later = ChainDirectory(server).chain(server.key(3).execution_id)
    assert later.first == 3
    assert sweep(server, directory, later, 6, 1, Remover(server)).retired == 4
    assert held(server) == [0, 5, 6]


def test_an_agent_without_sub_runs_is_retired_without_reading_its_task_lists():
    server = RetentionServer()
    directory, chain = chain_of(server, 5)
    server.get_workflow = None  # any read of a whole run would fail
    assert sweep(server, directory, chain, 4, 1, Remover(server), with_sub_runs=False).retired == 2


def aged_chain(server, clock, ended_minutes_ago):
    """Links 0..len+1: link n (n >= 1) ended ``ended_minutes_ago[n-1]`` minutes before now (oldest first),
    the last one is live."""
    directory, chain = chain_of(server, len(ended_minutes_ago) + 2)
    for number, minutes in enumerate(ended_minutes_ago, start=1):
        server.ended[server.key(number).execution_id] = (clock.time() - minutes * 60) * 1000
    return directory, chain


def test_keep_for_alone_retires_the_ended_runs_older_than_the_age_and_says_when_the_next_comes_of_age():
    clock = FakeClock()
    server = RetentionServer()
    directory, chain = aged_chain(server, clock, [300, 200, 90, 30, 5])  # links 1-5 ended; 6 live
    swept = sweep(server, directory, chain, 6, None, Remover(server), keep_for=timedelta(hours=1), clock=clock)
    assert swept.retired == 3 and held(server) == [0, 4, 5, 6]
    assert swept.next_due == pytest.approx(clock.time() + 30 * 60)  # link 4 (30 min old) in 30 min
    clock.advance(31 * 60)
    swept = sweep(server, directory, chain, 6, None, Remover(server), keep_for=timedelta(hours=1), clock=clock)
    assert swept.retired == 1 and held(server) == [0, 5, 6]
    assert swept.next_due == pytest.approx(clock.time() + 24 * 60)


def test_a_run_is_retired_when_beyond_the_count_or_older_than_the_age():
    clock = FakeClock()
    server = RetentionServer()
    directory, chain = aged_chain(server, clock, [500, 400, 300, 120, 10])
    # Within keep_runs=4 (links 2-5) but older than 2 h 30 min: links 2 and 3 go as well as link 1.
    swept = sweep(server, directory, chain, 6, 4, Remover(server), keep_for=timedelta(minutes=150), clock=clock)
    assert swept.retired == 3 and held(server) == [0, 4, 5, 6]
    # All young, but beyond keep_runs=1: the count still retires link 4.
    swept = sweep(server, directory, chain, 6, 1, Remover(server), keep_for=timedelta(days=7), clock=clock)
    assert swept.retired == 1 and held(server) == [0, 5, 6]
    assert swept.next_due == pytest.approx(clock.time() + 7 * 86400 - 600)


def test_the_age_walk_stops_at_a_run_that_has_not_ended():
    clock = FakeClock()
    server = RetentionServer()
    directory, chain = aged_chain(server, clock, [300, 200])
    server.runs[server.key(2).execution_id]["status"] = "RUNNING"  # a switch left half done
    swept = sweep(server, directory, chain, 3, None, Remover(server), keep_for=timedelta(minutes=1), clock=clock)
    assert swept.retired == 1 and held(server) == [0, 2, 3] and swept.next_due is None


def test_the_retirer_sweeps_a_quiet_listener_again_when_its_next_run_comes_of_age():
    clock = FakeClock()
    server = RetentionServer()
    directory, chain = aged_chain(server, clock, [120, 30])
    retirer = Retirer(server, directory, clock=clock)
    try:
        retirer.request(chain, 3, None, keep_for=timedelta(hours=1))
        eventually_true(lambda: held(server) == [0, 2, 3] and retirer.scheduled(chain.run_id) is not None)
        assert retirer.scheduled(chain.run_id) == pytest.approx(clock.time() + 30 * 60)
        clock.advance(10 * 60)
        assert held(server) == [0, 2, 3]  # not of age yet
        clock.advance(21 * 60)  # no switch, no request: the schedule alone retires link 2
        retirer._wake.set()  # its wait is real time (at most 5 s): cut it short
        eventually_true(lambda: held(server) == [0, 3])
        eventually_true(lambda: retirer.scheduled(chain.run_id) is None)  # nothing left to age
    finally:
        retirer.close(5.0)


def test_a_failed_sweep_under_keep_for_is_tried_again_after_the_floor_not_in_a_loop():
    clock = FakeClock()
    server = RetentionServer()
    directory, chain = aged_chain(server, clock, [120])
    broken = {"on": True}
    original = server.poll_data

    def poll_data(task_type):
        if broken["on"]:
            raise ServerUnavailableError("down")
        return original(task_type)

    server.poll_data = poll_data
    retirer = Retirer(server, directory, clock=clock)
    try:
        retirer.request(chain, 2, None, keep_for=timedelta(hours=1))
        eventually_true(lambda: retirer.scheduled(chain.run_id) is not None)
        assert retirer.scheduled(chain.run_id) == pytest.approx(clock.time() + RESWEEP_FLOOR)
        sweeps = retirer.sweeps
        broken["on"] = False
        clock.advance(RESWEEP_FLOOR)
        retirer._wake.set()
        eventually_true(lambda: held(server) == [0, 2])
        assert retirer.sweeps == sweeps + 1
    finally:
        retirer.close(5.0)


@pytest.mark.parametrize("value,error", [
    (3600, AgentTypeError), ("1h", AgentTypeError), (timedelta(0), AgentDefinitionError),
    (timedelta(seconds=-5), AgentDefinitionError),
])
def test_keep_for_must_be_a_positive_timedelta(value, error):
    with pytest.raises(error, match="Continuation.keep_for"):
        Continuation(keep_for=value)
    assert Continuation(keep_runs=None, keep_for=timedelta(days=30)).keep_for == timedelta(days=30)


def eventually_true(check, timeout=10.0):
    from tests.helpers import eventually

    eventually(check, timeout=timeout, interval=0.01, message="retirer")


# -- a listener with a mailbox (the id callers hold is not a link) -------------------------------

MAILBOX = "4f0c6b2e-9a51-4d1b-8f35-0d6e2a7c9b11"


class MailboxServer(RetentionServer):
    """A retention server whose listener also has a mailbox run (its correlation id names the chain)."""

    def workflow_status(self, execution_id, include_variables=False):
        if execution_id == MAILBOX:
            from conductor_agents._listener.chain import mailbox_key
            self.calls.append(("status", execution_id))
            return {"workflowId": MAILBOX, "status": "RUNNING", "correlationId": mailbox_key(RUN, "listener")}
        return super().workflow_status(execution_id, include_variables)


def test_a_mailbox_names_its_listener_whose_every_link_is_derived():
    server = MailboxServer()
    directory, chain = chain_of(server, 3)
    boxed = directory.chain(MAILBOX)
    assert (boxed.execution_id, boxed.run_id, boxed.first, boxed.mailbox) == (MAILBOX, RUN, 0, True)
    assert boxed.link(0) == chain.link(0) and boxed.link(0).execution_id != MAILBOX
    assert not boxed.held(0) and chain.held(0)
    assert directory.refresh(boxed).number == 2


def test_a_sweep_of_a_listener_with_a_mailbox_retires_its_first_run_too():
    server = MailboxServer()
    chain_of(server, 8)  # links 0..7, 7 live
    directory = ChainDirectory(server)
    boxed = directory.chain(MAILBOX)
    assert sweep(server, directory, boxed, 7, 2, Remover(server)).retired == 5
    assert held(server) == [5, 6, 7]  # the newest 2 ended, the live one: link 0 went like the others
    assert sweep(server, directory, boxed, 7, 2, Remover(server)).retired == 0  # idempotent


def test_the_mailbox_id_reaches_the_current_run_after_link_0_was_retired():
    """A process that knows only the mailbox id: status and sends find the newest link through the head hint."""
    server = MailboxServer()
    chain_of(server, 8)
    sweep(server, ChainDirectory(server), ChainDirectory(server).chain(MAILBOX), 7, 1, Remover(server))
    assert held(server) == [6, 7]
    fresh = ChainDirectory(server)
    boxed = fresh.chain(MAILBOX)
    link, status = current_status(server, fresh, boxed)
    assert link.number == 7 and not status.is_terminal
    send(server, fresh, MAILBOX)
    assert server.runs[server.key(7).execution_id]["queue"] == ["m1"]


def test_a_link_id_is_anchored_at_the_mailbox_when_one_is_written():
    from conductor_agents._listener.head import write_mailbox

    server = MailboxServer()
    directory, _ = chain_of(server, 4)
    later = directory.chain(server.key(3).execution_id)
    assert directory.anchor(later).execution_id == server.key(0).execution_id  # no mailbox: its first run
    write_mailbox(server, RUN, MAILBOX)
    anchored = directory.anchor(later)
    assert anchored.mailbox and anchored.execution_id == MAILBOX
