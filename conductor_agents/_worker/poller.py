"""The polling loop: one thread that fetches the tasks of one task domain.

A stateful run gets its own :class:`DomainPoller` pinned to the run's domain (its run id);
non-stateful runs share one poller with no domain. The poller serves a set of
*executions*; the owner removes each one when it ends (the runtime's watchdog samples them)
and stops the poller once none is left. No thread outlives its runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.loops import BackgroundLoop
from .._wire.api import ConductorApi
from ..errors import ConductorAgentsError, ConfigurationError, ServerError
from ..tools import ToolDef
from .executor import ToolExecutor
from .task_watch import hand_back

__all__ = ["DomainPoller"]

log = logging.getLogger("conductor_agents.worker")

#: Most tasks taken by one poll.
_MAX_BATCH = 8
#: Longest pause between polls while the server is unreachable (a poller is given a lower cap
#: when the stall threshold is short: see ``max_backoff``).
_MAX_BACKOFF = 5.0
#: While backing off after a failed poll, a ring (the watcher counts a task in our queues, or the
#: watchdog sees one wait unpolled) cuts the pause short, but not below this: a task is known to
#: wait, so the poller tries again soon rather than up to ``_MAX_BACKOFF`` later. Without a ring
#: (nothing waits, or the server is down for every call) the pause keeps doubling.
_RUNG_RETRY_SECONDS = 0.5
#: While a queue watcher rings this poller, it still polls on its own this often: a missed ring,
#: and the server's poll data shows the domain served by a live worker (``_serving.live_workers``).
SAFETY_POLL_SECONDS = 60.0
# Until a poller's first poll works, its failures are logged at INFO for this long: the call that
# started the run meets the same server and says what is wrong in one line (no warning before it).
_QUIET_FIRST_FAILURES_SECONDS = 5.0
#: A poller counts as active (the watcher looks at it often) this long after a task or a new run: the
#: tasks of one model turn come within it; a model turn longer than it ends at the watcher's idle pace
#: (0.25 s), and an active watcher reads the server's queue listing 10 times a second (see watcher.py).
_ACTIVE_SECONDS = 2.0
#: After this many rings in a row that found nothing (e.g. a retry not due yet: the queue
#: counts it), rings are ignored for ``_RING_QUIET_SECONDS``. One empty ring is normal: the
#: watcher may count a task this poller has just taken, or (behind a balancer) the poll reached a
#: node whose peer had fetched the task ahead: the first empty answer to a ring is retried at once.
_EMPTY_RINGS = 5
_RING_QUIET_SECONDS = 1.0


class DomainPoller:
    """Polls the task types of one domain and hands tasks to the :class:`ToolExecutor`.

    Thread-safe. The owner calls :meth:`start` once, may :meth:`add_execution` /
    :meth:`remove_execution` at any time, and :meth:`stop` + :meth:`join` to end it
    (``on_exit`` is then called from the poller thread). Stopping takes at most one
    long poll (``long_poll_ms``).

    While the tool pool is full the poller takes no task; every ``keepalive_seconds`` it
    still sends a poll for none (``count=0``) on its domain, so the server's poll data
    (``lastPollTime``) shows that a live worker serves the domain: busy, not dead.
    """

    def __init__(
        self,
        api: ConductorApi,
        executor: ToolExecutor,
        *,
        domain: str | None,
        worker_id: str,
        long_poll_ms: int,
        poll_interval_ms: int,
        clock: Clock = SYSTEM_CLOCK,
        on_exit: Callable[[DomainPoller], None] | None = None,
        name_suffix: str | None = None,
        watcher: Any | None = None,  # a conductor_agents._worker.watcher.QueueWatcher
        keepalive_seconds: float | None = None,
        max_backoff: float = _MAX_BACKOFF,
        on_recovered: Callable[[DomainPoller], None] | None = None,
        may_serve: Callable[[], bool] | None = None,
    ) -> None:
        self.domain = domain
        # Whether this process may run the domain's tasks now (False: its lease on the domain may have passed to
        # another process, see :meth:`_hand_back_unserved`); None: always.
        self._may_serve = may_serve
        self._max_backoff = max(_RUNG_RETRY_SECONDS, min(_MAX_BACKOFF, max_backoff))
        # Told (from the poller thread) after the first successful poll that follows failed ones.
        self._on_recovered = on_recovered
        self._failing = False
        self._quiet_failures_until: float | None = None  # set at the first failure; None once a poll worked
        self._ever_polled = False
        self._api = api
        self._executor = executor
        self._worker_id = worker_id
        self._long_poll_ms = long_poll_ms
        self._poll_interval = poll_interval_ms / 1000.0
        self._keepalive = keepalive_seconds if domain is not None else None
        self._last_polled: dict[str, float] = {}  # task type -> when it was last polled (poller thread only)
        self._clock = clock
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._tools: dict[str, ToolDef] = {}
        self._queue_names: tuple[str, ...] = ()
        self._executions: dict[str, Mapping[str, ToolDef]] = {}
        self._pending = 0  # registrations whose execution id is not known yet
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._exited = threading.Event()
        self._polled: set[str] = set()
        self._draining: set[str] = set()  # types whose last poll brought tasks (poller thread only)
        self._watcher = watcher
        self._rung = False
        # The task types a ring named (their queues held tasks): a rung round polls only those (and the
        # draining and fresh ones); None: every type (a ring that named none). Under ``_lock``.
        self._ring_types: set[str] | None = set()
        self._quiet_until = 0.0
        self._empty_rings = 0
        self._next_safety = 0.0
        self.keepalives = 0
        self._last_activity = 0.0
        self._active_now()
        self._polled_cond = threading.Condition(self._lock)
        self.polls = 0
        self.poll_errors = 0
        # The task types whose polls failed since the last successful round: the server may have answered them with
        # tasks (handed to this worker id) that never arrived. Taken by the recovery listener (poller thread only).
        self._failed_types: set[str] = set()
        # Daemon: a poller is pure I/O; if the interpreter exits without close(), the
        # tasks it would have fetched stay SCHEDULED and the liveness monitor reports them.
        self._thread = BackgroundLoop(
            f"poll-{name_suffix or domain or 'shared'}", self._loop, daemon=True, stop=self._stop, wake=self._wake,
            on_crash=lambda err: log.exception("poller for domain %s crashed", self.domain), on_exit=self._exit)

    def __repr__(self) -> str:
        return f"DomainPoller(domain={self.domain!r}, executions={len(self._executions)})"

    # -- registrations ----------------------------------------------------------------

    def reserve(self, tools: Mapping[str, ToolDef]) -> None:
        """Serve ``tools`` before the execution id is known (the poller starts before the run)."""
        with self._lock:
            self._pending += 1
            self._merge(tools)
        self._active_now()
        self._wake.set()

    def add_execution(self, execution_id: str, tools: Mapping[str, ToolDef], *, reserved: bool = False) -> None:
        """Serve ``tools`` for ``execution_id`` until that execution ends."""
        with self._lock:
            if reserved:
                self._pending -= 1
            self._executions[execution_id] = dict(tools)
            self._merge(tools)
        self._active_now()
        self._wake.set()

    def cancel_reservation(self) -> None:
        """Undo a :meth:`reserve` whose run did not start."""
        with self._lock:
            self._pending -= 1
            self._rebuild_tools()

    def remove_execution(self, execution_id: str) -> None:
        """Stop serving ``execution_id`` (it ended)."""
        with self._lock:
            if self._executions.pop(execution_id, None) is not None:
                self._rebuild_tools()

    @property
    def executions(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._executions)

    @property
    def task_types(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._tools)

    def _merge(self, tools: Mapping[str, ToolDef]) -> None:
        for name, tool_def in tools.items():
            self._tools[name] = tool_def
        self._name_queues()

    def _rebuild_tools(self) -> None:
        if self._pending:
            return  # a reservation still needs its tools; they are dropped once it resolves
        self._tools = {name: tool_def for tools in self._executions.values() for name, tool_def in tools.items()}
        self._name_queues()

    def _name_queues(self) -> None:
        # Read by the watcher many times a second: kept ready (one tuple, replaced whole).
        self._queue_names = tuple(f"{self.domain}:{t}" if self.domain else t for t in self._tools)

    def is_idle(self) -> bool:
        """True when no execution (or pending start) needs this poller."""
        with self._lock:
            return not self._executions and self._pending <= 0

    # -- the queue watcher's side ------------------------------------------------------

    def queue_names(self) -> tuple[str, ...]:
        """The server's names of the queues this poller serves (``domain:type``, or ``type``)."""
        return self._queue_names

    def _active_now(self) -> None:
        """A task came, or a run was added: tell the watcher too (it reads faster for a while)."""
        self._last_activity = now = self._clock.monotonic()
        if self._watcher is not None:
            self._watcher.note_activity(now)

    def is_active(self, now: float) -> bool:
        """Whether a task came (or a run was added) lately, so another one is likely soon."""
        return now - self._last_activity < _ACTIVE_SECONDS

    def ring(self, queues: Iterable[str] | None = None) -> None:
        """The watcher saw tasks in ``queues`` (names from :meth:`queue_names`), or changed state
        (None: every queue): poll now, those types only."""
        if self._clock.monotonic() < self._quiet_until:
            return
        self._note_ring(None if queues is None else self._types_of(queues))
        self._rung = True
        self._wake.set()

    def _types_of(self, queues: Iterable[str]) -> set[str]:
        prefix = f"{self.domain}:" if self.domain else ""
        return {q[len(prefix):] for q in queues if q.startswith(prefix)}

    def _note_ring(self, types: set[str] | None) -> None:
        with self._lock:
            if types is None or self._ring_types is None:
                self._ring_types = None
            else:
                self._ring_types |= types

    def _take_ring(self, rung: bool, types: tuple[str, ...]) -> set[str] | None:
        """The types this round polls while watched (None: all): those rung, draining or never polled.

        Each type of a round is a request to the server, and a round used to poll every type of
        the domain (a listener's tool and its turn task: two polls for each task, four with the
        drain), whichever queue held the task; the server's per-message share went with it."""
        with self._lock:
            named, self._ring_types = self._ring_types, set()
        if rung and named is None:
            return None
        taken = named if rung and named is not None else set()
        only = taken | self._draining | {t for t in types if t not in self._polled}
        return only & set(types) or None

    def _watched(self) -> bool:
        return self._watcher is not None and self._watcher.healthy

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread. Raises RuntimeError when called twice."""
        self._thread.start()

    def stop(self) -> None:
        """Ask the loop to end (idempotent, safe before start)."""
        self._thread.stop()

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end; True when it did."""
        return self._thread.join(timeout)

    def close(self) -> None:
        """Stop the thread and join it: at most one long poll and 12 s (a :class:`~.._common.parts.Part`; its
        owner may :meth:`stop` several first, so that they end together). Idempotent, safe before start."""
        self.stop()
        bound = self._long_poll_ms / 1000.0 + 12.0
        if not self.join(bound):
            log.error("poller thread for domain %s did not stop within %.0fs", self.domain, bound)

    @property
    def retired(self) -> bool:
        """True once the poller was told to stop; the owner must not register anything on it then."""
        return self._stop.is_set()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive

    @property
    def has_exited(self) -> bool:
        return self._exited.is_set()

    # -- the loop ---------------------------------------------------------------------

    def _loop(self) -> None:
        """The thread's body (its crash is logged, and :meth:`_exit` called, by the BackgroundLoop)."""
        backoff = 0.0
        while not self._stop.is_set():
            now = self._clock.monotonic()
            types = self.task_types
            if not types:
                self._wake.wait()  # a registration or stop() sets it
                self._wake.clear()
                continue
            watched = self._watched()
            if watched and not self._rung and not self._draining and now < self._next_safety \
                    and set(types) <= self._polled:
                # The watcher rings when one of our queues holds a task: no poll until then.
                self._wake.wait(max(0.0, self._next_safety - now))
                self._wake.clear()
                continue
            rung, self._rung = self._rung, False
            if watched and now < self._next_safety:
                only = self._take_ring(rung, types)
                types = types if only is None else tuple(t for t in types if t in only)
            backoff = self._poll_round(types, backoff, short_only=watched, rung=rung)
            if backoff:
                self._pause_after_failure(backoff)

    def _exit(self) -> None:
        self._exited.set()
        if self._on_exit is not None:
            self._on_exit(self)

    def _pause_after_failure(self, backoff: float) -> None:
        """Wait ``backoff`` seconds after a failed poll, or only ``_RUNG_RETRY_SECONDS`` when rung.

        A ring while the server is unreachable for polls means a task waits in one of our queues
        (the watcher could read it, or the watchdog saw it unpolled): the next poll then goes at
        most ``_RUNG_RETRY_SECONDS`` after the failure, so a healed connection serves the task at
        once instead of at the end of a back-off that grew during the outage.
        """
        end = time.monotonic() + backoff  # real time, as the event waits are (also with a test clock)
        if self._stop.wait(min(backoff, _RUNG_RETRY_SECONDS)):
            return
        while not self._stop.is_set() and not self._rung:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._wake.clear()
            if self._rung:  # rung between the check and the clear
                return
            self._wake.wait(remaining)

    def wait_polled(self, task_types: tuple[str, ...], timeout: float) -> bool:
        """Wait until each of ``task_types`` has been polled successfully once; True if so."""
        deadline = self._clock.monotonic() + timeout
        with self._polled_cond:
            while not set(task_types) <= self._polled:
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    return False
                self._polled_cond.wait(min(remaining, 0.25))
        return True

    def _poll_round(self, types: tuple[str, ...], backoff: float, *, short_only: bool = False,
                    rung: bool = False) -> float:
        """Poll each type once: a long poll, or only short ones while the watcher rings us."""
        per_type_ms = max(100, self._long_poll_ms // len(types))
        if short_only:
            self._next_safety = self._clock.monotonic() + SAFETY_POLL_SECONDS
        got = 0
        recovered = False
        with self._lock:
            fresh = [t for t in types if t not in self._polled]
        if fresh:  # a type nobody polled yet gets a quick poll first, so start() can confirm it
            types = tuple(fresh) + tuple(t for t in types if t not in fresh)
        for task_type in types:
            if self._stop.is_set():
                return 0.0
            slots = min(_MAX_BATCH, self._executor.free_slots())
            keepalive = not slots and task_type not in fresh
            if keepalive and not self._keepalive_due(task_type):
                self._stop.wait(self._poll_interval)
                continue
            # A long poll asks for ONE task: the server's SQL queues (SQLite, Postgres, MySQL)
            # answer a long poll only once ``count`` tasks are there or the timeout passed, so
            # count=8 held a lone task until the poll ended (pickup p50 ~700 ms, benchmarks/).
            # Once a poll brought tasks, short polls take what else is queued, up to the slots.
            short = short_only or task_type in fresh or task_type in self._draining
            count = 0 if keepalive else max(1, slots) if short else 1
            try:
                tasks = self._api.poll_tasks(
                    task_type, worker_id=self._worker_id, domain=self.domain,
                    count=count,
                    timeout_ms=0 if short or keepalive else per_type_ms,
                    http_timeout=per_type_ms / 1000.0 + 10.0,
                )
            except (ServerError, ConfigurationError) as err:
                self.poll_errors += 1
                self._failing = True
                if count and isinstance(err, ServerError):
                    self._failed_types.add(task_type)
                    self._draining.add(task_type)  # polled again after the back-off, ring or not (the recovery)
                backoff = min(self._max_backoff, max(0.2, backoff * 2))
                log.log(self._failure_level(), "polling %s (domain %s) failed: %s; retrying in %.1fs",
                        task_type, self.domain, err, backoff)
                return backoff
            self.polls += 1
            self._ever_polled = True
            self._last_polled[task_type] = self._clock.monotonic()
            recovered = recovered or self._failing
            self._failing = False
            if keepalive:
                self.keepalives += 1
                continue  # the server gives nothing to a poll for none
            got += len(tasks)
            if tasks:
                self._active_now()
            # A poll that filled its count may have left tasks behind: the next round drains the type. One that
            # got fewer found the queue empty; a task that comes later rings (a drain poll per task was 3 of the
            # SDK's 21 requests per message a listener handled, each answering nothing).
            if len(tasks) >= count:
                self._draining.add(task_type)
            else:
                self._draining.discard(task_type)
            if task_type in fresh:
                with self._polled_cond:
                    self._polled.add(task_type)
                    self._polled_cond.notify_all()
            for task in tasks:
                tool_def = self._tools_for(task)
                if tool_def is None:
                    self._hand_back_unserved(task)
                    continue
                if self._may_serve is not None and not self._may_serve():
                    self._hand_back_unserved(task, because="this process's presence lapsed: another process may "
                                                           "serve its run now")
                    continue
                self._executor.submit(task, tool_def)
        if recovered:  # after the round: every task it took counts as polled on the server now
            self._recovered()
        if short_only and (got or rung):  # drain and safety polls say nothing about rings
            self._empty_rings = 0 if got else self._empty_rings + 1
            if self._empty_rings == 1 and not self._stop.is_set():
                # Ask once more at once: behind a load balancer the task may sit in another node's
                # prefetch buffer (a Redis-backed node fetches ahead for its own pollers), and the
                # next request goes to another node.
                self._note_ring(set(types))
                self._rung = True
            if self._empty_rings >= _EMPTY_RINGS:
                self._empty_rings = 0
                self._quiet_until = self._clock.monotonic() + _RING_QUIET_SECONDS
        return 0.0

    def _failure_level(self) -> int:
        """WARNING for a failed poll, but INFO for the first seconds of a poller that never polled."""
        if self._ever_polled:
            return logging.WARNING
        now = self._clock.monotonic()
        if self._quiet_failures_until is None:
            self._quiet_failures_until = now + _QUIET_FIRST_FAILURES_SECONDS
        return logging.INFO if now < self._quiet_failures_until else logging.WARNING

    def take_failed_types(self) -> frozenset[str]:
        """The task types whose polls failed before the poller polled again (then forgotten; the recovery listener
        asks, on the poller thread): their answers may have carried tasks that never arrived."""
        failed, self._failed_types = frozenset(self._failed_types), set()
        return failed

    def _recovered(self) -> None:
        log.info("polling domain %s works again", self.domain)
        if self._on_recovered is not None:
            try:
                self._on_recovered(self)
            except Exception:
                log.exception("the recovery listener of the poller for domain %s failed", self.domain)

    def _hand_back_unserved(self, task: Mapping[str, Any], *, because: str = "") -> None:
        """A task polled for a type this poller no longer serves: the run whose tools it served left it between the
        poll and its answer (a listener's switch moving its tools from one run to the next was seen doing it, the
        soak's turn task left polled and never run). Handed back to its queue for the next delivery, here once
        the tools are back or in another process: a polled task left alone waits for its response timeout.

        Also a task polled while this process may not serve its domain (``because``): a process whose presence
        thread was starved past the fence's bound answers its polls late, and the run's lease may be another
        process's by then (seen under gunicorn recycling on a loaded machine: a tool ran in the old owner after
        the new one had run one). The fence's own thread lapses the runs' leases a moment later."""
        log.warning("polled a task of type %s (run %s) that this process no longer serves%s; handing it back",
                    task.get("taskType"), task.get("workflowInstanceId"), f" ({because})" if because else "")
        try:
            hand_back(self._api, workflow_id=str(task.get("workflowInstanceId")), task_id=str(task.get("taskId")),
                      worker_id=self._worker_id, note="polled by a process that no longer served its type")
        except ConductorAgentsError as err:
            log.warning("handing back task %s failed (%s); it is delivered again after its response timeout",
                        task.get("taskId"), err)

    def _tools_for(self, task: Mapping[str, Any]) -> ToolDef | None:
        task_type = task.get("taskType") or task.get("taskDefName")
        with self._lock:
            per_run = self._executions.get(str(task.get("workflowInstanceId")))
            if per_run is not None and isinstance(task_type, str) and task_type in per_run:
                return per_run[task_type]
            return self._tools.get(str(task_type))

    def _keepalive_due(self, task_type: str) -> bool:
        """Whether the pool-full poller should tell the server again that it still polls ``task_type``."""
        if self._keepalive is None:
            return False
        return self._clock.monotonic() - self._last_polled.get(task_type, float("-inf")) >= self._keepalive
