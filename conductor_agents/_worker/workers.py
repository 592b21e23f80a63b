"""The runtime's workers: which poller serves which run, and their lifecycle.

:class:`WorkerSet` owns one :class:`ToolExecutor` (created on first use), the
pollers: one per stateful run's domain and one shared, domain-less poller for
non-stateful tools, one :class:`QueueWatcher` that tells the pollers when their
queues hold tasks, and one :class:`RunWatchdog` that samples every run served or
watched here (end of run, liveness). A run's tools are registered through a
:class:`Reservation` *before* the run starts and committed to its execution id afterwards.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from .._common.clock import SYSTEM_CLOCK, Clock
from .._common.parts import Part, Step, close_in_order
from .._common.task_names import CARRY_TASK, FORWARD_TASK, INTERNAL_TASK_TYPES, TURN_TASK
from .._listener.chain import is_continued
from .._listener.directory import Chain, ChainDirectory, Link
from .._listener.driver import ContinuationDriver
from .._listener.switch import LinkSpec, carry_grace_seconds
from .._listener.tracker import ChainTracker
from .._liveness.nudges import LostPolls
from .._liveness.tree import RootFinder
from .._liveness.watchdog import Companions, RunWatch, RunWatchdog, Successor
from .._tracing import hooks as tracing
from .._wire.api import ConductorApi
from ..agent import Agent
from ..errors import ConductorAgentsError, WorkerStartupError
from ..settings import AgentSettings
from ..tools import ToolDef
from .executor import TaskRef, ToolExecutor
from .observer import TaskObserver
from .poller import DomainPoller
from .task_watch import hand_back
from .watcher import QueueWatcher

__all__ = ["Reservation", "WorkerSet"]

log = logging.getLogger("conductor_agents.worker")

#: A poller whose tool pool is full still polls (``count=0``) this often, per stall threshold,
#: so the server's poll data shows its domain alive to other processes' watchdogs.
_KEEPALIVES_PER_STALL = 3.0
#: A poller's pause after failed polls grows to at most a quarter of the stall threshold (and 5 s),
#: and the watcher asks again for an unlisted empty queue at most every half threshold (and 30 s):
#: no back-off of the SDK's own can keep a task unpolled for a threshold once the server answers.
_BACKOFFS_PER_STALL = 4.0
_UNLISTED_RECHECKS_PER_STALL = 2.0
#: The SDK's own tasks of a continued listener: they never keep it from being at rest.
_INTERNAL_TASKS = INTERNAL_TASK_TYPES
#: The watchdog skips a run's sample when the watcher read all its queues empty this recently.
_QUEUES_READ_WITHIN_SECONDS = 2.0


class Reservation:
    """A run's tools registered on a poller, before and after the run exists."""

    def __init__(self, workers: WorkerSet, poller: DomainPoller, tools: dict[str, ToolDef],
                 agent_name: str | None = None) -> None:
        self._workers = workers
        self.poller = poller
        self.tools = tools
        self.agent_name = agent_name  # the run's workflow name, as the server compiles agents
        self.execution_id: str | None = None
        #: The id the tools of the runs served here count as (a listener's mailbox; else ``execution_id``).
        self.counted_as: str | None = None

    def commit(self, execution_id: str, *, domain: str | None) -> None:
        """Bind the reservation to the started run (moving it when the run's domain differs)."""
        self.execution_id = execution_id
        if domain == self.poller.domain:
            self.poller.add_execution(execution_id, self.tools, reserved=True)
        else:
            old = self.poller
            self.poller = self._workers.poller_for(domain)
            self.poller.add_execution(execution_id, self.tools)
            old.cancel_reservation()
            self._workers.retire_if_idle(old)
        # Released when a sample finds it ended.
        self._workers.watch(execution_id, served=True, served_domain=self.poller.domain,
                            workflow_name=self.agent_name)

    def handle_link(self, add: bool, execution_id: str) -> RunWatch | None:
        """Serve (``add``) or stop serving one more run of this reservation's listener: a link of its
        chain (same domain, same tools). Returns the link's watch when liveness is on."""
        if not add:
            self._workers.execution_ended(execution_id)
            return None
        self.poller.add_execution(execution_id, self.tools)
        counted_as = self.counted_as or self.execution_id
        if counted_as is not None:
            self._workers.observer.alias(execution_id, counted_as)
        return self._workers.watch(execution_id, served=True, served_domain=self.poller.domain,
                                   workflow_name=self.agent_name,
                                   domain=self.poller.domain if self._workers.liveness_enabled else None)

    def cancel(self) -> None:
        """The run did not start: stop serving its tools."""
        self.poller.cancel_reservation()
        self._workers.retire_if_idle(self.poller)

    def release(self) -> None:
        """This process will not serve the run (committed or not): stop serving its tools."""
        if self.execution_id is None:
            self.cancel()
            return
        self.poller.remove_execution(self.execution_id)
        self._workers.retire_if_idle(self.poller)
        self._workers.unwatch(self.execution_id)


class WorkerSet:
    """Pollers and the tool executor of one runtime. Thread-safe."""

    def __init__(self, api: ConductorApi, settings: AgentSettings, *, worker_id: str,
                 clock: Clock = SYSTEM_CLOCK, observer: TaskObserver | None = None,
                 directory: ChainDirectory | None = None) -> None:
        self._api = api
        self.directory = directory if directory is not None else ChainDirectory(api)
        self._driver: ContinuationDriver | None = None
        self._settings = settings
        self._worker_id = worker_id
        self._clock = clock
        self._lock = threading.Lock()
        self._executor: ToolExecutor | None = None
        self._pollers: dict[str | None, DomainPoller] = {}
        self._retiring: list[DomainPoller] = []
        self._watcher: QueueWatcher | None = None
        self._stopped_watchers: list[QueueWatcher] = []  # ended (or ending) for want of pollers
        self._watchdog: RunWatchdog | None = None
        self._closed = False
        self._roots = RootFinder(api)
        #: Counts, timings and local tool events of this runtime's workers (runtime.stats(), handle.events()).
        self.observer = observer if observer is not None else TaskObserver(clock=clock)
        #: Whether this process may run the tasks of a domain now (set by ``serve()``: not while the process's
        #: presence has lapsed on a domain it holds a lease on); None: always.
        self.serve_gate: Callable[[str], bool] | None = None

    # -- registration -----------------------------------------------------------------

    @property
    def liveness_enabled(self) -> bool:
        return self._settings.liveness_enabled

    def reserve(self, domain: str | None, agent: Agent, *, continued: bool = False) -> Reservation:
        """Serve ``agent``'s worker tools on ``domain`` (None: the shared poller) from now on;
        ``continued``: the run is a continued listener's (its turn task is served too)."""
        tools = {t.name: t for t in agent.worker_tools}
        if continued:
            tools[TURN_TASK] = self.driver.turn_tool
            tools[FORWARD_TASK] = self.driver.forward_tool  # its mailbox's (if it has one)
        poller = self.poller_for(domain, reserve=tools)
        return Reservation(self, poller, tools, agent.name)

    def poller_for(self, domain: str | None, *, reserve: dict[str, Any] | None = None) -> DomainPoller:
        """The live poller of ``domain``, started if needed."""
        with self._lock:
            if self._closed:
                raise ConductorAgentsError("the runtime is closing; no new workers start")
            poller = self._pollers.get(domain)
            if poller is None or poller.retired:
                if poller is not None:
                    self._retiring.append(poller)
                poller = self._new_poller(domain)
                self._pollers[domain] = poller
                if reserve is not None:
                    poller.reserve(reserve)
                poller.start()
            elif reserve is not None:
                poller.reserve(reserve)
            return poller

    def _new_poller(self, domain: str | None) -> DomainPoller:
        if self._watcher is None:  # none yet, or the last one stopped when the pollers were gone
            self._watcher = QueueWatcher(
                self._api, self.pollers, clock=self._clock, may_stop=self._watcher_may_stop,
                unlisted_recheck_max=self._settings.liveness_stall_seconds / _UNLISTED_RECHECKS_PER_STALL)
            self._watcher.start()
        if self._executor is None:
            self._executor = ToolExecutor(
                self._api, threads=self._settings.worker_threads, worker_id=self._worker_id, clock=self._clock,
                task_listener=self.observer, on_task_done=self._task_done,
                grace=self._settings.shutdown_grace_seconds)
        return DomainPoller(
            self.observer.polling_api(self._api), self._executor, domain=domain, worker_id=self._worker_id,
            long_poll_ms=self._settings.worker_long_poll_ms,
            poll_interval_ms=self._settings.worker_poll_interval_ms,
            clock=self._clock, on_exit=self._poller_exited, watcher=self._watcher,
            keepalive_seconds=self._settings.liveness_stall_seconds / _KEEPALIVES_PER_STALL,
            max_backoff=self._settings.liveness_stall_seconds / _BACKOFFS_PER_STALL,
            on_recovered=self._poller_recovered,
            may_serve=None if domain is None else functools.partial(self._may_serve, domain),
        )

    def _may_serve(self, domain: str) -> bool:
        gate = self.serve_gate
        return gate is None or gate(domain)

    def _poller_recovered(self, poller: DomainPoller) -> None:
        """A poller polls again after failed polls: have its runs sampled now (a stall is over), and their tasks
        handed to this process in the failed polls' lost answers looked for."""
        failed = poller.take_failed_types()
        with self._lock:
            watchdog, executor = self._watchdog, self._executor
        if watchdog is not None and poller.domain is not None:
            lost = LostPolls(failed, self._worker_id, executor.runs) if failed and executor is not None else None
            watchdog.resample(poller.domain, lost)

    def _watcher_may_stop(self, watcher: QueueWatcher) -> bool:
        """Called by the watcher when it sees no poller: let it end unless one came meanwhile."""
        with self._lock:
            if self._pollers:
                return False
            if self._watcher is watcher:
                self._watcher = None
                self._stopped_watchers = [w for w in self._stopped_watchers if w.is_alive]
                self._stopped_watchers.append(watcher)
            return True

    def _poller_exited(self, poller: DomainPoller) -> None:
        with self._lock:
            if self._pollers.get(poller.domain) is poller:
                del self._pollers[poller.domain]

    def retire_if_idle(self, poller: DomainPoller) -> None:
        """Stop ``poller`` when no run needs it any more."""
        with self._lock:
            if not poller.is_idle():
                return
            if self._pollers.get(poller.domain) is poller:
                del self._pollers[poller.domain]
            self._retiring = [p for p in self._retiring if p.is_alive]
            self._retiring.append(poller)
            poller.stop()

    def execution_ended(self, execution_id: str) -> None:
        """The run ended (a handle or the watchdog saw it): stop serving and watching it now, and
        cancel its tools still running here (``ctx.cancelled``).

        The hook for anything that must learn when a run ends in this process.
        """
        with self._lock:
            pollers = [p for p in self._pollers.values() if execution_id in p.executions]
            executor = self._executor
            driver = self._driver
        if driver is not None:
            driver.link_ended(execution_id)
        self._stop_serving(execution_id, executor, pollers)
        tracing.run_ended(execution_id, lambda: self._api.get_workflow(execution_id, include_tasks=True),
                          continued=is_continued,
                          read_run=lambda run_id: self._api.get_workflow(run_id, include_tasks=True))

    def serves_domain(self, domain: str) -> bool:
        """Whether a run on ``domain`` is served here now (or its poller is reserved for one starting)."""
        with self._lock:
            poller = self._pollers.get(domain)
        return poller is not None and not poller.is_idle()

    def _stop_serving(self, execution_id: str, executor: ToolExecutor | None, pollers: list[DomainPoller]) -> None:
        """Stop running, polling and watching ``execution_id`` here (its tools still running are cancelled)."""
        if executor is not None:
            executor.run_ended(execution_id)
            for sub_run in self._sub_runs_here(executor, execution_id):
                executor.run_ended(sub_run)
        for poller in pollers:
            poller.remove_execution(execution_id)
            self.retire_if_idle(poller)
        self.unwatch(execution_id)

    def let_go(self, domain: str) -> None:
        """Stop serving every run on ``domain`` at once: another process may serve them next (this process's
        presence lapsed). Nothing about them is looked at or ended on the server: they have not ended."""
        with self._lock:
            poller = self._pollers.get(domain)
            executor = self._executor
            driver = self._driver
        if poller is None:
            return
        executions = poller.executions
        if driver is not None:
            driver.let_go(executions)
        for execution_id in executions:
            self._stop_serving(execution_id, executor, [poller])

    # -- continued listeners ----------------------------------------------------------

    @property
    def driver(self) -> ContinuationDriver:
        """The continuation driver (created on first use)."""
        with self._lock:
            if self._driver is None:
                self._driver = ContinuationDriver(
                    self._api, self.directory, worker_id=self._worker_id, clock=self._clock,
                    locally_busy=self._runs_tools_of,
                    drain_seconds=self._settings.continuation_drain_seconds,
                    switch_wait=self._settings.switch_wait_seconds,
                    mailbox_check_seconds=self._settings.mailbox_check_seconds,
                    mailbox_check_max_seconds=self._settings.mailbox_check_max_seconds)
                if self._closed:
                    self._driver.close()
            return self._driver

    def serve_chain(self, reservation: Reservation, chain: Chain, spec: LinkSpec, current: Link, *,
                    turns_before: int, pending_from: Link | None = None) -> ChainTracker:
        """Continue ``chain`` from here: its links are served on ``reservation``'s poller."""
        if chain.mailbox:  # the tools of every run count as the id callers hold
            reservation.counted_as = chain.execution_id
            if reservation.execution_id is not None:
                self.observer.alias(reservation.execution_id, chain.execution_id)
        return self.driver.serve(chain, spec, current, turns_before=turns_before,
                                 handle_link=reservation.handle_link, pending_from=pending_from)

    def chain_tracker(self, run_id: str | None) -> ChainTracker | None:
        """The tracker of the continued listener on ``run_id`` this process serves, if any."""
        with self._lock:
            driver = self._driver
        return driver.tracker(run_id) if driver is not None else None

    def _runs_tools_of(self, execution_id: str) -> bool:
        with self._lock:
            executor = self._executor
        return executor is not None and executor.runs_tools_of(execution_id, except_types=_INTERNAL_TASKS)

    # -- the watchdog -----------------------------------------------------------------

    def watch(self, execution_id: str, *, domain: str | None = None, served: bool = False,
              served_domain: str | None = None, workflow_name: str | None = None,
              tree: bool = False, companions: Companions | None = None,
              successor: Successor | None = None) -> RunWatch:
        """Have the runtime's watchdog sample ``execution_id`` (see :meth:`RunWatchdog.watch`)."""
        with self._lock:
            if self._watchdog is None:
                self._watchdog = RunWatchdog(
                    self._api, interval=self._settings.liveness_check_interval_seconds,
                    stall_seconds=self._settings.liveness_stall_seconds, on_ended=self.execution_ended,
                    is_busy=self._is_busy, ring=self._ring, queues_empty=self._queues_empty,
                    grace={CARRY_TASK: carry_grace_seconds(self._settings.continuation_drain_seconds)},
                    clock=self._clock,
                )
                if self._closed:
                    self._watchdog.close()
            watchdog = self._watchdog
        return watchdog.watch(execution_id, domain=domain, served=served, served_domain=served_domain,
                              workflow_name=workflow_name, tree=tree, companions=companions, successor=successor)

    def _task_done(self, task: TaskRef, outcome: str, seconds: float) -> None:
        """The executor is done with a task (its result posted, if it had one): the watchdog looks at the run's
        join later if it was a tool's and nothing of the run follows (see ``_liveness/nudges.py``)."""
        with self._lock:
            watchdog = self._watchdog
        if watchdog is not None:
            watchdog.note_result(task.workflow_id, tool=task.task_type not in _INTERNAL_TASKS)

    def unwatch(self, execution_id: str) -> None:
        """Stop sampling ``execution_id`` (this process no longer serves or watches it)."""
        with self._lock:
            watchdog = self._watchdog
        if watchdog is not None:
            watchdog.forget(execution_id)

    @property
    def watchdog(self) -> RunWatchdog | None:
        """The watchdog, once a run was watched."""
        return self._watchdog

    def _serving(self, domain: str) -> tuple[DomainPoller | None, ToolExecutor | None, QueueWatcher | None]:
        """The live poller of ``domain`` (None when this process does not poll it), the executor, the watcher."""
        with self._lock:
            poller = self._pollers.get(domain)
            executor, watcher = self._executor, self._watcher
        if poller is None or poller.retired or not poller.is_alive:
            poller = None
        return poller, executor, watcher

    def _is_busy(self, domain: str) -> bool:
        """Whether this process polls ``domain`` but its tool pool was full within the stall threshold."""
        poller, executor, _ = self._serving(domain)
        return poller is not None and executor is not None and \
            executor.full_within(self._settings.liveness_stall_seconds)

    def _queues_empty(self, domain: str) -> bool:
        """Whether the queue watcher just read every queue this process polls on ``domain`` empty."""
        poller, _, watcher = self._serving(domain)
        return poller is not None and watcher is not None and \
            watcher.is_empty(poller.queue_names(), within=_QUEUES_READ_WITHIN_SECONDS)

    def _ring(self, domain: str) -> None:
        with self._lock:
            poller = self._pollers.get(domain)
        if poller is not None:
            poller.ring()

    def stop_requested(self, execution_id: str) -> None:
        """A graceful stop of the run was asked from this process: its tools see ``ctx.stop_requested``."""
        with self._lock:
            executor = self._executor
        if executor is not None:
            executor.stop_requested(execution_id)
            for sub_run in self._sub_runs_here(executor, execution_id):
                executor.stop_requested(sub_run)

    def _sub_runs_here(self, executor: ToolExecutor, execution_id: str) -> list[str]:
        """The sub-runs of ``execution_id`` (sub-agents, agent tools) whose tools run here now."""
        with self._lock:
            known = {e for p in self._pollers.values() for e in p.executions}
        others = executor.in_flight_workflows() - known - {execution_id}
        return [run for run in others if self._roots.root_of(run) == execution_id]

    # -- start-up check ---------------------------------------------------------------

    def confirm_polling(self, reservation: Reservation) -> None:
        """Return once the server has seen this run's domain polled, or raise.

        Raises:
            WorkerStartupError: no poll reached the server within
                ``worker_startup_timeout_seconds``.
        """
        poller = reservation.poller
        timeout = self._settings.worker_startup_timeout_seconds
        task_types = tuple(reservation.tools)
        if not poller.wait_polled(task_types, timeout):
            raise WorkerStartupError(
                f"the workers of run {reservation.execution_id} (domain {poller.domain!r}) did not reach "
                f"the server within {timeout:g}s; the run is started but no task of it will be executed "
                "here. Check the server URL and network, then resume the run."
            )
        if poller.domain is None:
            return
        rows = self._api.poll_data(task_types[0])
        if not any(row.get("domain") == poller.domain for row in rows):
            raise WorkerStartupError(
                f"the server reports no poller for task {task_types[0]!r} on domain {poller.domain!r} "
                f"although this process polls it; check that {self._api.transport.base_url} is the server "
                "the run was started on"
            )

    # -- taking over after a crash ----------------------------------------------------

    def reclaim_orphans(self, workflow: dict[str, Any], domain: str | None) -> list[str]:
        """Hand back the tasks of ``domain`` that another (dead) worker had taken.

        A worker killed mid-tool leaves its task IN_PROGRESS until its lease ends (an hour
        for agent tools). ``resume()`` is the caller saying that process is gone, so each
        such task is handed back (requeued IN_PROGRESS, see ``task_watch.hand_back``): the
        server delivers the same call again on the same domain, which this process serves,
        and the model sees only that delivery's result. Returns the reference names reclaimed.
        """
        reclaimed = []
        for task in workflow.get("tasks") or ():
            if (task.get("domain") != domain or task.get("status") != "IN_PROGRESS"
                    or not task.get("pollCount") or task.get("workerId") == self._worker_id):
                continue
            try:
                hand_back(self._api, workflow_id=str(task.get("workflowInstanceId")), task_id=str(task.get("taskId")),
                          worker_id=self._worker_id,
                          note=f"reclaimed on resume: worker {task.get('workerId')} is gone")
            except ConductorAgentsError as err:
                log.warning("could not reclaim task %s: %s", task.get("referenceTaskName"), err)
                continue
            log.info("reclaimed task %s from worker %s", task.get("referenceTaskName"), task.get("workerId"))
            reclaimed.append(str(task.get("referenceTaskName")))
        return reclaimed

    # -- introspection ----------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """This process's worker id (what its run spans are owned by)."""
        return self._worker_id

    def pollers(self) -> list[DomainPoller]:
        with self._lock:
            return list(self._pollers.values())

    # -- shutdown ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop every poller, let running tools finish, join everything: the listeners' switch driver, the
        watchdog, the pollers and queue watchers (stopped together, then joined in turn), the tool pool, each
        a :class:`~.._common.parts.Part` of one list: each is closed even when one before it failed.
        Idempotent, safe before start."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pollers = list(self._pollers.values()) + self._retiring
            self._pollers.clear()
            self._retiring = []
            executor = self._executor
            watchers = [w for w in (self._watcher, *self._stopped_watchers) if w is not None]
            self._stopped_watchers = []
            watchdog = self._watchdog
            driver = self._driver
        loops: list[QueueWatcher | DomainPoller] = [*watchers, *pollers]

        def stop_loops() -> None:
            for loop in loops:
                loop.stop()

        parts: list[Part] = [
            *(part for part in (driver, watchdog) if part is not None),
            # all at once: each leaves its long poll meanwhile, then each is joined in turn
            Step("stop every loop", stop_loops),
            *pollers, *watchers, *([executor] if executor is not None else []),
            # the spans of its runs still going end here (the runs go on)
            Step("end the runs' spans", lambda: tracing.runs_closed(self._worker_id))]
        close_in_order(parts, log)
