"""Which processes serve an agent now: a presence row per process in the server's poll data.

Every process that serves an agent (:meth:`AgentRuntime.serve`) polls a made-up task type every
``interval`` seconds with ``count=0``: nothing is ever handed out, but the server writes the row
(type, domain) → ``{workerId, lastPollTime}`` on every poll, on every node's shared store. The type
names the agent and the hour (``conductor_agents_presence_<agent digest>_<hour>``), the domain names
the process. A reader lists the rows of the hour before, this hour and the next (a clock an hour
off still shows), and a process counts as present while its freshest row is younger than
``dead_after`` on the server's clock. Reads stay as small as the number of processes seen in those
hours: the server never deletes poll-data rows, so the hourly names keep old ones out of the way.

A process that closes writes its row once more with a worker id marked gone: others adopt its runs
at once instead of waiting ``dead_after``.

The fence: the owner of a run must stop serving it before others may think it dead. A process
knows its own row's age from its last successful read; once that age plus the time since the read
reaches ¾ of ``dead_after`` (its server cannot be reached, its beacon thread is starved), it calls
``on_fenced``: no task of the runs it holds runs in it until its presence and their leases are renewed
(see ``docs/operations.md``).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._liveness.stall import poll_age, server_now
from .._wire.api import ConductorApi
from ..errors import ServerError
from .live_workers import worker_is_dead_here

__all__ = ["GONE_MARK", "PeerView", "Presence", "presence_task_type"]

log = logging.getLogger("conductor_agents.serve")

GONE_MARK = "#gone"
_HOUR = 3600


def _digest(text: str, size: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:size]


def presence_task_type(agent_name: str, hour: int) -> str:
    """The made-up task type whose rows name the processes serving ``agent_name`` in ``hour``
    (hours since the epoch)."""
    return f"conductor_agents_presence_{_digest(agent_name, 12)}_{hour}"


def process_domain(worker_id: str) -> str:
    """The domain of one process's presence row."""
    return "p" + _digest(worker_id, 20)


@attrs.frozen
class PeerView:
    """What one read of the presence rows of an agent said."""

    #: Present processes (worker ids, this one included) and how old their freshest rows were (s).
    alive: Mapping[str, float]
    #: Processes seen that closed (marked gone), fell silent longer than ``dead_after``, or are processes of
    #: this host that no longer exist.
    gone: frozenset[str]
    #: When the read came back (this process's monotonic clock).
    read_at: float

    def is_dead(self, worker_id: str) -> bool:
        """Known gone, or not present: a worker of another SDK or a non-serving runtime has no row and
        counts as dead here (callers also check the run's own poll data for such workers)."""
        return worker_id not in self.alive

    def assignee(self, key: str) -> str | None:
        """The present process that should take the orphan named ``key`` (hashing spreads orphans)."""
        if not self.alive:
            return None
        ranked = sorted(self.alive)
        return ranked[int(_digest(key, 8), 16) % len(ranked)]


class Presence:
    """This process's presence rows, and its latest view of everyone's. Thread-safe.

    ``beacon()`` once (a first row, so that its leases are never seen without it), then ``start()``
    keeps it fresh on the ``conductor-agents-presence`` thread.
    """

    def __init__(self, api: ConductorApi, worker_id: str, *, dead_after: float, interval: float,
                 on_fenced: Callable[[], None], on_read: Callable[[], None] = lambda: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self.worker_id = worker_id
        self.dead_after = dead_after
        self.interval = interval
        self._on_fenced = on_fenced
        self._on_read = on_read
        self._clock = clock
        self._domain = process_domain(worker_id)
        self._lock = threading.Lock()
        self._agents: list[str] = []
        self._views: dict[str, PeerView] = {}
        #: (when the read came back, this process's row's age then): the fence's evidence.
        self._own: tuple[float, float] | None = None
        self._fenced = False
        self._left = False  # close() marked this process gone
        # Daemon: if it dies with the interpreter, only the beacon stops: this process's runs are
        # adopted by others once its row is older than ``dead_after``, as after a crash.
        self._thread = BackgroundLoop.every("presence", interval, self._beat, daemon=True)

    # -- what others read ---------------------------------------------------------------

    def add(self, agent_name: str) -> None:
        with self._lock:
            if agent_name not in self._agents:
                self._agents.append(agent_name)

    def view(self, agent_name: str) -> PeerView | None:
        """The latest view of ``agent_name``'s processes, or None when it is older than an interval
        and a half (no fresh evidence: adopt nothing on it)."""
        with self._lock:
            view = self._views.get(agent_name)
        if view is None or time.monotonic() - view.read_at > self.interval * 1.5 + 5.0:
            return None
        return view

    def read_again(self, agent_name: str) -> PeerView:
        """A view of ``agent_name``'s processes read now (kept as the latest): for a decision the round's view, read
        up to two intervals ago, must not make alone (a process whose presence was renewed since).

        Raises: ServerError (and subclasses), HttpError: the server could not be reached."""
        view = self._read(agent_name, int(self._clock.time() // _HOUR))
        with self._lock:
            self._views[agent_name] = view
        return view

    def holds(self) -> bool:
        """Whether this process may serve leased runs now (its own row is fresh enough)."""
        with self._lock:
            own, fenced = self._own, self._fenced
        if fenced or own is None:
            return False
        read_at, age = own
        return age + (time.monotonic() - read_at) < 0.75 * self.dead_after

    # -- the beacon -----------------------------------------------------------------------

    def beacon(self) -> None:
        """Write this process's rows for every agent it serves, then read everyone's.

        Raises: ServerError (and subclasses), HttpError: the server could not be reached.
        """
        with self._lock:
            agents = list(self._agents)
        hour = int(self._clock.time() // _HOUR)
        for agent_name in agents:
            self._write(agent_name, hour, self.worker_id)
        for agent_name in agents:
            view = self._read(agent_name, hour)
            with self._lock:
                self._views[agent_name] = view

    def close(self) -> None:
        """Stop the thread, then mark this process gone (once it no longer serves anything): others adopt its
        runs now. Safe before start (it marks nothing when it serves no agent)."""
        self._stop()
        hour = int(self._clock.time() // _HOUR)
        with self._lock:
            agents = [] if self._left else list(self._agents)
            self._left = True
        for agent_name in agents:
            try:
                self._write(agent_name, hour, self.worker_id + GONE_MARK)
            except (ServerError, OSError) as err:
                log.warning("could not mark this process gone for %s (%s): its runs are adopted once its "
                            "presence ages out (%.0fs)", agent_name, err, self.dead_after)

    def start(self) -> None:
        """Keep the rows fresh on the thread, every ``interval``. Only the first call starts it."""
        self._thread.start_once()

    def _stop(self) -> None:
        """Stop the thread and join it (15 s at most). Idempotent, safe before start."""
        self._thread.stop()
        self._thread.join(15.0)

    def _beat(self) -> None:
        """One round of the thread: the beacon, then the fence."""
        try:
            self.beacon()
            self._on_read()
        except (ServerError, OSError) as err:
            log.debug("presence beacon failed: %s", err)
        except Exception:  # the thread must go on; the fence decides
            log.exception("presence beacon failed")
        self._check_fence()

    def _check_fence(self) -> None:
        with self._lock:
            if self._fenced or self._own is None:
                return
        if self.holds():
            return
        with self._lock:
            self._fenced = True
        log.error("this process's presence could not be renewed for %.0fs (about ¾ of the %.0fs after which "
                  "others adopt its runs): it stops serving them", 0.75 * self.dead_after, self.dead_after)
        try:
            self._on_fenced()
        except Exception:
            log.exception("fencing this process's runs failed")
        with self._lock:
            self._fenced = False  # serving again means holding new leases, after a fresh row
            self._own = None

    # -- rows -----------------------------------------------------------------------------

    def _write(self, agent_name: str, hour: int, worker_id: str) -> None:
        self._api.mark_presence(presence_task_type(agent_name, hour), worker_id=worker_id, domain=self._domain)

    def _read(self, agent_name: str, hour: int) -> PeerView:
        freshest: dict[str, float] = {}
        gone: set[str] = set()
        for h in (hour - 1, hour, hour + 1):
            rows, date = self._api.poll_data_sample(presence_task_type(agent_name, h))
            now = server_now(date, self._clock.time())
            for row in rows:
                worker = str(row.get("workerId") or "")
                age = poll_age(row, now)
                if not worker or age is None:
                    continue
                if worker.endswith(GONE_MARK):
                    gone.add(worker[: -len(GONE_MARK)])
                    continue
                if worker not in freshest or age < freshest[worker]:
                    freshest[worker] = age
        read_at = time.monotonic()
        # A process of this host that no longer exists is gone at once, though its row is still fresh: left in
        # ``alive``, it would be the assignee of its share of the orphans (its own runs among them), which the
        # others then take only after the grace, whoever looks first (seen: 30 runs spread 21/7/2).
        alive = {w: a for w, a in freshest.items()
                 if a < self.dead_after and w not in gone and not worker_is_dead_here(w)}
        gone |= {w for w in freshest if w not in alive}
        if self.worker_id in freshest and self.worker_id not in gone:
            with self._lock:
                self._own = (read_at, freshest[self.worker_id])
        return PeerView(alive=alive, gone=frozenset(gone), read_at=read_at)

