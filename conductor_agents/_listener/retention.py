"""Retiring a continued listener's older runs from the server (``Continuation.keep_runs``).

Every switch leaves an ended run on the server, and the server never deletes one by itself (its
archiving listener does not fire for agent runs; its prune endpoint needs a search index: see
``docs/operations.md``). So the process that serves a listener removes them: after each switch has
come to rest, and whenever it takes a listener up (a start, ``resume()``, an adoption), it runs a
*sweep*:

1. write the head hint (:mod:`.head`): the newest committed link's number, and read it back; without
   it a process that knows only the first run's id could not find the newest one once the runs in
   between are gone, so nothing is retired unless the hint is there;
2. retire, lowest first, every link from 1 (from 0 when the listener has a mailbox, which is then the id
   callers hold: :mod:`.mailbox`) up to ``head - 1 - keep_runs``: link 0 of a listener without a mailbox
   (the id callers hold) and the newest ``keep_runs`` ended links stay, with the live one. With
   ``keep_for`` (an age), the ended links after those that ended more than ``keep_for`` ago go too (links
   end in order, so the old ones are the lowest: one status read per link looked at, up to the first young
   one). A link's sub-runs (its sub-agents and agent tools, and theirs) go before the link itself, which is
   what lists them.

Each step is idempotent and the removed links always form the lowest stretch after link 0, so a
process killed in the middle leaves a listener that the next sweep (any process's) finishes: it
finds the lowest link still there with a binary search and goes on from it.

Removal is ``DELETE /workflow/{id}/remove?archiveWorkflow=false``, the only call that frees every row
and key of a run on both SQLite and Redis. On a SQLite server with task indexing on, that call holds
the server's only database connection for 30 s and fails; that run is archived instead (``archiveWorkflow=true``:
frees the run, keeps its index rows), and when the archive worked and the full removal had held the server (timed
out, failed after half the timeout, or said its connection pool timed out) the failure is logged once and the
process archives from then on. It also records that failure on the server (a poll-data row of
:data:`FULL_REMOVAL_FAILED`), which every process reads before its own first removal: a new process (a deploy, a web
server's recycled worker) archives at once instead of holding the server's connection for another 30 s. The record
holds for :data:`FAILURE_HOLDS_SECONDS`; after that one process tries a full removal again (the server's settings may
have changed). A full removal that failed at once for another reason (a store restarting: Redis's
``LOADING``; a dropped connection) archives that run only: it says nothing of the server's settings (seen in the
cluster soak: one such failure made every process archive for a day). An ended run that the archive refuses because
a task of it is still in progress (an end that raced a task's update) is removed in full: kept, it blocked the
retirement of every later run of its listener.
Sweeps run on one background thread per process (``conductor-agents-retire``), never on a switch's
or a tool's path; with ``keep_for``, that thread sweeps a listener again when its next ended link
comes of age (a quiet listener has no switch to trigger one).
"""

from __future__ import annotations

import collections
import logging
import threading
from datetime import timedelta

import attrs

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._liveness.stall import poll_age, server_now
from .._liveness.tree import all_sub_runs
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ConductorAgentsError, ExecutionNotFoundError, ServerUnavailableError
from ..result import RunStatus
from .directory import Chain, ChainDirectory
from .head import read_head, write_head

__all__ = ["Remover", "Retirer", "Swept", "sweep"]

log = logging.getLogger("conductor_agents.continuation")

#: The longest one removal may take before it counts as hanging (a healthy server answers in 0.1 s).
REMOVE_TIMEOUT = 15.0
#: The task type whose poll data records that a full removal failed on this server (a poll that takes nothing; no
#: task of it ever exists), and how long that record makes every process archive.
FULL_REMOVAL_FAILED = "conductor_agents_full_removal_failed"
FAILURE_HOLDS_SECONDS = 24 * 3600.0
#: A full removal that failed after holding the server this share of :data:`REMOVE_TIMEOUT` or longer (the symptom of
#: task indexing on SQLite) makes this process archive; one that failed sooner does not.
SLOW_FAILURE_SHARE = 0.5
#: How a SQLite server says its connection was held (Hikari's pool timed out): task indexing's nested connection.
_POOL_EXHAUSTED = "Connection is not available"
#: How the server refuses to archive a run with a task still in progress (``ExecutionDAOFacade.removeTaskIndex``).
_ARCHIVE_REFUSED = "Cannot archive task"
_RECORD_DOMAIN = "retention"


class Remover:
    """Removes runs from the server, falling back to archiving where a full removal fails. Thread-safe."""

    def __init__(self, api: ConductorApi, *, timeout: float = REMOVE_TIMEOUT, clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._record_read = False  # whether this process read the server's record of a failed full removal
        self.archive = False  # True once a full removal failed here (or the server's record says one did)
        self.removed = 0  # runs removed (tests, stats)

    def remove(self, execution_id: str) -> bool:
        """Remove one run; False when it could not be removed (logged), True when it is gone."""
        self._read_record_once()
        with self._lock:
            archive = self.archive
        if archive:
            return self._archive(execution_id, full_if_refused=True)
        began = self._clock.monotonic()
        try:
            self._api.remove_workflow(execution_id, archive=False, timeout=self._timeout)
            return self._gone()
        except ExecutionNotFoundError:
            return True
        except (ServerUnavailableError, HttpError) as err:
            if isinstance(err, HttpError) and err.status < 500:
                log.warning("run %s could not be removed (%s); it is kept", execution_id, err)
                return False
            failure, held = err, self._clock.monotonic() - began
        if not self._archive(execution_id, full_if_refused=False):
            return False
        # The archive of the same run worked where the full removal had failed: the full removal is what fails on
        # this server, if it held the server (task indexing on SQLite holds its only connection until the pool's
        # timeout, 30 s on a stock server, and says so). One that failed at once for another reason (a store
        # restarting: "LOADING", a dropped connection) says nothing of the server's settings.
        pool = isinstance(failure, HttpError) and _POOL_EXHAUSTED in failure.server_message
        if pool or held >= self._timeout * SLOW_FAILURE_SHARE:
            with self._lock:
                first, self.archive = not self.archive, True
            if first:
                log.warning(
                    "the server could not remove run %s in full (%s, after %.0fs): on a SQLite server this is task "
                    "indexing (start it with conductor.app.taskIndexingEnabled=false, see docs/operations.md). "
                    "Processes of this server archive ended runs instead for a day (their index rows stay)",
                    execution_id, failure, held)
                self._record_failure()
        return True

    def _archive(self, execution_id: str, *, full_if_refused: bool) -> bool:
        """``archiveWorkflow=true``; with ``full_if_refused``, a run the archive refuses because a task of it is still
        in progress (an ended run whose end raced a task's update: seen at Redis restarts) is removed in full, the
        one call that frees it (without, it blocked the retirement of every later run of its listener)."""
        try:
            self._api.remove_workflow(execution_id, archive=True, timeout=self._timeout)
            return self._gone()
        except ExecutionNotFoundError:
            return True
        except (ServerUnavailableError, HttpError) as err:
            refused = isinstance(err, HttpError) and err.status == 400 and _ARCHIVE_REFUSED in err.server_message
            if not (refused and full_if_refused):
                log.warning("run %s could not be removed (%s); it is kept until the next sweep", execution_id, err)
                return False
        try:
            self._api.remove_workflow(execution_id, archive=False, timeout=self._timeout)
            log.info("run %s was removed in full: the archive refused it (a task of it still in progress)",
                     execution_id)
            return self._gone()
        except ExecutionNotFoundError:
            return True
        except (ServerUnavailableError, HttpError) as err:
            log.warning("run %s could not be removed (the archive refused a task of it still in progress, and the "
                        "full removal failed: %s); it is kept until the next sweep", execution_id, err)
            return False

    def _gone(self) -> bool:
        with self._lock:
            self.removed += 1
        return True

    def _read_record_once(self) -> None:
        """Before this process's first removal: archive from the start if another process (or an earlier life of
        this one) found within :data:`FAILURE_HOLDS_SECONDS` that this server cannot remove a run in full."""
        with self._lock:
            if self._record_read:
                return
            self._record_read = True
        try:
            rows, date = self._api.poll_data_sample(FULL_REMOVAL_FAILED)
        except ConductorAgentsError as err:  # not known: the full removal is tried, and its failure said
            log.debug("the record of failed full removals could not be read (%s)", err)
            return
        now = server_now(date, self._clock.time())
        ages = [age for row in rows if row.get("domain") == _RECORD_DOMAIN
                and (age := poll_age(row, now)) is not None]
        if ages and min(ages) < FAILURE_HOLDS_SECONDS:
            with self._lock:
                self.archive = True
            log.info("a full removal failed on this server %.0f minutes ago (task indexing on a SQLite server: "
                     "docs/operations.md); this process archives ended runs (their index rows stay)", min(ages) / 60)

    def _record_failure(self) -> None:
        try:
            self._api.mark_presence(FULL_REMOVAL_FAILED, worker_id="full removal failed", domain=_RECORD_DOMAIN)
        except ConductorAgentsError as err:  # the next process tries for itself
            log.debug("the failed full removal could not be recorded on the server (%s)", err)


@attrs.frozen
class Swept:
    """What a sweep did: how many links it retired, and when (epoch seconds) the oldest ended link it
    kept comes of age under ``keep_for`` (None: no age limit, or no ended link left to age)."""

    retired: int = 0
    next_due: float | None = None


def sweep(api: ConductorApi, directory: ChainDirectory, chain: Chain, head: int, keep: int | None,
          remover: Remover, stop: threading.Event | None = None, *, with_sub_runs: bool = True,
          keep_for: timedelta | None = None, clock: Clock = SYSTEM_CLOCK) -> Swept:
    """Write the head hint for committed link ``head`` and retire the links ``keep`` and ``keep_for``
    allow (see the module's docstring). ``keep`` None puts no limit on the count, ``keep_for`` None
    none on the age. ``with_sub_runs`` False: the agent starts no sub-runs (no sub-agents, no agent
    tools), so a link's task list (up to a megabyte) is not read to find them.

    Raises:
        ServerUnavailableError, ServerError: a read or the hint's write failed (the next sweep goes on).
    """
    if not chain.continuable:
        return Swept()
    run_id = chain.run_id
    assert run_id is not None
    if chain.first != 0 and not chain.mailbox:  # served from a later run's id: link 0 is the one callers hold
        chain = Chain(chain.link(0).execution_id, run_id, chain.agent_name, 0)
    write_head(api, run_id, head)
    if keep is None and keep_for is None:
        return Swept()
    hint = read_head(api, run_id)
    if hint < head:
        log.warning("listener %s: its head hint reads %d after link %d was written; nothing is retired this time",
                    chain.execution_id, hint, head)
        return Swept()
    bound = head - 1 - keep if keep is not None else -1  # -1: none by count (link 0 too, for a mailbox)
    next_due = None
    if keep_for is None:
        lowest = directory.lowest_kept(chain, bound)
    else:
        lowest = directory.lowest_kept(chain, head - 1)  # the oldest ended link still held
        if lowest is not None:
            bound, next_due = _aged_bound(api, chain, lowest, head, bound, keep_for, clock)
    if lowest is None or lowest > bound:
        return Swept(0, next_due)
    retired = 0
    for number in range(lowest, bound + 1):
        if stop is not None and stop.is_set():
            break
        link = chain.link(number)
        subs = all_sub_runs(api, link.execution_id) if with_sub_runs else []
        if not all([remover.remove(run) for run in subs]):  # noqa: C419 - remove every one, not up to a failure
            break  # the link lists the sub-runs left: keep it, so the next sweep finds them
        if not remover.remove(link.execution_id):
            break  # removed lowest first: a link left behind stops the sweep (the next one goes on)
        retired += 1
    if retired:
        log.info("listener %s: retired %d ended run(s) (links %d-%d; the newest %s ended kept%s)",
                 chain.execution_id, retired, lowest, lowest + retired - 1, "all" if keep is None else keep,
                 f", none older than {keep_for}" if keep_for is not None else "")
    if keep_for is not None and retired < bound + 1 - lowest:
        return Swept(retired, clock.time())  # cut short: due again (the retirer spaces its sweeps)
    return Swept(retired, next_due)


def _aged_bound(api: ConductorApi, chain: Chain, lowest: int, head: int, bound: int, keep_for: timedelta,
                clock: Clock) -> tuple[int, float | None]:
    """``bound`` raised past the ended links (from ``lowest``, the oldest held) that ended more than
    ``keep_for`` ago, and when the first one kept comes of age (epoch seconds; None when none is kept)."""
    cutoff = clock.time() - keep_for.total_seconds()
    for number in range(max(lowest, bound + 1), head):
        ended = _ended_at(api, chain.link(number).execution_id)
        if ended is None:
            return bound, None  # not ended (a switch left half done): looked at by the sweep after it
        if ended > cutoff:
            return bound, ended + keep_for.total_seconds()
        bound = number
    return bound, None


def _ended_at(api: ConductorApi, execution_id: str) -> float | None:
    """When run ``execution_id`` ended (epoch seconds, the server's clock); None while it runs. A run
    already gone counts as long ended."""
    try:
        status = api.agent_status(execution_id)
    except ExecutionNotFoundError:
        return 0.0
    end = status.get("endTime")
    if not RunStatus.parse(status.get("status")).is_terminal or not isinstance(end, (int, float)) or end <= 0:
        return None
    return float(end) / 1000.0


#: Sweeps of one listener that its ``keep_for`` schedules are at least this far apart (seconds): a sweep
#: cut short or failing is tried again after it, not in a loop.
RESWEEP_FLOOR = 30.0


@attrs.frozen
class _Job:
    chain: Chain
    head: int
    keep: int | None
    keep_for: timedelta | None
    with_sub_runs: bool


class Retirer:
    """The ``conductor-agents-retire`` thread of one process: sweeps asked for, one at a time, coalesced
    per listener, and the sweeps ``keep_for`` schedules (when a listener's next ended run comes of age).
    Thread-safe; owned by the :class:`~._driver.ContinuationDriver`.
    """

    def __init__(self, api: ConductorApi, directory: ChainDirectory, *, remover: Remover | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._api = api
        self._directory = directory
        self._clock = clock
        self.remover = remover if remover is not None else Remover(api)
        self._lock = threading.Lock()
        self._wanted: dict[str, _Job] = {}  # run id -> the sweep asked for
        self._order: collections.deque[str] = collections.deque()
        self._due: dict[str, tuple[float, _Job]] = {}  # run id -> (epoch seconds, the sweep to do again then)
        self._wake = threading.Event()
        self._stop = threading.Event()
        # A daemon: a sweep cut short leaves the lowest links for the next sweep (any process's).
        self._thread = BackgroundLoop("retire", self._loop, daemon=True, stop=self._stop, wake=self._wake)
        self._busy = False
        self.sweeps = 0  # sweeps done (tests)

    def request(self, chain: Chain, head: int, keep: int | None, *, keep_for: timedelta | None = None,
                with_sub_runs: bool = True) -> None:
        """Sweep ``chain`` with committed link ``head`` soon (a later request for it replaces this one)."""
        if not chain.continuable or self._stop.is_set():
            return
        key = str(chain.run_id)
        with self._lock:
            known = self._wanted.get(key)
            if known is None:
                self._order.append(key)
            head = max(head, known.head) if known else head
            self._wanted[key] = _Job(chain, head, keep, keep_for, with_sub_runs)
            self._due.pop(key, None)
        self._thread.start_once()
        self._wake.set()

    def idle(self) -> bool:
        """No sweep waiting or under way (tests; a sweep scheduled for later does not count)."""
        with self._lock:
            return not self._order and not self._busy

    def scheduled(self, run_id: str) -> float | None:
        """When ``keep_for`` sweeps the listener on ``run_id`` again (epoch seconds), if it does."""
        with self._lock:
            due = self._due.get(str(run_id))
        return due[0] if due is not None else None

    def _take(self) -> tuple[str | None, _Job | None, float]:
        """The next sweep to do now, or how long to wait for one (under the lock)."""
        while self._order:
            key = self._order.popleft()
            job = self._wanted.pop(key, None)
            if job is not None:
                return key, job, 0.0
        now = self._clock.time()
        if not self._due:
            return None, None, 5.0
        key, (due, job) = min(self._due.items(), key=lambda item: item[1][0])
        if due > now:
            return None, None, min(5.0, due - now)
        del self._due[key]
        return key, job, 0.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                key, job, wait = self._take()
                self._busy = job is not None
                if job is None:
                    self._wake.clear()
            if key is None or job is None:
                self._wake.wait(max(0.05, wait))
                continue
            swept: Swept | None = None
            try:
                swept = sweep(self._api, self._directory, job.chain, job.head, job.keep, self.remover,
                              stop=self._stop, with_sub_runs=job.with_sub_runs, keep_for=job.keep_for,
                              clock=self._clock)
            except ConductorAgentsError as err:
                log.warning("listener %s: retiring its older runs failed (%s); the next switch or take-up tries "
                            "again", job.chain.execution_id, err)
            except Exception:  # the thread serves every listener of the process
                log.exception("listener %s: retiring its older runs failed", job.chain.execution_id)
            finally:
                self._done(key, job, swept)

    def _done(self, key: str, job: _Job, swept: Swept | None) -> None:
        with self._lock:
            self.sweeps += 1
            self._busy = False
            if job.keep_for is None or key in self._wanted:
                return  # no age limit, or a newer request replaces this one
            now = self._clock.time()
            due = swept.next_due if swept is not None else now  # a failed sweep: again after the floor
            if due is not None:
                self._due[key] = (max(due, now + RESWEEP_FLOOR), job)

    def close(self, timeout: float = 15.0) -> None:
        """Stop between two removals and join the thread (bounded). Idempotent."""
        self._thread.stop()
        self._thread.join(timeout)
