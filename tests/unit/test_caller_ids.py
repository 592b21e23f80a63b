"""Errors name the id the caller holds (issue 41, point 4): a continued listener's verbs met errors in one of its
runs and said that run's id (a ``WorkerStallError``'s ``execution_id``, ``run LINK waits for no person now``,
``GET /agent/LINK/status: ...``, ``run LINK did not end within 4.99999s``). Now an error's ``execution_id`` is
the caller's id and its message names the listener first, the run after it."""

from __future__ import annotations

from typing import Any

import pytest
import requests
import responses

from conductor_agents import AgentSettings
from conductor_agents._listener import by_id, chained_events
from conductor_agents._listener.by_id import RunsById
from conductor_agents._listener.chained_events import ChainedEvents
from conductor_agents._listener.delivery import wait_for_delivery
from conductor_agents._listener.directory import Chain, ChainDirectory
from conductor_agents._listener.tracker import ChainTracker
from conductor_agents._listener.naming import rename, run_name
from conductor_agents._listener.sending import send_to_listener
from conductor_agents._liveness.stall import Stall, stall_error
from conductor_agents._people.pending import HumanAnswer, PendingRequest
from conductor_agents._runs.handles import HandleMaker
from conductor_agents._wire.api import ConductorApi
from conductor_agents._wire.transport import Transport
from conductor_agents.cli._options import AGENT_ERRORS
from conductor_agents.errors import (
    ExecutionNotRunningError,
    MessageLostError,
    NothingPendingError,
    PayloadError,
    RunPausedError,
    ServerUnavailableError,
    WaitTimeoutError,
    WorkerStallError,
)
from conductor_agents.handle import AgentHandle
from tests.unit.fakes import BASE_URL, FakeClock, FakeEvent, FakeWatch
from tests.unit.test_chain_directory_and_sending import FakeChainServer, directory_for

RUN_ID = "0123456789abcdef0123456789abcdef"
HELD = "5c31b96b-ded7-4c96-b8ab-401d49f4c90c"  # the listener's mailbox: the id the caller holds
CHAIN = Chain(HELD, RUN_ID, "listener", 0, mailbox=True)
LINK = CHAIN.link(1).execution_id  # its current run
SETTINGS = AgentSettings(server_url=BASE_URL)


def listener_handle(*, liveness: Any = None) -> AgentHandle:
    """A handle on the listener by its mailbox's id, whose current run (as this process knows) is link 1."""
    api = ConductorApi(Transport(BASE_URL))
    directory = ChainDirectory(api)
    directory.remember(CHAIN, newest=CHAIN.link(1))
    clock = FakeClock()
    handle = AgentHandle(api=api, execution_id=HELD, agent_name="listener", run_id=RUN_ID, settings=SETTINGS,
                         clock=clock, liveness=liveness, directory=directory, chain=CHAIN)
    handle._wake = FakeEvent(clock)
    return handle


# --- the rule -------------------------------------------------------------------------------------------


def test_an_error_met_in_a_run_is_named_by_the_listener_then_the_run() -> None:
    said = NothingPendingError(f"run {LINK} waits for no person now (nothing to approve)", execution_id=LINK)
    assert rename(said, HELD) is said
    assert (said.execution_id, str(said)) == (
        HELD, f"listener {HELD} (its run {LINK}) waits for no person now (nothing to approve)")
    assert str(rename(said, HELD)) == str(said)  # renaming twice changes nothing


def test_the_servers_words_for_a_run_are_named_so_too() -> None:
    paused = RunPausedError(f"execution {LINK!r} is paused; it takes no messages until it is unpaused",
                            execution_id=LINK)
    assert str(rename(paused, HELD)) == (
        f"listener {HELD} (its run {LINK}) is paused; it takes no messages until it is unpaused")
    down = rename(ServerUnavailableError(f"GET /agent/{LINK}/status: cannot reach the server at {BASE_URL}"), HELD)
    assert str(down) == f"listener {HELD}: GET /agent/{LINK}/status: cannot reach the server at {BASE_URL}"


def test_an_answer_an_error_carries_is_named_by_the_listener_and_a_bad_argument_is_left_alone() -> None:
    last = HumanAnswer(execution_id=LINK, task_reference_name="deploy_approval_human__1",
                       kind=PendingRequest.APPROVAL)
    said = rename(NothingPendingError("nothing", execution_id=LINK, last_answer=last), HELD)
    assert (said.last_answer.execution_id, said.last_answer.held_in) == (HELD, LINK)
    assert str(rename(PayloadError("the answer must be JSON"), HELD)) == "the answer must be JSON"
    assert (run_name(HELD, HELD), run_name(HELD, LINK, current=True)) == (
        f"run {HELD}", f"listener {HELD} (its current run {LINK})")


# --- where it was met -----------------------------------------------------------------------------------


def test_a_stall_of_a_listeners_run_is_raised_by_its_handle_as_the_listeners() -> None:
    """``wait()`` raised the current run's id as ``execution_id``; the handle's id is the one to resume."""
    stall = stall_error(LINK, Stall(task_reference_name="note_ref", task_type="note", domain=RUN_ID,
                                    waited_seconds=41.5))
    handle = listener_handle(liveness=FakeWatch(stall=stall))
    with pytest.raises(WorkerStallError) as raised:
        handle.wait()
    assert (raised.value.execution_id, handle.stall.execution_id, stall.execution_id) == (HELD, HELD, LINK)
    assert str(raised.value).startswith(f"task 'note_ref' of listener {HELD} (its run {LINK}) is routed to domain")


def test_on_stall_hears_a_listeners_stall_by_the_id_its_handle_holds() -> None:
    heard: list = []
    watch = FakeWatch()
    maker = HandleMaker(ConductorApi(Transport(BASE_URL)), ChainDirectory(None), SETTINGS, clock=FakeClock(),
                        observer=None, workers=lambda: None, on_stall=lambda h, err: heard.append((h, err)),
                        on_pending=None)
    handle = maker.make(HELD, "listener", RUN_ID, None, workers=False, tracker=watch, chain=CHAIN)
    watch.flag(stall_error(LINK, Stall("note_ref", "note", RUN_ID, 41.5)))
    [(told, error)] = heard
    assert (told, error.execution_id, f"listener {HELD} (its run {LINK})" in str(error)) == (handle, HELD, True)


def test_a_listeners_tracker_tells_each_runs_watch_the_id_callers_hold() -> None:
    """So the watchdog's warning of a stall names the listener first (``test_watchdog``)."""
    watch = FakeWatch()
    ChainTracker(CHAIN, CHAIN.link(0)).link_added(CHAIN.link(1), watch)
    assert watch.listener_id == HELD


@responses.activate
def test_a_server_that_is_down_is_told_for_the_listener_not_for_its_run() -> None:
    responses.add(responses.GET, f"{BASE_URL}/agent/{LINK}/status", body=requests.ConnectionError("refused"))
    handle = listener_handle()
    for verb in (handle.status, handle.wait):
        with pytest.raises(ServerUnavailableError) as raised:
            verb()
        assert str(raised.value).startswith(f"listener {HELD}: GET /agent/{LINK}/status: cannot reach the server")


class _TimedOutStream:
    """A run's event stream that reached its deadline: it names its run and the seconds it had left."""

    def __init__(self, api: Any, execution_id: str, *, timeout: float, **options: Any) -> None:
        self.execution_id, self.timeout = execution_id, timeout

    def __next__(self) -> Any:
        raise WaitTimeoutError(f"run {self.execution_id} did not end within 4.99999s of events()",
                               execution_id=self.execution_id, timeout=4.99999)

    def close(self) -> None:
        pass


def test_events_that_time_out_name_the_listener_and_the_timeout_asked_for(monkeypatch) -> None:
    """``conductor-agents events ID --timeout 5`` said ``run LINK did not end within 4.99999s``."""
    monkeypatch.setattr(chained_events, "EventStream", _TimedOutStream)
    directory = ChainDirectory(None)
    directory.remember(CHAIN, newest=CHAIN.link(1))
    events = ChainedEvents(None, directory, CHAIN, timeout=5, clock=FakeClock())
    with pytest.raises(WaitTimeoutError) as raised:
        next(events)
    assert (raised.value.execution_id, raised.value.timeout) == (HELD, 5.0)
    rule = next(rule for rule in AGENT_ERRORS if rule[0] is WaitTimeoutError)
    assert rule[2](raised.value).startswith(f"run {HELD} did not end within 5s; it goes on on the server")


class _WaitsForNobody:
    def get_workflow(self, execution_id: str, include_tasks: bool = False) -> dict:
        return {"workflowId": execution_id, "status": "RUNNING", "tasks": []}


def test_an_answer_to_a_listener_that_waits_for_nobody_names_the_listener(monkeypatch) -> None:
    """``conductor-agents approve ID`` said ``run LINK waits for no person now``."""
    monkeypatch.setattr(by_id, "people_runs", lambda api, directory, execution_id, chain, request=None: (LINK,))
    runs = RunsById(_WaitsForNobody(), ChainDirectory(None), SETTINGS, FakeClock())
    with pytest.raises(NothingPendingError) as raised:
        runs.approve(HELD, chain=CHAIN, reason=None, by=None, request=None, timeout=1.0)
    assert (raised.value.execution_id, str(raised.value)) == (
        HELD, f"listener {HELD} (its run {LINK}) waits for no person now (nothing to approve)")


def test_a_message_to_a_paused_listener_is_refused_by_the_listeners_id() -> None:
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)
    current = server.continue_link(0)
    directory.refresh(chain)  # this process knows the listener is in its second run

    def paused(execution_id: str, body: Any) -> str:
        raise RunPausedError(f"execution {execution_id!r} is paused; it takes no messages until it is unpaused",
                             execution_id=execution_id)
    server.push_message = paused
    with pytest.raises(RunPausedError) as raised:
        send_to_listener(server, directory, root, {"m": 1}, switch_wait=1.0, clock=FakeClock(), pause=lambda s: None)
    assert (raised.value.execution_id, str(raised.value).split(";")[0]) == (
        root, f"listener {root} (its run {current}) is paused")


def test_a_message_not_pulled_in_time_names_the_listener_and_its_current_run() -> None:
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)
    current = server.continue_link(0)
    clock = FakeClock()
    with pytest.raises(WaitTimeoutError) as raised:
        wait_for_delivery(server, directory, chain, "m9", timeout=2.0, interval=0.5, max_transient_errors=3,
                          clock=clock, pause=clock.advance)
    assert (raised.value.execution_id, str(raised.value).split(" within")[0]) == (
        root, f"message m9 was not pulled by listener {root} (its current run {current})")


def test_a_message_lost_in_a_listeners_run_is_told_by_the_listeners_id() -> None:
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, chain = directory_for(server, root)
    current = server.continue_link(0)
    server.runs[current].update(status="COMPLETED")  # the listener ended without pulling it
    with pytest.raises(MessageLostError) as raised:
        wait_for_delivery(server, directory, chain, "m9", timeout=2.0, interval=0.5, max_transient_errors=3,
                          clock=FakeClock(), pause=lambda s: None)
    assert (raised.value.execution_id, str(raised.value).split(" ended")[0]) == (
        root, f"message m9 was not delivered: listener {root} (its run {current})")


def test_an_error_of_the_run_the_caller_holds_keeps_its_words() -> None:
    """A listener that ended in its first run, the id the caller holds: nothing to rename."""
    server = FakeChainServer()
    root = server.key(0).execution_id
    directory, _ = directory_for(server, root)
    server.runs[root].update(status="COMPLETED")
    with pytest.raises(ExecutionNotRunningError) as raised:
        send_to_listener(server, directory, root, {"m": 1}, switch_wait=1.0, clock=FakeClock(), pause=lambda s: None)
    assert (raised.value.execution_id, str(raised.value)) == (root, "not running")
