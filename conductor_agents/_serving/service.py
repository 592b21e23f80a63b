"""One process's share of serving agents: presence, leases and adoption, put together.

:meth:`AgentRuntime.serve` makes one :class:`Service` per process (a forked child makes its own):

- ``conductor-agents-presence`` writes this process's presence row and reads everyone's every
  ``interval`` (``liveness_stall_seconds / 8``, between 0.5 and 2 s), and fences the process when
  its row cannot be renewed;
- ``conductor-agents-adopt`` runs an adoption round after each read;
- each run this process starts of a served agent takes lease 0 before it starts, and each run it
  adopts the next lease: one owner per run at any time;
- its owner closes :attr:`Service.adopter` (stop adopting), then its workers, then :attr:`Service.presence`
  (marks the process gone, so that other processes adopt its runs in their next round): each a
  :class:`~.._common.parts.Part`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .._wire.api import ConductorApi
from ..errors import ServerError, WorkerStartupError
from .adoption import Adopter, ServedAgent
from .leases import Lease, LeaseBook
from .presence import Presence

__all__ = ["Service", "serve_interval"]

log = logging.getLogger("conductor_agents.serve")


def serve_interval(dead_after: float) -> float:
    """Seconds between presence rows (and adoption rounds) for a stall threshold of ``dead_after``."""
    return max(0.5, min(2.0, dead_after / 8.0))


class Service:
    """Presence, leases and the adopter of one process. Thread-safe."""

    def __init__(self, api: ConductorApi, *, worker_id: str, dead_after: float,
                 adopt: Callable[[str, Any], Any], serving_here: Callable[[str], bool],
                 let_go: Callable[[str], None], pause: Callable[[float], bool]) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._started = False
        self.book = LeaseBook(api, pause=pause)
        self.presence = Presence(api, worker_id, dead_after=dead_after, interval=serve_interval(dead_after),
                                 on_fenced=self._fenced, on_read=self._after_read)
        self.adopter = Adopter(api, self.book, self.presence, worker_id=worker_id, adopt=adopt,
                               serving_here=serving_here, let_go=let_go)

    def add(self, agent: Any, on_adopt: Callable[[Any], Any] | None) -> None:
        """Serve ``agent`` from this process too; the first call starts the threads.

        Raises: WorkerStartupError: the first presence row could not be written and read back.
        """
        self.presence.add(agent.name)
        self.adopter.add(ServedAgent(agent, on_adopt))
        with self._lock:
            first, self._started = not self._started, True
        try:
            self._first_row()
        except BaseException:
            if first:
                with self._lock:
                    self._started = False
            raise
        if first:
            self.presence.start()
            self.adopter.start()
        self.adopter.wake()

    def serves(self, agent_name: str) -> bool:
        return self.adopter.serves(agent_name)

    def claim_first(self, domain: str, execution_hint: str = "") -> Lease | None:
        """Lease 0 of a run about to start here; the lease as the server holds it.

        Raises: ServerError (and subclasses), HttpError: the lease could not be created.
        """
        lease = self.book.claim(domain, 0, self.worker_id, execution_id=execution_hint)
        if lease is not None and lease.owner == self.worker_id:
            self.adopter.hold(lease)
        return lease

    def claim_next(self, domain: str, execution_id: str) -> bool:
        """Take the run on ``domain`` (``resume()`` in a serving process): its next lease, if no one else
        takes it first."""
        newest = self.book.newest(domain)
        if newest is not None and newest.owner == self.worker_id:
            self.adopter.hold(newest)
            return True
        epoch = newest.epoch + 1 if newest is not None else 0
        lease = self.book.claim(domain, epoch, self.worker_id, execution_id=execution_id)
        if lease is None or lease.owner != self.worker_id:
            return False
        self.adopter.hold(lease)
        return True

    def may_serve(self, domain: str) -> bool:
        """Whether this process may run the tasks of ``domain`` now: not while it holds the domain's lease and its
        presence has lapsed (:meth:`Presence.holds`), even before the fence's thread has run, nor after the fence
        until the lease is renewed: a process starved that long answers its polls late, and others may have adopted
        the run meanwhile."""
        return not self.adopter.holds_lease(domain) or (self.presence.holds() and not self.adopter.lapsed(domain))

    # -- internals ----------------------------------------------------------------------

    def _first_row(self) -> None:
        # The first row before any lease: a lease whose owner has no row would look orphaned.
        last: BaseException | None = None
        for attempt in range(3):
            try:
                self.presence.beacon()
                if self.presence.holds():
                    return
            except (ServerError, OSError) as err:
                last = err
            if attempt < 2:
                threading.Event().wait(0.5)
        raise WorkerStartupError(
            "serve(): this process's presence row could not be written and read back on the server "
            f"({type(last).__name__ + ': ' + str(last) if last else 'the row did not show'}); it adopts nothing")

    def _after_read(self) -> None:
        self.adopter.wake()

    def _fenced(self) -> None:
        domains = self.adopter.lapse_all()
        log.info("no task of the runs on %d domain(s) runs here until this process has renewed its presence and "
                 "their leases (%s); a run another process took meanwhile is let go of", len(domains),
                 ", ".join(domains) or "none")
