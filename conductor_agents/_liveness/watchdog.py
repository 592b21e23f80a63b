"""The runtime's watchdog: one thread that samples every run the runtime serves or watches.

One sample per run and interval serves three purposes (the third: :mod:`.nudges`, a served run's task
whose queue message the server leased away is made due again):

- **End of run.** A run whose tools this process serves is released (its poller stops) once a
  sample finds it ended, also when it was ended from another process. Without a sample the
  poller would serve an ended run until the runtime closes.
- **Liveness.** For a stateful run started or resumed here (liveness on), the sample is the
  run's task list; :func:`~conductor_agents._liveness.stall.find_stall` turns a task of the run's
  domain that nobody polled for too long into a :class:`WorkerStallError` on the run's
  :class:`RunWatch` (``handle.stall``), wakes the handles waiting on it and calls the runtime's ``on_stall`` listener.

A full tool pool is not a dead worker: a pool that is full stops this process's pollers, so
the run's next task waits unpolled. The watchdog holds off while this process serves the
domain and its pool was full within the stall threshold (``is_busy``), and a stall seen
from another process is dismissed when the server's poll data shows the domain polled within
the threshold (a busy process keeps polling with ``count=0``, see ``poller``).

**Idle runs cost little.** A served stateful run whose queues the runtime's queue watcher has
just read empty has no task waiting, so it cannot be stalled: its sample is skipped (no
request), except one every ``IDLE_SAMPLE_INTERVALS`` intervals (30 s by default) for the
end-of-run check. That check is answered by the list of the run's workflow's running ids
(``GET /workflow/running/{name}``; the name is the agent's, or what a sample told), fetched at most
once an interval and shared by every idle run of the name: a thousand idle listeners of one agent
cost the watchdog about one request per interval, not one per run. A run missing from the list is
sampled itself (it may have ended, or its name was not the agent's). A run with a task in a queue,
one not served here, or any run while the watcher is not healthy is sampled every interval.

**A listener's mailbox.** The watch of a listener's mailbox in a process that does not serve the
listener (``resume()`` with ``auto_start_workers=False``, a start without workers) also reads the
listener's current run (its *companion*, given by the caller as a function): a message the SDK sends
goes straight into that run, so a turn or tool task nobody polls waits there, not in the mailbox.
That is one more read per sample (its SCHEDULED and IN_PROGRESS tasks); a run whose read shows no
task waiting at all has ended (a switch, or the listener's end), and the function is asked again,
this time from the server.

Runs are sampled one at a time, each at most once per ``interval`` (a heap of due times; the thread
wakes a tenth of the interval, one second at most, after the next due time and samples every run
due by then); a thousand runs cost one thread. The thread starts with the first watched run and
ends when none is left (an idle runtime sends nothing); the next :meth:`RunWatchdog.watch` starts one.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._wire.api import ConductorApi
from .._wire.transport import HttpError
from ..errors import ConductorAgentsError, ExecutionNotFoundError, WorkerStallError
from ..result import RunStatus
from .nudges import LostPolls, Nudges
from .run_watch import Companions, RunWatch, StallListener, Successor
from .server_fault import retry_if_server_fault
from .stall import Stall, find_stall, run_words, server_time_from_date
from .tree import running_sub_runs

__all__ = ["Companions", "RunWatch", "RunWatchdog", "Successor"]

log = logging.getLogger("conductor_agents.liveness")

#: An idle run (its queues read empty by the watcher) is sampled once per this many intervals.
IDLE_SAMPLE_INTERVALS = 3

#: The most a sample is taken late so that runs due close together are sampled at one wake-up.
_MAX_SLACK_SECONDS = 1.0

class RunWatchdog:
    """Samples every watched run on one thread (``conductor-agents-watchdog``). Thread-safe.

    Owned by the runtime's ``WorkerSet``, which creates it on first use and closes it.

    Args:
        api: the runtime's API.
        interval: seconds between two samples of one run (``liveness_check_interval_seconds``).
        stall_seconds: how long a task may wait unpolled (``liveness_stall_seconds``).
        on_ended: told the execution id of a served run a sample found ended.
        is_busy: whether this process serves ``domain`` and its tool pool was full lately.
        ring: told a domain that has a task waiting unpolled (a ring its poller may have missed).
        queues_empty: whether the queue watcher read every queue this process polls on
            ``domain`` empty just now (the run is idle: no sample needed for liveness).
        idle_sample_seconds: an idle run is still sampled this often (end of run), by default
            ``IDLE_SAMPLE_INTERVALS`` intervals.
        grace: extra seconds a task of a given type may wait unpolled (a continued listener's new
            run waits for its switch to be committed: its carry task is never polled).
    """

    def __init__(
        self,
        api: ConductorApi,
        *,
        interval: float,
        stall_seconds: float,
        on_ended: Callable[[str], None],
        is_busy: Callable[[str], bool] = lambda domain: False,
        ring: Callable[[str], None] = lambda domain: None,
        queues_empty: Callable[[str], bool] = lambda domain: False,
        idle_sample_seconds: float | None = None,
        grace: dict[str, float] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._api = api
        self._nudges = Nudges(api, clock=clock)
        self._grace = dict(grace or {})
        self._interval = interval
        self._stall_seconds = stall_seconds
        self._on_ended = on_ended
        self._is_busy = is_busy
        self._ring = ring
        self._queues_empty = queues_empty
        self._idle_sample = max(interval, idle_sample_seconds if idle_sample_seconds is not None
                                else IDLE_SAMPLE_INTERVALS * interval)
        # The thread sleeps this long past the next due time, then samples every run due by then:
        # a thousand runs wake it about once a second instead of a hundred times (never early, so
        # two samples of a run are always at least an interval apart).
        self._slack = min(_MAX_SLACK_SECONDS, interval / 10)
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, RunWatch] = {}
        self._due: list[tuple[float, int, str]] = []  # heap; entries of forgotten runs are skipped
        self._order = itertools.count()
        self._wake = threading.Event()
        self._thread: BackgroundLoop | None = None
        self._previous: BackgroundLoop | None = None  # one that is ending, joined by close()
        self._closed = False
        self.threads_started = 0
        # workflow name -> (when fetched, its running ids); only the watchdog thread touches it
        self._running: dict[str, tuple[float, frozenset[str]]] = {}
        self._running_refused = False  # the server does not list running ids: sample each run

    # -- registration -----------------------------------------------------------------

    def watch(self, execution_id: str, *, domain: str | None = None, served: bool = False,
              served_domain: str | None = None, workflow_name: str | None = None,
              tree: bool = False, companions: Companions | None = None,
              successor: Successor | None = None) -> RunWatch:
        """Sample ``execution_id`` from now on (first sample one interval from now); its RunWatch.

        ``domain``: watch the run's liveness on that domain. ``served``: this process serves the
        run's tools (``on_ended`` when a sample finds it ended), on ``served_domain`` (None: the
        shared poller). ``workflow_name``: the run's workflow name if known (the agent's name):
        its end checks can use the name's running list without a first sample (a wrong name costs
        one sample, which tells the right one). ``tree``: the run has sub-runs on its domain (an agent
        with sub-agents or agent tools): liveness samples read their SCHEDULED tasks too (one more
        read per sample, and one per running sub-run). ``companions``: runs sampled with it (a listener's
        mailbox: its current run; ``tree`` then reads their sub-runs, not its own). Watching a run again
        merges them.
        """
        with self._lock:
            run = self._runs.get(execution_id)
            if run is None:
                run = RunWatch(execution_id)
                if self._closed:
                    return run  # never sampled: the runtime is closing
                self._runs[execution_id] = run
                run.last_sampled = self._clock.monotonic()
                self._schedule(run, self._clock.monotonic() + self._interval)
            run.domain = domain or run.domain
            run.served = served or run.served
            run.served_domain = served_domain or run.served_domain
            run.workflow_name = run.workflow_name or workflow_name
            run.tree = tree or run.tree
            run.companions = companions or run.companions
            run.successor = successor or run.successor
            if self._thread is None:
                self._start_thread()
        self._wake.set()
        return run

    def note_result(self, execution_id: str, *, tool: bool) -> None:
        """This process posted a task result of the watched run ``execution_id`` (see :class:`~.nudges.Nudges`)."""
        with self._lock:
            if execution_id in self._runs:
                self._nudges.note_result(execution_id, tool=tool)

    def forget(self, execution_id: str) -> None:
        """Stop sampling ``execution_id`` (it ended); its stall flag is cleared. Idempotent."""
        with self._lock:
            run = self._runs.pop(execution_id, None)
            self._nudges.forget(execution_id)
            if not self._runs:
                self._due.clear()
        if run is not None:
            run._forget()
            self._wake.set()

    def resample(self, domain: str, lost: LostPolls | None = None) -> int:
        """Sample soon every run watched or served on ``domain`` (its poller polls again after failed polls): a stall
        found during the outage is cleared or confirmed by a fresh sample, so a ``wait()`` right after the heal raises
        none that is over; tasks lost in the failed polls' answers (``lost``) are looked for. How many rescheduled."""
        now = self._clock.monotonic()
        count = 0
        with self._lock:
            for run in self._runs.values():
                if domain not in (run.domain, run.served_domain):
                    continue
                if lost is not None:
                    self._nudges.note_lost_polls(run.execution_id, lost)
                if run.due > now:
                    self._schedule(run, now)
                    count += 1
        if count:
            self._wake.set()
        return count

    def watched(self) -> tuple[str, ...]:
        """The execution ids sampled now."""
        with self._lock:
            return tuple(self._runs)

    @property
    def is_running(self) -> bool:
        """Whether the thread is alive (it is only while some run is watched)."""
        with self._lock:
            thread = self._thread
        return thread is not None and thread.is_alive

    # -- lifecycle --------------------------------------------------------------------

    def _start_thread(self) -> None:
        # Daemon: the watchdog only observes; losing it at interpreter exit loses nothing. It is
        # stopped by ``_closed`` (or no run left) and a wake: the loop ends in ``_next_due``.
        self._thread = BackgroundLoop("watchdog", self._loop, daemon=True, on_crash=self._crashed)
        self.threads_started += 1
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop sampling, forget every run and join the thread (bounded). Idempotent."""
        with self._lock:
            self._closed = True
            runs = list(self._runs.values())
            self._runs.clear()
            self._nudges.clear()
            self._due.clear()
            threads = [t for t in (self._thread, self._previous) if t is not None]
        self._wake.set()
        for run in runs:
            run._forget()
        for thread in threads:
            thread.join(timeout)

    # -- the loop ---------------------------------------------------------------------

    def _schedule(self, run: RunWatch, due: float) -> None:
        run.due = due
        heapq.heappush(self._due, (due, next(self._order), run.execution_id))

    def _next_due(self) -> tuple[RunWatch | None, float]:
        """The run to sample now (or None) and how long to wait otherwise; (None, -1) to end."""
        with self._lock:
            while self._due:
                due, _, execution_id = self._due[0]
                run = self._runs.get(execution_id)
                if run is None or run.due != due:
                    heapq.heappop(self._due)  # forgotten, or rescheduled
                    continue
                delay = due - self._clock.monotonic()
                if delay > 0:
                    return None, delay + self._slack  # late by the slack: the runs due by then together
                heapq.heappop(self._due)
                # Rescheduled before sampling: the next sample is one interval after this one starts.
                self._schedule(run, self._clock.monotonic() + self._interval)
                return run, 0.0
            if self._closed or not self._runs:
                if self._thread is not None and self._thread.is_current():
                    self._thread, self._previous = None, self._thread
                return None, -1.0
            return None, self._interval  # unreachable in practice: every run has a heap entry

    def _loop(self) -> None:
        while True:
            run, delay = self._next_due()
            if delay < 0:
                return
            if run is None:
                self._wake.wait(delay)
                self._wake.clear()
                continue
            self.sample(run)

    def _crashed(self, err: BaseException) -> None:
        # On the crashed thread: the next watch() starts a new one.
        log.exception("the liveness watchdog crashed")
        with self._lock:
            if self._thread is not None and self._thread.is_current():
                self._thread = None

    def run_due(self) -> int:
        """Sample every run that is due now, on the caller's thread; how many (tests, fake clock)."""
        sampled = 0
        while True:
            run, _ = self._next_due()
            if run is None:
                return sampled
            self.sample(run)
            sampled += 1

    # -- one sample -------------------------------------------------------------------

    def sample(self, run: RunWatch) -> None:
        """Sample one run: end of run, then (for a watched domain) the stall rule. Never raises."""
        try:
            self._sample(run)
        except ExecutionNotFoundError:
            log.warning("execution %s vanished from the server; no longer watching it", run.execution_id)
            self._ended(run)
        except ConductorAgentsError as err:
            log.debug("sampling run %s failed: %s", run.execution_id, err)
        except Exception:
            log.exception("sampling run %s failed", run.execution_id)

    def _idle(self, run: RunWatch) -> bool:
        """Whether the run's queues were just read empty: no task of its domain waits, so it
        cannot be stalled (only runs this process polls on their own domain can be known so)."""
        if not run.served or run.served_domain is None:
            return False
        return bool(self._queues_empty(run.served_domain))

    def _still_running(self, run: RunWatch) -> bool:
        """Whether the running list of the run's workflow (at most one interval old) holds it."""
        if run.workflow_name is None or self._running_refused:
            return False
        now = self._clock.monotonic()
        fetched = self._running.get(run.workflow_name)
        if fetched is None or now - fetched[0] >= self._interval:
            try:
                ids = frozenset(self._api.running_workflow_ids(run.workflow_name, run.workflow_version))
            except HttpError as err:
                if not err.transient:
                    log.info("the server does not list running workflows (%s); sampling idle runs one by one", err)
                    self._running_refused = True
                return False
            except ConductorAgentsError as err:
                log.debug("listing the running runs of %s failed: %s", run.workflow_name, err)
                return False
            with self._lock:
                names = {r.workflow_name for r in self._runs.values()}
            self._running = {name: entry for name, entry in self._running.items() if name in names}
            fetched = self._running[run.workflow_name] = (now, ids)
        return run.execution_id in fetched[1]

    def _sample(self, run: RunWatch) -> None:
        self._nudges.check(run.execution_id)
        if self._idle(run):
            recent = self._clock.monotonic() - run.last_sampled < self._idle_sample - self._interval / 2
            if recent or self._still_running(run):
                if not recent:  # the end-of-run check, answered by the running list
                    run.listed += 1
                    run.last_sampled = self._clock.monotonic()
                run.skipped += 1
                run.first_seen.clear()
                run._set_stall(None)
                return
        run.samples += 1
        run.last_sampled = self._clock.monotonic()
        domain = run.domain
        if not run.name_checked:  # once: the server's name of the run's workflow (for the running list)
            self._check_name(run)
        # Small reads whatever the run's age: its status, and for liveness the tasks still SCHEDULED
        # (a domain's worker task is SCHEDULED until a worker polls it; the poll moves it on).
        if domain is None:
            workflow: Any = self._api.workflow_status(run.execution_id)
            server_now = None
        else:
            workflow, date = self._api.liveness_sample(run.execution_id)
            server_now = server_time_from_date(date)
        status = RunStatus.parse(workflow.get("status"))
        if status is RunStatus.FAILED and self._goes_on(run):
            return  # the server failed it for want of writing its tasks: retried, it runs again
        if status.is_terminal:
            log.debug("run %s ended (%s)", run.execution_id, workflow.get("status"))
            if not self._followed(run):
                self._ended(run)
            return
        if status is RunStatus.PAUSED:  # paused on purpose: what waits, waits for the unpause
            run.first_seen.clear()
            run._set_stall(None)
            return
        if domain is None:
            return
        tasks = list(workflow.get("tasks") or ())
        roots: tuple[str, ...] = (run.execution_id,)
        if run.companions is not None:
            roots = self._companion_tasks(run, tasks)
        if run.tree:
            for root in roots:
                for sub_run in running_sub_runs(self._api, root):
                    tasks += self._api.workflow_tasks(sub_run, statuses=("SCHEDULED",), count=100).tasks
        stall = find_stall(tasks, domain=domain, stall_seconds=self._stall_seconds, server_now=server_now,
                           first_seen=run.first_seen, client_now=self._clock.monotonic(), grace=self._grace)
        if run.first_seen and run.served:
            self._ring(domain)  # a task of ours waits unpolled: our poller may have missed its ring
            if not self._is_busy(domain):  # polled in vain, not held back by a full pool: leased away?
                self._nudges.check_unpolled(run.execution_id, tasks, domain=domain, server_now=server_now)
        if stall is not None and self._excused(run, stall, server_now):
            stall = None
        newly = run._set_stall(stall)
        if newly is not None:
            error, listeners = newly
            log.warning("%s: task %s (domain %s) has not been polled for %.1fs", run_words(run.execution_id,
                        run.listener_id), error.task_reference_name, error.domain, error.waited_seconds)
            for listener in listeners:
                self._tell(listener, error)

    def _companion_tasks(self, run: RunWatch, tasks: list[Any]) -> tuple[str, ...]:
        """Add the SCHEDULED tasks of the run's companions to ``tasks``; the companions read.

        One read per companion (its SCHEDULED and IN_PROGRESS tasks: a running listener run always has
        its loop in progress). A companion with no task waiting, or gone, has ended: the companions are
        asked again from the server once, and the new ones read.
        """
        assert run.companions is not None
        read: set[str] = set()
        ids = tuple(run.companions(False))
        for refresh in (False, True):
            ended = False
            for execution_id in ids:
                if execution_id in read:
                    continue
                read.add(execution_id)
                try:
                    page = self._api.workflow_tasks(execution_id, statuses=("SCHEDULED", "IN_PROGRESS"), count=100)
                except ExecutionNotFoundError:  # retired since this process last looked: not the watched run's end
                    ended = True
                    continue
                ended = ended or not page.tasks
                tasks += [t for t in page.tasks if t.get("status") == "SCHEDULED"]
            if not ended or refresh:
                break
            ids = tuple(run.companions(True))
        return ids

    def _check_name(self, run: RunWatch) -> None:
        """Learn the run's workflow name and version from the server (the agent's name given at watch()
        is right unless the run is not this agent's); a failure leaves it for the next sample."""
        try:
            named: Any = self._api.get_workflow(run.execution_id)
        except ConductorAgentsError as err:
            log.debug("reading the workflow name of run %s failed: %s", run.execution_id, err)
            return
        run.name_checked = True
        if isinstance(named.get("workflowName"), str):
            run.workflow_name = named["workflowName"]  # the server's word over the agent's name
            version = named.get("workflowVersion")
            run.workflow_version = version if isinstance(version, int) else None

    def _excused(self, run: RunWatch, stall: Stall, server_now: float | None) -> bool:
        """Whether an unpolled task is explained by a busy, live worker rather than a dead one."""
        if self._is_busy(stall.domain):
            log.debug("run %s: task %s waits, but this process's tool pool is full; no stall",
                      run.execution_id, stall.task_reference_name)
            return True
        if server_now is None or not stall.task_type:
            return False
        for row in self._api.poll_data(stall.task_type):
            if row.get("domain") != stall.domain:
                continue
            last_poll = float(row.get("lastPollTime") or 0) / 1000.0
            if last_poll and server_now - last_poll <= self._stall_seconds:
                log.debug("run %s: task %s waits %.1fs unpolled, but its domain was polled %.1fs ago "
                         "(a busy worker); no stall", run.execution_id, stall.task_reference_name,
                         stall.waited_seconds, max(0.0, server_now - last_poll))
                return True
        return False

    def _followed(self, run: RunWatch) -> bool:
        """Whether the watch of a run that ended goes on in the run's successor (a continued listener's link with no
        mailbox, watched from a process that does not serve it: its newer link), sampled from now on."""
        newer = run.successor() if run.successor is not None else None
        if newer is None or newer == run.execution_id:
            return False
        with self._lock:
            if newer in self._runs or self._runs.get(run.execution_id) is not run:
                return False  # watched already (its own watch tells its end), or forgotten meanwhile
            del self._runs[run.execution_id]
            self._nudges.forget(run.execution_id)
            log.debug("run %s was continued: its watch goes on in run %s", run.execution_id, newer)
            run.execution_id = newer
            self._runs[newer] = run
            self._schedule(run, self._clock.monotonic() + self._interval)  # its heap entry names the old id
        run.first_seen.clear()
        run.name_checked = False
        return True

    def _goes_on(self, run: RunWatch) -> bool:
        """Whether a FAILED run goes on: the server failed it by its own fault and it was retried (``server_fault``),
        or a read or the retry failed (the next sample looks again)."""
        try:
            return retry_if_server_fault(self._api, run.execution_id)
        except ExecutionNotFoundError:
            return False
        except ConductorAgentsError as err:
            log.info("run %s failed; whether by the server's fault is looked at again at its next sample (%s)",
                     run.execution_id, err)
            return True

    def _ended(self, run: RunWatch) -> None:
        self.forget(run.execution_id)
        if run.served:
            try:
                self._on_ended(run.execution_id)
            except Exception:
                log.exception("releasing the workers of run %s failed", run.execution_id)

    @staticmethod
    def _tell(listener: StallListener, error: WorkerStallError) -> None:
        try:
            listener(error)
        except Exception:
            log.exception("a stall listener of run %s raised; the watchdog goes on", error.execution_id)
