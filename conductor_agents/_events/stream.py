""":class:`EventStream`: the iterator :meth:`AgentHandle.events` returns.

A reader thread (``conductor-agents-events-<execution id>``, owned by the stream) fetches
the run's server events and puts them on a queue; this process's local tool events are
put on the same queue by the :class:`~conductor_agents._worker.observer.TaskObserver`; the
caller's thread takes them off in order.

How the reader gets server events:

1. **Stream** ``GET /agent/stream/{id}``. On a dropped connection it reconnects with
   ``Last-Event-ID`` (the server replays what came after); events whose id was already
   delivered are dropped, so nothing is repeated.
2. **Polling** ``GET /workflow/{id}?includeTasks=true`` every ``poll_interval`` and
   rebuilding the events (:mod:`conductor_agents._events.polling`) when the stream cannot serve the run:
   the endpoint is missing (404 for a run that exists, 405/501...), refused on the first
   connection or after repeated reconnect failures, the run had already ended when the
   stream was opened, the server's replay has a gap (it keeps the last 200 events), or the
   stream stays silent while the run has ended. Events already delivered by the stream
   are recognised by content and not repeated.

Behind a load balancer the stream shows only what the node it reached emitted (the server
keeps a run's stream state per node): events are missing, and ``done`` may never come.
While a connection is open a second thread (``conductor-agents-events-<id>-quiet``, owned
by the reader, joined when the connection ends) reads the run's task list after
``idle_check_seconds`` (1 s) without an event, and every second while it stays quiet. The stream is partial when
the run has ended, when it delivered an event that the task list puts after one it never
delivered (one node's stream is in order: the earlier one was emitted elsewhere), or when
the same events stay missing for ten checks (about 10 s: not merely late). Then it
cuts the connection and the reader goes on from the task list. So the iterator ends within
about a second of the run's end on any topology, and behind a balancer it switches to
the task list soon after the first missed event. When the stream's last event (``done``)
comes before the quiet check noticed a gap, the task list is read once and what the stream
missed is delivered before it.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from .._common.checks import A_TIMEOUT
from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._common.transient import TransientErrors
from .._wire.sse import SseDecoder, SseMessage
from .._wire.transport import ByteStream, HttpError
from ..errors import ExecutionNotFoundError, ServerUnavailableError, WaitTimeoutError
from ..events import AgentEvent, WaitingEvent, event_from_sse
from ..result import RunStatus
from .polling import TaskEvents, as_listed

__all__ = ["EventStream", "signature"]

log = logging.getLogger("conductor_agents.events")

_END = object()
_ENDED, _DROPPED, _POLL = "ended", "dropped", "poll"
#: Event keys remembered to drop repeats (id, kind, timestamp).
_SEEN_LIMIT = 4096
#: Checks in a row that must find the same event missing (about 10 s) before a stream counts as partial:
#: a busy server may emit an event seconds after the task list shows it.
_MISSING_CHECKS = 10
#: Pauses before each read of the task of a question-shaped ``waiting`` event (:meth:`_Reader._as_read`).
_WAIT_KIND_PAUSES = (0.0, 0.2, 0.5)


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def signature(event: AgentEvent) -> Hashable:
    """What identifies an event whatever its source (stream ids and polled ids differ)."""
    kind = event.kind
    if kind in ("thinking", "waiting"):
        return kind, getattr(event, "task_reference_name", None)
    if kind == "error":
        return kind, getattr(event, "task_reference_name", None), getattr(event, "run_level", False)
    if kind == "tool_call":
        return kind, getattr(event, "tool_name", ""), _canonical(getattr(event, "arguments", {}))
    if kind == "tool_result":
        return kind, getattr(event, "tool_name", ""), _canonical(getattr(event, "result", None))
    if kind == "done":
        return (kind,)
    return kind, event.id


class _Reader:
    """Fetches a run's server events (stream, else polling) on the reader thread.

    :meth:`abort` may be called from any thread; everything else runs on the reader thread.
    """

    def __init__(self, api: Any, execution_id: str, emit: Callable[[Any], None], *, clock: Clock,
                 deadline: float, poll_interval: float, max_transient_errors: int,
                 idle_check_seconds: float = 1.0, read_timeout: float = 45.0, max_reconnects: int = 5) -> None:
        self._api = api
        self._execution_id = execution_id
        self._emit = emit
        self._clock = clock
        self._deadline = deadline
        self._poll_interval = poll_interval
        self._max_transient = max_transient_errors
        self._idle_check = idle_check_seconds
        self._read_timeout = read_timeout
        self._max_reconnects = max_reconnects
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stream: ByteStream | None = None
        self._seen: set[tuple[str, str, Any]] = set()
        self._seen_order: collections.deque[tuple[str, str, Any]] = collections.deque()
        self._delivered: collections.Counter[Hashable] = collections.Counter()
        self._delivered_lock = threading.Lock()  # the quiet watch reads what the reader delivered
        self._last_numeric: int | None = None
        self._retry_seconds: float | None = None
        self._got_event = False
        self._activity = threading.Event()  # set by the reader on every chunk; the quiet watch clears it
        self._ended_quietly = False
        self.last_event_id = ""
        self.mode = "stream"
        self._task_events = TaskEvents(api, execution_id)  # the task list, read a page from where it may change
        self._wait_kinds: TaskEvents | None = None  # the reader thread's own, to tell a wait's kind (_as_read)

    # -- control ----------------------------------------------------------------------

    def abort(self) -> None:
        """Stop, and cut the open connection so a blocked read returns."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.abort()

    def _stopped(self) -> bool:
        return self._stop.is_set() or self._clock.monotonic() >= self._deadline

    def _pause(self, seconds: float) -> None:
        self._stop.wait(max(0.0, min(seconds, self._deadline - self._clock.monotonic())))

    def run(self) -> None:
        """The thread's body: deliver events, then the end marker (or the error that ended it)."""
        try:
            ended = self._run()
        except BaseException as err:  # noqa: BLE001 - whatever ends the reader is handed to the consumer
            if not self._stop.is_set():
                log.debug("event reader of %s failed: %s", self._execution_id, err)
                self._emit(_Failure(err))
            return
        if ended:  # otherwise it was stopped or ran out of time: the consumer knows why
            self._emit(_END)

    # -- the plan ---------------------------------------------------------------------

    def _run(self) -> bool:
        """True when the run's last event was delivered; False when stopped or out of time."""
        status = self._status()
        if status is not None and RunStatus.parse(status.get("status")).is_terminal:
            log.debug("run %s already ended; reading its events from its task list", self._execution_id)
            return self._poll()
        failures = 0
        while not self._stopped():
            opened = self._clock.monotonic()
            try:
                outcome = self._stream_once()
                # A connection that ends at once without an event counts as a failure (no hot loop).
                brief = self._clock.monotonic() - opened < 2.0 and not self._got_event
                failures = failures + 1 if outcome == _DROPPED and brief else 0
            except HttpError as err:
                if err.status == 404:
                    self._check_exists()
                if not err.transient:
                    log.info("the event stream of %s is unavailable (%s); polling its task list instead",
                             self._execution_id, err)
                    outcome = _POLL
                else:
                    failures += 1
                    outcome = _DROPPED
            except ServerUnavailableError as err:
                failures += 1
                if self._last_numeric is None and failures == 1 and not self.last_event_id:
                    log.info("the event stream of %s is unreachable (%s); polling its task list instead",
                             self._execution_id, err)
                    outcome = _POLL
                else:
                    outcome = _DROPPED
            if outcome == _ENDED:
                return True
            if outcome == _POLL or failures > self._max_reconnects:
                return self._poll()
            delay = (self._retry_seconds or 0.0) if failures == 0 else min(5.0, 0.25 * 2 ** (failures - 1))
            log.debug("event stream of %s dropped; reconnecting after %s in %.2fs",
                      self._execution_id, self.last_event_id or "the start", delay)
            self._pause(delay)
        return False

    def _check_exists(self) -> None:
        """Raise ExecutionNotFoundError when the server does not know the run (a 404 is ambiguous)."""
        try:
            self._api.get_workflow(self._execution_id)
        except ExecutionNotFoundError:
            raise
        except (ServerUnavailableError, HttpError) as err:
            log.debug("could not check that run %s exists: %s", self._execution_id, err)

    # -- the stream -------------------------------------------------------------------

    def _stream_once(self) -> str:
        self._got_event = False
        stream = self._api.agent_stream(self._execution_id, last_event_id=self.last_event_id or None,
                                        timeout=(5.0, self._read_timeout))
        with self._lock:
            self._stream = stream
        done = threading.Event()
        # Daemon, as the reader it serves; ``done`` stops it when the connection ends.
        watch = BackgroundLoop(f"events-{self._execution_id}-quiet", lambda: self._watch_quiet(stream, done),
                               daemon=True, stop=done)
        try:
            if self._stop.is_set():
                return _DROPPED
            content_type = str(stream.headers.get("Content-Type", ""))
            if "text/event-stream" not in content_type:
                log.info("GET /agent/stream/%s answered %r, not an event stream", self._execution_id, content_type)
                return _POLL
            self._ended_quietly = False
            watch.start()
            outcome = self._read(stream)
            if outcome == _DROPPED and self._ended_quietly and not self._stop.is_set():
                return _POLL
            return outcome
        finally:
            done.set()
            with self._lock:
                self._stream = None
            stream.close()
            watch.join(15.0)  # at most one status request (10 s timeout) in flight

    def _watch_quiet(self, stream: ByteStream, done: threading.Event) -> None:
        """While the connection is open: check a quiet stream against the task list; cut it when partial."""
        self._activity.clear()
        still_missing: collections.Counter[Hashable] = collections.Counter()
        checks = 0
        while not done.wait(self._idle_check) and not self._stop.is_set():
            if self._activity.is_set():
                self._activity.clear()
                still_missing, checks = collections.Counter(), 0
                continue
            verdict, missing = self._compare_with_task_list()
            if verdict is None:
                still_missing = (still_missing & missing) if checks else missing
                checks = checks + 1 if still_missing else 0
                if checks < _MISSING_CHECKS:
                    continue
                verdict = "has lacked events of the task list for several seconds"
            log.info("the event stream of %s %s; reading its task list instead", self._execution_id, verdict)
            self._ended_quietly = True
            stream.abort()
            return

    def _compare_with_task_list(self) -> tuple[str | None, collections.Counter[Hashable]]:
        """Why the stream is partial (None when it may not be), and the events it has not delivered."""
        read = self._task_list(logging.DEBUG, "checking the quiet stream of %s failed: %s")
        if read is None:
            return None, collections.Counter()
        workflow, events = read
        if RunStatus.parse(workflow.get("status")).is_terminal:
            return "ended but its stream did not say so", collections.Counter()
        missing: collections.Counter[Hashable] = collections.Counter()
        for event, delivered in self._against_delivered(events):
            if not delivered:
                missing[signature(event)] += 1
            elif missing:  # a later event came, an earlier one never will: another node emitted it
                return "misses events another server node emitted (a load balancer in front)", missing
        return None, missing

    def _task_list(self, level: int, failure: str,
                   source: TaskEvents | None = None) -> tuple[dict[str, Any], list[Any]] | None:
        """The run's status and the events of its tasks (read incrementally), or None (logged at
        ``level`` with ``failure``) when unreadable."""
        try:
            return (source or self._task_events).read()
        except (ServerUnavailableError, HttpError, ExecutionNotFoundError) as err:
            log.log(level, failure, self._execution_id, err)
            return None

    def _against_delivered(self, events: list[AgentEvent]) -> Iterator[tuple[AgentEvent, bool]]:
        """The run's events in order, each with whether the stream delivered it (counted by signature)."""
        with self._delivered_lock:
            delivered = collections.Counter(self._delivered)
        for event in events:
            sig = signature(event)
            if delivered[sig] > 0:
                delivered[sig] -= 1
                yield event, True
            else:
                yield event, False

    def _read(self, stream: ByteStream) -> str:
        decoder = SseDecoder(self.last_event_id)
        try:
            for chunk in stream:
                if self._stopped():
                    return _DROPPED
                for message in decoder.feed(chunk):
                    self._activity.set()  # an event, not a heartbeat: the stream is not quiet
                    self._got_event = True
                    outcome = self._on_message(message)
                    if outcome is not None:
                        return outcome
                if decoder.retry_ms is not None:
                    self._retry_seconds = min(decoder.retry_ms / 1000.0, 30.0)
        except ServerUnavailableError as err:
            log.debug("event stream of %s broke: %s", self._execution_id, err)
        decoder.close()
        return _DROPPED

    def _on_message(self, message: SseMessage) -> str | None:
        numeric = int(message.id) if message.id.isdigit() else None
        if numeric is not None:
            expected = (self._last_numeric or 0) + 1
            if numeric > expected:
                log.info("the server did not replay events %d..%d of run %s (it keeps the last 200); "
                         "reading its task list instead", expected, numeric - 1, self._execution_id)
                return _POLL
        event = event_from_sse(message, self._execution_id)
        key = (message.id, message.event, message.data)
        if key in self._seen:
            log.debug("dropping repeated event %s of run %s", message.id, self._execution_id)
            return None
        self._remember(key)
        if numeric is not None:
            self._last_numeric = numeric  # (a smaller id than before: the server restarted and renumbers)
        if message.id:
            self.last_event_id = message.id
        if event is None:
            return None
        if event.ends_run:
            self._deliver_missing_before_end()
        event = self._as_read(event)
        with self._delivered_lock:
            self._delivered[signature(event)] += 1
        self._emit(event)
        return _ENDED if event.ends_run else None

    def _as_read(self, event: AgentEvent) -> AgentEvent:
        """A streamed ``waiting`` event as its task tells it (:func:`~.polling.as_listed`): the server streams
        every ``HUMAN`` task's form alike, so a listener's wait on one looks like a question to a person."""
        if not isinstance(event, WaitingEvent) or not event.for_person or event.tool_calls:
            return event
        if self._wait_kinds is None:
            self._wait_kinds = TaskEvents(self._api, self._execution_id)
        for pause in _WAIT_KIND_PAUSES:  # the event may come before its task is listed
            self._pause(pause)
            listed = None if self._stopped() else self._task_list(logging.DEBUG, "reading %s's wait failed: %s",
                                                                  self._wait_kinds)
            if listed is None:
                return event
            found = as_listed(event, listed[1])
            if found is not None:
                return found
        return event

    def _deliver_missing_before_end(self) -> None:
        """Before the stream's last event: deliver what the task list has and the stream never did.

        Behind a load balancer the node that streams ``done`` may not have emitted the events
        before it; the run has ended, so its task list is complete. On one node nothing is missing
        and this costs one request. A failed read is logged and the end delivered as it is."""
        read = self._task_list(logging.INFO,
                               "could not read the task list of %s to check its stream was complete: %s")
        if read is None:
            return
        for event, delivered in self._against_delivered(read[1]):
            if delivered or event.ends_run:
                continue
            with self._delivered_lock:
                self._delivered[signature(event)] += 1
            self._emit(event)

    def _remember(self, key: tuple[str, str, Any]) -> None:
        self._seen.add(key)
        self._seen_order.append(key)
        if len(self._seen_order) > _SEEN_LIMIT:
            self._seen.discard(self._seen_order.popleft())

    # -- status and polling -----------------------------------------------------------

    def _status(self) -> dict[str, Any] | None:
        budget = TransientErrors(self._max_transient)
        while not self._stopped():
            try:
                status: dict[str, Any] = self._api.agent_status(self._execution_id, timeout=10.0)
                return status
            except (ServerUnavailableError, HttpError) as err:
                if not budget.tolerate(err):
                    raise
                self._pause(self._poll_interval)
        return None

    def _poll(self) -> bool:
        """Deliver the events rebuilt from the task list until the run's last one (True) or a stop."""
        self.mode = "poll"
        emitted: set[str] = set()
        budget = TransientErrors(self._max_transient)
        while not self._stopped():
            try:
                _, events = self._task_events.read()
                budget.ok()
            except ExecutionNotFoundError:
                raise
            except (ServerUnavailableError, HttpError) as err:
                if not budget.tolerate(err):
                    raise
                log.info("polling the tasks of %s failed (%s); %d consecutive errors", self._execution_id, err,
                         budget.count)
            else:
                for event in events:
                    if event.id in emitted:
                        continue
                    emitted.add(event.id)
                    sig = signature(event)
                    with self._delivered_lock:
                        delivered = self._delivered[sig] > 0
                        if delivered:  # the stream delivered it before we switched
                            self._delivered[sig] -= 1
                    if delivered:
                        continue
                    self._emit(event)
                    if event.ends_run:
                        return True
            self._pause(self._poll_interval)
        return False


class EventStream:
    """The events of one run, in order, until it ends: iterate it, or use it as a context manager.

    One thread iterates; :meth:`close` may be called from any thread and closes the HTTP
    connection at once. The stream ends (StopIteration) after the run's last event
    (:class:`~conductor_agents.events.DoneEvent`, or a run-level ``ErrorEvent``).

    Raises (from ``next()``):
        WaitTimeoutError: ``timeout`` seconds passed since ``events()`` was called (the run goes on).
        ExecutionNotFoundError: the server does not know the run.
        ServerUnavailableError, ServerError: the server stayed unreachable.
    """

    def __init__(self, api: Any, execution_id: str, *, timeout: float, observer: Any = None,
                 clock: Clock = SYSTEM_CLOCK, poll_interval: float = 0.5, max_transient_errors: int = 3,
                 idle_check_seconds: float = 1.0) -> None:
        A_TIMEOUT.check("timeout", timeout)
        self.execution_id = execution_id
        self._timeout = float(timeout)
        self._clock = clock
        self._deadline = clock.monotonic() + self._timeout
        self._queue: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._reader = _Reader(api, execution_id, self._queue.put, clock=clock, deadline=self._deadline,
                               poll_interval=poll_interval, max_transient_errors=max_transient_errors,
                               idle_check_seconds=idle_check_seconds)
        # Daemon: if the interpreter exits while it reads, only this stream's events are lost.
        # close() stops it (it cuts the connection) and joins it.
        self._thread = BackgroundLoop(f"events-{execution_id}", self._reader.run, daemon=True)
        self._observer = observer
        self._unsubscribe: Callable[[], None] | None = None
        if observer is not None:
            observer.register_stream(self)
            self._unsubscribe = observer.subscribe(execution_id, self._queue.put)

    def __repr__(self) -> str:
        state = "closed" if self._closed else self.mode
        return f"EventStream(execution_id={self.execution_id!r}, {state}, last_event_id={self.last_event_id!r})"

    @property
    def mode(self) -> str:
        """``"stream"`` (the server's event stream) or ``"poll"`` (rebuilt from the task list)."""
        return self._reader.mode

    @property
    def last_event_id(self) -> str:
        """The id of the last event the server's stream delivered (``""`` before any)."""
        return self._reader.last_event_id

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> AgentEvent:
        with self._lock:
            if self._closed:
                raise StopIteration
            if not self._started:
                self._started = True
                self._thread.start()
        while True:
            remaining = self._deadline - self._clock.monotonic()
            if remaining <= 0:
                self.close()
                raise WaitTimeoutError(
                    f"run {self.execution_id} did not end within {self._timeout:g}s of events(); it goes on "
                    "on the server (call events() again to keep watching)",
                    execution_id=self.execution_id, timeout=self._timeout,
                )
            try:
                item = self._queue.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if self._closed:
                    raise StopIteration from None
                continue
            if item is _END:
                self.close()
                raise StopIteration
            if isinstance(item, _Failure):
                self.close()
                raise item.error
            log.debug("run %s: %s event %s from %s", self.execution_id, item.kind, item.id, item.source)
            if item.ends_run:
                self.close()
            event: AgentEvent = item
            return event

    def close(self) -> None:
        """Stop reading, close the connection and join the reader thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        self._reader.abort()
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._observer is not None:
            self._observer.unregister_stream(self)
        if started and not self._thread.is_current() and not self._thread.join(5.0):
            log.warning("the event reader of %s did not stop within 5s", self.execution_id)

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
