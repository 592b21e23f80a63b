"""The events of a listener across its runs: each run's events, then a ``continued`` event and the next's.

Wraps one :class:`~conductor_agents._events.stream.EventStream` per link. When a link ends because it was continued
(TERMINATED with the continuation's reason) its closing run-level error is replaced by a
:class:`~conductor_agents.events.ContinuedEvent` and the next link's events follow, from its start.
"""

from __future__ import annotations

import time
from typing import Any

from .._common.checks import A_TIMEOUT
from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.task_names import INTERNAL_TASK_TYPES
from .._events.stream import EventStream
from ..errors import ExecutionNotFoundError, WaitTimeoutError
from ..events import AgentEvent, ContinuedEvent, ErrorEvent
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
                 clock: Clock = SYSTEM_CLOCK, poll_interval: float = 0.5, max_transient_errors: int = 3,
                 start: Link | None = None) -> None:
        A_TIMEOUT.check("timeout", timeout)
        self._api = api
        self._directory = directory
        self._chain = chain
        self._timeout = float(timeout)
        self._clock = clock
        self._deadline = clock.monotonic() + self._timeout
        self._options: dict[str, Any] = {"observer": observer, "clock": clock, "poll_interval": poll_interval,
                                         "max_transient_errors": max_transient_errors}
        # The current run as last known (or ``start``, the run a handle saw the listener end in): its events,
        # then the next's.
        self._link: Link = start if start is not None else directory.newest(chain)
        self._stream: EventStream | None = self._open(self._link)
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
            stream = self._stream
            if stream is None or self._closed:
                raise StopIteration
            try:
                event = next(stream)
            except WaitTimeoutError:
                raise self._timed_out() from None
            except ExecutionNotFoundError:
                # Retention removed this run while it was being read (a reader more than ``keep_runs``
                # runs behind): go on with the first run still held; the rest of this one is gone.
                if not self._chain.continuable or self._chain.held(self._link.number):
                    raise
                successor = self._directory.next_link(self._chain, self._link.number)
                if successor is None:
                    raise
                return self._move_to(successor)
            if getattr(event, "tool_name", None) in INTERNAL_TASK_TYPES:
                continue  # the SDK's own tasks (a listener's turn reports) are not the model's tool calls
            if not (isinstance(event, ErrorEvent) and event.run_level and self._chain.continuable):
                return event
            successor = self._successor()
            if successor is None:
                return event
            if successor.number < self._link.number:  # an abandoned switch's run: not the listener's events
                self._read(successor)
                continue
            return self._move_to(successor)

    def _read(self, link: Link) -> Link:
        """Close the current run's stream and read ``link``'s from now on; the run read before."""
        if self._stream is not None:
            self._stream.close()
        previous, self._link = self._link, link
        self._stream = self._open(link)
        return previous

    def _move_to(self, successor: Link) -> AgentEvent:
        previous = self._read(successor)
        return ContinuedEvent(execution_id=previous.execution_id, id=f"continued:{successor.execution_id}",
                              timestamp=time.time(), source="local", next_execution_id=successor.execution_id,
                              run=successor.number - self._chain.first + 1)

    def _successor(self) -> Link | None:
        try:
            status = AgentStatus.from_dict(self._api.agent_status(self._link.execution_id))
        except ExecutionNotFoundError:  # retired just now: it was continued long ago
            return self._directory.next_link(self._chain, self._link.number)
        if is_abandoned(status.reason) and self._link.number > self._chain.first:
            return self._chain.link(self._link.number - 1)  # the listener ended in the run before it
        if not is_continued(status.reason):
            return None
        # The next run, or the first one retention kept when the runs after this one were retired
        # (their events are gone with them; the ``continued`` event's ``run`` shows the jump).
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
