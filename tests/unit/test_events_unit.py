"""Unit tests for handle.events() (EventStream), the polling view, the observer and the stats math.

No sockets: the server is a fake ConductorApi whose streams are scripted chunk lists.
"""

from __future__ import annotations

import json
import threading
from typing import Any, List, Optional

import pytest
import responses

from conductor_agents._events.polling import events_from_workflow
from conductor_agents._events.stream import EventStream, signature
from conductor_agents._worker.executor import TaskRef
from conductor_agents._worker.observer import TaskObserver
from conductor_agents._wire.transport import HttpError, Transport
from conductor_agents.errors import (
    ExecutionNotFoundError,
    RuntimeClosedError,
    ServerUnavailableError,
    WaitTimeoutError,
)
from conductor_agents.stats import LatencySummary, RuntimeStats, percentile

from .fakes import BASE_URL, FakeClock

EXEC = "wf-1"

# --- a scripted server ----------------------------------------------------------------------------


def frame(event_id: int, kind: str, **data: Any) -> bytes:
    body = {"id": event_id, "type": kind, "executionId": EXEC, "timestamp": 1_700_000_000_000 + event_id, **data}
    return f"id:{event_id}\nevent:{kind}\ndata:{json.dumps(body)}\n\n".encode()


#: What the server streams for the seed scenario (the shapes recorded from a real server).
SEED_SPECS = [
    ("thinking", {"content": "listener_llm__1"}),
    ("waiting", {"pendingTool": {"taskRefName": "call_1_0__1"}}),
    ("thinking", {"content": "listener_llm__2"}),
    ("tool_call", {"toolName": "act", "args": {"method": "act", "_agent_state": {}, "action": "go"}}),
    ("tool_result", {"toolName": "act", "result": {"done": "go"}}),
    ("thinking", {"content": "listener_llm__3"}),
    ("waiting", {"pendingTool": {"taskRefName": "call_5_0__3"}}),
    ("done", {"output": {"result": "stopped", "finishReason": "STOP"}}),
]
SEED = [frame(i + 1, kind, **data) for i, (kind, data) in enumerate(SEED_SPECS)]


class FakeStream:
    """A ByteStream stand-in: yields its chunks; an exception in the list is raised there, a
    threading.Event waited for; ``hold`` keeps it open (like a quiet server) until abort()."""

    def __init__(self, chunks: List[Any], *, hold: bool = False, content_type: str = "text/event-stream") -> None:
        self.chunks = chunks
        self.hold = hold
        self.headers = {"Content-Type": content_type}
        self.aborted = threading.Event()
        self.closed = False

    def __iter__(self):
        for chunk in self.chunks:
            if self.aborted.is_set():
                return
            if isinstance(chunk, BaseException):
                raise chunk
            if isinstance(chunk, threading.Event):
                chunk.wait(5)
                continue
            yield chunk
        if self.hold:
            self.aborted.wait(10)

    def abort(self) -> None:
        self.aborted.set()

    def close(self) -> None:
        self.closed = True


class FakeApi:
    """Answers agent_stream from a script of FakeStreams/exceptions, status and workflow from fields."""

    def __init__(self, streams: List[Any], *, status: str = "RUNNING", workflow: Optional[dict] = None) -> None:
        self.streams = list(streams)
        self.status = status
        self.workflow = workflow
        self.stream_calls: List[Optional[str]] = []
        self.workflow_calls = 0
        self.task_pages: List[int] = []
        self.opened: List[FakeStream] = []

    def agent_stream(self, execution_id: str, *, last_event_id: Optional[str] = None, timeout: Any = None):
        self.stream_calls.append(last_event_id)
        item = self.streams.pop(0) if self.streams else FakeStream([], hold=True)
        if isinstance(item, BaseException):
            raise item
        self.opened.append(item)
        return item

    def agent_status(self, execution_id: str, *, timeout: Any = None) -> dict:
        return {"status": self.status}

    def workflow_status(self, execution_id: str, *, include_variables: bool = False, include_output: bool = False):
        self.workflow_calls += 1  # one read of the run: its status, then the pages of its tasks
        if self.workflow is None:
            raise ExecutionNotFoundError(f"no execution {execution_id!r}", execution_id=execution_id)
        return {k: v for k, v in self.workflow.items() if k in ("status", "output", "reasonForIncompletion")}

    def get_workflow(self, execution_id: str, *, include_tasks: bool = False) -> dict:
        self.workflow_calls += 1
        if self.workflow is None:
            raise ExecutionNotFoundError(f"no execution {execution_id!r}", execution_id=execution_id)
        return self.workflow

    def workflow_tasks(self, execution_id: str, *, start: int = 0, count: int = 15, statuses=()):
        """The task list, a page at a time (what the event reader reads instead of the whole run)."""
        from conductor_agents._wire.api import TaskPage
        self.task_pages.append(start)
        if self.workflow is None:
            raise ExecutionNotFoundError(f"no execution {execution_id!r}", execution_id=execution_id)
        tasks = list(self.workflow.get("tasks") or ())
        return TaskPage(total=len(tasks), tasks=tasks[start:start + count])


def collect(stream: EventStream) -> list:
    with stream:
        return list(stream)


def make(api: FakeApi, **kwargs: Any) -> EventStream:
    kwargs.setdefault("timeout", 10.0)
    kwargs.setdefault("poll_interval", 0.01)
    return EventStream(api, EXEC, **kwargs)


def kinds(events: list) -> "list[str]":
    return [e.kind for e in events]


SEED_KINDS = ["thinking", "waiting", "thinking", "tool_call", "tool_result", "thinking", "waiting", "done"]

# --- a task list with the same story (what GET /workflow/{id}?includeTasks=true returns) ---------


def task(seq: int, task_type: str, ref: str, status: str, scheduled: int, end: int = 0, **extra: Any) -> dict:
    return {"seq": seq, "taskId": f"t{seq}", "taskType": task_type, "referenceTaskName": ref, "status": status,
            "scheduledTime": scheduled, "startTime": scheduled + 1, "endTime": end, **extra}


def seed_workflow(status: str = "COMPLETED") -> dict:
    act = dict(inputData={"method": "act", "_agent_state": {}, "_agent_tool_name": "act", "action": "go"},
               outputData={"done": "go"}, taskDefinition={"name": "act"})
    return {
        "workflowId": EXEC, "status": status, "endTime": 1900, "output": {"result": "stopped", "finishReason": "STOP"},
        "tasks": [
            task(1, "INLINE", "listener_ctx", "COMPLETED", 50, 60),
            task(2, "LLM_CHAT_COMPLETE", "listener_llm__1", "COMPLETED", 100, 150),
            task(3, "FORK", "listener_fork__1", "COMPLETED", 160, 160),
            task(4, "PULL_WORKFLOW_MESSAGES", "call_1_0__1", "COMPLETED", 200, 800),
            task(5, "JOIN", "listener_join__1", "COMPLETED", 200, 810),
            task(6, "LLM_CHAT_COMPLETE", "listener_llm__2", "COMPLETED", 900, 950),
            task(7, "act", "call_3_0__2", "COMPLETED", 1000, 1100, **act),
            task(8, "LLM_CHAT_COMPLETE", "listener_llm__3", "COMPLETED", 1200, 1250),
            task(9, "PULL_WORKFLOW_MESSAGES", "call_5_0__3", "COMPLETED", 1300, 1800),
        ],
    }


# --- the stream -----------------------------------------------------------------------------------


def test_the_stream_yields_typed_events_in_order_and_ends_after_done():
    """Eight server events in one connection: eight typed events, then StopIteration."""
    api = FakeApi([FakeStream([b":connected\n\n", *SEED], hold=True)])
    events = collect(make(api))
    assert kinds(events) == SEED_KINDS
    assert [e.id for e in events] == [str(i) for i in range(1, 9)]
    assert events[3].arguments == {"action": "go"} and events[4].result == {"done": "go"}
    assert events[-1].result == "stopped"
    assert api.opened[0].closed  # the connection is closed at the end


def test_a_dropped_connection_resumes_after_the_last_event_without_loss_or_repeat():
    """The connection breaks after event 3 (mid-event); the reconnect sends Last-Event-ID: 3 and
    the replay (which repeats 3) gives 4..8: every event once, in order."""
    first = FakeStream([SEED[0], SEED[1], SEED[2], SEED[3][:20], ServerUnavailableError("reset")])
    second = FakeStream([SEED[2], *SEED[3:]])
    api = FakeApi([first, second])
    events = collect(make(api))
    assert [e.id for e in events] == [str(i) for i in range(1, 9)]
    assert api.stream_calls == [None, "3"]


def test_a_clean_end_of_stream_before_done_also_reconnects():
    """A server that closes the stream quietly (no done yet) is asked again from the last id."""
    api = FakeApi([FakeStream(SEED[:5]), FakeStream(SEED[5:])])
    assert kinds(collect(make(api))) == SEED_KINDS
    assert api.stream_calls == [None, "5"]


def test_repeated_events_are_dropped_by_id():
    """A server that replays from the start regardless of Last-Event-ID does not repeat events."""
    api = FakeApi([FakeStream(SEED[:4]), FakeStream(SEED)])
    events = collect(make(api))
    assert [e.id for e in events] == [str(i) for i in range(1, 9)]


def test_unknown_server_events_are_skipped_but_count_for_resuming():
    """An unknown type between known ones is not yielded; its id is still the resume point."""
    odd = b'id:3\nevent:subagent_start\ndata:{"type":"subagent_start"}\n\n'
    after = [frame(i + 2, kind, **data) for i, (kind, data) in enumerate(SEED_SPECS) if i >= 2]  # ids 4..9
    api = FakeApi([FakeStream([SEED[0], SEED[1], odd]), FakeStream(after)])
    events = collect(make(api))
    assert kinds(events) == SEED_KINDS
    assert api.stream_calls == [None, "3"]


def test_a_replay_gap_switches_to_the_task_list_and_still_repeats_nothing():
    """The server's replay starts after a gap (its buffer overflowed): the rest comes from the task
    list, and the events the stream already gave are not given again."""
    api = FakeApi([FakeStream(SEED[:3] + [ServerUnavailableError("reset")]), FakeStream([SEED[6], SEED[7]])],
                  workflow=seed_workflow())
    events = collect(make(api))
    assert kinds(events) == SEED_KINDS
    assert [e.source for e in events] == ["stream"] * 3 + ["poll"] * 5


def test_404_for_an_existing_run_falls_back_to_polling():
    """A server without the stream endpoint: the same kinds, rebuilt from the task list."""
    api = FakeApi([HttpError("nope", status=404, server_message="", method="GET", path="/agent/stream/wf-1")],
                  workflow=seed_workflow())
    stream = make(api)
    events = collect(stream)
    assert kinds(events) == SEED_KINDS and stream.mode == "poll"
    assert {e.source for e in events} == {"poll"}


def test_connection_refused_at_first_falls_back_to_polling():
    """The stream cannot be reached at all: polling."""
    api = FakeApi([ServerUnavailableError("refused")], workflow=seed_workflow())
    assert kinds(collect(make(api))) == SEED_KINDS


def test_404_for_an_unknown_run_raises_execution_not_found():
    """A 404 for a run the server does not know is the caller's error, raised from next()."""
    api = FakeApi([HttpError("nope", status=404, server_message="", method="GET", path="/x")], workflow=None)
    with pytest.raises(ExecutionNotFoundError):
        collect(make(api))


def test_a_run_that_already_ended_is_read_from_its_task_list():
    """events() on a finished run needs no stream: one task-list read gives everything."""
    api = FakeApi([], status="COMPLETED", workflow=seed_workflow())
    assert kinds(collect(make(api))) == SEED_KINDS
    assert api.stream_calls == []


def test_a_silent_stream_of_an_ended_run_switches_to_the_task_list():
    """Only heartbeats, and the status says the run ended: the events come from the task list."""
    ended = threading.Event()
    api = FakeApi([FakeStream([SEED[0], ended, b":heartbeat\n\n"], hold=True)], workflow=seed_workflow())
    it = iter(make(api, idle_check_seconds=0.0))
    first = next(it)
    api.status = "COMPLETED"
    ended.set()
    assert kinds([first, *it]) == SEED_KINDS


def test_repeated_reconnect_failures_end_in_polling():
    """The stream keeps failing to connect after it worked once: after the retries, polling."""
    failures = [ServerUnavailableError("refused")] * 7
    api = FakeApi([FakeStream([SEED[0], ServerUnavailableError("reset")]), *failures], workflow=seed_workflow())
    stream = make(api)
    stream._reader._pause = lambda seconds: None  # no backoff waits in a unit test
    assert kinds(collect(stream)) == SEED_KINDS
    assert stream.mode == "poll"


def test_the_timeout_raises_wait_timeout_and_closes_the_connection():
    """No end within the timeout: WaitTimeoutError from next(), and the held connection is cut."""
    held = FakeStream([SEED[0]], hold=True)
    stream = make(FakeApi([held]), timeout=0.3)
    it = iter(stream)
    assert next(it).kind == "thinking"
    with pytest.raises(WaitTimeoutError) as caught:
        next(it)
    assert caught.value.execution_id == EXEC and caught.value.timeout == 0.3
    assert held.aborted.is_set()
    assert not [t for t in threading.enumerate() if t.name == f"conductor-agents-events-{EXEC}"]


def test_close_from_another_thread_cuts_the_connection_and_ends_iteration():
    """close() while the reader is blocked: the connection is aborted, the thread joined, next() stops."""
    held = FakeStream([SEED[0]], hold=True)
    stream = make(FakeApi([held]))
    assert next(stream).kind == "thinking"
    closer = threading.Thread(target=stream.close)
    closer.start()
    closer.join(5)
    assert held.aborted.is_set() and held.closed
    with pytest.raises(StopIteration):
        next(stream)
    assert not [t for t in threading.enumerate() if t.name.startswith("conductor-agents-events-")]


def test_timeout_must_be_positive():
    with pytest.raises(ValueError):
        EventStream(FakeApi([]), EXEC, timeout=0)


def test_a_non_event_stream_answer_falls_back_to_polling():
    """A 200 that is not text/event-stream (a proxy's HTML page) is not parsed as events."""
    api = FakeApi([FakeStream([b"<html>"], content_type="text/html")], workflow=seed_workflow())
    assert kinds(collect(make(api))) == SEED_KINDS


# --- local events ---------------------------------------------------------------------------------


def task_ref(task_id: str = "t7", workflow_id: str = EXEC) -> TaskRef:
    return TaskRef(task_id=task_id, workflow_id=workflow_id, task_type="act", reference_name="call_3_0__2",
                   input_data={}, response_timeout_seconds=3600)


def test_local_tool_events_are_merged_into_the_run_stream():
    """The observer's tool_started/tool_finished for this run reach the iterator; other runs' do not."""
    observer = TaskObserver(clock=FakeClock())
    gate = threading.Event()

    class GatedStream(FakeStream):
        def __iter__(self):
            yield from SEED[:3]
            gate.wait(5)  # the tool runs here
            yield from SEED[3:]

    stream = make(FakeApi([GatedStream([])]), observer=observer)
    it = iter(stream)
    assert kinds([next(it), next(it), next(it)]) == ["thinking", "waiting", "thinking"]
    observer.task_started(task_ref("other", workflow_id="wf-2"))
    observer.task_started(task_ref())
    observer.task_finished(task_ref(), "FAILED_WITH_TERMINAL_ERROR", 0.25, "ValueError: bad")
    gate.set()
    rest = list(it)
    assert kinds(rest) == ["tool_started", "tool_finished", *SEED_KINDS[3:]]
    finished = rest[1]
    assert (finished.source, finished.task_id, finished.duration_seconds, finished.error, finished.ok) == (
        "local", "t7", 0.25, "ValueError: bad", False)


def test_a_closed_observer_refuses_new_streams_and_closes_open_ones():
    """runtime.close() closes the observer: open streams end, new ones raise RuntimeClosedError."""
    observer = TaskObserver()
    held = FakeStream([SEED[0]], hold=True)
    stream = make(FakeApi([held]), observer=observer)
    next(stream)
    observer.close()
    assert held.aborted.is_set()
    with pytest.raises(StopIteration):
        next(stream)
    with pytest.raises(RuntimeClosedError):
        make(FakeApi([]), observer=observer)


# --- the polling view -----------------------------------------------------------------------------


def test_the_task_list_gives_the_same_story_as_the_stream():
    """Same kinds, same order, same signatures as the server's stream of the same run."""
    polled = events_from_workflow(seed_workflow(), EXEC)
    streamed = collect(make(FakeApi([FakeStream(SEED)])))
    assert kinds(polled) == SEED_KINDS
    assert [signature(e) for e in polled] == [signature(e) for e in streamed]
    assert polled[3].arguments == {"action": "go"} and polled[4].result == {"done": "go"}
    assert polled[0].timestamp == 0.1 and polled[0].id == "task:t2:thinking"


def test_a_running_workflow_has_no_end_event_yet():
    assert kinds(events_from_workflow(seed_workflow("RUNNING"), EXEC)) == SEED_KINDS[:-1]


def test_failed_tools_and_failed_runs_become_errors():
    """A failed optional tool (COMPLETED_WITH_ERRORS) is an error event; a terminated run a run-level one."""
    workflow = seed_workflow("TERMINATED")
    workflow["reasonForIncompletion"] = "cancelled by the caller"
    workflow["tasks"][6].update(status="COMPLETED_WITH_ERRORS", reasonForIncompletion="RuntimeError: kaboom")
    events = events_from_workflow(workflow, EXEC)
    assert kinds(events) == ["thinking", "waiting", "thinking", "error", "thinking", "waiting", "error"]
    assert (events[3].task_reference_name, events[3].message, events[3].run_level) == (
        "call_3_0__2", "RuntimeError: kaboom", False)
    assert events[-1].run_level and events[-1].ends_run and events[-1].message == "cancelled by the caller"


def test_a_tool_result_map_with_a_result_key_reports_that_value():
    """Like the server: output['result'] when present, else the whole output map."""
    workflow = seed_workflow()
    workflow["tasks"][6]["outputData"] = {"result": 42, "extra": 1}
    assert events_from_workflow(workflow, EXEC)[4].result == 42


# --- stats ----------------------------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    """p50 of 1..100 is 50, p99 is 99, p100 the max; one sample is every percentile; none is None."""
    samples = list(range(100, 0, -1))  # unsorted on purpose
    assert (percentile(samples, 50), percentile(samples, 99), percentile(samples, 100)) == (50, 99, 100)
    assert percentile([1, 2, 3, 4], 50) == 2 and percentile([1, 2, 3, 4], 51) == 3
    assert percentile([7.5], 1) == 7.5 and percentile([7.5], 99) == 7.5
    assert percentile([], 50) is None
    for bad in (0, -1, 100.5):
        with pytest.raises(ValueError):
            percentile([1], bad)


def test_latency_summary():
    assert LatencySummary.of([]) == LatencySummary()
    assert LatencySummary.of([0.3, 0.1, 0.2]) == LatencySummary(count=3, p50=0.2, p99=0.3, max=0.3)


def test_the_observer_counts_tools_and_pickup_latency():
    """Started/finished tools, failures, in-flight; pickup = startTime - scheduledTime of polled tasks."""
    observer = TaskObserver(clock=FakeClock())
    observer.task_started(task_ref("a"))
    observer.task_started(task_ref("b"))
    observer.task_finished(task_ref("a"), "COMPLETED", 0.5, None)
    api = observer.polling_api(_PollApi([
        [{"workflowInstanceId": EXEC, "scheduledTime": 1000, "startTime": 1250},
         {"workflowInstanceId": "wf-2", "scheduledTime": 1000, "startTime": 1010},
         {"workflowInstanceId": EXEC, "scheduledTime": 0, "startTime": 5}],  # no scheduled time: no sample
        ServerUnavailableError("down"),
    ]))
    api.poll_tasks("act", count=1)
    with pytest.raises(ServerUnavailableError):
        api.poll_tasks("act", count=1)
    assert api.other() == "delegated"
    run = observer.run_stats(EXEC, domain="d1")
    assert (run.tools_executed, run.tools_failed, run.tools_in_flight, run.domain) == (1, 0, 1, "d1")
    assert run.pickup_latency == LatencySummary(count=1, p50=0.25, p99=0.25, max=0.25)
    observer.task_finished(task_ref("b"), "FAILED_WITH_TERMINAL_ERROR", 1.5, "boom")
    total = observer.runtime_stats([_Poller("d1", [EXEC]), _Poller(None, ["wf-3"])])
    assert (total.tools_executed, total.tools_failed, total.tools_in_flight) == (2, 1, 0)
    assert (total.polls, total.poll_errors) == (2, 1)
    assert total.tool_duration == LatencySummary(count=2, p50=0.5, p99=1.5, max=1.5)
    assert total.pickup_latency.count == 2
    assert [(r.execution_id, r.domain) for r in total.active_runs] == [("wf-3", None), (EXEC, "d1")]
    assert total.domains == ("d1",)
    assert observer.run_stats("never").tools_executed == 0
    assert isinstance(total, RuntimeStats)


def test_the_observer_keeps_a_window_of_samples():
    observer = TaskObserver(window=3)
    for i in range(10):
        observer.task_started(task_ref(str(i)))
        observer.task_finished(task_ref(str(i)), "COMPLETED", float(i), None)
    assert observer.run_stats(EXEC).tool_duration == LatencySummary(count=3, p50=8.0, p99=9.0, max=9.0)
    assert observer.run_stats(EXEC).tools_executed == 10


class _PollApi:
    def __init__(self, answers: list) -> None:
        self.answers = answers

    def poll_tasks(self, task_type: str, **kwargs: Any) -> list:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def other(self) -> str:
        return "delegated"


class _Poller:
    def __init__(self, domain: Optional[str], executions: list) -> None:
        self.domain = domain
        self.executions = tuple(executions)


# --- the transport's stream -----------------------------------------------------------------------


@responses.activate
def test_open_stream_sends_the_headers_and_yields_the_body():
    responses.add(responses.GET, BASE_URL + "/agent/stream/wf-1", body=b"".join(SEED),
                  content_type="text/event-stream")
    from conductor_agents._wire.api import ConductorApi

    api = ConductorApi(Transport(BASE_URL))
    with api.agent_stream("wf-1", last_event_id="4") as stream:
        body = b"".join(stream)
    assert body == b"".join(SEED)
    sent = responses.calls[0].request.headers
    assert (sent["Last-Event-ID"], sent["Accept"]) == ("4", "text/event-stream")


@responses.activate
def test_open_stream_maps_error_statuses():
    responses.add(responses.GET, BASE_URL + "/agent/stream/wf-1", json={"message": "No such workflow"}, status=404)
    with pytest.raises(HttpError) as caught:
        Transport(BASE_URL).open_stream("/agent/stream/wf-1")
    assert (caught.value.status, caught.value.server_message) == (404, "No such workflow")


def test_a_stream_that_misses_events_of_a_running_run_switches_to_the_task_list():
    """Behind a balancer the stream carries only its node's events: here the first two arrive, then
    silence while the task list shows more. Two quiet checks later the rest comes from the task list,
    once each, and the iterator ends with the run."""
    api = FakeApi([FakeStream(SEED[:2], hold=True)], workflow=seed_workflow(status="RUNNING"))
    stream = make(api, idle_check_seconds=0.05)
    it = iter(stream)
    first_two = [next(it), next(it)]
    third = next(it)  # only the task list has it
    assert stream.mode == "poll" and third.source == "poll"
    api.workflow = seed_workflow()
    assert kinds([*first_two, third, *it]) == SEED_KINDS


def test_task_list_reads_start_where_events_may_still_change():
    """Each read asks for the tasks from the first one whose events may change, not the whole run again."""
    api = FakeApi([], status="RUNNING", workflow=seed_workflow(status="RUNNING"))
    api.workflow["tasks"] = api.workflow["tasks"][:4]
    from conductor_agents._events.polling import TaskEvents
    reader = TaskEvents(api, EXEC)
    first = [e.kind for e in reader.read()[1]]
    api.workflow = seed_workflow()
    assert [e.kind for e in reader.read()[1]] == SEED_KINDS and first == SEED_KINDS[:2]
    assert api.task_pages[0] == 0 and api.task_pages[1] > 0  # the finished head is not read again


def test_a_complete_quiet_stream_stays_a_stream():
    """Quiet but complete (the task list has nothing the stream has not delivered): no switch."""
    api = FakeApi([FakeStream(SEED[:2], hold=True)], workflow=seed_workflow(status="RUNNING"))
    api.workflow["tasks"] = api.workflow["tasks"][:4]  # up to the first wait: what the stream delivered
    stream = make(api, idle_check_seconds=0.05, timeout=1.0)
    it = iter(stream)
    assert kinds([next(it), next(it)]) == SEED_KINDS[:2]
    with pytest.raises(WaitTimeoutError):
        next(it)
    assert stream.mode == "stream" and api.workflow_calls >= 2


def test_a_stream_that_skipped_an_earlier_event_switches_at_the_first_check():
    """The stream delivered the second `thinking` but never the `waiting` before it: one node's stream
    is in order, so another node emitted it. One quiet check suffices."""
    own_second = frame(2, "thinking", content="listener_llm__2")  # this node numbers its own events
    api = FakeApi([FakeStream([SEED[0], own_second], hold=True)], workflow=seed_workflow(status="RUNNING"))
    stream = make(api, idle_check_seconds=0.05)
    it = iter(stream)
    delivered = [next(it), next(it)]
    third = next(it)
    assert third.kind == "waiting" and third.source == "poll" and api.workflow_calls == 2  # one check, one poll
    api.workflow = seed_workflow()
    assert sorted(kinds([*delivered, third, *it])) == sorted(SEED_KINDS)


def test_a_stream_that_ends_with_events_missing_delivers_them_from_the_task_list_before_done():
    """The node streaming ``done`` emitted only some events (the others went to another node) and
    ``done`` came before any quiet check: the task list fills the gap, every event once, ``done`` last."""
    own = [SEED[0], SEED[1], frame(3, "thinking", content="listener_llm__2"),
           frame(4, "thinking", content="listener_llm__3"), frame(5, "waiting", **SEED_SPECS[6][1]),
           frame(6, "done", **SEED_SPECS[7][1])]
    api = FakeApi([FakeStream(own, hold=True)], workflow=seed_workflow())
    events = collect(make(api, idle_check_seconds=30.0))
    assert sorted(kinds(events)) == sorted(SEED_KINDS) and events[-1].kind == "done"
    assert {e.source for e in events if e.kind in ("tool_call", "tool_result")} == {"poll"}
    assert events[-1].source == "stream" and api.workflow_calls == 1


def test_a_complete_stream_costs_one_task_list_read_at_its_end_and_stays_a_stream():
    api = FakeApi([FakeStream(SEED, hold=True)], workflow=seed_workflow())
    events = collect(make(api, idle_check_seconds=30.0))
    assert kinds(events) == SEED_KINDS and {e.source for e in events} == {"stream"}
    assert api.workflow_calls == 1


def test_a_streamed_human_wait_for_messages_is_not_a_persons_wait_but_a_question_is():
    """The server streams every HUMAN task's form alike; the task list tells a listener's wait for messages
    (``listener_wait="human"``: its input's mark) from a question to a person, whose event stays as streamed."""
    from conductor_agents._common.task_names import MESSAGE_WAIT_MARK

    form = {"response_schema": {"type": "object"}, "tool_name": None}
    frames = [frame(1, "waiting", pendingTool={**form, "taskRefName": "call_1_0__1"}),
              frame(2, "waiting", pendingTool={**form, "taskRefName": "call_3_0__2"}),
              frame(3, "done", output={"result": "ok"})]
    human = {"response_schema": {"type": "object"}}
    workflow = {"workflowId": EXEC, "status": "RUNNING", "tasks": [
        task(1, "HUMAN", "call_1_0__1", "COMPLETED", 100, 200,
             inputData={**human, "_description": f"Waits for a message. {MESSAGE_WAIT_MARK}"}),
        task(2, "HUMAN", "call_3_0__2", "IN_PROGRESS", 300, inputData={**human, "_description": "Ask."}),
    ]}
    api = FakeApi([FakeStream([*frames], hold=True)], workflow=workflow)
    waits = [e for e in collect(make(api)) if e.kind == "waiting"]
    assert [(e.task_reference_name, e.for_person, e.source) for e in waits] == [
        ("call_1_0__1", False, "stream"), ("call_3_0__2", True, "stream")]
