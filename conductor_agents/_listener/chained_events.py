"""The events of a listener across its runs: each run's events, then a ``continued`` event and the next's.

Wraps one :class:`~conductor_agents._events.stream.EventStream` per link, from the oldest run the server still
holds (link 0, the first run; when retention removed it, the lowest link left), oldest first. When a link ends
because it was continued (TERMINATED with the continuation's reason) its closing run-level error is replaced by
a :class:`~conductor_agents.events.ContinuedEvent` and the next held link's events follow, from its start. Where
links were retired (removed or archived: the server answers 404 for them), a
:class:`~conductor_agents.events.RetiredEvent` says which runs were there.

Cost: each held link is read once (its stream, or its task list once it has ended), plus a small status read
when it ends without saying why, and a probe or a few to find the next held link after a retired stretch;
never a read per event.
"""

from __future__ import annotations

import time
from typing import Any

from .._common.checks import A_TIMEOUT
from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import INTERNAL_TASK_TYPES
from .._events.stream import EventStream
from ..errors import ExecutionNotFoundError, WaitTimeoutError
from ..events import AgentEvent, ContinuedEvent, ErrorEvent, RetiredEvent
from ..result import AgentStatus
from .chain import is_abandoned, is_continued
from .directory import Chain, ChainDirectory, Link
from .naming import named_for

__all__ = ["ChainedEvents"]


class ChainedEvents:
    """An iterator of a listener's events until its last run ends. One thread iterates; :meth:`close`
    may be called from any thread.

    Raises (from ``next()``): as :class:`~conductor_agents._events.stream.EventStream`; the timeout covers every run,
    and errors name the id the caller holds (``chain``'s), not a run's.
    """

    def __init__(self, api: Any, directory: ChainDirectory, chain: Chain, *, timeout: float, observer: Any = None,
                 clock: Clock = SYSTEM_CLOCK, poll_interval: float = 0.5, max_transient_errors: int = 3) -> None:
        A_TIMEOUT.check("timeout", timeout)
        self._api = api
        self._directory = directory
        self._chain = chain
        self._timeout = float(timeout)
        self._clock = clock
        self._deadline = clock.monotonic() + self._timeout
        self._options: dict[str, Any] = {"observer": observer, "clock": clock, "poll_interval": poll_interval,
                                         "max_transient_errors": max_transient_errors}
        # The listener's first run (a later link's id held: from that link on): its events, then the next's. A
        # first run retired is found missing when read (then the lowest held link follows, after a ``retired``).
        self._link: Link = chain.link(0 if chain.mailbox else chain.first)
        self._stream: EventStream | None = self._open(self._link)
        self._delivered = False  # whether the current link's stream gave an event yet
        self._queued: list[AgentEvent] = []  # events to give before reading on
        self._closed = False

    def _open(self, link: Link) -> EventStream:
        remaining = self._deadline - self._clock.monotonic()
        if remaining <= 0:
            raise self._timed_out()
        return EventStream(self._api, link.execution_id, timeout=remaining, **self._options)

    def _timed_out(self) -> WaitTimeoutError:
        # Also for a run's stream that timed out: its deadline is this one, its id a run's, its timeout what was left.
        return WaitTimeoutError(
            f"run {self._chain.execution_id} did not end within {self._timeout:g}s of events(); it goes on "
            "on the server (call events() again to keep watching)",
            execution_id=self._chain.execution_id, timeout=self._timeout)

    @property
    def execution_id(self) -> str:
        return self._chain.execution_id

    @property
    def mode(self) -> str:
        return self._stream.mode if self._stream is not None else "closed"

    @property
    def last_event_id(self) -> str:
        return self._stream.last_event_id if self._stream is not None else ""

    def __repr__(self) -> str:
        return f"ChainedEvents(execution_id={self.execution_id!r}, run={self._link.execution_id!r})"

    def __iter__(self) -> ChainedEvents:
        return self

    def __next__(self) -> AgentEvent:
        with named_for(self._chain):
            return self._next()

    def _next(self) -> AgentEvent:
        while True:
            if self._queued:
                return self._queued.pop(0)
            stream = self._stream
            if stream is None or self._closed:
                raise StopIteration
            try:
                event = next(stream)
            except WaitTimeoutError:
                raise self._timed_out() from None
            except ExecutionNotFoundError:
                # Retention removed this run (before it was read: a first run retired, or while it was read: a
                # reader more than ``keep_runs`` runs behind): go on with the first run still held.
                if not self._chain.continuable or self._chain.held(self._link.number):
                    raise
                successor = self._directory.next_link(self._chain, self._link.number)
                if successor is None:
                    raise
                self._move_to(successor, gone=self._link.number, continued=self._delivered)
                continue
            if getattr(event, "tool_name", None) in INTERNAL_TASK_TYPES:
                continue  # the SDK's own tasks (a listener's turn reports) are not the model's tool calls
            self._delivered = True
            if not (isinstance(event, ErrorEvent) and event.run_level and self._chain.continuable):
                return event
            successor = self._successor(event)
            if successor is None:
                return event
            if successor.number < self._link.number:  # an abandoned switch's run: not the listener's events
                self._read(successor)
                continue
            self._move_to(successor, gone=self._link.number + 1, continued=True)

    def _read(self, link: Link) -> Link:
        """Close the current run's stream and read ``link``'s from now on; the run read before."""
        if self._stream is not None:
            self._stream.close()
        previous, self._link = self._link, link
        self._stream = None  # (a stream that cannot open leaves none to close)
        self._stream = self._open(link)
        self._delivered = False
        return previous

    def _run(self, number: int) -> int:
        """The listener's run number of link ``number`` (1 is its first run)."""
        return number - (0 if self._chain.mailbox else self._chain.first) + 1

    def _move_to(self, successor: Link, *, gone: int, continued: bool) -> None:
        """Read ``successor`` from now on; queue a ``continued`` event (when the run read before ended so, or
        was cut short), then a ``retired`` one for links ``gone`` to the one before ``successor``."""
        previous = self._read(successor)
        now = time.time()
        if continued:
            self._queued.append(ContinuedEvent(
                execution_id=previous.execution_id, id=f"continued:{successor.execution_id}", timestamp=now,
                source="local", next_execution_id=successor.execution_id, run=self._run(successor.number)))
        if gone < successor.number:
            first, last = self._run(gone), self._run(successor.number - 1)
            self._queued.append(RetiredEvent(
                execution_id=self._chain.execution_id, id=f"retired:{first}-{last}", timestamp=now, source="local",
                first_run=first, last_run=last))

    def _successor(self, event: ErrorEvent) -> Link | None:
        if not is_continued(event.message):  # the closing error names the reason, or else its status does
            try:
                status = AgentStatus.from_dict(self._api.agent_status(self._link.execution_id))
            except ExecutionNotFoundError:  # retired just now: it was continued long ago
                return self._directory.next_link(self._chain, self._link.number)
            if is_abandoned(status.reason) and self._link.number > self._chain.first:
                return self._chain.link(self._link.number - 1)  # the listener ended in the run before it
            if not is_continued(status.reason):
                return None
        # The next run, or the first one retention kept when the runs after this one were retired
        # (their events are gone with them: a ``retired`` event says which).
        return self._directory.next_link(self._chain, self._link.number)

    def close(self) -> None:
        """Stop reading and close the connection. Idempotent."""
        self._closed = True
        stream = self._stream
        if stream is not None:
            stream.close()

    def __enter__(self) -> ChainedEvents:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
